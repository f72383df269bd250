"""Remote-write request bodies (content type, snappy) and the per-series hot loop.

RW 1.0 requests are never decoded whole: ``route`` walks the WriteRequest bytes by hand, keys a
cache on each series' raw label bytes (its field-1 Label entries exactly as on the wire) and copies
kept series through as bytes, so a series seen before costs one dict lookup. Sample values are never
turned into floats on the way through, so stale markers (NaN 0x7ff0000000000002) stay byte-exact.
RW 2.0 is transcoded to RW 1.0 bytes first (``relay.ingest.wire_v2``); single entries are built and
read by ``relay.ingest.wire_codec`` (its names are importable from here too). ``route_loop`` and ``series_id`` are
the C twins (relay/native/cwire.c) when built, else the Python reference here; ``relay.ingest.wire_errors``
words a refusal of either with the field it is about (the error path only). Field numbers:
/work/shared/reference/remote-write-and-relays.md section 1 (prompb/remote.proto, types.proto).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import snappy

from relay import native
from relay.common.protowire import (
    MAX_FIELD_NUMBER,
    WireError,
    int64,
    malformed,
    read_len,
    skip_value,
    uvarint,
)
from relay.ingest.wire_codec import (
    LEN_PREFIX,
    decode_labels,
    decode_samples,
    decode_write_request,
    encode_label_pair,
    encode_labels,
    encode_sample,
    encode_write_request,
    split_series,
    wrap_series,
)
from relay.ingest.wire_entries import check_exemplar, check_metadata, histogram_timestamp, sample_timestamp
from relay.ingest.wire_v2 import V2Counts, v2_to_v1

__all__ = [
    "LEN_PREFIX", "Decision", "DestDecision", "Routed", "RoutedEntry", "V2Counts", "WireError", "compress",
    "decode_labels", "decode_samples", "decode_write_request", "decompress", "encode_label_pair", "encode_labels",
    "encode_routed", "encode_sample", "encode_write_request", "parse_content_type", "route", "series_id",
    "snappy_uncompressed_length", "uvarint", "v2_to_v1", "wrap_series"
]

_V1_PROTO = "prometheus.writerequest"
_V2_PROTO = "io.prometheus.write.v2.request"
_csnappy = native.load("csnappy")


def parse_content_type(content_type: str | None) -> int:
    """Remote-write version of a Content-Type: 1 or 2; anything else is a 415.

    A missing or empty header means RW 1.0, as in Prometheus' write handler.
    """
    if content_type is None or not content_type.strip():
        return 1
    media, *params = content_type.split(";")
    if media.strip().lower() != "application/x-protobuf":
        raise WireError(415, f"unsupported content type {content_type!r}: expected application/x-protobuf")
    proto = _V1_PROTO
    for param in params:
        key, sep, value = param.partition("=")
        if sep and key.strip().lower() == "proto":
            proto = value.strip().strip('"').lower()
    if proto == _V1_PROTO:
        return 1
    if proto == _V2_PROTO:
        return 2
    raise WireError(415, f"unsupported remote-write message {proto!r} in content type {content_type!r}")


def snappy_uncompressed_length(body: bytes) -> int:
    """Decompressed size announced by the snappy block header (a uint32 varint); nothing is decompressed."""
    try:
        length, _ = uvarint(body, 0)
    except WireError:
        raise WireError(400, "corrupt snappy body: missing or bad length header") from None
    if length > 0xFFFFFFFF:
        raise WireError(400, "corrupt snappy body: length header over 32 bits")
    return length


def decompress(body: bytes, max_bytes: int) -> bytes:
    """Snappy block decompression; 413 when the header announces more than ``max_bytes`` (checked first).

    relay.native._csnappy decodes straight into the bytes it returns; a block it declines (anything not
    valid) goes whole to ``py_decompress``, the reference, which raises the error."""
    if _csnappy is not None and snappy_uncompressed_length(body) <= max_bytes:
        # (a block holds at most 2^32 - 1 bytes: a larger limit, even past C's ssize_t, is that one)
        raw: bytes | None = _csnappy.uncompress(body, min(max_bytes, 0xFFFF_FFFF))
        if raw is not None:
            return raw
    return py_decompress(body, max_bytes)


def py_decompress(body: bytes, max_bytes: int) -> bytes:
    """The reference: python-snappy (cramjam), whose output is zero-filled, then copied."""
    length = snappy_uncompressed_length(body)
    if length > max_bytes:
        raise WireError(413, f"decompressed body of {length} bytes exceeds the limit of {max_bytes} bytes")
    try:
        raw = snappy.uncompress(body)
    except Exception as exc:  # python-snappy raises UncompressError, cramjam builds other types
        raise WireError(400, f"corrupt snappy body: {type(exc).__name__}") from None
    return bytes(raw)


def compress(raw: bytes) -> bytes:
    return bytes(snappy.compress(raw))


# ---- the hot loop ----------------------------------------------------------------------------

DestDecision = tuple[bytes, int, str]  # (output label bytes, series_id of them, metric name)
Decision = tuple[DestDecision | None, ...]  # one entry per destination; None: not sent there
# (decision, rest bytes, n = samples + histograms, oldest sample or histogram timestamp ms or 0)
RoutedEntry = tuple[DestDecision, bytes, int, int]


@dataclass(slots=True)
class Routed:
    per_dest: list[list[RoutedEntry]]
    metadata: bytes  # the request's field-3 entries, raw and tag-wrapped, validated
    series_in: int
    samples_in: int
    histograms_in: int
    exemplars_in: int
    new_keys: int  # label keys that were not cached (decide() was called)


def _py_series_id(label_bytes: bytes) -> int:
    """Stable 64-bit id: BLAKE2b (digest_size=8) of the label bytes, read little-endian."""
    return int.from_bytes(hashlib.blake2b(label_bytes, digest_size=8).digest(), "little")


def encode_routed(entries: list[RoutedEntry], metadata: bytes) -> bytes:
    """RW1 WriteRequest bytes for one destination's routed series (plus raw metadata entries)."""
    parts = [wrap_series(decision[0], rest) for decision, rest, _n, _ts in entries]
    parts.append(metadata)
    return b"".join(parts)


def route(
    v1: bytes, n_dest: int, cache: dict[bytes, Decision], decide: Callable[[bytes], Decision]
) -> Routed:
    """Split an RW1 WriteRequest into per-destination series, deciding each distinct label key once.

    ``decide(key)`` runs on a cache miss and its result is stored in ``cache``; its WireError
    (an invalid label set) propagates. Malformed protobuf, in any entry, raises WireError(400).
    """
    per_dest: list[list[RoutedEntry]] = [[] for _ in range(n_dest)]
    metadata: list[bytes] = []
    counts = route_loop(bytes(v1), cache, decide, per_dest, metadata)
    return Routed(per_dest, b"".join(metadata), *counts)


def _route_loop(
    buf: bytes,
    cache: dict[bytes, Decision],
    decide: Callable[[bytes], Decision],
    per_dest: list[list[RoutedEntry]],
    metadata: list[bytes],
) -> tuple[int, int, int, int, int]:
    """The per-series loop: (series, samples, histograms, exemplars, new keys).

    Fast path: a TimeSeries whose Label entries come first and whose remaining fields are 2-4, each
    validated (a Sample of the usual shape, value then timestamp, by its bytes; others by
    ``relay.wire_entries``). Anything else (other field order, unknown fields) goes through
    ``split_series``. Faster still: a cached series with one Sample of the same shape and timestamp
    bytes as the previous series' one (``head``, ``tail``: a scrape's series share a timestamp).
    """
    n = len(buf)
    pos = 0
    series = samples = histograms = exemplars = new = 0
    get = cache.get
    at = buf.startswith
    glen = gts = 0  # length of the guessed one-sample rest (0: no guess) and its timestamp
    head = tail = b""  # the guessed rest's bytes before and after its 8 value bytes
    stamps: dict[bytes, int] = {}  # timestamp varint bytes -> timestamp, for this request
    while pos < n:
        tag = buf[pos]
        if tag != 0x0A:
            pos = _top_level_other(buf, pos, n, metadata)
            continue
        ln = buf[pos + 1] if pos + 1 < n else 0x80
        if ln < 0x80:
            start = pos + 2
        else:
            ln, start = uvarint(buf, pos + 1)
        pos = end = start + ln
        if end > n:
            raise malformed("TimeSeries past the end of the request")
        # A hit is exact: every cache key is a complete, validated run of Label entries, and the rest
        # matched byte for byte but for the value, which any 8 bytes are.
        if glen and glen < ln:
            r = end - glen
            if at(tail, r + 11) and at(head, r):
                decision = get(buf[start:r])
                if decision is not None:
                    rest = buf[r:end]
                    series += 1
                    samples += 1
                    for dest, d in zip(per_dest, decision):  # noqa: B905
                        if d is not None:
                            dest.append((d, rest, 1, gts))
                    continue
        p = start
        ns = ne = nh = 0
        oldest: int | None = None
        usual = True  # every Sample had the usual shape
        try:
            while p < end and buf[p] == 0x0A:  # Label entries (validated by decide on a cache miss)
                ln = buf[p + 1]
                if ln < 0x80:
                    p += 2 + ln
                else:
                    ln, p = uvarint(buf, p + 1)
                    p += ln
            key_end = p
            while p < end:  # samples 0x12, exemplars 0x1A, histograms 0x22
                t = buf[p]
                if t not in (0x12, 0x1A, 0x22):
                    break
                ln = buf[p + 1]
                if ln < 0x80:
                    s = p + 2
                else:
                    ln, s = uvarint(buf, p + 1)
                p = s + ln
                if p > end:
                    break
                if t == 0x12:
                    ns += 1
                    ts = None
                    if ln >= 12 and buf[s] == 0x09 and buf[s + 9] == 0x10:  # the usual shape
                        tb = buf[s + 10 : p]
                        ts = stamps.get(tb)
                        if ts is None and buf[p - 1] < 0x80:
                            v, q = uvarint(buf, s + 10)
                            if q == p:
                                ts = stamps[tb] = int64(v)
                    if ts is None:
                        usual = False
                        ts = sample_timestamp(buf, s, p)
                elif t == 0x22:
                    nh += 1
                    ts = histogram_timestamp(buf, s, p)
                else:
                    ne += 1
                    check_exemplar(buf, s, p)
                    continue
                if oldest is None or ts < oldest:
                    oldest = ts
        except IndexError:
            p = -1
        if p == end:
            key = buf[start:key_end]
            rest = buf[key_end:end]
            if ns == 1 and usual and not ne and not nh and key_end + 2 + buf[key_end + 1] == end:
                glen, gts = end - key_end, oldest or 0
                head, tail = buf[key_end : key_end + 3], buf[key_end + 11 : end]
            else:
                glen = 0
        else:
            key, rest, ns, ne, nh, oldest = split_series(buf, start, end)
        series += 1
        samples += ns
        exemplars += ne
        histograms += nh
        decision = get(key)
        if decision is None:
            decision = decide(key)
            if len(decision) != len(per_dest):
                raise ValueError(
                    f"decide() returned {len(decision)} decisions for {len(per_dest)} destinations"
                )
            cache[key] = decision
            new += 1
        count = ns + nh
        first = oldest or 0
        for dest, d in zip(per_dest, decision):  # noqa: B905
            if d is not None:
                dest.append((d, rest, count, first))
    return series, samples, histograms, exemplars, new


def _top_level_other(buf: bytes, pos: int, n: int, metadata: list[bytes]) -> int:
    """Skip a WriteRequest field other than a TimeSeries; keep metadata (field 3) entries raw."""
    tag, p = uvarint(buf, pos)
    if tag == 0x1A:
        start, stop = read_len(buf, p, n)
        check_metadata(buf, start, stop)
        metadata.append(buf[pos:stop])
        return stop
    if tag >> 3 == 0 or tag >> 3 > MAX_FIELD_NUMBER:
        raise malformed(f"field number {tag >> 3}")
    if tag >> 3 in (1, 3):
        raise malformed(f"WriteRequest field {tag >> 3} with wire type {tag & 7}")
    return skip_value(buf, p, tag & 7, n)


# The C twins (relay/native/cwire.c) when built and not turned off (GPU_RELAY_NATIVE=0): same results,
# errors included; anything the C loop does not handle itself goes to _route_loop whole.
_c = native.load("cwire")
route_loop: Callable[[bytes, dict[bytes, Decision], Callable[[bytes], Decision], list[list[RoutedEntry]], list[bytes]],
                     tuple[int, int, int, int, int]] = _c.route_loop if _c else _route_loop
series_id: Callable[[bytes], int] = _c.series_id if _c else _py_series_id
