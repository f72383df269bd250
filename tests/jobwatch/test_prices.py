"""jobwatch.prices: the ``prices:`` table, matched on node labels, and its errors naming the field."""

from __future__ import annotations

import re
from typing import Any

import pytest

from jobwatch.prices import ConfigError, PriceEntry, PriceTable, load_prices, load_prices_text

P5 = {
    "node.kubernetes.io/instance-type": "p5.48xlarge",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "karpenter.sh/capacity-type": "on-demand",
    "topology.kubernetes.io/zone": "us-east-1a",
}
P5_SPOT_EKS = {
    "node.kubernetes.io/instance-type": "p5.48xlarge",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "eks.amazonaws.com/capacityType": "SPOT",
}
H200 = {"node.kubernetes.io/instance-type": "p5en.48xlarge", "nvidia.com/gpu.product": "NVIDIA-H200"}
G5 = {"beta.kubernetes.io/instance-type": "g5.xlarge", "nvidia.com/gpu.product": "NVIDIA-A10G"}
ONPREM = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}

CONFIG: dict[str, Any] = {
    "prices": [
        {"instance_type": "p5.48xlarge", "capacity_type": "spot", "usd_per_instance_hour": 22.0, "gpus": 8},
        {"instance_type": "p5.48xlarge", "usd_per_instance_hour": 55.04, "gpus": 8},
        {"gpu_product": "NVIDIA H200", "usd_per_gpu_hour": 4.5},
        {"instance_type": "G5.XLARGE", "usd_per_gpu_hour": 1.006},
    ],
    "default_usd_per_gpu_hour": 2.0,
    "listen": ":9403",  # another part of the config: left alone
}

PRICE_FOR = [
    ("p5-on-demand-55.04-over-8", P5, 6.88),
    ("p5-spot-eks-label-first-match", P5_SPOT_EKS, 2.75),
    ("h200-by-product-spaces-as-dashes", H200, 4.5),
    ("beta-instance-label-case-insensitive", G5, 1.006),
    ("no-match-default", ONPREM, 2.0),
    ("no-labels-default", {}, 2.0),
]


@pytest.mark.parametrize(("labels", "want"), [r[1:] for r in PRICE_FOR], ids=[r[0] for r in PRICE_FOR])
def test_price_for(labels: dict[str, str], want: float) -> None:
    assert load_prices(CONFIG, "jobwatch.yaml").price_for(labels) == pytest.approx(want)


def test_p5_dollars_per_gpu_hour_exact() -> None:
    table = load_prices({"prices": [{"instance_type": "p5.48xlarge", "usd_per_instance_hour": 55.04, "gpus": 8}]}, "x")
    assert table.price_for(P5) == 55.04 / 8 == pytest.approx(6.88)
    assert table.entry_for(P5) == PriceEntry(55.04 / 8, instance_type="p5.48xlarge")


def test_no_price_without_table_or_default() -> None:
    empties: list[Any] = [None, {}, {"prices": []}, {"prices": None}]
    for data in empties:
        table = load_prices(data, "x")
        assert table == PriceTable() and table.empty and table.price_for(P5) is None
    no_default = load_prices({"prices": [{"gpu_product": "NVIDIA-H200", "usd_per_gpu_hour": 4.5}]}, "x")
    assert no_default.price_for(P5) is None and not no_default.empty


def test_every_key_of_an_entry_must_match() -> None:
    table = load_prices(
        {"prices": [{"instance_type": "p5.48xlarge", "gpu_product": "NVIDIA-H200", "usd_per_gpu_hour": 1.0}]}, "x"
    )
    assert table.price_for(P5) is None
    capacity = load_prices({"prices": [{"capacity_type": "on_demand", "usd_per_gpu_hour": 3.0}]}, "x")
    assert capacity.price_for(P5) == 3.0 and capacity.price_for(P5_SPOT_EKS) is None


def test_zero_price_is_a_price() -> None:
    table = load_prices({"prices": [{"gpu_product": "NVIDIA-A100-SXM4-80GB", "usd_per_gpu_hour": 0}]}, "x")
    assert table.price_for(ONPREM) == 0.0


BAD = [
    ("config-not-mapping", ["prices"], "", "the config must be a mapping"),
    ("prices-not-list", {"prices": {"p5.48xlarge": 55}}, "prices", "must be a list"),
    ("entry-not-mapping", {"prices": ["p5.48xlarge"]}, "prices[0]", "must be a mapping"),
    (
        "unknown-key",
        {"prices": [{"instance": "p5.48xlarge", "usd_per_gpu_hour": 1}]},
        "prices[0].instance",
        "unknown key",
    ),
    (
        "modelName-is-not-a-key",
        {"prices": [{"modelName": "NVIDIA H200", "usd_per_gpu_hour": 1}]},
        "prices[0].modelName",
        "unknown key",
    ),
    ("no-match-key", {"prices": [{"usd_per_gpu_hour": 1}]}, "prices[0]", "needs at least one of"),
    (
        "empty-match-value",
        {"prices": [{"instance_type": " ", "usd_per_gpu_hour": 1}]},
        "prices[0].instance_type",
        "non-empty string",
    ),
    (
        "match-value-number",
        {"prices": [{"gpu_product": 100, "usd_per_gpu_hour": 1}]},
        "prices[0].gpu_product",
        "non-empty string",
    ),
    ("no-price", {"prices": [{"instance_type": "p5.48xlarge"}]}, "prices[0]", "exactly one of"),
    (
        "two-prices",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_gpu_hour": 1, "usd_per_instance_hour": 8, "gpus": 8}]},
        "prices[0]",
        "exactly one of",
    ),
    (
        "instance-price-without-gpus",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_instance_hour": 55.04}]},
        "prices[0].gpus",
        "is required",
    ),
    (
        "gpus-with-gpu-price",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_gpu_hour": 6.88, "gpus": 8}]},
        "prices[0].gpus",
        "usd_per_instance_hour only",
    ),
    (
        "gpus-zero",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_instance_hour": 55.04, "gpus": 0}]},
        "prices[0].gpus",
        "whole number >= 1",
    ),
    (
        "gpus-fraction",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_instance_hour": 55.04, "gpus": 7.5}]},
        "prices[0].gpus",
        "whole number >= 1",
    ),
    (
        "gpus-bool",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_instance_hour": 55.04, "gpus": True}]},
        "prices[0].gpus",
        "whole number >= 1",
    ),
    (
        "price-string",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_gpu_hour": "$6.88"}]},
        "prices[0].usd_per_gpu_hour",
        "must be a number, not a string",
    ),
    (
        "price-negative",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_gpu_hour": -1}]},
        "prices[0].usd_per_gpu_hour",
        "finite number >= 0",
    ),
    (
        "price-nan",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_gpu_hour": float("nan")}]},
        "prices[0].usd_per_gpu_hour",
        "finite number >= 0",
    ),
    (
        "price-bool",
        {"prices": [{"instance_type": "p5.48xlarge", "usd_per_gpu_hour": True}]},
        "prices[0].usd_per_gpu_hour",
        "a boolean",
    ),
    (
        "second-entry-named",
        {
            "prices": [
                {"gpu_product": "NVIDIA-H200", "usd_per_gpu_hour": 4.5},
                {"gpu_product": "NVIDIA-A10G", "usd_per_gpu_hour": "cheap"},
            ]
        },
        "prices[1].usd_per_gpu_hour",
        "must be a number",
    ),
    ("default-string", {"default_usd_per_gpu_hour": "3"}, "default_usd_per_gpu_hour", "must be a number"),
    ("default-infinite", {"default_usd_per_gpu_hour": float("inf")}, "default_usd_per_gpu_hour", "finite"),
]


@pytest.mark.parametrize(("data", "field", "message"), [r[1:] for r in BAD], ids=[r[0] for r in BAD])
def test_load_errors_name_the_field(data: Any, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_prices(data, "/etc/gpu-jobwatch/config.yaml")
    e = info.value
    assert (e.file, e.field, e.line) == ("/etc/gpu-jobwatch/config.yaml", field, 0)
    assert message in e.message
    prefix = f"/etc/gpu-jobwatch/config.yaml: {field}: " if field else "/etc/gpu-jobwatch/config.yaml: "
    assert str(e).startswith(prefix)
    assert isinstance(e, ValueError)


YAML_OK = """\
listen: ":9403"
prices:
  - instance_type: p5.48xlarge
    usd_per_instance_hour: 55.04
    gpus: 8
default_usd_per_gpu_hour: 2.5
"""

YAML_BAD = [
    ("gpus-line", YAML_OK.replace("gpus: 8", "gpus: eight"), "prices[0].gpus", 5),
    ("unknown-key-line", YAML_OK.replace("    gpus: 8", "    gpus: 8\n    zone: us-east-1a"), "prices[0].zone", 6),
    (
        "entry-line",
        YAML_OK.replace("  - instance_type: p5.48xlarge\n", "  - {}\n  - instance_type: p5.48xlarge\n"),
        "prices[0]",
        3,
    ),
    ("default-line", YAML_OK.replace("2.5", "cheap"), "default_usd_per_gpu_hour", 6),
    ("prices-not-list-line", "prices: 55\n", "prices", 1),
    ("not-yaml-flow", "prices: [\n  - a: b\n", "", 2),
    ("not-yaml-indent", "prices:\n  - a: b\n - c\n", "", 3),
]


@pytest.mark.parametrize(("text", "field", "line"), [r[1:] for r in YAML_BAD], ids=[r[0] for r in YAML_BAD])
def test_load_text_gives_the_line(text: str, field: str, line: int) -> None:
    with pytest.raises(ConfigError) as info:
        load_prices_text(text, "c.yaml")
    assert (info.value.field, info.value.line) == (field, line)
    assert re.match(rf"c\.yaml:{line}: ", str(info.value))


def test_load_text_ok() -> None:
    table = load_prices_text(YAML_OK, "c.yaml")
    assert table.price_for(P5) == pytest.approx(6.88) and table.price_for({}) == 2.5
    assert load_prices_text("", "c.yaml") == PriceTable()
