"""An RW 1.0 route's refusal worded with the field it is about (the error path only).

``route_error`` takes the WireError(400) that ``relay.ingest.wire.route`` raised (the C route or the
Python reference: both refuse with the same text) and names where it is: the refused entry is found
with the route's own checks, entry by entry, and within it ``relay.ingest.wire_locate.locate_v1``
names the field where its reason is the error's. ``Runtime.write`` calls it once a refused request.

The walk is linear in the body but runs the route's checks once more, in Python: about three times
the route's own time. A body over ``LOCATE_MAX_BYTES`` is not walked (its refusal keeps the route's
text and says so), so a sender of large malformed bodies costs the relay no more than valid ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from relay.common.protowire import MAX_FIELD_NUMBER, WireError, fields, read_len, skip_value, uvarint
from relay.ingest import wire
from relay.ingest.wire import Decision, RoutedEntry
from relay.ingest.wire_codec import decode_labels, split_series
from relay.ingest.wire_entries import check_exemplar, histogram_timestamp, sample_timestamp
from relay.ingest.wire_locate import LOCATE_MAX_BYTES, locate_v1, not_located

__all__ = ["route_error"]

_MALFORMED = "malformed protobuf: "
_ENTRY_CHECKS: dict[int, tuple[str, Callable[[bytes, int, int], object]]] = {
    2: ("samples", sample_timestamp), 3: ("exemplars", check_exemplar), 4: ("histograms", histogram_timestamp)}


@dataclass(frozen=True, slots=True)
class _Unit:
    """The entry the route's own checks refuse: its path and first byte; ``within`` (field names from
    WriteRequest down to it) and ``start``/``end`` (its payload) where the locator may look inside."""

    path: str
    at: int
    series: int = -1  # the series' index, for an entry of a series
    within: tuple[str, ...] | None = None
    start: int = 0
    end: int = 0


def route_error(error: WireError, v1: bytes, version: int) -> WireError:
    """``error``, as ``route`` raised it on ``v1`` (either core), worded to name where it is.

    The entry is found with the route's own checks, entry by entry (the top-level framing, a series'
    entries, then its label set, a metadata entry), and within it ``wire_locate.locate_v1`` names the
    field where its reason is the error's: ``malformed protobuf at WriteRequest.timeseries[3].samples[0]
    .timestamp (byte 1234): truncated varint``, ``duplicate label name 'gpu' at
    WriteRequest.timeseries[2].labels (byte 130)``. ``v1`` transcoded from an RW 2.0 request
    (``version`` 2) can only hold a refused label set: the text names the request's series
    (``Request.timeseries[2].labels_refs``). Anything not found so comes back as it was.
    """
    if error.status != 400:
        return error
    if len(v1) > LOCATE_MAX_BYTES:
        return WireError(400, not_located(error.message, len(v1)))
    unit = _failing_unit(v1, error.message)
    if unit is None:
        return error
    if version == 2:
        if unit.series < 0 or not unit.path.split(".")[-1].startswith("labels"):
            return error
        return WireError(400, f"{error.message} at Request.timeseries[{unit.series}].labels_refs")
    path, at = unit.path, unit.at
    if unit.within is not None:
        found = locate_v1(v1, unit.start, unit.end, within=unit.within, path=unit.path)
        if found is not None and _agrees(error.message, found.reason):
            path, at = found.path, found.offset
    if error.message.startswith(_MALFORMED):
        return WireError(400, f"malformed protobuf at {path} (byte {at}): {error.message[len(_MALFORMED):]}")
    return WireError(400, f"{error.message} at {path} (byte {at})")


def _agrees(message: str, reason: str) -> bool:
    if message.startswith(_MALFORMED):
        return message[len(_MALFORMED):] == reason
    return reason == "invalid UTF-8" and message.startswith("invalid UTF-8")


def _labels_checked(key: bytes) -> Decision:
    """What decide() refuses, refused: a label set ``decode_labels`` refuses (the C twin first, as
    relay.rules.label_codec.decode_key does: it answers valid canonical keys, None for the rest)."""
    if wire._c is None or wire._c.decode_key(key) is None:
        decode_labels(key)
    return ((key, 0, ""),)


def _failing_unit(buf: bytes, message: str) -> _Unit | None:
    """The first top-level entry of an RW 1.0 request that the route refuses (within a series, the
    entry that refuses with ``message``, where one is found); None where the route takes it all.
    The route loop runs once more to count what it took before it refused (a series appended, a
    metadata entry kept): the entry after those is the one."""
    taken: list[list[RoutedEntry]] = [[]]
    metadata: list[bytes] = []
    try:
        wire.route_loop(buf, {}, _labels_checked, taken, metadata)
    except WireError:
        pass
    else:
        return None
    n = len(buf)
    pos = series = meta = 0
    while pos < n:
        at = pos
        if buf[pos] == 0x0A:
            path = f"WriteRequest.timeseries[{series}]"
            try:
                ln, start = uvarint(buf, pos + 1)
            except WireError:
                return _Unit(path, at, series)
            pos = start + ln
            if pos > n:
                return _Unit(path, at, series)
            if series == len(taken[0]):
                return _failing_in_series(buf, start, pos, path, at, series, message)
            series += 1
            continue
        try:
            tag, p = uvarint(buf, pos)
        except WireError:
            return _Unit("WriteRequest", at)
        if tag == 0x1A and meta < len(metadata):  # taken
            pos = read_len(buf, p, n)[1]
            meta += 1
            continue
        try:
            pos = wire._top_level_other(buf, at, n, [])
        except WireError:
            if tag != 0x1A:
                name = {1: "timeseries", 3: "metadata"}.get(tag >> 3, f"#{tag >> 3}")
                return _Unit(f"WriteRequest.{name}", at)
            try:
                start, stop = read_len(buf, p, n)
            except WireError:
                return _Unit(f"WriteRequest.metadata[{meta}]", at)
            return _Unit(f"WriteRequest.metadata[{meta}]", at, -1, ("metadata",), start, stop)
    return None


def _failing_in_series(buf: bytes, start: int, end: int, path: str, at: int, series: int,
                       message: str) -> _Unit:
    """Of a series the route refuses, the entry whose check is the first to refuse, where it refuses
    with ``message`` (a Sample, Exemplar, Histogram or one Label), else the series itself
    (``.labels`` for its label set)."""
    whole = _Unit(path, at, series, ("timeseries",), start, end)
    try:
        key = split_series(buf, start, end)[0]
    except WireError:
        # entry by entry, each checked as it is read (the route's fast path; where split_series read
        # it first, the entry found has its refusal all the same)
        counts = dict.fromkeys(_ENTRY_CHECKS, 0)
        pos = start
        while pos < end:
            tag_at = pos
            try:
                tag, pos = uvarint(buf, pos)
                if tag >> 3 == 0 or tag >> 3 > MAX_FIELD_NUMBER:
                    return whole
                s, pos = read_len(buf, pos, end) if tag & 7 == 2 else (pos, skip_value(buf, pos, tag & 7, end))
            except WireError:
                return whole
            number = tag >> 3
            if number in (1, 2, 3, 4) and tag & 7 != 2:
                return whole  # split_series' own refusal
            if number not in _ENTRY_CHECKS:
                continue
            name, check = _ENTRY_CHECKS[number]
            try:
                check(buf, s, pos)
            except WireError as x:
                if x.message != message:
                    return whole
                return _Unit(f"{path}.{name}[{counts[number]}]", tag_at, series, ("timeseries", name), s, pos)
            counts[number] += 1
        return whole
    try:
        decode_labels(key)
    except WireError:
        labels = [(tag_at, s, e) for number, _, tag_at, s, e in fields(buf, start, end) if number == 1]
        for i, (tag_at, s, e) in enumerate(labels):  # the key's entries, in the key's order
            try:
                decode_labels(buf[tag_at:e])
            except WireError as x:
                if x.message != message:
                    break  # (a duplicate name before it, say)
                return _Unit(f"{path}.labels[{i}]", tag_at, series, ("timeseries", "labels"), s, e)
        return _Unit(f"{path}.labels", labels[0][0] if labels else at, series)  # e.g. a duplicate name
    return whole


