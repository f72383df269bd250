"""The label-set type shared by every relay stage.

A label set is a tuple of (name, value) pairs sorted by name, with no empty values: the same
invariant Prometheus keeps in ``labels.Labels``. Stages take one and return one (or None: dropped).
"""

from __future__ import annotations

from collections.abc import Iterable

Labels = tuple[tuple[str, str], ...]
METRIC_NAME = "__name__"


def make(pairs: Iterable[tuple[str, str]]) -> Labels:
    """Sorted, empty values removed (setting a label to "" deletes it, as in Prometheus)."""
    return tuple(sorted((n, v) for n, v in dict(pairs).items() if v != ""))


def get(labels: Labels, name: str) -> str:
    for n, v in labels:
        if n == name:
            return v
    return ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def canonical(labels: Labels) -> str:
    """``name{a="1",b="2"}`` with labels sorted; ``{a="1"}`` when there is no metric name."""
    name = get(labels, METRIC_NAME)
    rest = ",".join(f'{n}="{_escape(v)}"' for n, v in labels if n != METRIC_NAME)
    if name and _is_legacy_metric_name(name):
        return f"{name}{{{rest}}}"
    inner = ",".join(f'{n}="{_escape(v)}"' for n, v in labels)
    return f"{{{inner}}}"


def _is_legacy_metric_name(name: str) -> bool:
    if not name or not (name[0].isascii() and (name[0].isalpha() or name[0] in "_:")):
        return False
    return all(c.isascii() and (c.isalnum() or c in "_:") for c in name)
