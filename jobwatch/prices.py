"""GPU prices from the ``prices:`` table of gpu-jobwatch's config, matched on a node's labels.

Contract: :func:`load_prices` checks the whole table once and raises one :class:`ConfigError`
naming the file, line (when known) and field of the first problem; :meth:`PriceTable.price_for`
is then a pure lookup that never raises. There is no built-in price list: with no match and no
default the price is None (GPU-hours still, no dollars).

The config keys::

    prices:
      - instance_type: p5.48xlarge         # node.kubernetes.io/instance-type
        capacity_type: on-demand           # karpenter.sh/capacity-type, else eks.amazonaws.com/capacityType
        usd_per_instance_hour: 55.04       # divided by gpus: $6.88 per GPU-hour
        gpus: 8
      - gpu_product: NVIDIA H200           # nvidia.com/gpu.product (GFD), e.g. NVIDIA-H200
        usd_per_gpu_hour: 4.5
    default_usd_per_gpu_hour: 3.0          # when no entry matches

An entry matches when every match key it sets equals the node's label; the first matching entry
wins. Comparison ignores case, and ``gpu_product`` treats spaces as dashes (the DCGM modelName
``NVIDIA H200`` is GFD's ``NVIDIA-H200``) and ``capacity_type`` underscores as dashes (EKS's
``ON_DEMAND`` is Karpenter's ``on-demand``). An entry needs at least one match key and exactly one
price: ``usd_per_gpu_hour``, or ``usd_per_instance_hour`` with ``gpus`` (a whole number >= 1).
Prices are finite numbers >= 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
GPU_PRODUCT_LABELS = ("nvidia.com/gpu.product",)
CAPACITY_TYPE_LABELS = ("karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType")
MATCH_KEYS = ("instance_type", "gpu_product", "capacity_type")
PRICE_KEYS = ("usd_per_gpu_hour", "usd_per_instance_hour", "gpus")


class ConfigError(ValueError):
    """A bad price config; ``str()`` is ``file:line: field: message`` (no line when unknown)."""

    def __init__(self, file: str, field: str, message: str, line: int = 0) -> None:
        self.file, self.field, self.message, self.line = file, field, message, line
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


def _norm(key: str, value: str) -> str:
    v = value.strip().casefold()
    if key == "gpu_product":
        v = "-".join(v.split())
    if key == "capacity_type":
        v = v.replace("_", "-")
    return v


@dataclass(frozen=True)
class PriceEntry:
    usd_per_gpu_hour: float
    instance_type: str | None = None
    gpu_product: str | None = None
    capacity_type: str | None = None

    def matches(self, node: NodeKeys) -> bool:
        want = (
            ("instance_type", self.instance_type),
            ("gpu_product", self.gpu_product),
            ("capacity_type", self.capacity_type),
        )
        return all(v is None or getattr(node, k) == _norm(k, v) for k, v in want)


@dataclass(frozen=True)
class NodeKeys:
    """A node's match keys, normalised; None where the node has no such label."""

    instance_type: str | None
    gpu_product: str | None
    capacity_type: str | None

    @classmethod
    def of(cls, labels: Mapping[str, Any]) -> NodeKeys:
        def first(key: str, names: tuple[str, ...]) -> str | None:
            for n in names:
                v = labels.get(n)
                if isinstance(v, str) and v.strip():
                    return _norm(key, v)
            return None

        return cls(
            first("instance_type", INSTANCE_TYPE_LABELS),
            first("gpu_product", GPU_PRODUCT_LABELS),
            first("capacity_type", CAPACITY_TYPE_LABELS),
        )


@dataclass(frozen=True)
class PriceTable:
    entries: tuple[PriceEntry, ...] = ()
    default_usd_per_gpu_hour: float | None = None

    def entry_for(self, node_labels: Mapping[str, Any]) -> PriceEntry | None:
        keys = NodeKeys.of(node_labels)
        return next((e for e in self.entries if e.matches(keys)), None)

    def price_for(self, node_labels: Mapping[str, Any]) -> float | None:
        """USD per GPU-hour on a node with these labels: the first matching entry, else the default."""
        entry = self.entry_for(node_labels)
        return entry.usd_per_gpu_hour if entry is not None else self.default_usd_per_gpu_hour

    @property
    def empty(self) -> bool:
        return not self.entries and self.default_usd_per_gpu_hour is None


def _price(v: Any, where: str, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(where, field, f"must be a number, not {_kind(v)}")
    if not math.isfinite(v) or v < 0:
        raise ConfigError(where, field, f"must be a finite number >= 0, not {v}")
    return float(v)


def _kind(v: Any) -> str:
    return {str: "a string", list: "a list", dict: "a mapping", bool: "a boolean"}.get(type(v), type(v).__name__)


def _entry(item: Any, where: str, path: str) -> PriceEntry:
    if not isinstance(item, Mapping):
        raise ConfigError(where, path, f"must be a mapping, not {_kind(item)}")
    for k in item:
        if k not in MATCH_KEYS + PRICE_KEYS:
            known = ", ".join(MATCH_KEYS + PRICE_KEYS)
            raise ConfigError(where, f"{path}.{k}", f"unknown key (known: {known})")
    match: dict[str, str] = {}
    for k in MATCH_KEYS:
        if k in item:
            v = item[k]
            if not isinstance(v, str) or not v.strip():
                raise ConfigError(where, f"{path}.{k}", f"must be a non-empty string, not {_kind(v)}")
            match[k] = v.strip()
    if not match:
        raise ConfigError(where, path, f"needs at least one of {', '.join(MATCH_KEYS)} (use default_usd_per_gpu_hour)")
    per_gpu, per_node, gpus = (item.get(k) for k in PRICE_KEYS)
    if (per_gpu is None) == (per_node is None):
        raise ConfigError(where, path, "needs exactly one of usd_per_gpu_hour, usd_per_instance_hour")
    if per_gpu is not None:
        if gpus is not None:
            raise ConfigError(where, f"{path}.gpus", "goes with usd_per_instance_hour only")
        price = _price(per_gpu, where, f"{path}.usd_per_gpu_hour")
    else:
        node_price = _price(per_node, where, f"{path}.usd_per_instance_hour")
        if gpus is None:
            raise ConfigError(where, f"{path}.gpus", "is required with usd_per_instance_hour")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ConfigError(where, f"{path}.gpus", f"must be a whole number >= 1, not {gpus!r}")
        price = node_price / gpus
    return PriceEntry(price, **match)


def load_prices(data: Any, where: str) -> PriceTable:
    """The price table from a config mapping's ``prices`` and ``default_usd_per_gpu_hour`` keys.

    Other keys of ``data`` belong to other parts of the config and are left alone; ``None`` (no
    config) is an empty table. ``where`` names the file in errors.
    """
    if data is None:
        return PriceTable()
    if not isinstance(data, Mapping):
        raise ConfigError(where, "", f"the config must be a mapping, not {_kind(data)}")
    raw = data.get("prices")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ConfigError(where, "prices", f"must be a list, not {_kind(raw)}")
    entries = tuple(_entry(item, where, f"prices[{i}]") for i, item in enumerate(raw))
    default = data.get("default_usd_per_gpu_hour")
    return PriceTable(entries, None if default is None else _price(default, where, "default_usd_per_gpu_hour"))


def load_prices_text(text: str, where: str) -> PriceTable:
    """:func:`load_prices` on YAML text, with the line of the bad field in the error."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(where, "", f"not YAML: {getattr(e, 'problem', e)}", mark.line + 1 if mark else 0) from None
    try:
        return load_prices(data, where)
    except ConfigError as e:
        raise ConfigError(where, e.field, e.message, _line_of(text, e.field)) from None


def _line_of(text: str, field: str) -> int:
    """1-based line of what a path like ``prices[1].gpus`` names (a key's line), or of its deepest parent."""
    node: yaml.Node | None = yaml.compose(text)
    line = node.start_mark.line + 1 if node is not None else 0
    for part in field.replace("[", ".[").split("."):
        if not part:
            continue
        nxt: yaml.Node | None = None
        if part.startswith("[") and isinstance(node, yaml.SequenceNode):
            i = int(part[1:-1])
            if i < len(node.value):
                nxt = node.value[i]
                line = nxt.start_mark.line + 1
        elif isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
            if found:
                line, nxt = found[-1][0].start_mark.line + 1, found[-1][1]
        if nxt is None:
            break
        node = nxt
    return line
