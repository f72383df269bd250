"""The pipeline's cold path: ``decide(key)``, once per distinct input label set (its raw label
bytes), with no side effect: external labels, global relabel, per destination its rules, prune,
AMP per-series checks, aggregation match and the output series' identity. What it answers is what
the decision cache keeps (``relay.state.decision_cache``), so no result may depend on state.

:class:`Decider` is a mixin of :class:`relay.state.pipeline.Pipeline` (which owns the rules, the
stages and the request's scratch labels); its short paths (a name every destination drops, every
destination sending the input as it is, or with the external labels only) give the same decisions as
the general path, from memos bounded by ``_MAX_SHORT_MEMO`` entries each.
"""

from __future__ import annotations

import bisect
import sys

from relay.common.labels import METRIC_NAME, Labels
from relay.ingest import wire
from relay.rules import label_codec
from relay.rules.label_codec import decode_key
from relay.rules.rule_plan import Names
from relay.state import limits
from relay.state.limits import amp_violation_named
from relay.state.ruleset import Rules
from relay.state.stage import POS_SHIFT, RULES, DestinationStage

_MAX_SHORT_MEMO = 4_096  # entries of each of decide()'s short-path memos (metric names, name tuples)
_MAX_MEMO_NAME_CHARS = 2_048  # name tuples longer in all are decided, not memoised
_ID_MASK = (1 << 60) - 1  # input ids: 60 bits, a 32-byte int (64 bits take 36)


class Decider:
    """``decide`` and its short paths; the pipeline sets ``rules``, ``stages``, ``_scratch`` and
    ``_external``, then calls :meth:`_plan_decisions`."""

    rules: Rules
    stages: list[DestinationStage]
    _scratch: dict[bytes, Labels]
    _external: Labels

    def _plan_decisions(self, external: bytes) -> None:
        """Which short paths apply to this configuration (``external``: the external labels' bytes)."""
        # every destination sends every sendable input as it is (no rules, external labels, prune or
        # aggregation): decide()'s shortest path, one output id for all of them
        self._as_is = (self.rules.global_identity and all(self.rules.destination_identity)
                       and all(stage.aggregator is None and not stage.external for stage in self.stages))
        # metric name -> every destination's rules drop it (Rules.name_gates; None: not known so)
        self._name_drops: dict[str, bool] | None = {} if self.rules.name_gates is not None else None
        self._all_rules = (RULES,) * len(self.stages)
        # every destination sends every sendable input with the external labels added, and nothing
        # else changes it: decide()'s second shortest path, the same decision for all of them
        self._ext_only = (self.rules.external_only and all(self.rules.destination_identity)
                          and all(stage.aggregator is None for stage in self.stages))
        self._ext_bytes = external
        # label names -> (where the external labels go in, the names with them), when the series
        # lacks every one and they go in together (else None: the general path)
        self._ext_at: dict[Names, tuple[int, Names, int] | None] = {}

    def decide(self, key: bytes) -> wire.Decision:
        labels, names, canonical = decode_key(key)  # raises WireError(400) for an invalid label set
        try:
            metric_in = sys.intern(labels[names.index(METRIC_NAME)][1])
        except ValueError:
            metric_in = ""
        # The input's identity: a 64-bit hash of its sorted label set (so the same series with its
        # labels in another order is the same series). In memory only, never on disk: Python's hash.
        in_id = hash(labels) & _ID_MASK
        self._scratch[key] = labels
        drops = self._name_drops
        if drops is not None and metric_in:  # (decoded names are unique: one __name__, as the rules read it)
            dropped = drops.get(metric_in)
            if dropped is None:
                dropped = self.rules.dropped_by_name(metric_in)
                if len(metric_in) <= limits.MAX_MEMO_TEXT:  # (a hostile name is not kept)
                    if len(drops) >= _MAX_SHORT_MEMO:
                        drops.clear()
                    drops[metric_in] = dropped
            if dropped:  # what the general path below answers, without building the rules' input
                return ((key, in_id, metric_in), *self._all_rules)
        out: list[wire.DestDecision | None] = [(key, in_id, metric_in)]
        if self._as_is and canonical and metric_in:  # what stage.decide answers for the key's own labels
            sid = label_codec.series_id(key)
            size = len(key)
            for stage in self.stages:
                if amp_violation_named(labels, names, size, stage.amp_limits) is None:
                    out.append((key, sid, metric_in))
                else:
                    out.append(stage.decide(key, labels, True, self._scratch, -1, names))
            return tuple(out)
        if self._ext_only and canonical and metric_in:
            sent = self._with_external(key, labels, names, metric_in)
            if sent is not None:
                return ((key, in_id, metric_in), *(sent,) * len(self.stages))
        rules = self.rules
        if rules.global_identity:  # decoded labels have no empty value: sendable iff a metric name
            base = (labels, names) if metric_in else None
            plain = labels
        else:
            plain, base = rules.global_named(labels, names)
        identity = rules.destination_identity
        splice: int | None = None
        spliced = False  # where the external labels go into the key: only for a series a destination sends
        for i, stage in enumerate(self.stages):
            # every destination gets a decision (never None), so entries line up with the inputs
            result = None if base is None else base if identity[i] else rules.apply_destination_named(i, *base)
            if result is None:
                out.append(RULES)
                continue
            if not spliced:
                splice, spliced = (self._splice(labels, plain, key) if canonical else None), True
            out.append(stage.decide(key, result[0], result[0] == plain, self._scratch, splice, result[1]))
        return tuple(out)

    def _with_external(self, key: bytes, labels: Labels, names: Names, metric: str) -> wire.DestDecision | None:
        """For ``_ext_only``, a canonical key with a metric name: what every destination's
        ``stage.decide`` answers (the external labels spliced into the key), where they all go in
        at one place and no AMP limit is crossed; else None (the general path decides)."""
        try:
            at = self._ext_at[names]
        except KeyError:
            at = self._ext_place(names)
        if at is None:
            return None
        i, plain_names, fits = at
        plain = (*labels[:i], *self._external, *labels[i:])
        pos = label_codec.entry_offset(key, i)
        ext = self._ext_bytes
        full = key[:pos] + ext + key[pos:]
        size = len(full)
        if size > fits or not limits.metric_ok(metric):  # else amp_violation_named answers None for all
            for stage in self.stages:
                if amp_violation_named(plain, plain_names, size, stage.amp_limits) is not None:
                    return None
        self._scratch[full] = plain
        return (ext, label_codec.series_id(full) | (pos + 1) << POS_SHIFT, metric)

    def _ext_place(self, names: Names) -> tuple[int, Names, int] | None:
        ext_names = [n for n, _ in self._external]
        i = bisect.bisect_left(names, ext_names[0])
        at: tuple[int, Names, int] | None = None
        # no name of the series sorts from the first external label to the last: they go in
        # together, and the series has none of them (its own label would win)
        if i == len(names) or ext_names[-1] < names[i]:
            plain_names = (*names[:i], *ext_names, *names[i:])
            # the largest size every destination's AMP limits take with these names without a
            # closer look (-1: some destination looks closer whatever the size)
            fits = min(limits.fits_named(plain_names, stage.amp_limits) for stage in self.stages)
            at = (i, plain_names, fits)
        if len(names) <= limits.MAX_MEMO_NAMES and sum(map(len, names)) <= _MAX_MEMO_NAME_CHARS:
            if len(self._ext_at) >= _MAX_SHORT_MEMO:
                self._ext_at.clear()
            self._ext_at[names] = at  # (hostile label names are not kept)
        return at

    def _splice(self, labels: Labels, plain: Labels, key: bytes) -> int | None:
        """For a canonical key: -1 when ``plain`` (labels + external labels) is the key's own label
        set; the byte offset where every external label goes in, when they all do, together; else None."""
        if plain is labels:
            return -1
        ext = self._external
        if len(plain) != len(labels) + len(ext):
            return None
        i = bisect.bisect_left(labels, ext[0])
        if i < len(labels) and not ext[-1][0] < labels[i][0]:
            return None
        return label_codec.entry_offset(key, i)
