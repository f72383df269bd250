"""Issue 20 points 7 and 8, on the rendered manifests: the Prometheus-side pre-filter of every
deployment keeps everything the relay would ship (it is derived from the relay's keep rule), and
the relay's NetworkPolicy has no catch-all rule and never admits Prometheus's 9090 from everywhere."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from relay.common import labels as lbl
from relay.config.config import parse_config
from relay.rules.relabel import RelabelConfig, parse_relabel_configs, process
from tests.deploy.render import DEPLOY, ROOT, render
from tests.deploy.test_deploy_relay import SIDECARS

RELAY_CONFIGS = [DEPLOY / "relay" / "relay.yaml", DEPLOY / "examples" / "relay.yaml"]
ENV = {"CLUSTER_NAME": "c", "POD_NAME": "prometheus-0", "AWS_REGION": "us-east-1",
       "AMP_REMOTE_WRITE_URL": "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"}
OLD_PREFILTER = "DCGM_.*|gpu_exporter_.*|gpu_relay_.*"  # the hard-coded one of issue 20 point 7


def corpus(rules: list[tuple[RelabelConfig, ...]]) -> set[str]:
    """Metric names to try: every DCGM field the exporter knows, names a relay user keeps (the
    issue's container_gpu_usage_seconds_total), the relay's own, and each literal alternative of a
    keep regex."""
    names = set()
    for path in (ROOT / "exporter").rglob("*.py"):
        names |= set(re.findall(r"DCGM_FI_[A-Z0-9_]+", path.read_text(encoding="utf-8")))
    names |= {"container_gpu_usage_seconds_total", "gpu_relay_queue_bytes", "gpu_exporter_build_info", "up"}
    for rule_list in rules:
        for r in rule_list:
            if r.action == "keep" and r.source_labels == ("__name__",):
                names |= {alt for alt in r.regex.pattern.split("|") if re.fullmatch(r"[A-Za-z_:][\w:]*", alt)}
    return names


def relay_rules(path: Path) -> list[tuple[RelabelConfig, ...]]:
    config = parse_config(path.read_text(), str(path), env=ENV)
    return [config.global_relabel + d.write_relabel_configs for d in config.destinations if not d.dry_run]


def filtered_out(prefilter: tuple[RelabelConfig, ...], rules: list[tuple[RelabelConfig, ...]]) -> list[str]:
    """Names some destination of the relay would ship that the pre-filter drops before the relay."""
    lost = []
    for name in sorted(corpus(rules)):
        series = lbl.make([("__name__", name), ("gpu", "0")])
        shipped = any(process(series, r) is not None for r in rules)
        if shipped and process(series, prefilter) is None:
            lost.append(name)
    return lost


def prefilter_of(sidecar_name: str) -> tuple[RelabelConfig, ...]:
    (rw,) = SIDECARS[sidecar_name]().remote_write
    return parse_relabel_configs(rw.get("write_relabel_configs", []))


@pytest.mark.parametrize("config", RELAY_CONFIGS, ids=lambda p: str(p.relative_to(DEPLOY)))
@pytest.mark.parametrize("sidecar", list(SIDECARS))
def test_the_prometheus_prefilter_keeps_every_name_the_relay_ships(sidecar: str, config: Path) -> None:
    assert filtered_out(prefilter_of(sidecar), relay_rules(config)) == []


def test_the_check_catches_a_prefilter_narrower_than_the_relay_s_keep_list() -> None:
    """The issue's case: the seed keeps container_gpu_usage_seconds_total, the old pre-filter did not."""
    keep = "DCGM_FI_DEV_GPU_UTIL|container_gpu_usage_seconds_total"
    relay = [parse_relabel_configs([{"source_labels": ["__name__"], "regex": keep, "action": "keep"}])]
    old = parse_relabel_configs([{"source_labels": ["__name__"], "regex": OLD_PREFILTER, "action": "keep"}])
    assert filtered_out(old, relay) == ["container_gpu_usage_seconds_total"]


def _policies(path: str) -> list[dict[str, Any]]:
    return [d for d in render(path) if d["kind"] == "NetworkPolicy"
            and d["metadata"]["labels"].get("app.kubernetes.io/name") == "gpu-relay"]


def _admits_everyone(peers: list[dict[str, Any]] | None) -> bool:
    """A missing or empty ``from``, an any-namespace selector without a pod selector, or 0.0.0.0/0."""
    if not peers:
        return True
    for peer in peers:
        ns = peer.get("namespaceSelector")
        if ns is not None and not ns.get("matchLabels") and not ns.get("matchExpressions") \
                and "podSelector" not in peer:
            return True
        if peer.get("ipBlock", {}).get("cidr") in ("0.0.0.0/0", "::/0"):
            return True
    return False


def _covers(rule_port: dict[str, Any], port: int) -> bool:
    start = rule_port.get("port")
    if not isinstance(start, int):
        return start is None  # a named port could be anything; none: every port
    return start <= port <= int(rule_port.get("endPort", start))


@pytest.mark.parametrize("path", ["relay", "overlays/kube-prometheus-stack", "overlays/prometheus-operator",
                                  "overlays/prometheus-statefulset"])
def test_networkpolicy_has_no_catch_all_and_no_open_9090(path: str) -> None:
    policies = _policies(path)
    assert policies, f"deploy/{path} applies the relay's NetworkPolicy"
    for p in policies:
        for rule in p["spec"]["ingress"]:
            assert rule.get("ports"), f"an ingress rule without ports admits every port: {rule}"
            if any(_covers(rp, 9090) for rp in rule["ports"]):
                assert not _admits_everyone(rule.get("from")), f"9090 admitted from everywhere: {rule}"
            if any(_covers(rp, 9202) for rp in rule["ports"]):
                assert not _admits_everyone(rule.get("from")), f"9202 admitted from everywhere: {rule}"


def test_the_old_catch_all_rule_is_what_the_check_refuses() -> None:
    catch_all = {"ports": [{"protocol": "TCP", "port": 1, "endPort": 9200}]}
    assert _covers(catch_all["ports"][0], 9090) and _admits_everyone(catch_all.get("from"))


def test_the_policy_documents_both_relay_ports_and_when_to_apply_it() -> None:
    text = (DEPLOY / "relay" / "networkpolicy.yaml").read_text()
    assert "9201 (relay write)" in text and "9202 (relay telemetry)" in text
    assert "When to apply it:" in text and "default-deny" in text


@pytest.mark.parametrize("sidecar", list(SIDECARS))
def test_the_prefilter_is_derived_from_the_relay_s_keep_rule(sidecar: str) -> None:
    """The same regex as the keep rule of the config the sidecar mounts, not a hand-written family list."""
    (keep, *_) = prefilter_of(sidecar)
    relay_keeps = {r.regex.pattern for rules in relay_rules(RELAY_CONFIGS[0]) for r in rules
                   if r.action == "keep" and r.source_labels == ("__name__",)}
    assert keep.action == "keep" and keep.source_labels == ("__name__",)
    assert relay_keeps == {keep.regex.pattern}
