"""The prometheus-operator's camelCase remote write (kube-prometheus-stack) as prometheus.yml's.

The operator's ``RemoteWriteSpec`` (``monitoring.coreos.com/v1``) names Prometheus's keys in camelCase
(``writeRelabelConfigs``, ``sourceLabels``, ``queueConfig.maxSamplesPerSend``, ``sigv4.roleArn``...).
``find_remote_write`` takes the entries from the three places a user has them: a kube-prometheus-stack
values file (``prometheus.prometheusSpec.remoteWrite``, external labels at ``...externalLabels``), a
Prometheus custom resource (``kind: Prometheus``, ``spec.remoteWrite``) or a bare list of entries.
``to_prometheus`` turns one entry into prometheus.yml's snake_case, key by key (:func:`camel_to_snake`
plus the few the operator renames), and says what it could not carry over: a Kubernetes Secret
reference (``{name, key}``) is a value the operator reads from the cluster, so it is left out with a
note. Rule values are copied as they are (``action: Keep`` is read case-insensitively, as Prometheus
does). ``to_operator`` writes an entry the other way, for the entry that points at the relay.
"""

from __future__ import annotations

import re
from typing import Any

RENAMED = {  # operator key -> Prometheus key, where the plain case change is not it
    "retryOnRateLimit": "retry_on_http_429",
    "azureAd": "azuread",
    "messageVersion": "protobuf_message",
    "enableHTTP2": "enable_http2",
    "roundRobinDNS": "round_robin_dns",
    "useFIPSSTSEndpoint": "use_fips_sts_endpoint",
}
_MESSAGE_VERSIONS = {"V1.0": "prometheus.WriteRequest", "V2.0": "io.prometheus.write.v2.Request"}
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z]|\d|$)|[A-Z]?[a-z]+|\d+|[A-Z]+")


def camel_to_snake(key: str) -> str:
    """``writeRelabelConfigs`` -> ``write_relabel_configs``; ``enableHTTP2`` -> ``enable_http2``."""
    if key in RENAMED:
        return RENAMED[key]
    words = _WORD.findall(key)
    return "_".join(w.lower() for w in words) if words else key


def snake_to_camel(key: str) -> str:
    first, *rest = key.split("_")
    return first + "".join(w[:1].upper() + w[1:] for w in rest)


def is_camel(key: str) -> bool:
    return key != key.lower() and "_" not in key


def find_remote_write(doc: Any) -> tuple[list[Any], dict[str, Any], str] | None:
    """(entries, external labels, where) of an operator-form document; None when it is not one."""
    if isinstance(doc, list):  # entries, each a mapping: anything else is no remote write list
        return (doc, {}, "the list") if doc and all(isinstance(e, dict) for e in doc) else None
    if not isinstance(doc, dict):
        return None
    spec: Any = None
    where = ""
    if doc.get("kind") == "Prometheus" and isinstance(doc.get("spec"), dict):
        spec, where = doc["spec"], "spec.remoteWrite"
    elif isinstance(doc.get("prometheus"), dict) and isinstance(doc["prometheus"].get("prometheusSpec"), dict):
        spec, where = doc["prometheus"]["prometheusSpec"], "prometheus.prometheusSpec.remoteWrite"
    if spec is None or "remoteWrite" not in spec:
        return None
    external = spec.get("externalLabels")
    return list(spec.get("remoteWrite") or []), dict(external) if isinstance(external, dict) else {}, where


def _secret_ref(value: Any) -> bool:
    return isinstance(value, dict) and "key" in value and set(value) <= {"name", "key", "optional"}


def to_prometheus(entry: Any, path: str, notes: list[str]) -> Any:
    """One operator entry (or a part of one) in prometheus.yml's keys; what is left out goes to ``notes``."""
    if isinstance(entry, list):
        return [to_prometheus(v, f"{path}[{i}]", notes) for i, v in enumerate(entry)]
    if not isinstance(entry, dict):
        return entry
    out: dict[str, Any] = {}
    for key, value in entry.items():
        where = f"{path}.{key}"
        if _secret_ref(value):
            notes.append(f"{where} is a Kubernetes Secret reference ({value.get('name')}/{value.get('key')}): "
                         "left out; give the relay that secret itself (a file or ${VAR} from the Secret)")
            continue
        name = camel_to_snake(str(key)) if is_camel(str(key)) else str(key)
        if key == "messageVersion" and isinstance(value, str):
            value = _MESSAGE_VERSIONS.get(value, value)
        if key in ("headers", "externalLabels"):  # user's names, not the schema's
            out[name] = value
        elif key == "writeRelabelConfigs" and isinstance(value, list):
            out[name] = [to_prometheus(rule, f"{where}[{i}]", notes) for i, rule in enumerate(value)]
        else:
            out[name] = to_prometheus(value, where, notes)
    return out


def to_operator(entry: dict[str, Any]) -> dict[str, Any]:
    """A prometheus.yml entry (url, name, write_relabel_configs, flags) in the operator's keys."""
    def convert(value: Any) -> Any:
        if isinstance(value, list):
            return [convert(v) for v in value]
        if isinstance(value, dict):
            return {snake_to_camel(k): convert(v) for k, v in value.items()}
        return value

    return {snake_to_camel(k): convert(v) for k, v in entry.items()}
