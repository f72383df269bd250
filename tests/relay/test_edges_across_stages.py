"""Hostile-review reproductions for what landed on main after 3c4de33: request and response heads
(relay.http_head, the server's parse_request), the queue's wake-ups and group inserts, the literal
name filter and the native tables. Each test pins an edge the code's own tests did not cover."""

from __future__ import annotations

import http.client
import io
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.common.http_head import MAX_HEADERS, Response
from relay.delivery.queue.durable import ENTRY_OVERHEAD_BYTES, DurableQueue
from tests.helpers import REPO_ROOT
from tests.relay.ingest.test_write_endpoint_http import (
    WRITE_HEAD,
    Recorder,
    Serve,
    connect,
    read_until_closed,
    serve,
    status_of,
)

__all__ = ["serve"]  # the fixture, imported for its use here


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[DurableQueue]:
    q = DurableQueue(tmp_path / "dest.queue.db", 1 << 20, clock=lambda: 1000.0)
    yield q
    q.close()


class _Sock:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.raw))


def _begin(cls: type[http.client.HTTPResponse], raw: bytes) -> str:
    r = cls(_Sock(raw), method="POST")  # type: ignore[arg-type]
    try:
        r.begin()
    except http.client.HTTPException as e:
        return type(e).__name__
    return f"{r.status}"


# ---- response heads: the limits hold for lines the lenient reader drops or folds ----------------

@pytest.mark.parametrize("line", [b"not a header line\r\n", b"  folded onto the previous value\r\n",
                                  b"Bad Name: v\r\n"])
def test_a_response_head_of_endless_dropped_or_folded_lines_is_refused_like_http_clients(line: bytes) -> None:
    # a receiver (or anything between) that streams such lines must not hold the sender forever nor
    # grow a value without bound: http.client counts every line against its 100, so must we
    raw = b"HTTP/1.1 200 OK\r\nX-A: 1\r\n" + line * (MAX_HEADERS + 5) + b"Content-Length: 0\r\n\r\n"
    assert _begin(http.client.HTTPResponse, raw) == "HTTPException"
    assert _begin(Response, raw) == "HTTPException"


def test_an_interim_100_heads_lines_count_against_the_limit_too() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n" + b"junk\r\n" * (MAX_HEADERS + 5) + b"\r\nHTTP/1.1 204 No Content\r\n\r\n"
    assert _begin(http.client.HTTPResponse, raw) == "HTTPException"
    assert _begin(Response, raw) == "HTTPException"


def test_a_connect_tunnel_refused_with_407_is_an_oserror_with_the_transports_response_class() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        seen: list[bytes] = []

        def proxy() -> None:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                seen.append(data)
                conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n"
                             b"Content-Length: 5\r\n\r\nnope!")
                time.sleep(0.2)

        t = threading.Thread(target=proxy)
        t.start()
        conn = http.client.HTTPConnection("127.0.0.1", listener.getsockname()[1], timeout=5)
        conn.response_class = Response
        conn.set_tunnel("example.invalid", 443, headers={"Proxy-Authorization": "Basic eA=="})
        with pytest.raises(OSError, match="Tunnel connection failed: 407"):
            conn.connect()
        t.join()
        conn.close()
    assert seen[0].startswith(b"CONNECT example.invalid:443 HTTP/1.")
    assert b"Proxy-Authorization: Basic eA==\r\n" in seen[0]


# ---- request heads through the real server ------------------------------------------------------

def _replies(sock: socket.socket, count: int, timeout: float = 3.0) -> list[bytes]:
    """``count`` replies read off a kept-alive connection (each has a Content-Length)."""
    sock.settimeout(timeout)
    buf = b""
    out: list[bytes] = []
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, (out, buf)
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        length = int(head.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(rest) < length:
            rest += sock.recv(65536)
        out.append(head + b"\r\n\r\n" + rest[:length])
        buf = rest[length:]
    return out


def test_pipelined_writes_with_their_bodies_in_one_segment_are_each_served_in_order(serve: Serve) -> None:
    ep = Recorder()
    with connect(serve(ep)) as sock:
        sock.sendall(WRITE_HEAD + b"Content-Length: 3\r\n\r\none"
                     + WRITE_HEAD + b"Content-Length: 3\r\n\r\ntwo"
                     + b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"
                     + WRITE_HEAD + b"Content-Length: 5\r\n\r\nthree")
        replies = _replies(sock, 4)
    assert [status_of(r) for r in replies] == [204, 204, 200, 204]
    assert [b for _, b in ep.writes] == [b"one", b"two", b"three"]


def test_a_head_split_across_segments_at_every_byte_is_read_whole(serve: Serve) -> None:
    ep = Recorder()
    raw = WRITE_HEAD + b"X-Split: a\xe9b\r\nContent-Length: 2\r\n\r\nok"
    with connect(serve(ep)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(raw)):
            sock.sendall(raw[i : i + 1])
            if i % 16 == 0:
                time.sleep(0.002)
        [reply] = _replies(sock, 1)
    assert status_of(reply) == 204
    [(headers, body)] = ep.writes
    assert body == b"ok" and headers["x-split"] == "a\u00e9b"


def test_a_malformed_head_after_a_served_request_on_one_connection_is_400_and_closes(serve: Serve) -> None:
    ep = Recorder()
    with connect(serve(ep)) as sock:
        sock.sendall(WRITE_HEAD + b"Content-Length: 2\r\n\r\nok")
        [first] = _replies(sock, 1)
        sock.sendall(WRITE_HEAD + b"Content-Length : 2\r\n\r\nno")
        rest = read_until_closed(sock, timeout=2)
    assert status_of(first) == 204 and status_of(rest) == 400 and not rest.endswith(b"<still open>")
    assert [b for _, b in ep.writes] == [b"ok"]


@pytest.mark.parametrize("raw", [
    WRITE_HEAD + b"Content-Length: 2\rX-Smuggled: 1\r\n\r\nok",  # a bare CR inside a line
    WRITE_HEAD + b"Content-Length: 2\r\n\rX: 1\r\n\r\nok",  # a line starting with a bare CR
    WRITE_HEAD + b"Content-Length: 2\r\nX-Nul: a\0b\r\n\r\nok",
])
def test_bare_cr_and_nul_in_a_request_head_are_refused(serve: Serve, raw: bytes) -> None:
    ep = Recorder()
    with connect(serve(ep)) as sock:
        sock.sendall(raw)
        answer = read_until_closed(sock, timeout=2)
    assert status_of(answer) == 400 and ep.writes == []


def test_a_head_request_on_a_kept_alive_connection_gets_no_body_and_the_next_request_is_served(
    serve: Serve
) -> None:
    with connect(serve()) as sock:
        sock.sendall(b"HEAD /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(2)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            assert chunk
            head += chunk
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing after HEAD's head
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        [second] = _replies(sock, 1)
    assert status_of(head) == 200 and head.endswith(b"\r\n\r\n") and status_of(second) == 200


# ---- the queue: group commits that trim, waits with thresholds ------------------------------------

def test_concurrent_puts_that_trim_keep_order_ids_and_exact_counts(tmp_path: Path) -> None:
    # group commit + one INSERT ... RETURNING per put + queue_full trimming: what survives is in id
    # order per shard, each writer's entries in put order, and dropped + queued == put, to the sample
    entry = 300 + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "q.db", 40 * entry, clock=lambda: 1000.0)
    dropped = [0] * 6
    try:
        def writer(w: int) -> None:
            for i in range(30):
                pieces = [(s, f"{w}:{i}:".encode().ljust(300, b"x"), 1 + s, 0) for s in range(w % 3 + 1)]
                dropped[w] += q.put(pieces)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        put = sum(sum(1 + s for s in range(w % 3 + 1)) * 30 for w in range(6))
        kept = {s: q.peek(s, 10_000, 10_000) for s in q.shards()}
        samples = sum(e.samples for es in kept.values() for e in es)
        assert q.depth()[0] == samples and samples + sum(dropped) == put
        assert sum(len(es) for es in kept.values()) <= 40
        for es in kept.values():
            assert [e.id for e in es] == sorted(e.id for e in es)
            for w in range(6):
                mine = [int(e.payload.split(b":")[1]) for e in es if e.payload.startswith(f"{w}:".encode())]
                assert mine == sorted(mine)
        assert q.last_id() == max(e.id for es in kept.values() for e in es)
    finally:
        q.close()


def test_two_waits_on_one_shard_with_different_thresholds_each_wake_at_their_own(queue: DurableQueue) -> None:
    low: list[bool] = []
    high: list[bool] = []
    t_low = threading.Thread(target=lambda: low.append(queue.wait(0, 10, min_samples=2)))
    t_high = threading.Thread(target=lambda: high.append(queue.wait(0, 10, min_samples=5)))
    t_low.start()
    t_high.start()
    deadline = time.monotonic() + 2
    while len(queue._wants.get(0, ())) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.put([(0, b"a", 2)])
    t_low.join(2)
    time.sleep(0.05)
    assert low == [True] and high == []  # the low one's wake-up left the high one asleep
    queue.put([(0, b"b", 3)])
    t_high.join(2)
    assert high == [True] and queue._wants[0] == []


def test_close_wakes_a_threshold_wait_that_no_put_would_fill(queue: DurableQueue) -> None:
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(queue.wait(0, 30, min_samples=10**9)))
    t.start()
    deadline = time.monotonic() + 2
    while not queue._wants.get(0) and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.put([(0, b"a", 1)])
    started = time.monotonic()
    queue.close()
    t.join(2)
    assert woke == [False] and time.monotonic() - started < 2


# ---- the literal name filter: regexes that only look literal, names that nearly match -------------

@pytest.mark.parametrize(("regex", "literal"), [
    ("up|up", True), ("up|", False), ("|up", False), ("", False), ("u.", False), ("^up$", False),
    (r"u\_p", False), ("(?i)up", False), ("up$", False), ("u+p", False), ("[u]p", False), ("up\n", False),
])
@pytest.mark.parametrize("action", ["keep", "drop"])
def test_a_name_filter_answers_as_the_regex_for_names_that_nearly_match(regex: str, literal: bool, action: str) -> None:
    from relay.rules.relabel import parse_relabel_config, process
    from relay.rules.rule_plan import RulePlan, name_filter, names_of

    rules = [parse_relabel_config({"source_labels": ["__name__"], "regex": regex, "action": action})]
    assert (name_filter(rules[0]) is not None) is literal
    plan = RulePlan(rules)
    for name in ["up", "UP", "Up", "up\n", "\nup", "up ", "u", "upp", "", "ub", "u\np", "up|up", "úp"]:
        labels = (("__name__", name), ("job", "j"))
        want = process(labels, rules)
        assert plan.apply(labels, names_of(labels)) == (None if want is None else (want, names_of(want))), name


# ---- native tables: a mapping that cannot grow (mmap / mremap failing) --------------------------

_OUT_OF_SPACE = r"""
import resource, sys
from relay import native
cd, cs = native.load("cdcache"), native.load("cstage")
if cd is None or cs is None:
    print("skip"); sys.exit(0)
EXT = b"\n\x0c\n\x07cluster\x12\x01c"
POS_SHIFT = int(sys.argv[1])
keys = [b"series-%d" % i for i in range(400_000)]
ids = [(i * 0x9E3779B97F4A7C15 | 1) & (2**64 - 1) for i in range(400_000)]
t, s = cd.DecisionTable(2), cs.Table()
for i in range(40_000):  # past a mebibyte: their own mappings from here on
    t[keys[i]] = ((keys[i], i, "m"), (EXT, i | 1 << POS_SHIFT, "m"))
    s.put(ids[i], i)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
with open("/proc/self/statm") as f:
    used = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (24 << 20), hard))  # a little room, then none
failed = {"cdcache": 0, "cstage": 0}
n_t = n_s = 40_000
for i in range(40_000, len(keys)):
    if not failed["cdcache"]:
        try:
            t[keys[i]] = ((keys[i], i, "m"), (EXT, i | 1 << POS_SHIFT, "m"))
            n_t += 1
        except MemoryError:
            failed["cdcache"] = i
    if not failed["cstage"]:
        try:
            s.put(ids[i], i)
            n_s += 1
        except MemoryError:
            failed["cstage"] = i
    if all(failed.values()):
        break
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
assert all(failed.values()), failed  # both hit the limit
assert len(t) == n_t and len(s) == n_s, (len(t), n_t, len(s), n_s)
assert all(t[keys[i]][0][1] == i for i in range(n_t))
assert all(s.get(ids[i]) == i for i in range(n_s))
s.check()
t[keys[n_t]] = ((keys[n_t], n_t, "m"), None)  # grows again once there is room
assert len(t) == n_t + 1
t.clear(); del s
print("ok", failed)
"""


def test_native_tables_that_cannot_grow_raise_memoryerror_and_keep_every_entry(tmp_path: Path) -> None:
    import subprocess
    import sys

    from relay import native
    from relay.state.stage import POS_SHIFT

    if native.load("cdcache") is None or native.load("cstage") is None:
        pytest.skip("native modules off or not built")
    script = tmp_path / "oos.py"
    script.write_text(_OUT_OF_SPACE)
    done = subprocess.run([sys.executable, str(script), str(POS_SHIFT)], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0 and done.stdout.startswith("ok"), (done.stdout, done.stderr[-2000:])


# ---- label values' slots mod 2**16: what counts around the wrap, in both trackers ---------------

def _trackers() -> list[str]:
    from relay import native
    return ["python"] + (["c"] if native.load("cstage") is not None else [])


@pytest.mark.parametrize("kind", _trackers())
def test_label_values_count_by_their_true_slot_across_the_2_16_wrap(kind: str) -> None:
    from relay.state import cardinality

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    cls = cardinality.PySeriesTracker if kind == "python" else cardinality.CSeriesTracker
    t = cls(60.0, clock, slots=60, max_values=100)  # one slot a second

    def uid(sid: int, value: str) -> None:
        t.observe(sid, "m", (("__name__", "m"), ("uid", value)))

    uid(1, "early")  # slot 0
    clock.t = 30.0
    assert t.expire() == 0  # cutoff below 0: the base stays at 0
    clock.t = 65_535.0  # 2**16 - 1 slots on, no expire since: no sweep yet, the value is still counted
    uid(2, "late")  # kept as 65535 mod 2**16: read back as 65535, not as a slot before 0
    assert t.top_labels(5, "m") == [("uid", 2)]
    clock.t = 65_535.0 + 59
    t.expire()  # cutoff 65534: "early" (slot 0) leaves, "late" (65535) is in the window
    assert t.top_labels(5, "m") == [("uid", 1)]
    clock.t = 65_535.0 + 2 * 65_536  # two wraps on without expire: the next labels noted sweep first
    uid(3, "later")
    assert t.top_labels(5, "m") == [("uid", 1)]  # "late" swept, though expire() never ran
    clock.t += 59
    t.expire()
    assert t.top_labels(5, "m") == [("uid", 1)] and t.active() == 1
    clock.t += 2
    t.expire()
    assert t.top_labels(5, "m") == [] and t.active() == 0


@pytest.mark.parametrize("kind", _trackers())
def test_the_largest_window_of_slots_still_expires_values_exactly_across_wraps(kind: str) -> None:
    from relay.state import cardinality

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    slots = cardinality.MAX_SLOTS
    cls = cardinality.PySeriesTracker if kind == "python" else cardinality.CSeriesTracker
    t = cls(float(slots), clock, slots=slots, max_values=1000)  # one slot a second, 2**15 of them
    with pytest.raises(ValueError):
        cls(float(slots), clock, slots=slots + 1)
    for step in range(8):  # a value a quarter span apart, never an expire(): sweeps only
        clock.t = step * 16_384.0
        t.observe(step, "m", (("__name__", "m"), ("uid", f"v{step}")))
        # in the window: the values of the last 2**15 slots (older ones may linger until a sweep)
        assert t.top_labels(1, "m")[0][1] >= min(step + 1, 3)
    clock.t += 1
    t.expire()  # cutoff = now - 2**15: v6 (now - 16385) and v7 (now - 1) in, the rest out
    assert t.top_labels(1, "m") == [("uid", 2)]


def test_a_head_refused_as_malformed_with_a_large_body_behind_it_is_answered_not_reset(serve: Serve) -> None:
    # the strict 400 is new for lines email used to accept: the body still on the wire must not turn
    # the close into a reset that destroys the answer before the client reads it
    ep = Recorder()
    body = b"x" * (3 << 20)
    errors: list[BaseException] = []
    with connect(serve(ep)) as sock:
        def send() -> None:
            try:
                sock.sendall(WRITE_HEAD + b"Content-Length : %d\r\n\r\n" % len(body) + body)
            except OSError as e:  # the server closed before taking it all: fine, the answer counts
                errors.append(e)

        sender = threading.Thread(target=send)
        sender.start()
        answer = read_until_closed(sock, timeout=5)
        sender.join(10)
    assert status_of(answer) == 400 and not answer.endswith((b"<still open>", b"<reset>")), answer[:100]
    assert ep.writes == []


def _one_shot_receiver(answer: bytes) -> tuple[socket.socket, threading.Thread]:
    """A receiver on 127.0.0.1 that reads one request head (and its body) and sends ``answer``."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_once() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, rest = data.split(b"\r\n\r\n", 1)
            length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            while len(rest) < length:
                rest += conn.recv(65536)
            try:
                conn.sendall(answer)
                time.sleep(0.2)
            except OSError:
                pass

    t = threading.Thread(target=serve_once)
    t.start()
    return listener, t


def test_the_transport_gives_up_on_a_receiver_whose_head_is_endless_junk_lines(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay.delivery.transport import NETWORK_ERROR, HttpTransport

    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    listener, t = _one_shot_receiver(b"HTTP/1.1 200 OK\r\n" + b"junk\r\n" * 5000 + b"Content-Length: 0\r\n\r\n")
    with listener:
        transport = HttpTransport()
        try:
            r = transport.post(f"http://127.0.0.1:{listener.getsockname()[1]}/api/v1/write", b"body", {}, 5.0)
        finally:
            transport.close()
        t.join(5)
    assert r.status == NETWORK_ERROR and b"too many headers" in r.body.lower(), r


def test_puts_of_every_row_count_prepare_a_bounded_number_of_insert_statements(tmp_path: Path) -> None:
    # each distinct VALUES count is its own prepared statement, and sqlite3 keeps 128 of them per
    # connection: puts of 873..1000 rows (max_shards in the thousands) held ~76 MiB in that cache alone
    q = DurableQueue(tmp_path / "q.db", 1 << 30, clock=lambda: 1000.0)
    try:
        shapes: set[int] = set()  # the VALUES rows of each INSERT run (the trace may expand parameters)
        q._wdb.set_trace_callback(
            lambda sql: shapes.add(sql.count("), (") + 1) if sql.startswith("INSERT INTO entries") else None)
        total = 0
        for rows in range(1, 400, 3):
            q.put([(s, b"p", 1, 0) for s in range(rows)])
            total += rows
        q._wdb.set_trace_callback(None)
        assert len(shapes) <= 40, len(shapes)
        assert q.depth()[0] == total
        first = q.peek(0, 10_000, 10_000)
        assert [e.id for e in first] == sorted(e.id for e in first) and len(first) == len(range(1, 400, 3))
    finally:
        q.close()
