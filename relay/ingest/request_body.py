"""A remote-write request's body, as it came, to RW 1.0 WriteRequest bytes.

``decode_body(headers, body, max_bytes)`` reads the Content-Type (RW 1.0 or 2.0,
``wire.parse_content_type``) and the Content-Encoding: ``snappy`` (the remote-write specs; the default
when the header is absent) or ``zstd`` (the VictoriaMetrics remote-write protocol, which vmagent
sends by default: the RW 1.0 message compressed with zstd), for either version. Anything else is a
415. The same limits hold for both encodings: the decompressed body over ``max_bytes`` is a 413,
checked before anything is allocated where the encoding announces its size (a snappy block header,
a zstd frame's content size) and, for zstd, again while decoding, so a frame that lies about its
size or announces none never makes the relay allocate more than ``max_bytes`` plus one chunk; a
corrupt body is a 400. It returns ``DecodedBody``: the RW 1.0 bytes, the body the queue may store
as it came (a snappy RW 1.0 body only) and, for RW 2.0, what the request carried (``V2Counts``).
``VM_PROTO_VERSION`` is what the write endpoint answers vmagent's protocol probe with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import zstandard

from relay.common.protowire import WireError
from relay.ingest import wire
from relay.ingest.wire_v2 import V2Counts, v2_to_v1

VM_PROTO_VERSION = b"1"  # ?get_vm_proto_version=1 is answered 200 with this body, as VictoriaMetrics does
ENCODINGS = ("snappy", "zstd")
_CHUNK = 1 << 20  # zstd output is read this much at a time
_MAX_WINDOW = 1 << 27  # zstd's own default limit (ZSTD_WINDOWLOG_LIMIT_DEFAULT)


@dataclass(frozen=True, slots=True)
class DecodedBody:
    raw: bytes  # RW 1.0 WriteRequest bytes
    stored: bytes | None  # the body, when it is the snappy block of exactly ``raw``; else None
    counts: V2Counts | None  # RW 2.0: samples, histograms, exemplars the request carried


def decode_body(headers: Mapping[str, str], body: bytes, max_bytes: int) -> DecodedBody:
    """RW 1.0 bytes of a write whose headers (lower-cased names) and body are given; WireError
    (400 malformed, 413 too large, 415 unsupported type or encoding) otherwise."""
    version = wire.parse_content_type(headers.get("content-type"))
    encoding = headers.get("content-encoding", "snappy").strip().lower()
    if encoding == "snappy":
        raw = wire.decompress(body, max_bytes)
    elif encoding == "zstd":
        raw = zstd_decompress(body, max_bytes)
    else:
        raise WireError(415, f"unsupported Content-Encoding {encoding[:40]!r}: expected snappy or zstd")
    if version == 2:
        v1, counts = v2_to_v1(raw, max_bytes)
        return DecodedBody(v1, None, counts)
    return DecodedBody(raw, body if encoding == "snappy" else None, None)


def _window_limit(max_bytes: int) -> int:
    """The largest zstd window a body of at most ``max_bytes`` needs: the power of two at or above
    it (at least 1 KiB, zstd's smallest), capped at zstd's default limit."""
    return min(_MAX_WINDOW, 1 << max(10, (max_bytes - 1).bit_length()))


def zstd_decompress(body: bytes, max_bytes: int) -> bytes:
    """One or more concatenated zstd frames; 413 past ``max_bytes`` (a frame's announced content size
    checked first, then the output as it is produced), 400 for anything zstd cannot decode."""
    try:
        frame = zstandard.get_frame_parameters(body)
    except zstandard.ZstdError:
        raise WireError(400, "corrupt zstd body: no valid zstd frame header") from None
    if frame.content_size != zstandard.CONTENTSIZE_UNKNOWN and frame.content_size > max_bytes:
        raise WireError(413, f"decompressed body of {frame.content_size} bytes exceeds the limit of {max_bytes} bytes")
    dctx = zstandard.ZstdDecompressor(max_window_size=_window_limit(max_bytes))
    chunks: list[bytes] = []
    total = 0
    try:
        with dctx.stream_reader(body, read_across_frames=True) as reader:
            while chunk := reader.read(min(_CHUNK, max_bytes + 1 - total)):
                total += len(chunk)
                if total > max_bytes:
                    raise WireError(413, f"decompressed body exceeds the limit of {max_bytes} bytes")
                chunks.append(chunk)
    except zstandard.ZstdError as exc:
        if "too much memory" in str(exc):  # a window over what a body of max_bytes can need
            raise WireError(413, f"zstd frame needs a window over the limit of {max_bytes} bytes") from None
        raise WireError(400, f"corrupt zstd body: {_reason(exc)}") from None
    return b"".join(chunks)


def _reason(exc: zstandard.ZstdError) -> str:
    text = " ".join(str(exc).split())
    return text[:120] if text else type(exc).__name__
