"""The relay benches measure what they claim: the issue 9 payload shape, RW 2.0 = RW 1.0 content, exact
read-back from a real victoria-metrics, and a run that delivered more or less than expected fails."""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import pytest
import snappy

from bench import relay_bench, relay_series_bench, request_bench
from bench.receivers import Contents, Sink, VictoriaMetrics
from bench.relay_run import KEEP4_RULES, Result, post_all, run_relay
from bench.rw_payload import KEEP, Payload, build_requests, cluster_series, encode_v1, encode_v2, payload
from relay.ingest import wire
from relay.proto import remote_v1_pb2
from tests.helpers import REPO_ROOT, require_binary, wait_until


def test_issue9_shape_is_63000_series_per_round_and_2016000_samples_in_32_rounds() -> None:
    series = cluster_series(250, 68)
    assert len(series) == 63_000
    assert len(set(series)) == 63_000  # every series distinct
    pl = Payload(series, 32, [])
    assert pl.samples == 2_016_000
    assert pl.kept(KEEP) == 4 * 8 * 250 * 32  # keep4 keeps the 4 DCGM names of each of 8 GPUs


def test_rw2_request_carries_the_same_series_and_samples_as_the_rw1_request() -> None:
    chunk = cluster_series(2, 68)[:300]
    v1 = snappy.uncompress(encode_v1(chunk, 1_700_000_000_000, 3))
    from_v2, counts = wire.v2_to_v1(snappy.uncompress(encode_v2(chunk, 1_700_000_000_000, 3)))
    assert counts.samples == 300
    assert remote_v1_pb2.WriteRequest.FromString(v1) == remote_v1_pb2.WriteRequest.FromString(from_v2)


def test_requests_split_a_round_by_series_per_request() -> None:
    series = cluster_series(1, 68)  # 252 series
    reqs = build_requests(series, 2, per_request=100)
    assert len(reqs) == 6  # 3 requests per round
    decoded = [wire.decode_write_request(snappy.uncompress(r)) for r in reqs]
    assert [len(d) for d in decoded] == [100, 100, 52, 100, 100, 52]
    assert {d[0][1][0][0] for d in decoded[:3]} != {d[0][1][0][0] for d in decoded[3:]}  # rounds differ in time


def test_distinct_requests_continue_mid_node_without_repeating_a_series() -> None:
    def labels(start: int, stop: int) -> list[tuple[tuple[str, str], ...]]:
        return [lab for r in relay_series_bench.distinct_requests(start, stop, 1000)
                for lab, _ in wire.decode_write_request(snappy.uncompress(r))]

    first, rest = labels(0, 100), labels(100, 2500)
    assert len(first) == 100 and len(rest) == 2400
    assert len(set(first) | set(rest)) == 2500


def _result(names: dict[str, int], label_names: set[str]) -> Result:
    n = sum(names.values())
    return Result(1.0, 1.0, 50.0, n, Contents(n, names, label_names, 1))


def test_check_refuses_a_run_missing_one_sample_of_a_kept_metric() -> None:
    pl = Payload(cluster_series(1), 2, [])
    want = relay_bench.expected_names(pl, KEEP)
    relay_bench.check(_result(want, {"__name__", "gpu"}), pl, KEEP, "ok")  # the exact content passes
    short = dict(want, DCGM_FI_DEV_GPU_UTIL=want["DCGM_FI_DEV_GPU_UTIL"] - 1)
    with pytest.raises(RuntimeError, match="DCGM_FI_DEV_GPU_UTIL"):
        relay_bench.check(_result(short, {"__name__"}), pl, KEEP, "keep4")


def test_check_refuses_a_keep4_run_where_a_dropped_label_arrived() -> None:
    pl = Payload(cluster_series(1), 2, [])
    want = relay_bench.expected_names(pl, KEEP)
    with pytest.raises(RuntimeError, match="pci_bus_id"):
        relay_bench.check(_result(want, {"__name__", "pci_bus_id"}), pl, KEEP, "keep4")


def test_check_refuses_a_passthrough_run_with_an_extra_metric() -> None:
    pl = Payload(cluster_series(1), 1, [])
    got = dict(relay_bench.expected_names(pl, None), up=1)
    with pytest.raises(RuntimeError, match="up"):
        relay_bench.check(_result(got, set()), pl, None, "passthrough")


@pytest.mark.slow
def test_victoria_metrics_receiver_counts_and_reads_back_exactly_what_was_posted(tmp_path: Path) -> None:
    require_binary("victoria-metrics")
    series = cluster_series(1, 68)
    rx = VictoriaMetrics(tmp_path)
    try:
        assert rx.rows() == 0
        post_all(rx.url, build_requests(series, 3, per_request=100))
        assert wait_until(lambda: rx.rows() >= 3 * 252)
        time.sleep(0.5)
        assert rx.rows() == 3 * 252  # and no more
        got = rx.contents()
    finally:
        rx.close()
    assert got.samples == 3 * 252 and got.series == 252
    assert got.names["node_cpu_seconds_total"] == 3 * 48 and got.names["DCGM_FI_DEV_GPU_UTIL"] == 3 * 8
    assert {"pci_bus_id", "mode", "UUID"} <= got.label_names


@pytest.mark.slow
def test_a_run_fails_when_the_receiver_gets_more_samples_than_expected(tmp_path: Path) -> None:
    pl = payload(1, 2)
    with pytest.raises(RuntimeError, match=f"expected {pl.samples - 1}"):
        run_relay("", pl, pl.samples - 1, tmp_path / "over")


@pytest.mark.slow
def test_keep4_relay_run_delivers_exactly_the_four_kept_metrics_to_the_in_process_sink(tmp_path: Path) -> None:
    # 20 rounds: enough work that the relay's CPU is more than a clock tick (/proc counts 10 ms ticks)
    pl = payload(1, 20, other_per_node=68)
    r = run_relay(KEEP4_RULES, pl, pl.kept(KEEP), tmp_path / "k")
    relay_bench.check(r, pl, KEEP, "keep4")
    assert r.delivered == 20 * 4 * 8 and r.cpu > 0 and r.rss_mb > 10


@pytest.mark.slow
def test_sink_counts_samples_it_received() -> None:
    sink = Sink()
    try:
        post_all(sink.url, [encode_v1(cluster_series(1)[:10], int(time.time() * 1000), 0)])
        got = sink.contents()
    finally:
        sink.close()
    assert sink.rows() == 10 and got.samples == 10 and "gpu" in got.label_names


@pytest.mark.slow
def test_tiny_full_bench_prints_every_table_with_exact_deliveries(tmp_path: Path) -> None:
    require_binary("victoria-metrics")
    require_binary("vmagent")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        relay_bench.main(["--nodes", "1", "--rounds", "2", "--memory-series", "2000"])
    text = out.getvalue()
    assert "252 series x 2 rounds = 504 samples" in text
    rows = [ln for ln in text.splitlines() if ln.endswith(" exact")]
    assert len(rows) == 8 and "WRONG" not in text  # 6 RW 1.0 rows (each scenario: 3 programs) + 2 RW 2.0 rows
    assert sum(ln.split()[0] == "4" and ln.split()[1] == "fixed" for ln in rows) == 2
    assert "x vmagent's" in text and "the RW 1.0 CPU per sample" in text
    assert text.count("gpu-relay on 4 fixed shards (min_shards: 4): CPU per sample") == 2
    assert "given one RW 2.0 request (252 samples)" in text
    assert "first sight" in text and "passthrough" in text
    assert "     2,000 " in text  # the memory row at 2,000 series


@pytest.mark.slow
def test_request_bench_compares_two_trees_and_vmagent_with_exact_deliveries() -> None:
    require_binary("victoria-metrics")
    require_binary("vmagent")
    out = io.StringIO()
    root = str(REPO_ROOT)
    with contextlib.redirect_stdout(out):
        request_bench.main(["--nodes", "1", "--rounds", "2", "--repeat", "1", "--compare", root])
    text = out.getvalue()
    assert "184 series x 2 rounds = 368 samples in 92 requests" in text
    rows = [ln for ln in text.splitlines() if ln.startswith(("gpu-relay (", "vmagent "))]
    assert len(rows) == 3 and rows[-1].endswith(" 1.00x"), text
    assert "every run delivered exactly 368 samples" in text


@pytest.mark.slow
def test_memory_run_stops_before_a_size_the_machine_has_no_memory_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(relay_series_bench, "MIN_AVAILABLE_MIB", 1e12)
    base, peak, rows = relay_series_bench.memory([2000], tmp_path)
    assert rows == [] and 10 < base <= peak
    assert "stopped before 2,000 series" in capsys.readouterr().out
