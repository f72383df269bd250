from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from relay.common.labels import make
from relay.control.report import ReportError, fetch_and_render, render_report
from relay.state.cardinality import DestinationStats


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@contextmanager
def http_answer(status: int, body: bytes) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 that answers every GET with ``status`` and ``body``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def snapshot() -> dict[str, Any]:
    clock = Clock()
    stats = DestinationStats("amp", clock=clock)
    util = "DCGM_FI_DEV_GPU_UTIL"
    for i in range(12):
        stats.tracker_in.observe(i, util, make([("__name__", util), ("gpu", str(i % 4)), ("pod", f"p{i}")]))
    out = "DCGM_FI_DEV_GPU_UTIL:30s_without_pod_avg"
    for g in range(4):
        stats.tracker_out.observe(100 + g, out, make([("__name__", out), ("gpu", str(g))]))
    stats.record_samples(1200, 400)
    clock.t += 30  # 1200 in / 30 s = 40/s, 400 out / 30 s = 13.33/s
    stats.record_drop("collision", 3)
    return stats.snapshot(limit=5)


def block(text: str, title: str) -> list[str]:
    """The lines under ``title`` up to the next blank line."""
    lines = text.splitlines()
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i]), len(lines))
    return lines[start + 1:end]


def test_render_report_shows_series_tops_drops_and_cost_one_list_under_the_other() -> None:
    snap = snapshot()
    snap["estimated_cost"]["leaves_out"] = "queries and HA duplicates"
    text = render_report(snap)
    lines = text.splitlines()
    assert lines[0] == "== destination amp =="
    assert ["active", "series", "in", "12,", "out", "4"] in [ln.split() for ln in lines]
    assert ["samples/s", "in", "40,", "kept", "13.33,", "out", "0"] in [ln.split() for ln in lines]
    # in and out are separate lists, one under the other (issue 10: no side-by-side tables)
    assert [ln.split() for ln in block(text, "top metrics by series, in")] == [
        ["metric", "series"], ["DCGM_FI_DEV_GPU_UTIL", "12"]]
    assert [ln.split() for ln in block(text, "top metrics by series, out")] == [
        ["metric", "series"], ["DCGM_FI_DEV_GPU_UTIL:30s_without_pod_avg", "4"]]
    assert [ln.split() for ln in block(text, "top labels by distinct values, in")] == [
        ["label", "distinct_values"], ["pod", "12"], ["gpu", "4"]]
    assert ["collision", "3", "0"] in [ln.split() for ln in block(text, "dropped")]
    assert "ingest tier $0.90/10M" in text
    assert "total per month" in text
    assert "free tier not deducted" in text
    assert "  leaves out: queries and HA duplicates" in lines
    assert all(ln == ln.rstrip() for ln in lines)


def test_drops_the_relay_counts_in_samples_only_show_no_series_count_rather_than_zero() -> None:
    """Rule and aggregation drops are counted in samples only: "rules 0 1091" read as "0 series dropped"."""
    snap = snapshot()
    snap["dropped"] = {"rules": {"series": 0, "samples": 1091}, "aggregated": {"series": 0, "samples": 40},
                       "max_series": {"series": 2, "samples": 7}, "collision": {"series": 3, "samples": 0}}
    rows = [ln.split() for ln in block(render_report(snap), "dropped")]
    assert rows[0] == ["reason", "series", "samples"]
    assert ["rules", "-", "1091"] in rows
    assert ["aggregated", "-", "40"] in rows
    assert ["max_series", "2", "7"] in rows
    assert ["collision", "3", "0"] in rows
    assert any("-" in ln and "samples only" in ln for ln in render_report(snap).splitlines())


@pytest.mark.parametrize(("seconds", "shown"), [(3600, "1h"), (5400, "1h30m"), (90, "1m30s"), (45, "45s")])
def test_the_window_is_shown_as_a_duration_like_the_config_writes_it(seconds: int, shown: str) -> None:
    snap = snapshot()
    snap["window_seconds"] = float(seconds)
    assert ["window", shown] in [ln.split() for ln in render_report(snap).splitlines()]


def sending_snapshot(**over: Any) -> dict[str, Any]:
    snap = snapshot()
    snap.update(
        dry_run=False, url="http://rx:9090/api/v1/write", credentials="none (no sigv4)",
        sending={"state": "rejecting", "state_text": "rejecting (dropping 4xx)", "samples_kept": 1200,
                 "samples_sent": 1000, "samples_failed": 50, "samples_retried": 30, "last_success": 1_000_000.0,
                 "samples_per_second": 2.5, "dropped_last_hour": {"http_403": 50, "queue_full": 7},
                 "last_error": {"time": 1_000_060.0, "reason": "HTTP 403: access denied"}},
        queue={"samples": 150, "bytes": 3 * 1024, "oldest_age_seconds": 42.0, "max_bytes": 2**30},
        estimated_cost=None, estimated_cost_without_rules=None,
    )
    snap.update(over)
    return snap


def test_render_report_shows_the_sending_state_queue_and_last_outcomes() -> None:
    text = render_report(sending_snapshot(), now=1_000_100.0)
    fields = {ln.split("  ")[1].strip(): ln.split("  ", 2)[2].strip() for ln in text.splitlines()[1:13]}
    assert fields["state"] == "rejecting (dropping 4xx)"
    assert fields["dropped, last hour"] == "http_403 50, queue_full 7"
    assert fields["dry_run"] == "false"
    assert fields["url"] == "http://rx:9090/api/v1/write"
    assert fields["samples sent"] == "1000" and fields["samples failed"] == "50"
    assert fields["samples retried"] == "30" and fields["samples kept"] == "1200"
    assert fields["queue"] == "150 samples, 3.0 KiB of 1.0 GiB, oldest 42s"
    assert fields["last success"] == "1970-01-12T13:46:40Z (100s ago)"
    assert fields["last error"] == "1970-01-12T13:47:40Z (40s ago): HTTP 403: access denied"
    # not an AMP workspace: no bill, and it says why
    assert "estimated AMP bill" not in text
    assert "no AMP bill: not an Amazon Managed Prometheus workspace URL" in text


def test_render_report_handles_empty_destination() -> None:
    text = render_report(DestinationStats("empty", clock=Clock()).snapshot())
    assert "destination empty" in text
    assert text.count("(none)") == 5  # top metrics in/out, top labels in/out, drops


def test_render_report_renders_several_destinations() -> None:
    snap = snapshot()
    other = dict(snap, destination="backup")
    text = render_report({"destinations": [snap, other]})
    assert "== destination amp ==" in text and "== destination backup ==" in text


def test_fetch_and_render_builds_the_cardinality_url() -> None:
    urls: list[str] = []

    def fetch(url: str) -> Mapping[str, Any]:
        urls.append(url)
        return snapshot()

    text = fetch_and_render("http://127.0.0.1:9201/", "amp", 5, fetch=fetch)
    assert urls == ["http://127.0.0.1:9201/api/v1/cardinality?limit=5&destination=amp"]
    assert text.startswith("== destination amp ==")
    fetch_and_render("http://127.0.0.1:9201", None, 10, fetch=fetch)
    assert urls[-1] == "http://127.0.0.1:9201/api/v1/cardinality?limit=10"


def test_report_without_a_destination_shows_every_destination() -> None:
    urls: list[str] = []

    def fetch(url: str) -> Mapping[str, Any]:
        urls.append(url)
        name = url.partition("destination=")[2] or "amp"
        return dict(snapshot(), destination=name, all_destinations=["amp", "backup", "vm"])

    text = fetch_and_render("http://relay:9201", None, 3, fetch=fetch)
    assert [ln for ln in text.splitlines() if ln.startswith("== ")] == [
        "== destination amp ==", "== destination backup ==", "== destination vm =="]
    assert urls == ["http://relay:9201/api/v1/cardinality?limit=3",
                    "http://relay:9201/api/v1/cardinality?limit=3&destination=backup",
                    "http://relay:9201/api/v1/cardinality?limit=3&destination=vm"]


@pytest.mark.parametrize(("status", "body", "message"), [
    (404, b'{"status": "error", "error": "unknown destination \'x\'", "destinations": ["amp", "vm"]}',
     "unknown destination 'x' (destinations: amp, vm)"),
    (400, b'{"status": "error", "error": "limit must be an integer"}', "limit must be an integer"),
    (502, b"Bad Gateway\nfrom the proxy", "the relay answered HTTP 502: Bad Gateway"),
])
def test_an_error_answer_is_shown_in_the_relays_words(status: int, body: bytes, message: str) -> None:
    with http_answer(status, body) as url, pytest.raises(ReportError) as err:
        fetch_and_render(url, "x", 5)
    assert str(err.value) == message
    assert "HTTP Error" not in str(err.value)
