"""Mutated RW 1.0 and 2.0 bodies: every rejection is a 4xx with a one-line reason, nothing else
escapes the decoder, and whatever is accepted parses with protobuf's own parser, in and out.

The examples per test come from RELAY_FUZZ_EXAMPLES (default small, for CI); run a large number
once with e.g. ``RELAY_FUZZ_EXAMPLES=20000 pytest tests/relay/ingest/test_wire_fuzz.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import snappy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.common.labels import Labels
from relay.common.protowire import encode_len, encode_uvarint
from relay.ingest import wire
from relay.proto import remote_v1_pb2 as v1pb
from relay.proto import remote_v2_pb2 as v2pb
from tests.relay.ingest.test_wire import build_v2, raw_requests, v2_series

EXAMPLES = int(os.environ.get("RELAY_FUZZ_EXAMPLES", "300"))
RW1_TYPE = "application/x-protobuf"
RW2_TYPE = "application/x-protobuf;proto=io.prometheus.write.v2.Request"


def label_entry(name: bytes, value: bytes) -> bytes:
    return encode_len(1, encode_len(1, name) + encode_len(2, value))


# ---- bodies ---------------------------------------------------------------------------------------


@st.composite
def v1_bodies(draw: st.DrawFn) -> bytes:
    raw: bytes = draw(raw_requests())
    extra = draw(st.sampled_from(["none", "none", "duplicate label", "empty label name", "no labels"]))
    sample = encode_len(2, b"\x09" + bytes(8) + b"\x10\x01")
    if extra == "duplicate label":
        raw += encode_len(1, label_entry(b"a", b"1") + label_entry(b"a", b"2") + sample)
    elif extra == "empty label name":
        raw += encode_len(1, label_entry(b"", b"1") + sample)
    elif extra == "no labels":
        raw += encode_len(1, sample)
    return raw


@st.composite
def v2_bodies(draw: st.DrawFn) -> bytes:
    raw, _ = build_v2(draw(st.lists(v2_series, max_size=4)))
    req = v2pb.Request.FromString(raw)
    extra = draw(st.sampled_from(["none", "none", "bad symbol ref", "odd refs", "empty name", "duplicate name",
                                  "bad first symbol", "histogram and samples"]))
    n = len(req.symbols)
    if extra == "bad symbol ref":
        req.timeseries.add(labels_refs=[1, n + draw(st.integers(0, 2**31))]).samples.add(value=1.0, timestamp=1)
    elif extra == "odd refs":
        req.timeseries.add(labels_refs=[0]).samples.add(value=1.0)
    elif extra == "empty name" and n > 1:
        req.timeseries.add(labels_refs=[0, 1]).samples.add(value=1.0)
    elif extra == "duplicate name" and n > 2:
        req.timeseries.add(labels_refs=[1, 2, 1, 2]).samples.add(value=1.0)
    elif extra == "bad first symbol" and n:
        req.symbols[0] = "x"
    elif extra == "histogram and samples" and n > 2:
        t = req.timeseries.add(labels_refs=[1, 2])
        t.samples.add(value=1.0, timestamp=5)
        t.histograms.add(count_int=1, timestamp=4, positive_spans=[v2pb.BucketSpan(length=1)], positive_deltas=[1])
    return bytes(req.SerializeToString())


MUTATIONS = ["none", "truncate", "flip", "insert", "delete", "huge length", "bad varint", "invalid utf-8",
             "wrong wire type"]


V2_LENGTH_TAGS = (b"\x0a", b"\x12", b"\x1a", b"\x22", b"\x2a")
V2_WIRE_TAGS = (0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x09, 0x10, 0x11, 0x18)


def mutate(draw: st.DrawFn, raw: bytes, kinds: Sequence[str] = MUTATIONS, *,
           length_tags: Sequence[bytes] = V2_LENGTH_TAGS, lengths: Sequence[int] = (2**31, 2**32 - 1, 2**63, 2**64 - 1),
           varint_ends: Sequence[bytes] = (b"",), wire_tags: Sequence[int] = V2_WIRE_TAGS) -> bytes:
    """One of ``kinds`` done to ``raw`` at a drawn position (the defaults: RW 2.0 bodies; the RW 1.0
    differential tests pass their own tags)."""
    kind = draw(st.sampled_from(list(kinds)))
    if kind == "none" or not raw:
        return raw
    i = draw(st.integers(0, len(raw) - 1))
    if kind == "truncate":
        return raw[:i]
    if kind == "flip":
        return raw[:i] + bytes((draw(st.integers(0, 255)),)) + raw[i + 1 :]
    if kind == "insert":
        return raw[:i] + draw(st.binary(min_size=1, max_size=12)) + raw[i:]
    if kind == "delete":
        return raw[:i] + raw[i + draw(st.integers(1, 16)) :]
    if kind == "huge length":
        tag = draw(st.sampled_from(list(length_tags)))
        return raw[:i] + tag + encode_uvarint(draw(st.sampled_from(list(lengths)))) + raw[i:]
    if kind == "bad varint":
        last = draw(st.sampled_from(list(varint_ends)))
        return raw[:i] + b"\x10" + b"\xff" * draw(st.integers(9, 12)) + last + raw[i:]
    letters = [j for j, b in enumerate(raw) if 0x61 <= b <= 0x7A or 0x41 <= b <= 0x5A]
    if kind == "invalid utf-8" and letters:
        j = draw(st.sampled_from(letters))
        return raw[:j] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + raw[j + 1 :]
    tags = [j for j, b in enumerate(raw) if b in wire_tags]
    if kind == "wrong wire type" and tags:
        j = draw(st.sampled_from(tags))
        return raw[:j] + bytes(((raw[j] & ~7) | draw(st.sampled_from([0, 1, 2, 3, 5, 6, 7])),)) + raw[j + 1 :]
    return raw


def mutate_snappy(draw: st.DrawFn, body: bytes) -> bytes:
    kind = draw(st.sampled_from(["none", "none", "none", "truncate", "lying length", "flip", "garbage"]))
    if kind == "truncate":
        return body[: draw(st.integers(0, max(0, len(body) - 1)))]
    if kind == "lying length":
        length, pos = snappy_header(body)
        lie = draw(st.sampled_from([0, max(0, length - 1), length + 1, 2**31, 2**32 - 1, 2**40]))
        return encode_uvarint(lie) + body[pos:]
    if kind == "flip" and body:
        i = draw(st.integers(0, len(body) - 1))
        return body[:i] + bytes((draw(st.integers(0, 255)),)) + body[i + 1 :]
    if kind == "garbage":
        return draw(st.binary(max_size=64))
    return body


def snappy_header(body: bytes) -> tuple[int, int]:
    value = shift = pos = 0
    while pos < len(body):
        b = body[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    return value, pos


@st.composite
def write_bodies(draw: st.DrawFn) -> tuple[int, bytes]:
    version = draw(st.sampled_from([1, 2]))
    raw = draw(v1_bodies() if version == 1 else v2_bodies())
    raw = mutate(draw, raw)
    return version, mutate_snappy(draw, bytes(snappy.compress(raw)))


# ---- what the relay does with a body, up to what it would queue ---------------------------------------


def pipeline_like_decide(choice: Callable[[Labels, int], int], n_dest: int) -> Callable[[bytes], wire.Decision]:
    """Like relay.pipeline: the input series' entry, then per destination keep, drop or rename."""

    def decide(key: bytes) -> wire.Decision:
        labels = wire.decode_labels(key)
        out: list[wire.DestDecision | None] = [(key, wire.series_id(key), "")]
        for dest in range(n_dest):
            action = choice(labels, dest)
            if action == 1:
                out.append(None)
                continue
            result = labels if action == 0 else tuple(sorted({**dict(labels), "renamed": "x"}.items()))
            lb = wire.encode_labels(result)
            out.append((lb, wire.series_id(lb), ""))
        return tuple(out)

    return decide


def relay_decode(version: int, body: bytes, max_bytes: int, cache: dict[bytes, wire.Decision],
                 decide: Callable[[bytes], wire.Decision]) -> tuple[bytes, wire.Routed]:
    """relay.service.Runtime.write's decoding: decompress, transcode v2, route."""
    raw = wire.decompress(body, max_bytes)
    v1 = wire.v2_to_v1(raw, max_bytes)[0] if version == 2 else raw
    return raw, wire.route(v1, 3, cache, decide)


def check_accepted(version: int, raw: bytes, routed: wire.Routed) -> None:
    message = v1pb.WriteRequest() if version == 1 else v2pb.Request()
    message.ParseFromString(raw)  # what was acknowledged parses with protobuf's own parser
    for dest in routed.per_dest[1:]:
        out = wire.encode_routed(dest, routed.metadata)  # and so does what would be queued
        parsed = v1pb.WriteRequest.FromString(out)
        assert len(parsed.timeseries) == len(dest)
        again = wire.route(out, 1, {}, lambda k: ((k, 0, ""),))  # and it passes the relay's own checks
        assert again.series_in == len(dest)


outcomes: dict[str, int] = {}


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(write_bodies(), st.integers(0, 2**32), st.sampled_from([1 << 20, 1 << 20, 300]))
def test_mutated_bodies_are_4xx_or_accepted_and_parse_with_protobuf(
    case: tuple[int, bytes], seed: int, max_bytes: int
) -> None:
    version, body = case
    decide = pipeline_like_decide(lambda labels, dest: hash((labels, dest, seed)) % 3, 2)
    cache: dict[bytes, wire.Decision] = {}
    try:
        raw, routed = relay_decode(version, body, max_bytes, cache, decide)
    except wire.WireError as e:
        assert 400 <= e.status < 500 and e.message and "\n" not in e.message
        outcomes[str(e.status)] = outcomes.get(str(e.status), 0) + 1
        return
    check_accepted(version, raw, routed)
    outcomes["accepted"] = outcomes.get("accepted", 0) + 1
    _, again = relay_decode(version, body, max_bytes, cache, decide)  # the cached path agrees
    assert [[(e[1], e[2], e[3]) for e in d] for d in again.per_dest] == [
        [(e[1], e[2], e[3]) for e in d] for d in routed.per_dest]


def test_zz_fuzz_outcomes_cover_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    # runs after the property test (file order): the mutations must both pass and fail the decoder
    if not outcomes:
        pytest.skip("the property test did not run in this session")
    with capsys.disabled():
        print(f"\nfuzzed bodies: {sum(outcomes.values())}, outcomes {dict(sorted(outcomes.items()))}")
    assert outcomes.get("accepted", 0) > 0 and outcomes.get("400", 0) > 0


# ---- the same bodies over HTTP into the real relay, to a receiver that parses what it gets ---------------


class _Receiver(BaseHTTPRequestHandler):
    server: ParsingReceiver
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            req = v1pb.WriteRequest.FromString(snappy.uncompress(body))
            with self.server.lock:
                self.server.series += len(req.timeseries)
        except Exception as e:
            with self.server.lock:
                self.server.bad.append(f"{type(e).__name__}: {e}")
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()


class ParsingReceiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receiver)
        self.lock = threading.Lock()
        self.series = 0
        self.bad: list[str] = []


@contextmanager
def running_relay(tmp_path: Path, receiver_url: str) -> Iterator[tuple[Any, Any]]:
    from relay.config.config import load_config
    from relay.control.service import Runtime
    from relay.ingest.server import RelayHTTPServer

    path = tmp_path / "relay.yaml"
    path.write_text(
        "server: {listen: '127.0.0.1:9201', max_request_bytes: 65536}\n"
        f"storage: {{path: {tmp_path / 'queues'}}}\n"
        "destinations:\n"
        f"  - name: rx\n    url: {receiver_url}\n"
        "    queue: {batch_send_deadline: 20ms, max_shards: 2, min_backoff: 10ms, max_backoff: 50ms}\n"
    )
    runtime = Runtime(str(path), load_config(path))
    server = RelayHTTPServer(("127.0.0.1", 0), runtime)
    runtime.start()
    server.start()
    try:
        yield runtime, server
    finally:
        server.stop()
        runtime.stop()


def test_mutated_bodies_over_http_never_5xx_and_what_is_delivered_parses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    import http.client

    caplog.set_level(logging.WARNING)
    rx = ParsingReceiver()
    rx_thread = threading.Thread(target=rx.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    rx_thread.start()
    statuses: dict[int, int] = {}
    try:
        with running_relay(tmp_path, f"http://127.0.0.1:{rx.server_address[1]}/api/v1/write") as (runtime, server):
            conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)

            @settings(max_examples=max(50, EXAMPLES // 5), deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
            @given(write_bodies())
            def post(case: tuple[int, bytes]) -> None:
                version, body = case
                headers = {"Content-Type": RW1_TYPE if version == 1 else RW2_TYPE, "Content-Encoding": "snappy"}
                conn.request("POST", "/api/v1/write", body=body, headers=headers)
                resp = conn.getresponse()
                reply = resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1
                assert resp.status == 204 or 400 <= resp.status < 500, (resp.status, reply)
                assert resp.status == 204 or reply.count(b"\n") == 1
                if resp.status == 204:
                    raw = snappy.uncompress(body)
                    (v1pb.WriteRequest() if version == 1 else v2pb.Request()).ParseFromString(raw)

            post()
            conn.close()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and runtime.destinations["rx"].queue.depth()[0] > 0:
                time.sleep(0.05)
            assert runtime.destinations["rx"].queue.depth()[0] == 0
    finally:
        rx.shutdown()
        rx.server_close()
        rx_thread.join(5)
    with capsys.disabled():
        print(f"\nfuzzed bodies over HTTP: {sum(statuses.values())}, statuses {dict(sorted(statuses.items()))}, "
              f"series delivered {rx.series}, unparsable deliveries {len(rx.bad)}")
    assert rx.bad == []
    assert statuses.get(204, 0) > 0 and sum(n for s, n in statuses.items() if s >= 500) == 0, statuses
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
