"""Scrape mode against Prometheus 2.42 itself: the same churning targets scraped by the real
``prometheus`` (server mode, remote-writing to one receiver) and by ``gpu-relay`` in scrape mode
(to another). Both must write the same series with the same labels (names as exposed), staleness
markers on the same series, the same values, the same five report series per target and the
same metadata. Sets are compared, never timestamps.

The targets, 1 s apart scrapes, phases of 4 s:
  text    0.0.4 text: a counter without ``_total`` (DCGM_FI_DEV_PCIE_REPLAY_COUNTER), gauges per
          GPU (gpu 2 appears in phase 1, gpu 1 vanishes in phase 2), an exposed ``job`` label,
          a NaN, a histogram, an explicit timestamp
  om      OpenMetrics: ``_total``, ``_created``, a UNIT, an exemplar; goes away in phase 2
  honor   scraped with honor_labels: its own job/instance win
  limited sample_limit 3: over it in phase 1 (the scrape fails), back under in phase 2
  leaving one of its two targets removed by a reload in phase 3 (end-of-run staleness); the
          job ``limited`` is removed whole by the same reload (no markers: Prometheus cancels it)
"""

from __future__ import annotations

import http.server
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import snappy

from relay.proto import remote_v1_pb2
from tests.e2e.procs import running, start_prometheus, start_relay
from tests.helpers import wait_until

pytestmark = pytest.mark.e2e

STALE = 0x7FF0000000000002
PHASE_S = 4.0
Series = tuple[tuple[str, str], ...]


def bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


# ---- the targets ----------------------------------------------------------------------------------

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def text_body(phase: int) -> str:
    gpus = {0: ["0", "1"], 1: ["0", "1", "2"]}.get(phase, ["0", "2"])
    lines = [
        "# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER Total number of PCIe retries.",
        "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter",
        *[f'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{gpu="{g}",UUID="GPU-{g}"}} {10 + int(g)}' for g in gpus],
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        *[f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}", UUID="GPU-{g}",}} {50 + phase}' for g in gpus],
        'exposed_job{job="trainer",instance="pod-1"} 1',
        "not_a_number NaN",
        "# TYPE lat histogram",
        'lat_bucket{le="0.5"} 3',
        'lat_bucket{le="+Inf"} 4',
        "lat_sum 1.5",
        "lat_count 4",
        f"stamped 7 {int(time.time()) * 1000 - 500}",  # recent: Prometheus's TSDB keeps it
    ]
    return "\n".join(lines) + "\n"


def om_body(phase: int) -> str:
    return (
        "# TYPE requests counter\n# HELP requests Requests served.\n"
        'requests_total{code="200"} 12 # {trace_id="abc"} 1.0 1700000000.5\n'
        'requests_created{code="200"} 1700000000\n'
        "# TYPE temperature_celsius gauge\n# UNIT temperature_celsius celsius\n"
        f"temperature_celsius {40 + phase}\n# EOF\n"
    )


def honor_body(phase: int) -> str:
    return 'pod_metric{job="custom",instance="elsewhere:1"} 1\nplain_metric 2\n'


def limited_body(phase: int) -> str:
    n = 5 if phase == 1 else 2
    return "".join(f'item{{i="{i}"}} {i}\n' for i in range(n))


def leaving_body(phase: int) -> str:
    return 'leaving_metric{a="1"} 3\n'


@dataclass
class Phase:
    value: int = 0


class _Target(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        srv: TargetServer = self.server  # type: ignore[assignment]
        body = srv.render(srv.phase.value).encode()
        self.send_response(200)
        self.send_header("Content-Type", srv.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class TargetServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, render: Callable[[int], str], content_type: str, phase: Phase) -> None:
        super().__init__(("127.0.0.1", 0), _Target)
        self.render = render
        self.closed = False
        self.content_type = content_type
        self.phase = phase
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.shutdown()
        self.server_close()
        self.thread.join(5)


# ---- a receiver that keeps value bits and metadata -------------------------------------------------


@dataclass
class Received:
    samples: dict[Series, set[int]] = field(default_factory=dict)  # value bits
    metadata: set[tuple[str, int, str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Receive(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        rx: Received = self.server.received  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        req = remote_v1_pb2.WriteRequest()
        req.ParseFromString(snappy.uncompress(body))
        with rx.lock:
            for ts in req.timeseries:
                key = tuple(sorted((lb.name, lb.value) for lb in ts.labels))
                rx.samples.setdefault(key, set()).update(bits(s.value) for s in ts.samples)
            for md in req.metadata:
                rx.metadata.add((md.metric_family_name, int(md.type), md.help, md.unit))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def receiver() -> Iterator[tuple[str, Received]]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receive)
    srv.daemon_threads = True
    srv.received = Received()  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/api/v1/write", srv.received  # type: ignore[attr-defined]
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


# ---- the configs -------------------------------------------------------------------------------------


def jobs(targets: dict[str, TargetServer], reloaded: bool) -> str:
    extra = {"honor": "    honor_labels: true\n", "limited": "    sample_limit: 3\n"}
    groups = {job: [srv.address] for job, srv in targets.items() if job not in ("leaving", "staying")}
    groups["leaving"] = [targets["staying"].address] + ([] if reloaded else [targets["leaving"].address])
    if reloaded:
        del groups["limited"]
    out = ""
    for job, addresses in groups.items():
        out += (f"  - job_name: {job}\n    scrape_interval: 1s\n    scrape_timeout: 900ms\n{extra.get(job, '')}"
                f"    static_configs: [{{targets: {addresses}}}]\n")
    return out


def prometheus_config(targets: dict[str, TargetServer], rx: str, reloaded: bool) -> str:
    return (f"scrape_configs:\n{jobs(targets, reloaded)}"
            f"remote_write:\n  - url: {rx}\n    queue_config: {{batch_send_deadline: 200ms}}\n"
            f"    metadata_config: {{send_interval: 1s}}\n")


def relay_config(tmp: Path, targets: dict[str, TargetServer], rx: str, reloaded: bool) -> str:
    return (f'server: {{listen: "127.0.0.1:@PORT@"}}\nstorage: {{path: {tmp / "q"}}}\n'
            f"scrape:\n{jobs(targets, reloaded)}"
            f"destinations:\n  - name: home\n    url: {rx}\n    queue: {{batch_send_deadline: 200ms}}\n")


# ---- the comparison ----------------------------------------------------------------------------------


def summary(rx: Received) -> dict[Series, tuple[bool, frozenset[int]]]:
    """Per series: whether it got a staleness marker, and its other values (duration: any)."""
    with rx.lock:
        items = {k: set(v) for k, v in rx.samples.items()}
    out = {}
    for key, values in items.items():
        name = dict(key).get("__name__")
        kept = frozenset() if name == "scrape_duration_seconds" else frozenset(v for v in values if v != STALE)
        out[key] = (STALE in values, kept)
    return out


def _ups(rx: Received) -> dict[str, set[int]]:
    with rx.lock:
        return {dict(k)["instance"]: v for k, v in rx.samples.items() if dict(k).get("__name__") == "up"}


def scraping(rx: Received) -> bool:
    return len(_ups(rx)) == 6


def left_marked(rx: Received) -> bool:
    return any(STALE in v and dict(k).get("__name__") == "up" and dict(k)["job"] == "leaving"
               for k, v in list(rx.samples.items()))


def show(entry: tuple[bool, frozenset[int]] | None) -> str:
    if entry is None:
        return "absent"
    values = sorted(struct.unpack("<d", struct.pack("<Q", b))[0] for b in entry[1])
    return f"{'stale ' if entry[0] else ''}{values}"


def test_relay_scrapes_as_prometheus_does(tmp_path: Path) -> None:
    phase = Phase()
    renders = {"text": (text_body, TEXT), "om": (om_body, OPENMETRICS), "honor": (honor_body, TEXT),
               "limited": (limited_body, TEXT), "leaving": (leaving_body, TEXT), "staying": (leaving_body, TEXT)}
    targets = {job: TargetServer(render, ctype, phase) for job, (render, ctype) in renders.items()}
    try:
        with receiver() as (prom_rx, from_prom), receiver() as (relay_rx, from_relay):
            relay_dir = tmp_path / "relay"
            relay_dir.mkdir()
            prom, _ = start_prometheus(tmp_path, prometheus_config(targets, prom_rx, False))
            relay, relay_url = start_relay(relay_dir, relay_config(relay_dir, targets, relay_rx, False))
            with running(prom), running(relay):
                # Prometheus applies its targets on a 5 s tick: the phases start once both scrape all
                assert wait_until(lambda: scraping(from_prom) and scraping(from_relay), timeout=20), (
                    prom.tail(), relay.tail())
                time.sleep(PHASE_S)
                phase.value = 1
                time.sleep(PHASE_S)
                phase.value = 2
                targets["om"].close()
                time.sleep(PHASE_S)
                (tmp_path / "prometheus" / "prometheus.yml").write_text(prometheus_config(targets, prom_rx, True))
                (relay_dir / "relay.yaml").write_text(relay_config(relay_dir, targets, relay_rx, True).replace(
                    "@PORT@", relay_url.rpartition(":")[2]))
                prom.p.send_signal(signal.SIGHUP)
                relay.p.send_signal(signal.SIGHUP)
                # each applies it (Prometheus on its next 5 s tick), then marks the target that left
                # ~2.1 intervals later
                assert wait_until(lambda: left_marked(from_prom) and left_marked(from_relay), timeout=15), (
                    prom.tail(), relay.tail())
                time.sleep(1.5)  # anything either would still write
                got_prom, got_relay = summary(from_prom), summary(from_relay)
                meta_prom, meta_relay = set(from_prom.metadata), set(from_relay.metadata)
                logs = f"prometheus:\n{prom.tail()}\nrelay:\n{relay.tail()}"
    finally:
        for srv in targets.values():
            srv.close()

    differ = sorted(k for k in got_prom.keys() | got_relay.keys() if got_prom.get(k) != got_relay.get(k))
    assert differ == [], "\n".join([*(f"{dict(k)}: prometheus {show(got_prom.get(k))} relay {show(got_relay.get(k))}"
                                      for k in differ), logs])

    # what the equality above covers, spelled out (so an empty run cannot pass)
    names = {dict(k)["__name__"] for k in got_relay}
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in names and "DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total" not in names
    assert {"requests_total", "requests_created", "up", "scrape_series_added"} <= names
    stale = {k for k, (marked, _) in got_relay.items() if marked}
    gpu1 = [k for k in stale if dict(k).get("gpu") == "1"]
    assert len(gpu1) == 2, stale  # gpu 1 vanished: its two series marked
    assert any(dict(k)["job"] == "om" for k in stale)  # the target that went away
    leaving = targets["leaving"].address
    assert any(dict(k).get("__name__") == "up" and dict(k)["instance"] == leaving for k in stale)  # reload
    ups_marked = {dict(k)["job"] for k in stale if dict(k)["__name__"] == "up" and dict(k)["instance"] != leaving}
    assert ups_marked == set(), stale  # not a failing target (up 0), one that stayed, or a job removed whole
    assert any(dict(k).get("i") == "4" for k in stale)  # over sample_limit, then gone: marked
    exported = [k for k in got_relay if dict(k).get("__name__") == "exposed_job"]
    assert exported and dict(exported[0])["exported_job"] == "trainer"
    assert any(dict(k).get("job") == "custom" for k in got_relay)  # honor_labels
    up_limited = next(v for k, (_, v) in got_relay.items() if dict(k).get("__name__") == "up"
                      and dict(k)["job"] == "limited")
    assert up_limited == {bits(0.0), bits(1.0)}  # over sample_limit: up 0 in phase 1
    assert meta_prom == meta_relay, (meta_prom ^ meta_relay)
    assert ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1, "Total number of PCIe retries.", "") in meta_relay
