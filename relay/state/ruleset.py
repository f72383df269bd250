"""The relay's stateless rule stages, built once per config and pure.

Order, as in Prometheus remote write (external labels are added before write relabeling):
external_labels (a label the series already has wins) -> global relabel_configs -> per destination
write_relabel_configs -> prune_labels. A series is dropped (None) when a rule drops it, when no
labels are left, or when it has no metric name: remote-write receivers such as Cortex/AMP reject a
sample without ``__name__`` ("sample missing metric name") and would fail the whole batch.
"""

from __future__ import annotations

import bisect

from relay.common.labels import METRIC_NAME, Labels
from relay.config.config import Config
from relay.rules.relabel import RelabelConfig, process, process_traced
from relay.rules.rule_plan import Names, RulePlan, name_filter, names_of

NO_METRIC_NAME = "no metric name"


class UnknownDestinationError(ValueError):
    """A destination name the config does not define; ``valid`` lists the ones it does."""

    def __init__(self, name: str, valid: tuple[str, ...]) -> None:
        super().__init__(f'unknown destination "{name}" (valid: {", ".join(valid)})')
        self.name = name
        self.valid = valid


def add_external_labels(labels: Labels, external: Labels) -> Labels:
    """``labels`` plus each external label it lacks, sorted (a series' own label wins)."""
    if not external:
        return labels
    own = {n for n, _ in labels}
    missing = [(n, v) for n, v in external if n not in own]
    if not missing:
        return labels
    return tuple(sorted((*labels, *missing)))


def with_external_named(labels: Labels, names: Names, external: Labels) -> tuple[Labels, Names]:
    """``add_external_labels`` of a decoded label set (sorted, names unique) whose names are ``names``,
    and the result's names: each missing external label inserted where its name sorts, instead of a
    set of the names and a sort of the whole set (a new series' cold path runs this once)."""
    for pair in external:
        name = pair[0]
        if name in names:
            continue
        i = bisect.bisect_left(names, name)
        labels = (*labels[:i], pair, *labels[i:])
        names = (*names[:i], name, *names[i:])
    return labels, names


def prune(labels: Labels, names: frozenset[str]) -> Labels:
    """``labels`` without the named ones (the same tuple when none of them is present)."""
    if not names or not any(n in names for n, _ in labels):
        return labels
    return tuple((n, v) for n, v in labels if n not in names)


def _sendable(labels: Labels | None) -> Labels | None:
    if not labels:
        return None
    for n, v in labels:
        if n == METRIC_NAME:
            return labels if v else None
    return None


def _sendable_named(labels: Labels, names: Names) -> tuple[Labels, Names] | None:
    """``_sendable`` with the names known (first ``__name__`` pair, as ``_sendable`` looks)."""
    try:
        i = names.index(METRIC_NAME)
    except ValueError:
        return None
    return (labels, names) if labels[i][1] else None


class Rules:
    """The stateless stages of one config; ``destinations`` are the names, in config order."""

    def __init__(self, config: Config) -> None:
        self.destinations: tuple[str, ...] = tuple(d.name for d in config.destinations)
        self._external: Labels = config.external_labels
        self._global: tuple[RelabelConfig, ...] = config.global_relabel
        self._write: tuple[tuple[RelabelConfig, ...], ...] = tuple(
            d.write_relabel_configs for d in config.destinations
        )
        self._prune: tuple[frozenset[str], ...] = tuple(
            frozenset(d.prune_labels) for d in config.destinations
        )
        # the same stages with memoised effects, for label sets whose names are known (decide())
        self._global_plan = RulePlan(self._global)
        self._write_plans = tuple(RulePlan(w) for w in self._write)
        # nothing before the destinations' rules (a sendable input is its own base), and which
        # destinations change nothing (their result is the base)
        self.global_identity = not self._external and not self._global
        self.external_only = bool(self._external) and not self._global  # the base: labels + external labels
        self.destination_identity = tuple(not w and not p for w, p in zip(self._write, self._prune, strict=True))
        # no global rules, and every destination's rules begin with a keep/drop by literal metric
        # names (rule_plan.name_filter): (keep, names) each, so decide() can answer "every
        # destination's rules drop it" from the metric name alone, before anything is built
        filters = [name_filter(w[0]) if w else None for w in self._write]
        gates = [f for f in filters if f is not None]
        self.name_gates: tuple[tuple[bool, frozenset[str]], ...] | None = (
            tuple(gates) if not self._global and filters and len(gates) == len(filters) else None)

    def dropped_by_name(self, metric: str) -> bool:
        """Every destination's first rule drops a series named ``metric`` (``name_gates`` set)."""
        assert self.name_gates is not None
        return all((metric in names) != keep for keep, names in self.name_gates)

    def memo_bytes(self) -> int:
        """Estimated memory of the rule lists' effect memos (bounded)."""
        return sum(p.memo_bytes() for p in (self._global_plan, *self._write_plans))

    def apply_global_named(self, labels: Labels, names: Names) -> tuple[Labels, Names] | None:
        """``apply_global`` of sorted ``labels`` whose names are ``names``; also the result's names."""
        return self.global_named(labels, names)[1]

    def global_named(self, labels: Labels, names: Names) -> tuple[Labels, tuple[Labels, Names] | None]:
        """(``labels`` with the external labels, ``apply_global_named(labels, names)``): the first is
        the second's input, computed once for both."""
        plain, pnames = with_external_named(labels, names, self._external) if self._external else (labels, names)
        out = self._global_plan.apply(plain, pnames) if self._global else (plain, pnames)
        return plain, (None if out is None else _sendable_named(*out))

    def apply_destination_named(self, index: int, labels: Labels, names: Names) -> tuple[Labels, Names] | None:
        """``apply_destination`` of sorted ``labels`` whose names are ``names``; also the result's names."""
        out = self._write_plans[index].apply(labels, names) if self._write[index] else (labels, names)
        if out is None:
            return None
        labels, names = out
        drop = self._prune[index]
        if drop and not drop.isdisjoint(names):
            labels = tuple([p for p in labels if p[0] not in drop])
            names = names_of(labels)
        return _sendable_named(labels, names)

    def index(self, destination: str | int) -> int:
        """The index of a destination given by name or index; raises UnknownDestinationError."""
        if isinstance(destination, int):
            if 0 <= destination < len(self.destinations):
                return destination
            raise UnknownDestinationError(str(destination), self.destinations)
        try:
            return self.destinations.index(destination)
        except ValueError:
            raise UnknownDestinationError(destination, self.destinations) from None

    def apply_global(self, labels: Labels) -> Labels | None:
        """external_labels, then the global relabel_configs."""
        labels = add_external_labels(labels, self._external)
        if self._global:
            return _sendable(process(labels, self._global))
        return _sendable(labels)

    def apply_destination(self, index: int, labels: Labels) -> Labels | None:
        """One destination's write_relabel_configs, then its prune_labels."""
        rules = self._write[index]
        result: Labels | None = process(labels, rules) if rules else labels
        if result is None:
            return None
        return _sendable(prune(result, self._prune[index]))

    def apply(self, destination: str | int, labels: Labels) -> Labels | None:
        """Every stateless stage for one destination: what it would be sent (None: dropped)."""
        index = self.index(destination)
        base = self.apply_global(labels)
        return None if base is None else self.apply_destination(index, base)

    def trace(self, destination: str | int, labels: Labels) -> tuple[Labels | None, str | None]:
        """``apply``, also telling what dropped the series: ``(labels, None)``, or ``(None, reason)``
        with reason ``global.relabel_configs[1] (drop)``, ``destinations[amp].write_relabel_configs[0]
        (keep)`` or ``no metric name``. For explaining; the relay's hot path calls ``apply``."""
        index = self.index(destination)
        base: Labels | None = add_external_labels(labels, self._external)
        if self._global and base is not None:
            base, i = process_traced(base, self._global)
            if base is None:
                return None, f"global.relabel_configs[{i}] ({self._global[i].action})"
        if (base := _sendable(base)) is None:
            return None, NO_METRIC_NAME
        rules = self._write[index]
        out, i = process_traced(base, rules)
        if out is None:
            return None, f"destinations[{self.destinations[index]}].write_relabel_configs[{i}] ({rules[i].action})"
        if (out := _sendable(prune(out, self._prune[index]))) is None:
            return None, NO_METRIC_NAME
        return out, None
