"""Fuzz relay.native._csnappy.uncompress against the reference (python-snappy over cramjam) with atheris,
and relay.native._csnappy.compress by round trip.

An input's first byte picks what is decoded: the raw bytes after it (libFuzzer's mutations reach
every tag and header shape), or those bytes compressed by cramjam and then maybe damaged (a
truncation, a byte changed, bytes inserted or removed, a lying header), so that long valid blocks
with every copy kind and overlapping copies go through the decoder too. Each block goes through
``wire.decompress`` and ``wire.py_decompress`` with two limits (identical bytes, or the same
WireError status and message), and through the C decoder itself, which must accept exactly what
cramjam accepts, with the same bytes. The input's bytes (and a run of its second byte in front of
them: long copies) are also compressed by the C compressor: cramjam and the C decoder must give
them back exactly, within snappy's output bound. Any difference raises, which atheris reports as a
crash with the input saved.

    .venv/bin/pip install atheris        # not a project dependency
    .venv/bin/python bench/fuzz_csnappy.py -max_total_time=300 [corpus_dir]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import atheris
import snappy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

with atheris.instrument_imports():
    from relay.ingest import wire  # instrumented: coverage guides the fuzzer

from relay import native
from relay.common.protowire import WireError, encode_uvarint

csnappy: Any = native.load("csnappy")
runs = {"inputs": 0, "accepted": 0, "compressed": 0}
DIRECT_MAX = 1 << 24


def through(fn: Any, body: bytes, max_bytes: int) -> tuple[Any, ...]:
    try:
        return ("ok", fn(body, max_bytes))
    except WireError as e:
        return ("WireError", e.status, e.message)


def header(body: bytes) -> int | None:
    """The announced length where wire accepts the header, else None (as the tests read it)."""
    value = 0
    for i, b in enumerate(body[:10]):
        if i == 9 and b > 1:
            return None
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return value if value <= 0xFFFFFFFF else None
    return None


def damaged(fdp: Any) -> bytes:
    raw = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096))
    if fdp.ConsumeBool():  # repeat it: long copies, overlapping runs
        raw = raw[: fdp.ConsumeIntInRange(1, 16)] * fdp.ConsumeIntInRange(1, 2000) + raw
    body = bytes(snappy.compress(raw))
    for _ in range(fdp.ConsumeIntInRange(0, 2)):
        kind = fdp.ConsumeIntInRange(0, 5)
        i = fdp.ConsumeIntInRange(0, max(0, len(body) - 1))
        if kind == 0:
            body = body[:i]
        elif kind == 1 and body:
            body = body[:i] + fdp.ConsumeBytes(1).ljust(1, b"\0") + body[i + 1 :]
        elif kind == 2:
            body = body[:i] + fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 8)) + body[i:]
        elif kind == 3:
            body = body[:i] + body[i + fdp.ConsumeIntInRange(1, 8) :]
        elif kind == 4:  # a lying header
            n = header(body) or 0
            rest = body[len(encode_uvarint(n)) :]
            body = encode_uvarint(max(0, n + fdp.ConsumeIntInRange(-3, 3))) + rest
    return body


def round_trip(raw: bytes) -> None:
    z = csnappy.compress(raw)
    if len(z) > 32 + len(raw) + len(raw) // 6:
        raise AssertionError(f"C compress of {len(raw)} bytes gave {len(z)}, over the bound")
    if bytes(snappy.uncompress(z)) != raw or csnappy.uncompress(z, len(raw)) != raw:
        raise AssertionError(f"C compress does not round-trip {raw!r}: {z!r}")
    runs["compressed"] += 1


def one_input(data: bytes) -> None:
    if not data:
        return
    round_trip(data[1:])
    round_trip(data[1:2] * (data[0] * 300) + data[1:])
    body = data[1:] if data[0] & 1 else damaged(atheris.FuzzedDataProvider(data[1:]))
    runs["inputs"] += 1
    for max_bytes in (len(body) * 4, 1 << 20):
        c, py = through(wire.decompress, body, max_bytes), through(wire.py_decompress, body, max_bytes)
        if c != py:
            raise AssertionError(f"wire.decompress differs on {body!r} (max {max_bytes}):\n C: {c!r}\n Py: {py!r}")
    n = header(body)
    if n is None:
        if csnappy.uncompress(body, 1 << 40) is not None:
            raise AssertionError(f"C accepted a header wire refuses: {body!r}")
    elif n <= DIRECT_MAX:
        got = csnappy.uncompress(body, DIRECT_MAX)
        try:
            want: bytes | None = bytes(snappy.uncompress(body))
        except Exception:
            want = None
        if got != want:
            raise AssertionError(f"C and cramjam differ on {body!r}:\n C: {got!r}\n Py: {want!r}")
        if want is not None:
            runs["accepted"] += 1
    k = runs["inputs"]
    if k & (k - 1) == 0 or k % 50_000 == 0:  # libFuzzer exits without atexit: report as it goes
        print(f"fuzz_csnappy: {k:,} inputs compared, {runs['accepted']:,} valid blocks decoded by both, "
              f"{runs['compressed']:,} compressed and decoded back", file=sys.stderr, flush=True)


def seeds() -> list[bytes]:
    from bench.rw_payload import ISSUE9_OTHER_PER_NODE, payload

    body = payload(2, 1, other_per_node=ISSUE9_OTHER_PER_NODE).requests[0]
    return [b"\x01" + bytes(body), b"\x00" + b"abcabcabc" * 40, b"\x01\x05\x00a\x01\x01", b"\x01\x00"]


def main() -> None:
    if csnappy is None:
        sys.exit("relay.native._csnappy is not built (bash scripts/setup.sh) or GPU_RELAY_NATIVE=0")
    args = list(sys.argv)
    corpus = [a for a in args[1:] if not a.startswith("-")]
    if corpus:
        Path(corpus[0]).mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(seeds()):
            (Path(corpus[0]) / f"seed-{i}").write_bytes(seed)
    else:
        for seed in seeds():
            one_input(seed)
    runs["inputs"] = runs["accepted"] = runs["compressed"] = 0
    atheris.Setup(args, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
