"""Fuzz relay.native._crw2 (RW 2.0 -> 1.0 in C) against its Python reference, relay.wire_v2.py_v2_to_v1.

Every input goes to both; they must give the same v1 bytes and counts or the same error (type,
status, message), and where the C code answers by itself (``transcode`` is not None) its answer
must be the reference's success. Inputs: libFuzzer's mutations of a seed corpus of valid requests
(the bench payload's shape, metadata on every series, native histograms, exemplars, unknown fields),
and half the time a freshly generated valid request mutated a few bytes (the C code is not
coverage-instrumented: gcc has no -fsanitize=fuzzer, so this keeps inputs near the valid shapes).
atheris is not a project dependency:

    .venv/bin/pip install atheris
    .venv/bin/python bench/fuzz_crw2.py -max_total_time=300          # 5 minutes; prints a summary
    .venv/bin/python bench/fuzz_crw2.py -runs=20000 -max_len=4096

A mismatch raises AssertionError with both outcomes; libFuzzer then writes the input to crash-*.
"""

from __future__ import annotations

import collections
import random
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import atheris

with atheris.instrument_imports():
    from relay.common import protowire
    from relay.ingest import wire_v2

from relay import native
from relay.proto import remote_v2_pb2 as v2pb

_c = native.load("crw2")
if _c is None:
    sys.exit("relay.native._crw2 is not built (or GPU_RELAY_NATIVE=0): nothing to fuzz")
STATS: collections.Counter[str] = collections.Counter()
REPORT_EVERY = 10_000
LIMITS = (wire_v2.DEFAULT_MAX_BYTES, 4096, 200)
SYMBOLS = ["", "__name__", "job", "instance", "le", "lat_bucket", "lat_sum", "lat_count", "up", "help text", "s",
           "gpu", "0", "1", "DCGM_FI_DEV_GPU_UTIL", "\u00e9t\u00e9", "trace_id", "v" * 130]


def outcome(fn: Any, raw: bytes, max_bytes: int) -> tuple[Any, ...]:
    try:
        v1, counts = fn(raw, max_bytes)
    except protowire.WireError as e:
        return ("WireError", e.status, e.message)
    except Exception as e:
        return (type(e).__name__, str(e))
    return ("ok", v1, counts)


def generate(rng: random.Random) -> bytes:
    """A valid request as Prometheus might send it (sometimes with odd but valid parts)."""
    syms = ["", *rng.sample(SYMBOLS[1:], rng.randint(1, len(SYMBOLS) - 1))]
    req = v2pb.Request(symbols=syms)
    for _ in range(rng.randint(0, 4)):
        names = rng.sample(range(1, len(syms)), rng.randint(0, min(4, len(syms) - 1)))
        ts = req.timeseries.add(labels_refs=[r for n in names for r in (n, rng.randrange(len(syms)))])
        for _ in range(rng.randint(0, 2)):
            bits = rng.choice([0, 0x7FF0000000000002, rng.getrandbits(64)])
            ts.samples.add(value=struct.unpack("<d", struct.pack("<Q", bits))[0], timestamp=rng.randint(-5, 2**41),
                           start_timestamp=rng.choice([0, 7]))
        if rng.random() < 0.3:
            h = ts.histograms.add(sum=rng.choice([0.0, 1.5, -0.0]), schema=rng.randint(-4, 8),
                                  timestamp=rng.randint(0, 2**41), start_timestamp=rng.randint(0, 9),
                                  reset_hint=rng.randint(0, 3), positive_deltas=[rng.randint(-3, 3)],
                                  positive_spans=[v2pb.BucketSpan(offset=rng.randint(-2, 2), length=1)],
                                  custom_values=[0.5] * rng.randint(0, 2))
            if rng.random() < 0.5:
                h.count_int = rng.randint(0, 9)
            else:
                h.zero_count_float = 0.0
        if rng.random() < 0.3:
            ts.exemplars.add(labels_refs=[syms.index("trace_id") if "trace_id" in syms else 1, 1], value=1.0,
                             timestamp=rng.randint(1, 9))
        if rng.random() < 0.5:
            ts.metadata.CopyFrom(v2pb.Metadata(type=rng.randint(0, 7), help_ref=rng.randrange(len(syms)),
                                               unit_ref=rng.randrange(len(syms))))
    raw = req.SerializeToString()
    if rng.random() < 0.2:
        raw += protowire.encode_len(rng.choice([1, 9, 77]), b"\x08\x01")  # an unknown field
    return raw


def mutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    if rng.random() < 0.5:
        return bytes(atheris.Mutate(data, max_size))
    raw = bytearray(generate(rng))
    for _ in range(rng.randint(0, 3)):
        if raw:
            raw[rng.randrange(len(raw))] = rng.randrange(256)
    return bytes(raw[:max_size])


def one_input(data: bytes) -> None:
    if not data:
        return
    max_bytes = LIMITS[data[-1] % len(LIMITS)] if len(data) > 1 and data[-1] >= 0xF0 else wire_v2.DEFAULT_MAX_BYTES
    want = outcome(wire_v2.py_v2_to_v1, data, max_bytes)
    got = outcome(wire_v2.v2_to_v1, data, max_bytes)
    assert got == want, (got, want)
    own = _c.transcode(data, max_bytes)
    if own is not None:
        assert want[0] == "ok", ("C answered", own, "reference", want)
        assert (own[0], wire_v2.V2Counts(*own[1:])) == want[1:], (own, want)
    STATS["inputs"] += 1
    STATS[f"reference {want[0]}{' ' + str(want[1]) if want[0] == 'WireError' else ''}"] += 1
    STATS["answered in C" if own is not None else "handed to the reference"] += 1
    if STATS["inputs"] % REPORT_EVERY == 0:
        report()  # libFuzzer ends the process with _exit: no atexit hook runs


def report() -> None:
    print("fuzz_crw2:", ", ".join(f"{k} {v:,}" for k, v in sorted(STATS.items())), file=sys.stderr, flush=True)


def main() -> None:
    corpus = Path(tempfile.mkdtemp(prefix="fuzz_crw2-"))
    rng = random.Random(1)
    for i in range(64):
        (corpus / f"seed{i}").write_bytes(generate(rng))
    import snappy

    from bench.rw_payload import cluster_series, encode_v2  # the bench payload's shape
    (corpus / "bench").write_bytes(snappy.uncompress(encode_v2(cluster_series(1, 68)[:40], 1_700_000_000_000, 1)))
    atheris.Setup([*sys.argv, str(corpus)], one_input, custom_mutator=mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
