"""relay.ingest.request_body: Content-Type and Content-Encoding (snappy, zstd) to RW 1.0 bytes, with
the same size limits for both encodings; and vmagent's protocol probe on the write endpoint."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
import snappy
import zstandard

from relay.common.protowire import WireError
from relay.ingest.request_body import decode_body, zstd_decompress
from relay.ingest.wire import encode_write_request
from relay.proto import remote_v2_pb2 as v2
from tests.relay.ingest.test_write_endpoint_http import Recorder, connect, status_of

RAW = encode_write_request([((("__name__", "up"), ("job", "a")), [(1000, 1.0)])])
V1 = "application/x-protobuf"
V2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
# what vmagent 1.116 sets on a write (app/vmagent/remotewrite/client.go, newRequest), names lower-cased
VMAGENT = {"user-agent": "vmagent", "content-type": V1, "content-encoding": "zstd",
           "x-victoriametrics-remote-write-version": "1"}


def _v2_request() -> bytes:
    r = v2.Request()
    r.symbols.extend(["", "__name__", "up", "job", "a"])
    ts = r.timeseries.add()
    ts.labels_refs.extend([1, 2, 3, 4])
    s = ts.samples.add()
    s.value, s.timestamp = 1.0, 1000
    return bytes(r.SerializeToString())


def zstd(raw: bytes) -> bytes:
    return bytes(zstandard.ZstdCompressor(level=1).compress(raw))


@pytest.mark.parametrize(("content_type", "encoding", "body", "stored"), [
    (V1, "snappy", snappy.compress(RAW), True),
    (V1, None, snappy.compress(RAW), True),  # no Content-Encoding: snappy, as Prometheus reads it
    (V1, "zstd", zstd(RAW), False),
    (V1, " ZSTD ", zstd(RAW), False),
    (V2, "snappy", snappy.compress(_v2_request()), False),
    (V2, "zstd", zstd(_v2_request()), False),
])
def test_both_versions_decode_from_snappy_and_zstd(content_type: str, encoding: str | None, body: bytes,
                                                   stored: bool) -> None:
    headers = {"content-type": content_type} | ({"content-encoding": encoding} if encoding else {})
    decoded = decode_body(headers, body, 1 << 20)
    assert decoded.raw == RAW
    assert decoded.stored == (body if stored else None)  # only a snappy RW 1.0 body is stored as it came
    assert (decoded.counts is not None) is (content_type == V2)


def test_a_zstd_body_exactly_as_vmagent_sends_it() -> None:
    decoded = decode_body(VMAGENT, zstd(RAW), 32 << 20)
    assert (decoded.raw, decoded.stored, decoded.counts) == (RAW, None, None)


@pytest.mark.parametrize("encoding", ["gzip", "br", "snappy, zstd", "identity"])
def test_other_encodings_are_415_naming_the_two_accepted(encoding: str) -> None:
    with pytest.raises(WireError) as e:
        decode_body({"content-type": V1, "content-encoding": encoding}, RAW, 1 << 20)
    assert e.value.status == 415
    assert "expected snappy or zstd" in str(e.value)


def _frame(fcs: int, payload: bytes) -> bytes:
    """A zstd frame by hand: single segment, an 8-byte content size ``fcs`` (true or not), one raw block."""
    header = b"\x28\xb5\x2f\xfd" + bytes((0xE0,)) + struct.pack("<Q", fcs)
    block = ((len(payload) << 3) | 1).to_bytes(3, "little")  # last block, raw
    return header + block + payload


@pytest.mark.parametrize(("body", "limit", "status", "needle"), [
    (zstd(b"x" * 1000), 999, 413, "1000 bytes exceeds the limit of 999"),
    (_frame(1 << 32, b"abc"), 32 << 20, 413, f"{1 << 32} bytes exceeds"),  # claims 4 GiB, holds 3 bytes
    (_frame(3, b"abcdef"), 1 << 20, 400, "corrupt zstd body"),  # claims 3 bytes, holds 6
    (zstd(b"x" * 600) * 2, 1000, 413, "exceeds the limit of 1000"),  # two frames, each under the limit
    (zstd(b"x" * 10) + b"junk", 1 << 20, 400, "corrupt zstd body"),
    (b"", 1 << 20, 400, "no valid zstd frame header"),
    (b"\x28\xb5\x2f\xfd", 1 << 20, 400, "no valid zstd frame header"),
    (snappy.compress(RAW), 1 << 20, 400, "no valid zstd frame header"),  # labelled zstd, is snappy
])
def test_zstd_limits_and_corruption(body: bytes, limit: int, status: int, needle: str) -> None:
    with pytest.raises(WireError) as e:
        zstd_decompress(body, limit)
    assert e.value.status == status
    assert needle in str(e.value)


def test_concatenated_zstd_frames_decode_whole() -> None:
    assert zstd_decompress(zstd(b"ab") + zstd(b"cd"), 4) == b"abcd"


@pytest.mark.parametrize(("window_log", "needle"), [
    (10, "decompressed body exceeds the limit"),  # a small window: stopped while decoding
    (23, "needs a window over the limit"),  # a window larger than any body under the limit needs
])
def test_a_frame_without_a_size_that_inflates_past_the_limit_stops_near_the_limit(window_log: int,
                                                                                  needle: str) -> None:
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=window_log, write_content_size=False)
    bomb = zstandard.ZstdCompressor(compression_params=params).compress(b"\0" * (64 << 20))
    assert zstandard.get_frame_parameters(bomb).content_size == zstandard.CONTENTSIZE_UNKNOWN
    tracemalloc.start()
    try:
        with pytest.raises(WireError) as e:
            zstd_decompress(bomb, 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.status == 413
    assert needle in str(e.value)
    assert peak < 4 << 20  # not the 64 MiB it inflates to


# ---- the probe, over the real HTTP front ----------------------------------------------------------


@pytest.mark.parametrize("request_head", [
    b"GET /api/v1/write?get_vm_proto_version=1 HTTP/1.1\r\nHost: relay\r\nUser-Agent: vmagent\r\n\r\n",
    b"POST /api/v1/write?get_vm_proto_version=1 HTTP/1.1\r\nHost: relay\r\nUser-Agent: vmagent\r\n"
    b"Content-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\nContent-Length: 0\r\n\r\n",
    b"POST /api/v1/write?get_vm_proto_version=1 HTTP/1.1\r\nHost: relay\r\nContent-Length: 3\r\n\r\nabc",
])
def test_the_vm_protocol_probe_is_answered_200_1_and_reaches_no_write(request_head: bytes) -> None:
    from relay.ingest.server import RelayHTTPServer

    ep = Recorder()
    server = RelayHTTPServer(("127.0.0.1", 0), ep)
    server.start()
    try:
        with connect(server) as sock:
            for _ in range(2):  # the connection stays usable
                sock.sendall(request_head)
                answer = sock.recv(65536)
                assert status_of(answer) == 200
                assert answer.split(b"\r\n\r\n", 1)[1] == b"1"
        assert ep.writes == []
    finally:
        server.stop()


def test_without_the_probe_query_a_get_on_the_write_path_is_still_405() -> None:
    from relay.ingest.server import RelayHTTPServer

    server = RelayHTTPServer(("127.0.0.1", 0), Recorder())
    server.start()
    try:
        with connect(server) as sock:
            sock.sendall(b"GET /api/v1/write?get_vm_proto_version= HTTP/1.1\r\nHost: relay\r\n\r\n")
            assert status_of(sock.recv(65536)) == 405
    finally:
        server.stop()
