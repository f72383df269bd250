"""A target's scrape loop as Prometheus 2.42's: staleness markers, report series, limits, honor_*,
metadata, and the scraper's reload semantics (issue 20 point 3)."""

from __future__ import annotations

import gzip
import http.server
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

from relay.common.labels import Labels
from relay.ingest import scrape, wire
from relay.ingest.scrape.loop import METADATA_RESEND_S
from relay.proto import remote_v1_pb2
from tests.helpers import wait_until

STALE = 0x7FF0000000000002
NOW = 1_724_000_000.0


def bits(v: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", v))[0])


def target(**kw: object) -> scrape.ScrapeTarget:
    return scrape.ScrapeTarget("job", "http://h:1/metrics", 15.0, 1.0, **kw)  # type: ignore[arg-type]


class Exposed:
    """A scripted target: each scrape answers the next body (an exception: the fetch fails)."""

    def __init__(self, *bodies: str | Exception) -> None:
        self.bodies = list(bodies)

    def __call__(self, url: str, timeout: float) -> str:
        body = self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]
        if isinstance(body, Exception):
            raise body
        return body


def run(loop: scrape.TargetLoop) -> dict[str, dict[Labels, tuple[int, float]]]:
    """One scrape, by metric name -> labels -> (timestamp, value)."""
    out: dict[str, dict[Labels, tuple[int, float]]] = {}
    for labels, samples in wire.decode_write_request(loop.scrape_once()):
        (sample,) = samples
        out.setdefault(dict(labels)["__name__"], {})[labels] = sample
    return out


def stale_names(got: dict[str, dict[Labels, tuple[int, float]]]) -> set[str]:
    return {dict(lb).get("gpu") or name for name, series in got.items()
            for lb, (_, v) in series.items() if bits(v) == STALE}


def report(got: dict[str, dict[Labels, tuple[int, float]]]) -> tuple[float, ...]:
    return tuple(next(iter(got[n].values()))[1] for n in scrape.REPORT_NAMES if n != "scrape_duration_seconds")


def new_loop(fetch: Callable[[str, float], str], **kw: object) -> scrape.TargetLoop:
    return scrape.TargetLoop(target(**kw), fetch, clock=lambda: NOW)


GPUS = "".join(f'g{{gpu="{i}"}} {i}\n' for i in range(3))


def test_a_vanished_series_gets_a_staleness_marker_at_the_scrape_time() -> None:
    loop = new_loop(Exposed(GPUS, 'g{gpu="0"} 0\ng{gpu="2"} 2\n'))
    first = run(loop)
    assert stale_names(first) == set() and report(first) == (1.0, 3.0, 3.0, 3.0)
    second = run(loop)
    assert stale_names(second) == {"1"}
    (ts, _), = [s for lb, s in second["g"].items() if dict(lb)["gpu"] == "1"]
    assert ts == int(NOW * 1000)
    assert report(second) == (1.0, 2.0, 2.0, 0.0)


def test_a_failed_fetch_marks_every_series_and_reports_up_zero() -> None:
    loop = new_loop(Exposed(GPUS, OSError("refused"), GPUS))
    run(loop)
    failed = run(loop)
    assert stale_names(failed) == {"0", "1", "2"} and report(failed) == (0.0, 0.0, 0.0, 0.0)
    back = run(loop)
    assert stale_names(back) == set()
    assert report(back) == (1.0, 3.0, 3.0, 0.0)  # the scrape cache survived the failure: nothing new


def test_a_parse_error_writes_no_samples_and_marks_only_what_it_did_not_reach() -> None:
    loop = new_loop(Exposed(GPUS, 'g{gpu="0"} 0\ng{gpu= 1\n', 'g{gpu="2"} 2\n'))
    run(loop)
    broken = run(loop)
    assert {bits(v) for _, v in broken["g"].values()} == {STALE}  # no sample, only markers
    assert stale_names(broken) == {"1", "2"}  # gpu 0 came before the error: Prometheus leaves it
    assert report(broken)[:2] == (0.0, 1.0)
    assert stale_names(run(loop)) == {"0"}  # the next scrape without it marks it


def test_over_sample_limit_the_scrape_fails_as_prometheus() -> None:
    loop = new_loop(Exposed('g{gpu="0"} 0\ng{gpu="1"} 1\n', GPUS + 'g{gpu="3"} 3\n', GPUS), sample_limit=3)
    run(loop)
    over = run(loop)
    assert all(bits(v) == STALE for _, v in over.get("g", {}).values())
    assert report(over) == (0.0, 4.0, 4.0, 1.0)  # all counted; one new series below the limit
    after = run(loop)
    assert report(after)[0] == 1.0 and stale_names(after) == {"3"}


@pytest.mark.parametrize(
    ("limits", "exposed"),
    [
        ({"label_limit": 3}, 'g{a="1",b="2"} 1\n'),  # __name__, a, b, instance, job
        ({"label_name_length_limit": 8}, 'g{abcdefghi="1"} 1\n'),  # __name__ and instance are 8
        ({"label_value_length_limit": 4}, 'g{a="12345"} 1\n'),
    ],
)
def test_a_label_limit_fails_the_scrape(limits: dict[str, int], exposed: str) -> None:
    got = run(new_loop(Exposed(exposed), **limits))
    assert "g" not in got and report(got)[0] == 0.0
    assert report(run(new_loop(Exposed('g 1\n'), **limits)))[0] == 1.0  # under it: up


@pytest.mark.parametrize(
    ("honor", "expected"),
    [
        (False, {"job": "job", "instance": "h:1", "exported_job": "app", "exported_instance": "x:9"}),
        (True, {"job": "app", "instance": "x:9"}),
    ],
)
def test_honor_labels(honor: bool, expected: dict[str, str]) -> None:
    got = run(new_loop(Exposed('m{job="app",instance="x:9"} 1\n'), honor_labels=honor))
    (labels,) = got["m"]
    assert dict(labels) == {"__name__": "m", **expected}
    assert dict(next(iter(got["up"]))) == {"__name__": "up", "job": "job", "instance": "h:1"}  # always the target's


@pytest.mark.parametrize(("honor", "ts"), [(True, 1_700_000_000_123), (False, int(NOW * 1000))])
def test_honor_timestamps(honor: bool, ts: int) -> None:
    loop = new_loop(Exposed("m 1 1700000000123\n", "other 1\n"), honor_timestamps=honor)
    assert next(iter(run(loop)["m"].values()))[0] == ts
    # an exposed timestamp takes the series out of staleness handling, as in Prometheus
    assert stale_names(run(loop)) == (set() if honor else {"m"})


def test_metadata_is_sent_when_it_changes_and_every_minute() -> None:
    body = ("# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER Total PCIe retries.\n"
            "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n")
    loop = new_loop(Exposed(body + "DCGM_FI_DEV_PCIE_REPLAY_COUNTER 1\n"))

    def metadata() -> list[tuple[str, int, str]]:
        req = remote_v1_pb2.WriteRequest()
        req.ParseFromString(loop.scrape_once())
        return [(m.metric_family_name, int(m.type), m.help) for m in req.metadata]

    assert metadata() == [("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1, "Total PCIe retries.")]
    assert metadata() == []  # unchanged
    loop.state.metadata_sent_at -= METADATA_RESEND_S
    assert len(metadata()) == 1  # a minute later: again


def test_end_of_run_marks_every_series_and_the_report() -> None:
    loop = new_loop(Exposed(GPUS))
    run(loop)
    got = {dict(lb)["__name__"] for lb, samples in wire.decode_write_request(loop.end_of_run(5))
           if samples == [(5, samples[0][1])] and bits(samples[0][1]) == STALE}
    assert got == {"g", *scrape.REPORT_NAMES}


def test_scraper_update_marks_a_target_that_left_its_job_but_not_a_job_removed_whole() -> None:
    got: list[bytes] = []
    lock = threading.Lock()

    def sink(raw: bytes) -> None:
        with lock:
            got.append(raw)

    def targets(*urls: tuple[str, str]) -> list[scrape.ScrapeTarget]:
        return [scrape.ScrapeTarget(job, url, 0.05, 0.05) for job, url in urls]

    def stale_ups() -> set[str]:
        with lock:
            return {dict(lb)["instance"] for raw in got for lb, s in wire.decode_write_request(raw)
                    if dict(lb)["__name__"] == "up" and bits(s[0][1]) == STALE}

    scraper = scrape.Scraper(targets(("a", "http://a:1/m"), ("a", "http://b:1/m"), ("c", "http://c:1/m")),
                             sink, fetch=lambda u, t: "m 1\n")
    scraper.start()
    try:
        assert wait_until(lambda: len(got) >= 6, timeout=5)
        scraper.update(targets(("a", "http://a:1/m")))  # b leaves job a; job c goes whole
        assert wait_until(lambda: stale_ups() == {"b:1"}, timeout=5)
        scraper.update(targets(("a", "http://a:1/m"), ("a", "http://d:1/m")))
        assert wait_until(lambda: any("d:1" in str(wire.decode_write_request(r)) for r in list(got)), timeout=5)
    finally:
        scraper.stop()
    assert stale_ups() == {"b:1"}  # not a (kept), not c (its job removed whole), not at stop


class _Server(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers.items()))
        body = gzip.compress(b"# TYPE c counter\nc_total 3 # {t=\"x\"} 1\n# EOF\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def om_target() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_http_fetch_negotiates_openmetrics_as_prometheus_and_reads_gzip(om_target: str) -> None:
    loop = scrape.TargetLoop(scrape.ScrapeTarget("j", om_target, 1.0, 1.0), scrape.http_fetch)
    got = run(loop)
    assert next(iter(got["c_total"].values()))[1] == 3.0 and report(got)[0] == 1.0
    headers = _Server.seen[-1]
    assert headers["Accept"].startswith("application/openmetrics-text;version=1.0.0,")
    assert "text/plain;version=0.0.4;q=0.5" in headers["Accept"]
    assert headers["X-Prometheus-Scrape-Timeout-Seconds"] == "1"
