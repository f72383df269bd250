"""Issue 9: a RW 1.0 request that a destination takes whole and unchanged, in one shard (pass-through
on one shard), is queued as the snappy block it came in as: not compressed a second time."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import snappy

from relay.config.config import load_config
from relay.control.service import Runtime
from relay.delivery.queue import codec as queue_codec
from relay.ingest import wire
from tests.relay.control.test_service import RW1_LOWER, S, now_ms

RW2 = {"content-type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
       "content-encoding": "snappy", "x-prometheus-remote-write-version": "2.0.0"}


def padded(block: bytes) -> bytes:
    """The same block with its length varint one byte longer (a continuation byte, then 0x00)."""
    _, start = queue_codec._header(block)
    return block[: start - 1] + bytes((block[start - 1] | 0x80, 0)) + block[start:]


def body_of(n: int, t: int) -> tuple[bytes, bytes]:
    raw = wire.encode_write_request([(S("DCGM_FI_DEV_GPU_UTIL", gpu=str(i), node="n1"), [(t, float(i))])
                                     for i in range(n)])
    return raw, bytes(snappy.compress(raw))


def runtime(tmp_path: Path, runtimes: list[Runtime], dest_extra: str = "", head: str = "") -> Runtime:
    path = tmp_path / "relay.yaml"
    path.write_text(f"storage: {{path: {tmp_path / 'q'}}}\n{head}destinations:\n"
                    f"  - name: a\n    url: http://127.0.0.1:1/w\n{dest_extra}")
    r = Runtime(str(path), load_config(path))  # not started: what it queues stays queued
    runtimes.append(r)
    return r


def rows(r: Runtime) -> list[tuple[bytes, int | None, bytes]]:
    q = r.destinations["a"].queue
    assert q is not None
    return [(e.stored, e.raw_len, e.payload) for shard in q.shards() for e in q.peek(shard, 1 << 30)]


def test_a_whole_unchanged_request_on_one_shard_is_stored_as_it_came(tmp_path: Path, runtimes: list[Runtime]) -> None:
    r = runtime(tmp_path, runtimes)
    raw, body = body_of(200, now_ms())
    assert r.write(RW1_LOWER, body).status == 204
    ((stored, raw_len, payload),) = rows(r)
    assert stored == body and raw_len == len(raw) and payload == raw
    assert queue_codec.unpack(stored, raw_len) == raw


@pytest.mark.parametrize(("what", "dest_extra", "head"), [
    ("rules keep a part", "    write_relabel_configs: [{source_labels: [gpu], regex: '1.*', action: keep}]\n", ""),
    ("external labels change every series", "", "external_labels: {cluster: c1}\n"),
    ("two shards: two pieces", "    queue: {min_shards: 2, max_shards: 2}\n", ""),
])
def test_a_request_that_is_not_queued_whole_and_unchanged_is_compressed_as_before(
    tmp_path: Path, runtimes: list[Runtime], what: str, dest_extra: str, head: str
) -> None:
    r = runtime(tmp_path, runtimes, dest_extra, head)
    _raw, body = body_of(200, now_ms())
    assert r.write(RW1_LOWER, body).status == 204
    got = rows(r)
    assert got and all(stored != body for stored, _, _ in got)
    for stored, raw_len, payload in got:
        assert queue_codec.unpack(stored, raw_len) == payload


def test_a_body_with_a_padded_length_header_is_not_stored_as_it_came(tmp_path: Path, runtimes: list[Runtime]) -> None:
    """Snappy decoders accept a length varint padded with 0x80 bytes; the sender's concatenation
    reads only the canonical one, so such a block would be dropped as malformed at send time."""
    r = runtime(tmp_path, runtimes)
    raw, body = body_of(200, now_ms())
    longer = padded(body)
    assert wire.decompress(longer, 1 << 20) == raw  # the relay accepts it
    assert r.write(RW1_LOWER, longer).status == 204
    ((stored, raw_len, payload),) = rows(r)
    assert stored != longer and payload == raw and queue_codec.concat([(stored, raw_len)])  # sendable


def test_rw2_input_is_transcoded_and_compressed(tmp_path: Path, runtimes: list[Runtime]) -> None:
    from relay.proto import remote_v2_pb2

    r = runtime(tmp_path, runtimes)
    req = remote_v2_pb2.Request()
    req.symbols.extend(["", "__name__", "m", "i", "0"])
    req.timeseries.add(labels_refs=[1, 2, 3, 4]).samples.add(value=1.0, timestamp=now_ms())
    body = bytes(snappy.compress(req.SerializeToString()))
    assert r.write(RW2, body).status == 204
    ((stored, _raw_len, payload),) = rows(r)
    assert stored != body and wire.decode_write_request(payload)[0][0] == (("__name__", "m"), ("i", "0"))


@pytest.mark.parametrize(("block", "expect"), [
    ("canonical", "block"),
    ("padded", "compressed"),
    ("not smaller", "raw"),
    ("none", "compressed"),
])
def test_pack_takes_a_block_only_when_its_header_is_canonical_and_it_saves_an_eighth(block: str, expect: str) -> None:
    payload = b"abcdefgh" * 200
    if block == "not smaller":
        payload = random.Random(1).randbytes(600)  # incompressible: pack keeps it raw whatever the block
    canonical = bytes(snappy.compress(payload))
    given = {"canonical": canonical, "padded": padded(canonical), "none": None,
             "not smaller": queue_codec.varint(len(payload)) + queue_codec.literal(payload)}[block]
    stored, raw_len = queue_codec.pack(payload, given)
    if expect == "block":
        assert stored is given and raw_len == len(payload)
    elif expect == "raw":
        assert stored == payload and raw_len is None
    else:
        assert stored != given and queue_codec.unpack(stored, raw_len) == payload
