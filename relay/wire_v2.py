"""Remote-Write 2.0 to 1.0: ``io.prometheus.write.v2.Request`` bytes into ``prometheus.WriteRequest`` bytes.

Walked by hand like the RW1 path, so sample and histogram values are copied as bytes and NaN bit
patterns (stale markers) survive. Field numbers (prompb/io/prometheus/write/v2/types.proto):
Request symbols=4 timeseries=5; TimeSeries labels_refs=1 samples=2 histograms=3 exemplars=4
metadata=5; Sample value=1 timestamp=2 start_timestamp=3 (dropped); Histogram = v1 fields 1-16 plus
start_timestamp=17 (dropped); Exemplar labels_refs=1 value=2 timestamp=3; Metadata type=1
help_ref=3 unit_ref=4. RW1 side: TimeSeries labels=1 samples=2 exemplars=3 histograms=4;
WriteRequest metadata=3 as MetricMetadata type=1 metric_family_name=2 help=4 unit=5.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.protowire import WireError, encode_len, encode_uvarint, fields, malformed, uvarint

_HISTOGRAM_TYPES = (3, 4)  # HISTOGRAM, GAUGEHISTOGRAM: classic series carry _bucket/_count/_sum
_SUMMARY_TYPE = 5


@dataclass(frozen=True, slots=True)
class V2Counts:
    """What a v2 request carried, for the X-Prometheus-Remote-Write-*-Written response headers."""

    samples: int
    histograms: int
    exemplars: int


def v2_to_v1(raw: bytes) -> tuple[bytes, V2Counts]:
    """Transcode a v2 Request: labels resolved and sorted, metadata as deduplicated MetricMetadata."""
    raw = bytes(raw)
    symbols: list[bytes] = []
    spans: list[tuple[int, int]] = []
    for number, wire_type, _, start, end in fields(raw, 0, len(raw)):
        if number in (4, 5) and wire_type != 2:
            raise malformed(f"Request field {number} with wire type {wire_type}")
        if number == 4:
            symbols.append(raw[start:end])
        elif number == 5:
            spans.append((start, end))
    if symbols and symbols[0] != b"":
        raise WireError(400, "invalid symbols table: symbols[0] must be the empty string")
    out: list[bytes] = []
    metadata: dict[bytes, bytes] = {}
    samples = histograms = exemplars = 0
    for start, end in spans:
        series, ns, nh, nx, meta = _series(raw, start, end, symbols)
        out.append(series)
        samples, histograms, exemplars = samples + ns, histograms + nh, exemplars + nx
        if meta is not None and meta[0] not in metadata:
            metadata[meta[0]] = meta[1]
    out.extend(metadata.values())
    return b"".join(out), V2Counts(samples, histograms, exemplars)


def _series(
    raw: bytes, start: int, end: int, symbols: list[bytes]
) -> tuple[bytes, int, int, int, tuple[bytes, bytes] | None]:
    """One v2 TimeSeries as a wrapped v1 entry, its counts and its (family, MetricMetadata entry)."""
    refs: list[int] = []
    rest: list[bytes] = []
    ns = nh = nx = 0
    meta_span: tuple[int, int] | None = None
    for number, wire_type, _, vs, ve in fields(raw, start, end):
        if number == 1:
            _read_refs(raw, wire_type, vs, ve, refs)
            continue
        if number in (2, 3, 4, 5) and wire_type != 2:
            raise malformed(f"TimeSeries field {number} with wire type {wire_type}")
        if number == 2:
            rest.append(encode_len(2, _without_field(raw, vs, ve, 3)))
            ns += 1
        elif number == 3:
            rest.append(encode_len(4, _without_field(raw, vs, ve, 17)))
            nh += 1
        elif number == 4:
            rest.append(encode_len(3, _exemplar(raw, vs, ve, symbols)))
            nx += 1
        elif number == 5:
            meta_span = (vs, ve)
    pairs = _resolve(refs, symbols, "series")
    pairs.sort(key=lambda nv: nv[0])
    labels = b"".join([_label(n, v) for n, v in pairs])
    meta = None if meta_span is None else _metadata(raw, *meta_span, pairs, symbols)
    return encode_len(1, labels + b"".join(rest)), ns, nh, nx, meta


def _read_refs(raw: bytes, wire_type: int, start: int, end: int, refs: list[int]) -> None:
    if wire_type == 0:
        refs.append(uvarint(raw, start)[0])
    elif wire_type == 2:  # packed
        pos = start
        while pos < end:
            ref, pos = uvarint(raw, pos)
            refs.append(ref)
        if pos != end:
            raise malformed("packed label refs past their end")
    else:
        raise malformed(f"labels_refs with wire type {wire_type}")


def _resolve(refs: list[int], symbols: list[bytes], what: str) -> list[tuple[bytes, bytes]]:
    if len(refs) % 2:
        raise WireError(400, f"invalid {what} labels_refs: odd count {len(refs)}")
    n = len(symbols)
    for ref in refs:
        if ref >= n:
            raise WireError(400, f"invalid {what} labels_refs: ref {ref} out of range ({n} symbols)")
    return [(symbols[refs[i]], symbols[refs[i + 1]]) for i in range(0, len(refs), 2)]


def _label(name: bytes, value: bytes) -> bytes:
    inner = (encode_len(1, name) if name else b"") + (encode_len(2, value) if value else b"")
    return encode_len(1, inner)


def _without_field(raw: bytes, start: int, end: int, drop: int) -> bytes:
    """The message bytes with every occurrence of field ``drop`` removed (unchanged bytes if none)."""
    parts = fields(raw, start, end)
    if all(number != drop for number, *_ in parts):
        return raw[start:end]
    return b"".join([raw[ts:stop] for number, _, ts, _, stop in parts if number != drop])


def _exemplar(raw: bytes, start: int, end: int, symbols: list[bytes]) -> bytes:
    refs: list[int] = []
    other: list[bytes] = []
    for number, wire_type, tag_start, vs, ve in fields(raw, start, end):
        if number == 1:
            _read_refs(raw, wire_type, vs, ve, refs)
        else:
            other.append(raw[tag_start:ve])
    labels = b"".join([_label(n, v) for n, v in _resolve(refs, symbols, "exemplar")])
    return labels + b"".join(other)


def _metadata(
    raw: bytes, start: int, end: int, pairs: list[tuple[bytes, bytes]], symbols: list[bytes]
) -> tuple[bytes, bytes] | None:
    """(family name, WriteRequest field-3 MetricMetadata entry), or None when there is nothing to say."""
    mtype, help_ref, unit_ref = 0, 0, 0
    for number, wire_type, _, vs, _ve in fields(raw, start, end):
        if wire_type == 0 and number in (1, 3, 4):
            value = uvarint(raw, vs)[0]
            if number == 1:
                mtype = value
            elif number == 3:
                help_ref = value
            else:
                unit_ref = value
    help_text, unit = _symbol(help_ref, symbols), _symbol(unit_ref, symbols)
    name = next((v for n, v in pairs if n == b"__name__"), b"")
    if not name or (mtype == 0 and not help_text and not unit):
        return None
    family = _family(name, mtype)
    body = (b"\x08" + encode_uvarint(mtype) if mtype else b"") + encode_len(2, family)
    if help_text:
        body += encode_len(4, help_text)
    if unit:
        body += encode_len(5, unit)
    return family, encode_len(3, body)


def _symbol(ref: int, symbols: list[bytes]) -> bytes:
    if ref == 0:
        return b""
    if ref >= len(symbols):
        raise WireError(400, f"invalid metadata: ref {ref} out of range ({len(symbols)} symbols)")
    return symbols[ref]


def _family(name: bytes, mtype: int) -> bytes:
    """Family name of a classic histogram/summary series (suffix removed); other names as they are."""
    suffixes: tuple[bytes, ...] = ()
    if mtype in _HISTOGRAM_TYPES:
        suffixes = (b"_bucket", b"_count", b"_sum")
    elif mtype == _SUMMARY_TYPE:
        suffixes = (b"_count", b"_sum")
    for suffix in suffixes:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name
