"""Torture, the fuzz scenario: mutated remote-write bodies over HTTP against the real relay (bench/torture.py)."""

from __future__ import annotations

import http.client
import random
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import snappy

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torture_procs import V1_HEADERS, V2_HEADERS, Outcome, Relay, VictoriaMetrics, drain

from relay.proto import remote_v1_pb2, remote_v2_pb2


def _base_bodies() -> list[tuple[bytes, dict[str, str]]]:
    """Valid raw (uncompressed) bodies to mutate: RW1 samples, RW1 with a histogram, exemplar and
    metadata, RW2 with samples and a histogram."""
    v1 = remote_v1_pb2.WriteRequest()
    for i in range(5):
        ts = v1.timeseries.add()
        for n, v in (("__name__", f"fuzz_metric_{i}"), ("job", "fuzz"), ("pod", f"p{i}")):
            lb = ts.labels.add()
            lb.name, lb.value = n, v
        s = ts.samples.add()
        s.value, s.timestamp = float(i), int(time.time() * 1000)
    h = v1.timeseries[0].histograms.add()
    h.count_int, h.sum, h.schema, h.zero_threshold, h.zero_count_int = 3, 1.5, 0, 1e-128, 1
    span = h.positive_spans.add()
    span.offset, span.length = 0, 2
    h.positive_deltas.extend([1, 1])
    h.timestamp = int(time.time() * 1000)
    ex = v1.timeseries[1].exemplars.add()
    el = ex.labels.add()
    el.name, el.value = "trace_id", "abc"
    ex.value, ex.timestamp = 1.0, int(time.time() * 1000)
    md = v1.metadata.add()
    md.metric_family_name, md.type, md.help = "fuzz_metric_0", remote_v1_pb2.MetricMetadata.GAUGE, "h"
    v2 = remote_v2_pb2.Request()
    v2.symbols.extend(["", "__name__", "fuzz_v2", "job", "fuzz"])
    t2 = v2.timeseries.add()
    t2.labels_refs.extend([1, 2, 3, 4])
    s2 = t2.samples.add()
    s2.value, s2.timestamp = 2.0, int(time.time() * 1000)
    return [(v1.SerializeToString(), V1_HEADERS), (v2.SerializeToString(), V2_HEADERS)]


def _mutations(rnd: random.Random, raw: bytes) -> Iterator[tuple[str, bytes, bool]]:
    """(kind, body, body is snappy-compressed protobuf we can check) for one base body."""
    b = bytearray(raw)
    kind = rnd.randrange(12)
    if kind == 0:  # bit flips
        for _ in range(rnd.randint(1, 4)):
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        yield "bitflip", bytes(b), True
    elif kind == 1:  # truncation
        yield "truncated", bytes(b[: rnd.randrange(len(b))]), True
    elif kind == 2:  # random insertion
        i = rnd.randrange(len(b) + 1)
        yield "insert", bytes(b[:i] + rnd.randbytes(rnd.randint(1, 16)) + b[i:]), True
    elif kind == 3:  # bad varint (11 continuation bytes)
        i = rnd.randrange(len(b))
        yield "bad varint", bytes(b[:i] + b"\xff" * 11 + b[i:]), True
    elif kind == 4:  # wrong wire type on a tag byte
        tags = [i for i, c in enumerate(b) if c in (0x0A, 0x12, 0x1A, 0x22, 0x09, 0x10)]
        if tags:
            i = rnd.choice(tags)
            b[i] = (b[i] & ~7) | rnd.choice([0, 1, 3, 4, 5, 6, 7])
        yield "wire type", bytes(b), True
    elif kind == 5:  # invalid UTF-8 in a string
        i = rnd.randrange(len(b))
        b[i] = rnd.choice([0xC0, 0xFF, 0xED, 0x80])
        yield "utf-8", bytes(b), True
    elif kind == 6:  # huge declared length
        tags = [i for i, c in enumerate(b[:-1]) if c in (0x0A, 0x12, 0x22)]
        if tags:
            i = rnd.choice(tags)
            b[i + 1 : i + 2] = b"\xff\xff\xff\xff\x0f"
        yield "huge length", bytes(b), True
    elif kind == 7:  # duplicate / empty label names (RW1)
        dup = remote_v1_pb2.WriteRequest()
        ts = dup.timeseries.add()
        for n in ["__name__", "a", "a"] if rnd.random() < 0.5 else ["__name__", ""]:
            lb = ts.labels.add()
            lb.name, lb.value = n, "x"
        ts.samples.add().timestamp = 1
        yield "labels", dup.SerializeToString(), True
    elif kind == 8:  # lying snappy header
        comp = bytearray(snappy.compress(raw))
        comp[0:1] = bytes([rnd.randrange(256) | 0x80]) + bytes([rnd.randrange(1, 128)])
        yield "snappy header", bytes(comp), False
    elif kind == 9:  # corrupt compressed bytes
        comp = bytearray(snappy.compress(raw))
        for _ in range(rnd.randint(1, 3)):
            i = rnd.randrange(len(comp))
            comp[i] = rnd.randrange(256)
        yield "snappy body", bytes(comp), False
    elif kind == 10:  # not snappy at all
        yield "raw bytes", rnd.randbytes(rnd.randint(0, 64)), False
    else:  # RW2 bad symbol ref
        v2 = remote_v2_pb2.Request()
        v2.symbols.extend(["", "__name__", "x"])
        t2 = v2.timeseries.add()
        t2.labels_refs.extend([1, rnd.choice([3, 99, 1 << 20])])
        t2.samples.add().timestamp = 1
        yield "v2 symbol ref", v2.SerializeToString(), True


def _parses(raw: bytes, headers: dict[str, str]) -> bool:
    msg = remote_v2_pb2.Request() if "v2" in headers["Content-Type"] else remote_v1_pb2.WriteRequest()
    try:
        msg.ParseFromString(raw)
    except Exception:
        return False
    return True


def scenario_fuzz(work: Path, bodies: int, threads: int = 4) -> Outcome:
    vm = VictoriaMetrics(work)
    vm.start()
    relay = Relay(work, vm.base + "/api/v1/write", read_timeout="5s")  # slow bodies cut off after 5 s
    relay.start()
    statuses: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    acked_unparsable: list[str] = []
    lock = threading.Lock()
    bases = _base_bodies()
    rss0 = relay.rss()
    rss_peak = rss0
    t0 = time.monotonic()

    def worker(seed: int, count: int) -> None:
        nonlocal rss_peak
        rnd = random.Random(seed)
        conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=15)
        for k in range(count):
            raw, headers = rnd.choice(bases)
            if rnd.random() < 0.5 and "v2" in headers["Content-Type"]:
                raw, headers = bases[0]
            for kind, body, checkable in _mutations(rnd, raw):
                payload = snappy.compress(body) if checkable else body
                try:
                    conn.request("POST", "/api/v1/write", body=payload, headers=headers)
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                    if resp.getheader("Connection", "").lower() == "close":
                        conn.close()
                except TimeoutError:
                    status = -1
                    conn.close()
                except (OSError, http.client.HTTPException):
                    status = 0
                    conn.close()
                with lock:
                    statuses[status] += 1
                    kinds[kind] += 1
                    if 200 <= status < 300 and checkable and not _parses(body, headers):
                        acked_unparsable.append(kind)
            if k % 500 == 0:
                with lock:
                    rss_peak = max(rss_peak, relay.rss())
        conn.close()

    pool = [threading.Thread(target=worker, args=(i, bodies // threads)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    fuzz_s = time.monotonic() - t0
    slow = _slow_bodies(relay)
    drain(relay, 60)
    # too_old: a mutated timestamp can make a sample older than max_sample_age: dropped and counted,
    # not refused by the receiver
    failed_by = relay.by_label("gpu_relay_samples_failed_total", "reason")
    failed = sum(v for k, v in failed_by.items() if k != "too_old")
    alive = relay.alive()
    relay.stop()
    vm.stop()
    log = relay.log_text()
    five = sum(n for s, n in statuses.items() if s >= 500)
    hangs = statuses[-1] + slow.count("hang")
    rows = [
        ("bodies", f"{sum(statuses.values()):,} in {fuzz_s:.0f}s"),
        ("statuses", ", ".join(f"{s}: {n:,}" for s, n in sorted(statuses.items()))),
        ("mutation kinds", ", ".join(f"{k}: {n:,}" for k, n in sorted(kinds.items()))),
        ("5xx", str(five)),
        ("hangs (no answer in 15 s)", str(hangs)),
        ("acked but not parseable by protobuf", str(len(acked_unparsable))),
        ("samples the receiver refused", f"{failed:,.0f}"),
        ("failed by reason", ", ".join(f"{k}: {v:,.0f}" for k, v in failed_by.items()) or "none"),
        ("slow bodies", ", ".join(slow)),
        ("RSS before / peak MB", f"{rss0:.1f} / {rss_peak:.1f}"),
        ("internal errors / tracebacks in log", f"{log.count('internal error')} / {log.count('Traceback')}"),
    ]
    ok = (
        alive
        and five == 0
        and hangs == 0
        and not acked_unparsable
        and failed == 0
        and "Traceback" not in log
        and rss_peak < rss0 + 200
    )
    return Outcome("fuzz", ok, rows)


def _slow_bodies(relay: Relay, wait_s: float = 45.0) -> list[str]:
    """Requests whose body never arrives in full (sent concurrently): each must be answered (4xx)
    or closed by the relay's read timeout, not hold the connection forever. One word per request:
    the status and when it came, "closed", or "hang" (nothing within ``wait_s``)."""
    body = snappy.compress(_base_bodies()[0][0])
    out: list[str] = []

    def one(declared: int) -> None:
        s = socket.create_connection(("127.0.0.1", relay.port), timeout=wait_s)
        head = (
            f"POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Encoding: snappy\r\nContent-Length: {declared}\r\n\r\n"
        ).encode()
        s.sendall(head + body[: len(body) // 2])
        t0 = time.monotonic()
        try:
            reply = s.recv(200)
            word = (reply.split(b" ")[1].decode() if reply else "closed") + f"@{time.monotonic() - t0:.0f}s"
        except TimeoutError:
            word = "hang"
        finally:
            s.close()
        out.append(word)

    pool = [threading.Thread(target=one, args=(n,)) for n in (len(body), len(body) + 100)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sorted(out)
