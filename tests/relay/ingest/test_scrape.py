"""Agent-mode scraping: exposition parsing, target labels, the scrape loop and a real HTTP target."""

from __future__ import annotations

import http.server
import math
import threading
import time
from collections.abc import Iterator

import pytest

from relay.common.labels import Labels
from relay.ingest import scrape, wire
from tests.helpers import wait_until

NOW_MS = 1_724_000_000_000

EXPOSITION = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",modelName="NVIDIA H100 80GB HBM3"} 87
# TYPE requests counter
requests_total{code="200"} 12 1700000000123
# TYPE lat histogram
lat_bucket{le="0.5"} 3
lat_bucket{le="+Inf"} 4
lat_sum 1.5
lat_count 4
"""


def parse_exposition(text: str, job: str, instance: str, now_ms: int) -> bytes:
    """One scrape of ``text`` by a fresh loop of a target at ``instance``, at ``now_ms``."""
    target = scrape.ScrapeTarget(job, f"http://{instance}/metrics", 15.0, 1.0)
    return scrape.TargetLoop(target, lambda url, timeout: text, clock=lambda: now_ms / 1000).scrape_once()


def series_of(raw: bytes) -> dict[Labels, list[tuple[int, float]]]:
    return dict(wire.decode_write_request(raw))


def labels(**pairs: str) -> Labels:
    return tuple(sorted(pairs.items()))


def test_parse_exposition_adds_target_labels_timestamps_and_up() -> None:
    got = series_of(parse_exposition(EXPOSITION, "gpu", "node1:9400", NOW_MS))
    target = {"job": "gpu", "instance": "node1:9400"}
    gpu_util = labels(
        __name__="DCGM_FI_DEV_GPU_UTIL", gpu="0", UUID="GPU-0", modelName="NVIDIA H100 80GB HBM3", **target
    )
    assert got[gpu_util] == [(NOW_MS, 87.0)]
    assert got[labels(__name__="requests_total", code="200", **target)] == [(1_700_000_000_123, 12.0)]
    assert got[labels(__name__="lat_bucket", le="+Inf", **target)] == [(NOW_MS, 4.0)]
    assert got[labels(__name__="lat_count", **target)] == [(NOW_MS, 4.0)]
    assert got[labels(__name__="up", **target)] == [(NOW_MS, 1.0)]
    assert got[labels(__name__="scrape_samples_scraped", **target)] == [(NOW_MS, 6.0)]
    assert got[labels(__name__="scrape_series_added", **target)] == [(NOW_MS, 6.0)]
    assert len(got) == 6 + len(scrape.REPORT_NAMES)


@pytest.mark.parametrize(
    ("exposed", "expected_extra"),
    [
        ('m{job="app"} 1', {"exported_job": "app"}),
        ('m{job="gpu"} 1', {"exported_job": "gpu"}),  # renamed even when equal, like Prometheus
        (
            'm{instance="a",exported_instance="b"} 1',
            {"exported_exported_instance": "a", "exported_instance": "b"},
        ),
        ('m{job=""} 1', {}),  # an empty label is no label
        ('m{other="x"} 1', {"other": "x"}),
    ],
)
def test_parse_exposition_target_labels_win_and_conflicts_become_exported(
    exposed: str, expected_extra: dict[str, str]
) -> None:
    got = series_of(parse_exposition(exposed + "\n", "gpu", "n:1", NOW_MS))
    expected = labels(__name__="m", job="gpu", instance="n:1", **expected_extra)
    assert expected in got


def test_parse_exposition_keeps_nan_and_infinities() -> None:
    got = series_of(parse_exposition("a NaN\nb +Inf\n", "j", "i:1", NOW_MS))
    assert math.isnan(got[labels(__name__="a", job="j", instance="i:1")][0][1])
    assert got[labels(__name__="b", job="j", instance="i:1")][0][1] == math.inf


def test_parse_exposition_rejects_invalid_text() -> None:
    with pytest.raises(ValueError, match="line 1"):
        scrape.parse(b'm{a="unterminated} 1\n')
    assert up_value(parse_exposition('m{a="unterminated} 1\n', "j", "i:1", NOW_MS)) == 0.0


@pytest.mark.parametrize(
    ("url", "instance"),
    [
        ("http://10.0.0.1:9400/metrics", "10.0.0.1:9400"),
        ("http://user:secret@host:9400/metrics", "host:9400"),
        ("https://host/metrics", "host"),
    ],
)
def test_instance_of_is_host_port_without_credentials(url: str, instance: str) -> None:
    assert scrape.instance_of(url) == instance


def up_value(raw: bytes) -> float:
    return next(
        samples[0][1] for lbls, samples in wire.decode_write_request(raw) if ("__name__", "up") in lbls
    )


def test_scrape_once_reports_up_zero_when_the_fetch_fails() -> None:
    def failing_fetch(url: str, timeout: float) -> str:
        raise OSError("connection refused")

    scraper = scrape.Scraper([], sink=lambda raw: None, fetch=failing_fetch, clock=lambda: NOW_MS / 1000)
    raw = scraper.scrape_once(scrape.ScrapeTarget("gpu", "http://h:1/metrics", 15.0, 1.0))
    got = series_of(raw)
    assert set(got) == {labels(__name__=n, job="gpu", instance="h:1") for n in scrape.REPORT_NAMES}
    assert got[labels(__name__="up", job="gpu", instance="h:1")] == [(NOW_MS, 0.0)]
    assert got[labels(__name__="scrape_samples_scraped", job="gpu", instance="h:1")] == [(NOW_MS, 0.0)]


def test_scrape_once_passes_timeout_and_uses_the_injected_clock() -> None:
    calls: list[tuple[str, float]] = []

    def fetch(url: str, timeout: float) -> str:
        calls.append((url, timeout))
        return "m 1\n"

    scraper = scrape.Scraper([], sink=lambda raw: None, fetch=fetch, clock=lambda: 1234.5)
    raw = scraper.scrape_once(scrape.ScrapeTarget("gpu", "http://h:1/metrics", 15.0, 2.5))
    assert calls == [("http://h:1/metrics", 2.5)]
    assert series_of(raw)[labels(__name__="m", job="gpu", instance="h:1")] == [(1_234_500, 1.0)]


def test_scraper_loop_calls_sink_each_interval_and_stops() -> None:
    got: list[bytes] = []
    targets = [
        scrape.ScrapeTarget("a", "http://a:1/m", 0.01, 1.0),
        scrape.ScrapeTarget("b", "http://b:1/m", 0.01, 1.0),
    ]
    scraper = scrape.Scraper(targets, sink=got.append, fetch=lambda url, timeout: "m 1\n")
    scraper.start()
    try:
        assert wait_until(lambda: len(got) >= 6, timeout=5)
    finally:
        scraper.stop()
    count = len(got)
    jobs = {dict(lbls)["job"] for raw in got for lbls, _ in wire.decode_write_request(raw)}
    assert jobs == {"a", "b"}
    time.sleep(0.05)  # five intervals: a loop still running would have called the sink again
    assert len(got) == count


def test_scraper_survives_a_failing_sink() -> None:
    calls: list[int] = []

    def sink(raw: bytes) -> None:
        calls.append(1)
        raise RuntimeError("queue full")

    scraper = scrape.Scraper(
        [scrape.ScrapeTarget("a", "http://a:1/m", 0.01, 1.0)], sink, lambda u, t: "m 1\n"
    )
    scraper.start()
    try:
        assert wait_until(lambda: len(calls) >= 3, timeout=5)
    finally:
        scraper.stop()


class _Exposition(http.server.BaseHTTPRequestHandler):
    body = b'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 41\n'

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_target() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_scraper_scrapes_a_real_http_target(http_target: str) -> None:
    got: list[bytes] = []
    target = scrape.ScrapeTarget("gpu", http_target + "/metrics", 0.05, 2.0)
    scraper = scrape.Scraper([target], sink=got.append)
    scraper.start()
    try:
        assert wait_until(lambda: len(got) >= 2, timeout=5)
    finally:
        scraper.stop()
    instance = http_target.removeprefix("http://")
    series = series_of(got[0])
    temp = labels(__name__="DCGM_FI_DEV_GPU_TEMP", gpu="0", job="gpu", instance=instance)
    assert series[temp][0][1] == 41.0
    assert up_value(got[0]) == 1.0


def test_http_fetch_error_status_gives_up_zero(http_target: str) -> None:
    scraper = scrape.Scraper([], sink=lambda raw: None)
    raw = scraper.scrape_once(scrape.ScrapeTarget("gpu", http_target + "/missing", 1.0, 2.0))
    assert up_value(raw) == 0.0
