"""Remote-write bodies built field by field with hostile values (tests/relay/ingest/wire_fields.py)
into the write endpoint, ``relay.control.service.Runtime.write``: every answer is a 204 or a 4xx
with a one-line reason, never a 5xx (a client error answered 5xx is retried by its sender forever,
issue 20 point 12), and it is exactly the answer of the Python reference run directly on the same
body (snappy or zstd, RW 2.0 -> 1.0, the route with the pipeline's own ``decide``, a refusal worded
by ``wire.route_error`` as the endpoint words it): same status, same text. With the native core
built, its C twins (``relay.native._crw2``, ``_cwire``) must also give the reference's results body
by body, bytes included; under ``GPU_RELAY_NATIVE=0`` the runtime
itself runs the reference, and the endpoint is checked against the reference's direct answers.

RELAY_FUZZ_FIELD_EXAMPLES sets the examples (default 2000: about 15 s per core mode on a busy
2-core machine); run many once with e.g. ``RELAY_FUZZ_FIELD_EXAMPLES=20000``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import snappy
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.common.protowire import WireError
from relay.config.config import load_config
from relay.control.service import Runtime
from relay.ingest import request_body, wire, wire_errors, wire_v2
from relay.rules.label_codec import py_decode_key
from tests.relay.ingest.wire_fields import v1_requests, v2_requests

EXAMPLES = int(os.environ.get("RELAY_FUZZ_FIELD_EXAMPLES", "2000"))
MAX_BYTES = 1 << 20
CONTENT_TYPES = {1: "application/x-protobuf", 2: "application/x-protobuf;proto=io.prometheus.write.v2.Request"}
NATIVE = wire.route_loop is not wire._route_loop or wire_v2.v2_to_v1 is not wire_v2.py_v2_to_v1
Outcome = tuple[Any, ...]


@st.composite
def bodies(draw: st.DrawFn) -> tuple[int, str, bytes, bytes]:
    """(version, Content-Encoding, the protobuf bytes, the body as sent)."""
    version = draw(st.sampled_from([1, 2]))
    raw = draw(v1_requests() if version == 1 else v2_requests())
    encoding = draw(st.sampled_from(["snappy", "snappy", "snappy", "zstd"]))
    body = bytes(snappy.compress(raw)) if encoding == "snappy" else zstandard.ZstdCompressor().compress(raw)
    return version, encoding, raw, body


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """Two destinations, one as it comes, one with rules (keep, rename, labeldrop): never started,
    so what is queued stays queued."""
    tmp = tmp_path_factory.mktemp("fields")
    path = tmp / "relay.yaml"
    path.write_text(
        f"server: {{listen: '127.0.0.1:9201', max_request_bytes: {MAX_BYTES}}}\n"
        f"storage: {{path: {tmp / 'queues'}}}\n"
        "external_labels: {cluster: c1}\n"
        "destinations:\n"
        "  - name: all\n    url: http://127.0.0.1:1/api/v1/write\n"
        "  - name: gpu\n    url: http://127.0.0.1:1/api/v1/write\n"
        "    write_relabel_configs:\n"
        "      - {source_labels: [__name__], regex: 'DCGM_.*|rpc_.*', action: keep}\n"
        "      - {source_labels: [gpu], target_label: device, replacement: 'nvidia$1'}\n"
        "      - {regex: instance, action: labeldrop}\n"
    )
    rt = Runtime(str(path), load_config(path))
    yield rt
    rt.stop()


def outcome(fn: Callable[[], Any]) -> Outcome:
    try:
        return ("ok", fn())
    except WireError as e:
        return ("WireError", e.status, e.message)
    except Exception as e:  # what must never happen: the comparisons below show it
        return (type(e).__name__, str(e))


def reference_decode(version: int, encoding: str, body: bytes) -> bytes:
    """The Python reference's RW 1.0 bytes of a body (WireError as the endpoint must answer it)."""
    decompress = wire.py_decompress if encoding == "snappy" else request_body.zstd_decompress
    raw = decompress(body, MAX_BYTES)
    return wire_v2.py_v2_to_v1(raw, MAX_BYTES)[0] if version == 2 else raw


def reference_answer(version: int, encoding: str, body: bytes, n: int,
                     decide: Callable[[bytes], wire.Decision]) -> tuple[Any, ...]:
    """The reference's route of a body; its refusal named as the endpoint names it (``wire.route_error``,
    the one place above both cores that words a route's refusal with its field)."""
    v1 = reference_decode(version, encoding, body)
    try:
        return routed(wire._route_loop, v1, n, decide)
    except WireError as e:
        raise wire_errors.route_error(e, v1, version) from None


def routed(loop: Any, v1: bytes, n: int, decide: Callable[[bytes], wire.Decision]) -> tuple[Any, ...]:
    per_dest: list[list[wire.RoutedEntry]] = [[] for _ in range(n)]
    metadata: list[bytes] = []
    cache: dict[bytes, wire.Decision] = {}
    counts = loop(v1, cache, decide, per_dest, metadata)
    return counts, per_dest, metadata, cache


def checked(decide: Callable[[bytes], wire.Decision]) -> Callable[[bytes], wire.Decision]:
    """The pipeline's ``decide`` behind the reference's label-set check (py_decode_key)."""

    def reference(key: bytes) -> wire.Decision:
        py_decode_key(key)  # an invalid label set: its WireError, as the reference raises it
        return decide(key)

    return reference


outcomes: dict[str, int] = {}


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(case=bodies())
def test_field_built_bodies_answer_the_references_2xx_or_4xx_never_5xx(
    runtime: Runtime, case: tuple[int, str, bytes, bytes]
) -> None:
    version, encoding, raw, body = case
    headers = {"content-type": CONTENT_TYPES[version], "content-encoding": encoding}
    reply = runtime.write(headers, body)  # never raises: its last resort is a 503 (the bug)
    assert reply.status == 204 or 400 <= reply.status < 500, (reply.status, reply.body)

    n = len(runtime.pipeline.stages) + 1
    decide = checked(runtime.pipeline.decide)
    want = outcome(lambda: reference_answer(version, encoding, body, n, decide))
    if want[0] == "ok":
        assert reply.status == 204, (reply.status, reply.body)
        outcomes["accepted"] = outcomes.get("accepted", 0) + 1
    else:
        assert want[0] == "WireError", want  # the reference itself: a client error, or nothing
        assert (reply.status, reply.body) == (want[1], (want[2] + "\n").encode())
        outcomes[str(want[1])] = outcomes.get(str(want[1]), 0) + 1
    if not NATIVE:
        return
    # the C twins, function by function, against the reference: results (bytes) and errors alike
    if version == 2:
        assert outcome(lambda: wire_v2.v2_to_v1(raw, MAX_BYTES)) == outcome(lambda: wire_v2.py_v2_to_v1(raw, MAX_BYTES))
    v1 = outcome(lambda: reference_decode(version, encoding, body))
    if v1[0] == "ok":
        simple = checked(lambda key: ((key, wire.series_id(key), ""),) * n)
        assert outcome(lambda: routed(wire.route_loop, v1[1], n, simple)) == outcome(
            lambda: routed(wire._route_loop, v1[1], n, simple))


def test_zz_field_fuzz_outcomes_cover_acceptance_and_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs after the property test (file order): the bodies must be accepted often enough to reach
    the pipeline and refused often enough to reach the checks."""
    if not outcomes:
        pytest.skip("the property test did not run in this session")
    total = sum(outcomes.values())
    with capsys.disabled():
        print(f"\nfield-built bodies: {total}, outcomes {dict(sorted(outcomes.items()))} (native: {NATIVE})")
    assert outcomes.get("accepted", 0) >= total // 10 and outcomes.get("400", 0) >= total // 10, outcomes

