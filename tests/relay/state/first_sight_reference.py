"""A frozen copy of the relay's uncached path as it was before its memos (main at 634c9e5):
decode, external labels, global and per-destination relabeling with no regex memo, prune, the AMP
checks, the aggregation match, output encoding and id. The reference that tests/relay/state/test_first_sight.py
and bench/relay_series_bench.py compare ``Pipeline.decide`` with; never optimise it."""

from __future__ import annotations

import bisect
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from relay.common.labels import METRIC_NAME, Labels
from relay.common.labels import get as label_get
from relay.ingest import wire
from relay.rules.relabel import Regexp
from relay.state.limits import amp_violation
from relay.state.pipeline import Pipeline
from relay.state.ruleset import add_external_labels
from relay.state.stage import CLAIM, POS_SHIFT, RULES, DestinationStage, _drop

_ID_MASK = (1 << 60) - 1


@contextmanager
def unmemoised() -> Iterator[None]:
    """Regex answers computed afresh (the reference had no memo)."""
    memo = Regexp.matches
    Regexp.matches = Regexp._match  # type: ignore[method-assign]
    try:
        yield
    finally:
        Regexp.matches = memo  # type: ignore[method-assign]


# ---- the frozen reference (main at 634c9e5) --------------------------------------------------------


def ref_decode(key: bytes) -> tuple[Labels, list[int] | None]:
    out: list[tuple[str, str]] = []
    offsets: list[int] = []
    n = len(key)
    p = 0
    try:
        while p < n:
            if key[p] != 0x0A or key[p + 1] >= 0x80 or key[p + 2] != 0x0A or key[p + 3] >= 0x80:
                return wire.decode_labels(key), None
            end = p + 2 + key[p + 1]
            ne = p + 4 + key[p + 3]
            if ne == end:
                value = ""
            elif key[ne] == 0x12 and key[ne + 1] < 0x80 and ne + 2 + key[ne + 1] == end:
                value = key[ne + 2 : end].decode()
            else:
                return wire.decode_labels(key), None
            if ne > end or end > n or ne == p + 4 or not value:
                return wire.decode_labels(key), None
            out.append((key[p + 4 : ne].decode(), value))
            offsets.append(p)
            p = end
    except (IndexError, UnicodeDecodeError):
        return wire.decode_labels(key), None
    ordered = all(out[i - 1][0] < out[i][0] for i in range(1, len(out)))
    if not ordered:
        out.sort()
        for i in range(1, len(out)):
            if out[i][0] == out[i - 1][0]:
                return wire.decode_labels(key), None
    return tuple(out), offsets if ordered else None


def ref_splice(ext: Labels, labels: Labels, plain: Labels, offsets: list[int], end: int) -> int | None:
    if plain is labels:
        return -1
    if len(plain) != len(labels) + len(ext):
        return None
    i = bisect.bisect_left(labels, ext[0])
    if i < len(labels) and not ext[-1][0] < labels[i][0]:
        return None
    return offsets[i] if i < len(offsets) else end


def ref_stage_decide(stage: DestinationStage, key: bytes, labels: Labels, unchanged: bool,
                     scratch: dict[bytes, Labels], splice: int | None) -> wire.DestDecision:
    violation = amp_violation(labels, stage.amp_limits)
    if violation is not None:
        return _drop(violation)
    metric = sys.intern(label_get(labels, METRIC_NAME))
    if stage.aggregator is not None:
        routed = stage.aggregator.route(labels)
        if routed is not None:
            rule, group = routed
            return (wire.encode_labels(group), -(rule + 1), metric)
    ext = stage.external
    if unchanged and splice is not None:
        if splice < 0:
            return (key, wire.series_id(key), metric)
        full = key[:splice] + ext + key[splice:]
        scratch[full] = labels
        return (ext, wire.series_id(full) | (splice + 1) << POS_SHIFT, metric)
    lb = wire.encode_labels(labels)
    if lb == key:
        lb = key
    scratch[lb] = labels
    sid = wire.series_id(lb) if unchanged else wire.series_id(lb) | CLAIM
    if ext and len(lb) == len(key) + len(ext):
        pos = lb.find(ext)
        if pos >= 0 and lb[:pos] == key[:pos] and lb[pos + len(ext):] == key[pos:]:
            return (ext, sid | (pos + 1) << POS_SHIFT, metric)
    return (lb, sid, metric)


def ref_decide(p: Pipeline, key: bytes, scratch: dict[bytes, Labels]) -> wire.Decision:
    with unmemoised():
        labels, offsets = ref_decode(key)
        metric_in = sys.intern(label_get(labels, METRIC_NAME))
        in_id = hash(labels) & _ID_MASK
        scratch[key] = labels
        out: list[wire.DestDecision | None] = [(key, in_id, metric_in)]
        base = p.rules.apply_global(labels)
        ext = tuple(sorted(p.config.external_labels))
        plain = add_external_labels(labels, ext)
        splice = None if offsets is None else ref_splice(ext, labels, plain, offsets, len(key))
        for i, stage in enumerate(p.stages):
            result = None if base is None else p.rules.apply_destination(i, base)
            out.append(RULES if result is None else
                       ref_stage_decide(stage, key, result, result == plain, scratch, splice))
        return tuple(out)
