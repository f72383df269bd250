"""Remote-Write 2.0 to 1.0: ``io.prometheus.write.v2.Request`` bytes into ``prometheus.WriteRequest`` bytes.

The v2 request is parsed by protobuf's C parser (upb) and the v1 bytes are written by hand: sample
values go float -> ``struct.pack`` unchanged, so NaN bit patterns (stale markers) survive, and
histograms are re-serialised without ``start_timestamp`` (v1 and v2 Histogram share fields 1-16).
A per-request cache maps each (name ref, value ref) pair to its encoded v1 Label entry, since most
pairs (Hostname, driver version, job...) repeat across a request's series.
``v2_to_v1`` is the C twin of this reference (relay/native/crw2.c, ``relay.native._crw2``) where it is built
and GPU_RELAY_NATIVE does not turn it off: the same bytes and counts; whatever it does not handle
(any error, an unusual shape) it hands, whole, to ``py_v2_to_v1``, so errors are this code's.
RW1 fields: TimeSeries labels=1 samples=2 exemplars=3 histograms=4; WriteRequest metadata=3 as
MetricMetadata type=1 metric_family_name=2 help=4 unit=5; Exemplar labels=1 value=2 timestamp=3.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import DecodeError

from relay import native
from relay.common.protowire import WireError, encode_int64, encode_len, encode_uvarint
from relay.ingest.wire_locate import LOCATE_MAX_BYTES, not_located
from relay.ingest.wire_locate_v2 import locate_v2
from relay.proto import remote_v2_pb2 as v2pb

_HISTOGRAM_TYPES = (3, 4)  # HISTOGRAM, GAUGEHISTOGRAM: classic series carry _bucket/_count/_sum
_SUMMARY_TYPE = 5
_DOUBLE = struct.Struct("<d")
_ZERO8 = bytes(8)
_U1 = [bytes((i,)) for i in range(128)]
_NOT_V2 = "malformed protobuf: not a valid io.prometheus.write.v2.Request"
DEFAULT_MAX_BYTES = 32 << 20  # relay.config.ServerConfig.max_request_bytes


@dataclass(frozen=True, slots=True)
class V2Counts:
    """What a v2 request carried, for the X-Prometheus-Remote-Write-*-Written response headers."""

    samples: int
    histograms: int
    exemplars: int


class _RefError(WireError):
    """A field of the series being transcoded that is refused: py_v2_to_v1 names the series.
    ``field``: its path below the series; ``done``: 1 when that series' entry is already in the
    output (its metadata is read after)."""

    def __init__(self, message: str, field: str, done: int = 0) -> None:
        super().__init__(400, message)
        self.field = field
        self.done = done


def too_large(limit: int) -> WireError:
    return WireError(413, f"remote-write 2.0 request transcodes to remote-write 1.0 over the limit of {limit} bytes "
                          "(server.max_request_bytes)")


class _Symbols:
    """The request's symbol table with validated refs and cached encoded Label entries."""

    def __init__(self, symbols: Sequence[str], limit: int) -> None:
        if symbols and symbols[0] != "":
            raise WireError(400, "invalid symbols table: symbols[0] must be the empty string")
        self.text = symbols
        self.raw = [s.encode() for s in symbols]
        self.entries: dict[int, tuple[bytes, bytes]] = {}
        self.limit = limit
        self.longest = 0  # the longest Label entry encoded so far: a cheap bound on a label set's size

    def labels(self, refs: Sequence[int], what: str, room: int) -> bytes:
        """Concatenated v1 Label entries for name/value ref pairs, sorted by name; 413 when they
        would take more than ``room`` bytes (checked before they are joined)."""
        if len(refs) % 2:
            raise _RefError(f"invalid {what} labels_refs: odd count {len(refs)}", "labels_refs")
        it = iter(refs)
        try:
            out = [self.entries[n << 32 | v] for n, v in zip(it, it, strict=True)]
        except KeyError:
            it = iter(refs)
            out = [self._entry(n, v, what) for n, v in zip(it, it, strict=True)]
        if len(out) * self.longest > room and sum([len(e) for _, e in out]) > room:
            raise too_large(self.limit)
        out.sort()
        return b"".join([e for _, e in out])

    def _entry(self, name_ref: int, value_ref: int, what: str) -> tuple[bytes, bytes]:
        key = name_ref << 32 | value_ref
        entry = self.entries.get(key)
        if entry is not None:
            return entry
        n = len(self.raw)
        if name_ref >= n or value_ref >= n:
            bad = name_ref if name_ref >= n else value_ref
            raise _RefError(f"invalid {what} labels_refs: ref {bad} out of range ({n} symbols)", "labels_refs")
        name, value = self.raw[name_ref], self.raw[value_ref]
        inner = (encode_len(1, name) if name else b"") + (encode_len(2, value) if value else b"")
        entry = self.entries[key] = (name, encode_len(1, inner))
        self.longest = max(self.longest, len(entry[1]))
        return entry

    def get(self, ref: int, what: str, field: str) -> str:
        """The symbol of a series' metadata ref (``what``, ``field``: its name in the text and path)."""
        if ref >= len(self.text):
            raise _RefError(f"invalid {what}: ref {ref} out of range ({len(self.text)} symbols)", field, 1)
        return self.text[ref]


def py_v2_to_v1(raw: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, V2Counts]:
    """Transcode a v2 Request: labels resolved and sorted, metadata as deduplicated MetricMetadata.
    The reference: ``v2_to_v1`` is its C twin (relay.native._crw2) where that is built.

    WireError(413) as soon as the v1 output would pass ``max_bytes``: a few KB of v2 can reference
    one long symbol thousands of times, so the size is checked series by series, before joining.
    WireError(400) for anything else it refuses, naming the field: where protobuf's parser refuses
    the bytes, the first spot relay.ingest.wire_locate finds (path, byte, reason); a ref out of
    range or a metadata type read negative, the series (``Request.timeseries[2].labels_refs``).
    """
    try:
        request = v2pb.Request.FromString(raw)
    except DecodeError:
        if len(raw) > LOCATE_MAX_BYTES:
            raise WireError(400, not_located(_NOT_V2, len(raw))) from None
        where = locate_v2(raw)  # the error path only: valid bodies never walk twice
        if where is None:
            raise WireError(400, _NOT_V2) from None
        raise WireError(400, f"malformed protobuf at {where}") from None
    out: list[bytes] = []
    try:
        return _transcode(request, out, max_bytes)
    except _RefError as e:  # one entry in ``out`` a series done
        raise WireError(400, f"{e.message} at Request.timeseries[{len(out) - e.done}].{e.field}") from None


def _transcode(request: v2pb.Request, out: list[bytes], max_bytes: int) -> tuple[bytes, V2Counts]:
    symbols = _Symbols(request.symbols, max_bytes)
    left = max_bytes  # output bytes still allowed
    metadata: dict[str, bytes] = {}
    samples = histograms = exemplars = 0
    pack = _DOUBLE.pack
    stamps: dict[int, bytes] = {}  # timestamp -> encoded field 2; a request repeats a few timestamps
    for ts in request.timeseries:
        labels = symbols.labels(ts.labels_refs, "series", left)
        used = len(labels) + 2  # at least: the TimeSeries tag and length, 2 bytes a sample
        rest = []
        for s in ts.samples:  # value=1 timestamp=2; start_timestamp dropped
            bits = pack(s.value)
            inner = b"" if bits == _ZERO8 else b"\x09" + bits
            t = s.timestamp
            if t:
                stamp = stamps.get(t)
                if stamp is None:
                    stamp = stamps[t] = b"\x10" + encode_int64(t)
                inner += stamp
            rest.append(b"\x12" + _U1[len(inner)] + inner)  # a Sample is at most 20 bytes
        used += 2 * len(ts.samples)
        try:
            for e in ts.exemplars:
                exemplar = encode_len(3, _exemplar(e, symbols, left - used))
                used += len(exemplar)
                rest.append(exemplar)
        except _RefError as x:  # ``rest``: the samples, then the exemplars done
            raise _RefError(x.message, f"exemplars[{len(rest) - len(ts.samples)}].{x.field}") from None
        for h in ts.histograms:
            h.ClearField("start_timestamp")
            histogram = encode_len(4, h.SerializeToString())
            used += len(histogram)
            rest.append(histogram)
        if used > left:
            raise too_large(max_bytes)
        entry = encode_len(1, labels + b"".join(rest))
        left -= len(entry)
        if left < 0:
            raise too_large(max_bytes)
        out.append(entry)
        samples += len(ts.samples)
        exemplars += len(ts.exemplars)
        histograms += len(ts.histograms)
        if ts.HasField("metadata"):
            meta = _metadata(ts, symbols)
            if meta is not None and meta[0] not in metadata:
                metadata[meta[0]] = meta[1]
                left -= len(meta[1])
                if left < 0:
                    raise too_large(max_bytes)
    out.extend(metadata.values())
    return b"".join(out), V2Counts(samples, histograms, exemplars)


def _exemplar(e: v2pb.Exemplar, symbols: _Symbols, room: int) -> bytes:
    body = symbols.labels(e.labels_refs, "exemplar", room)
    bits = _DOUBLE.pack(e.value)
    if bits != _ZERO8:
        body += b"\x11" + bits
    if e.timestamp:
        body += b"\x18" + encode_int64(e.timestamp)
    return body


def _metadata(ts: v2pb.TimeSeries, symbols: _Symbols) -> tuple[str, bytes] | None:
    """(family name, WriteRequest field-3 MetricMetadata entry), or None when there is nothing to say."""
    md = ts.metadata
    if md.type < 0:  # an int32 enum read from a negative varint: no MetricType (the C twin declines it too)
        raise _RefError(f"invalid metadata type {md.type}: TimeSeries.metadata.type must be 0-7", "metadata.type", 1)
    help_text = symbols.get(md.help_ref, "metadata help_ref", "metadata.help_ref")
    unit = symbols.get(md.unit_ref, "metadata unit_ref", "metadata.unit_ref")
    refs = ts.labels_refs
    name = next(
        (symbols.text[refs[i + 1]] for i in range(0, len(refs), 2) if symbols.text[refs[i]] == "__name__"), ""
    )
    if not name or (md.type == 0 and not help_text and not unit):
        return None
    family = _family(name, md.type)
    body = (b"\x08" + encode_uvarint(md.type) if md.type else b"") + encode_len(2, family.encode())
    if help_text:
        body += encode_len(4, help_text.encode())
    if unit:
        body += encode_len(5, unit.encode())
    return family, encode_len(3, body)


def _family(name: str, mtype: int) -> str:
    """Family name of a classic histogram/summary series (suffix removed); other names as they are."""
    suffixes: tuple[str, ...] = ()
    if mtype in _HISTOGRAM_TYPES:
        suffixes = ("_bucket", "_count", "_sum")
    elif mtype == _SUMMARY_TYPE:
        suffixes = ("_count", "_sum")
    for suffix in suffixes:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


_c = native.load("crw2")
if _c is not None:
    _c.configure(py_v2_to_v1, V2Counts, DEFAULT_MAX_BYTES)  # what the C code hands unusual requests to


class Transcoder(Protocol):
    def __call__(self, raw: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, V2Counts]: ...


v2_to_v1: Transcoder = _c.v2_to_v1 if _c is not None else py_v2_to_v1
