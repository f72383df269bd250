"""Fuzz relay.native._cwire.route_loop against the Python reference (wire._route_loop) with atheris.

An input is raw request bytes (first byte >= 0x80) or a recipe for a request built from valid parts,
maybe damaged afterwards: many of those go through the C loop itself. Every input is routed by both,
twice in a row with one cache each (the second pass runs the warm path and its one-sample guess),
with 1-3 destinations and a decide that sometimes raises WireError or answers the wrong number of
decisions; everything observable must match (results or errors, per-destination entries, metadata,
decide's keys, the cache), and series_id must match hashlib. Every label key decide saw, and the
input itself, also goes through decode_key: C must answer label_codec.py_decode_key's result or decline
(None), and label_codec.decode_key must give the reference's result or error.
Any difference raises, which atheris reports as a crash with the input saved.

    .venv/bin/pip install atheris        # not a project dependency
    .venv/bin/python bench/fuzz_cwire.py -max_total_time=300 [corpus_dir]
Seeds: a few valid requests (the issue 9 shape, histograms, exemplars, metadata) are always added.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

with atheris.instrument_imports():
    from relay.ingest import wire, wire_entries  # noqa: F401  (instrumented: coverage guides the fuzzer)

from relay import native
from relay.common.protowire import WireError, encode_int64, encode_len
from relay.proto import remote_v1_pb2 as v1pb
from relay.rules import label_codec

cwire: Any = native.load("cwire")
runs = {"inputs": 0, "accepted": 0, "fallbacks_at_start": 0}


def decider(n_dest: int, mode: int, calls: list[bytes]) -> Callable[[bytes], Any]:
    def decide(key: bytes) -> Any:
        calls.append(key)
        h = hashlib.sha1(key).digest()[0]
        if mode == 1 and h % 7 == 0:
            raise WireError(400, "decide refuses this one")
        wire.decode_labels(key)
        if mode == 2 and h % 7 == 1:
            return (None,) * (n_dest + 1)
        return tuple(None if (h >> i) & 1 else (key, h, "m") for i in range(n_dest))

    return decide


def observe(loop: Any, buf: bytes, n_dest: int, mode: int) -> Any:
    calls: list[bytes] = []
    cache: dict[bytes, Any] = {}
    decide = decider(n_dest, mode, calls)
    out = []
    for _ in range(2):
        per_dest: list[list[Any]] = [[] for _ in range(n_dest)]
        metadata: list[bytes] = []
        try:
            res: Any = ("ok", loop(buf, cache, decide, per_dest, metadata))
        except WireError as e:
            res = ("WireError", e.status, e.message)
        except ValueError as e:
            res = ("ValueError", str(e))
        out.append((res, per_dest, metadata))
    return out, calls, cache


NAMES = [b"__name__", b"job", b"gpu", b"a", b"\xc3\xa9", b""]
VALUES = [b"DCGM_FI_DEV_GPU_UTIL", b"0", b"10.0.0.1:9400", b"", b"\xff", b"x" * 130]


def structured(fdp: Any) -> bytes:
    """A request built from valid parts (most go through the C loop itself), then maybe damaged."""
    pool: list[bytes] = []
    out: list[bytes] = []
    for _ in range(fdp.ConsumeIntInRange(0, 16)):
        kind = fdp.ConsumeIntInRange(0, 7)
        if kind <= 4 and pool and fdp.ConsumeBool():  # the same series again: cache hits, the guess
            out.append(pool[fdp.ConsumeIntInRange(0, len(pool) - 1)])
            continue
        if kind <= 4:
            labels = b"".join(encode_len(1, encode_len(1, NAMES[fdp.ConsumeIntInRange(0, len(NAMES) - 1)])
                                         + encode_len(2, VALUES[fdp.ConsumeIntInRange(0, len(VALUES) - 1)]))
                              for _ in range(fdp.ConsumeIntInRange(0, 4)))
            parts = []
            for _ in range(fdp.ConsumeIntInRange(0, 3)):
                what = fdp.ConsumeIntInRange(0, 5)
                ts = encode_int64(fdp.ConsumeIntInRange(-(2**63), 2**63 - 1))
                if what <= 2:
                    parts.append(encode_len(2, b"\x09" + fdp.ConsumeBytes(8).ljust(8, b"\0") + b"\x10" + ts))
                elif what == 3:
                    parts.append(encode_len(2, b"\x10" + ts + b"\x09" + bytes(8)))
                elif what == 4:
                    parts.append(encode_len(3, encode_len(1, encode_len(1, b"trace_id") + encode_len(2, b"ab"))
                                            + b"\x11" + bytes(8) + b"\x18" + ts))
                else:
                    n = fdp.ConsumeIntInRange(0, 3)
                    spans = encode_len(11, b"\x08" + bytes((fdp.ConsumeIntInRange(0, 5),))
                                       + b"\x10" + bytes((n,)))
                    deltas = encode_len(12, bytes(fdp.ConsumeIntInRange(0, 3)))
                    parts.append(encode_len(4, b"\x08\x02" + spans + deltas + b"\x78" + ts))
            pool.append(encode_len(1, labels + b"".join(parts)))
            out.append(pool[-1])
        elif kind == 5:
            out.append(encode_len(3, b"\x08\x01" + encode_len(2, NAMES[fdp.ConsumeIntInRange(0, len(NAMES) - 1)])))
        else:
            out.append(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 12)))
    raw = b"".join(out)
    if raw and fdp.ConsumeBool():
        i = fdp.ConsumeIntInRange(0, len(raw) - 1)
        raw = raw[:i] + fdp.ConsumeBytes(1) + raw[i + 1 :] if fdp.ConsumeBool() else raw[:i]
    return raw


def one_input(data: bytes) -> None:
    if len(data) < 1:
        return
    n_dest, mode = 1 + data[0] % 3, (data[0] >> 2) % 3
    buf = data[1:] if data[0] & 0x80 else structured(atheris.FuzzedDataProvider(data[1:]))
    runs["inputs"] += 1
    py = observe(wire._route_loop, buf, n_dest, mode)
    c = observe(cwire.route_loop, buf, n_dest, mode)
    if c != py:
        raise AssertionError(f"C and Python differ on {buf!r}:\n C: {c!r}\n Py: {py!r}")
    if py[0][0][0][0] == "ok":
        runs["accepted"] += 1
    n = runs["inputs"]
    if n & (n - 1) == 0 or n % 50_000 == 0:  # libFuzzer exits without atexit: report as it goes
        handed = cwire.fallbacks() - runs["fallbacks_at_start"]
        print(f"fuzz_cwire: {n:,} inputs compared, {runs['accepted']:,} accepted by both; C routed "
              f"{2 * n - handed:,} calls itself, handed {handed:,} to the reference", file=sys.stderr, flush=True)
    for key in [buf, *py[1]]:
        check_decode_key(key)
    want = int.from_bytes(hashlib.blake2b(buf, digest_size=8).digest(), "little")
    if cwire.series_id(buf) != want:
        raise AssertionError(f"series_id differs on {buf!r}")


def _decoded(fn: Callable[[bytes], Any], key: bytes) -> Any:
    try:
        return ("ok", fn(key))
    except WireError as e:
        return ("WireError", e.status, e.message)


def check_decode_key(key: bytes) -> None:
    want = _decoded(label_codec.py_decode_key, key)
    got = cwire.decode_key(key)
    if got is not None and ("ok", got) != want:
        raise AssertionError(f"decode_key differs on {key!r}:\n C: {got!r}\n Py: {want!r}")
    if _decoded(label_codec.decode_key, key) != want:
        raise AssertionError(f"label_codec.decode_key differs from the reference on {key!r}")


def seeds() -> list[bytes]:
    from bench.rw_payload import ISSUE9_OTHER_PER_NODE, cluster_series

    labels = [wire.encode_labels(s) for s in cluster_series(1, ISSUE9_OTHER_PER_NODE)[::40]]
    one = encode_len(2, b"\x09" + struct.pack("<Q", 0x7FF0000000000002) + b"\x10" + encode_int64(1_700_000_000_000))
    h = v1pb.Histogram(count_int=3, schema=1, timestamp=-5, positive_deltas=[1, 2],
                       positive_spans=[v1pb.BucketSpan(offset=-1, length=2)]).SerializeToString()
    ex = v1pb.Exemplar(labels=[v1pb.Label(name="trace_id", value="abc")], value=1.0, timestamp=7).SerializeToString()
    md = v1pb.MetricMetadata(type=1, metric_family_name="m", help="h", unit="u").SerializeToString()
    plain = b"".join(wire.wrap_series(lb, one) for lb in labels)
    rich = (wire.wrap_series(labels[0], one + encode_len(3, ex) + encode_len(4, h)) + encode_len(3, md)
            + wire.wrap_series(labels[1], one + one) + wire.wrap_series(b"", b""))
    return [b"\x80" + plain, b"\x85" + rich, b"\x8a" + rich + plain, bytes(range(64))]


def main() -> None:
    if cwire is None:
        sys.exit("relay.native._cwire is not built (bash scripts/setup.sh) or GPU_RELAY_NATIVE=0")
    args = list(sys.argv)
    corpus = [a for a in args[1:] if not a.startswith("-")]
    if corpus:
        for i, seed in enumerate(seeds()):
            Path(corpus[0]).mkdir(parents=True, exist_ok=True)
            (Path(corpus[0]) / f"seed-{i}").write_bytes(seed)
    else:
        for seed in seeds():
            one_input(seed)
    runs["inputs"] = runs["accepted"] = 0
    runs["fallbacks_at_start"] = cwire.fallbacks()
    atheris.Setup(args, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
