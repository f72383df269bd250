"""Torture harness: the real victoria-metrics and gpu-relay processes, a Prometheus-like loader,
and an exact per-sample tally of what was acknowledged against what was stored (bench/torture.py)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay.ingest import wire  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from tests.helpers import wait_until as wait  # noqa: E402

METRIC = "torture_seq"
V1_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
V2_HEADERS = {
    "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "2.0.0",
}


# ---- processes -------------------------------------------------------------------------------


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class VictoriaMetrics:
    """A real victoria-metrics single node; stop() and start() keep its data directory."""

    def __init__(self, work: Path) -> None:
        self.binary = shutil.which("victoria-metrics")
        if self.binary is None:
            raise SystemExit("torture: victoria-metrics is not installed (run scripts/setup.sh)")
        self.port = free_port()
        self.data = work / "vm-data"
        self.log = work / "vm.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            self.binary,
            f"-storageDataPath={self.data}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-retentionPeriod=100y",
            "-search.disableCache",
            "-loggerLevel=ERROR",
        ]
        self.proc = subprocess.Popen(args, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        if not wait(lambda: _get(self.base + "/health")[0] == 200, 30):
            raise SystemExit(f"torture: victoria-metrics did not start; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def series_timestamps(self) -> dict[tuple[str, str], Counter[int]]:
        """(lane, s) -> how many times each timestamp is stored."""
        _get(self.base + "/internal/force_flush", 30)
        time.sleep(1.5)
        status, body = _get(self.base + f"/api/v1/export?match[]={METRIC}", 120)
        if status != 200:
            raise SystemExit(f"torture: victoria-metrics export answered {status}: {body[:200]!r}")
        out: dict[tuple[str, str], Counter[int]] = {}
        for line in body.splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            key = (row["metric"].get("lane", ""), row["metric"].get("s", ""))
            out.setdefault(key, Counter()).update(row["timestamps"])
        return out


class Relay:
    """The real ``gpu-relay run`` process."""

    def __init__(
        self,
        work: Path,
        dest_url: str,
        *,
        max_sample_age: str = "1h",
        max_disk: str = "1GiB",
        queue_dir: Path | None = None,
        read_timeout: str = "30s",
    ) -> None:
        self.port = free_port()
        self.queue_dir = queue_dir or work / "queue"
        self.config = work / "relay.yaml"
        self.log = work / "relay.log"
        self.config.write_text(
            f"server: {{listen: 127.0.0.1:{self.port}, read_timeout: {read_timeout}}}\n"
            f"storage: {{path: {self.queue_dir}}}\n"
            "destinations:\n"
            "  - name: vm\n"
            f"    url: {dest_url}\n"
            "    queue: {max_samples_per_send: 2000, batch_send_deadline: 200ms, max_shards: 4,\n"
            f"            min_backoff: 50ms, max_backoff: 1s, max_sample_age: {max_sample_age},"
            f" max_disk: {max_disk}}}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_times: list[float] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def write_url(self) -> str:
        return self.base + "/api/v1/write"

    def start(self, timeout: float = 30.0) -> float:
        """Start and wait for /-/ready; returns seconds to ready (inf when it never got ready)."""
        t0 = time.monotonic()
        args = [str(Path(sys.executable).parent / "gpu-relay"), "run", "--config", str(self.config)]
        self.proc = subprocess.Popen(args, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        ok = wait(
            lambda: self.proc is not None and self.proc.poll() is None and _get(self.base + "/-/ready", 1)[0] == 200,
            timeout,
            0.02,
        )
        took = time.monotonic() - t0 if ok else float("inf")
        self.ready_times.append(took)
        return took

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def rss(self) -> float:
        return rss_mb(self.proc.pid) if self.proc is not None else 0.0

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a self-metric's samples whose labels include ``labels`` (0 when absent)."""
        status, body = _get(self.base + "/metrics", 5)
        if status != 200:
            return float("nan")
        total = 0.0
        for line in body.decode().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)", line)
            if m is None or m.group(1) != name:
                continue
            have = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
        return total

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """A self-metric's samples summed per value of ``label``."""
        status, body = _get(self.base + "/metrics", 5)
        out: dict[str, float] = {}
        if status != 200:
            return out
        for line in body.decode().splitlines():
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)", line)
            if m is None or m.group(1) != name:
                continue
            have = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            key = have.get(label, "")
            out[key] = out.get(key, 0.0) + float(m.group(3))
        return {k: v for k, v in out.items() if v}

    def counted_losses(self) -> dict[str, float]:
        """What the relay itself says it lost, by reason: queue overflow, samples past
        max_sample_age, batches a destination refused (every failure is a loss here)."""
        out = {
            r: self.metric("gpu_relay_samples_dropped_total", reason=r)
            for r in ("queue_full", "max_sample_age", "too_old")
        }
        out["send failed"] = self.metric("gpu_relay_samples_failed_total")
        return {k: v for k, v in out.items() if v}

    def queued(self) -> float:
        return self.metric("gpu_relay_queue_samples")

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


# ---- load -------------------------------------------------------------------------------------


def request_body(lane: int, series: int, ts: int) -> bytes:
    """One RW 1.0 request: ``series`` series of lane ``lane``, one sample each at ``ts``."""
    rows = [
        ((("__name__", METRIC), ("lane", str(lane)), ("s", str(s))), [(ts, float(ts % 1_000_003))])
        for s in range(series)
    ]
    return wire.compress(wire.encode_write_request(rows))


@dataclass
class Loader:
    """Lanes of Prometheus-like senders: each lane sends its requests in order and retries one
    until it is answered 2xx (dropping it on a 4xx), pacing itself to ``rate`` requests/s."""

    url: Callable[[], str]
    lanes: int = 4
    series: int = 100
    rate: float = 12.0  # requests per second per lane
    acked: dict[int, list[int]] = field(default_factory=dict)  # lane -> acknowledged timestamps
    statuses: Counter[int] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for lane in range(self.lanes):
            self.acked[lane] = []
            t = threading.Thread(target=self._run, args=(lane,), daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    @property
    def acked_samples(self) -> int:
        return sum(len(v) for v in self.acked.values()) * self.series

    def _run(self, lane: int) -> None:
        last_ts = 0
        period = 1.0 / self.rate
        while not self._stop.is_set():
            t0 = time.monotonic()
            ts = max(int(time.time() * 1000), last_ts + 1)
            last_ts = ts
            body = request_body(lane, self.series, ts)
            while not self._stop.is_set():
                status = post(self.url(), body, V1_HEADERS)
                self.statuses[status] += 1
                if 200 <= status < 300:
                    self.acked[lane].append(ts)
                    break
                if 400 <= status < 500 and status not in (408, 429):
                    break
                self._stop.wait(0.05)
            self._stop.wait(max(0.0, period - (time.monotonic() - t0)))


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = 10.0) -> int:
    """Status of one POST; 0 for a connection error, -1 for a timeout."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code
    except TimeoutError:
        return -1
    except OSError as exc:
        return -1 if "timed out" in str(exc) else 0


@dataclass
class Tally:
    acked: int
    delivered_acked: int  # acknowledged samples found at the receiver
    lost: int
    duplicated: int
    unacked_delivered: int  # delivered though never acknowledged (a kill between commit and reply)


def tally(loader: Loader, vm: VictoriaMetrics) -> Tally:
    stored = vm.series_timestamps()
    lost = found = 0
    acked_keys: set[tuple[int, int]] = set()
    for lane, stamps in loader.acked.items():
        for ts in stamps:
            acked_keys.add((lane, ts))
            for s in range(loader.series):
                if stored.get((str(lane), str(s)), Counter())[ts]:
                    found += 1
                else:
                    lost += 1
    dup = extra = 0
    for (lane, _s), stamps in stored.items():
        for ts, n in stamps.items():
            dup += n - 1
            if (int(lane), ts) not in acked_keys:
                extra += 1
    return Tally(loader.acked_samples, found, lost, dup, extra)


def drain(relay: Relay, timeout: float) -> float:
    """Seconds until the relay's queue is empty (inf on timeout)."""
    t0 = time.monotonic()
    ok = wait(lambda: relay.queued() == 0, timeout, 0.2)
    return time.monotonic() - t0 if ok else float("inf")



@dataclass
class Outcome:
    name: str
    ok: bool
    rows: list[tuple[str, str]]
    notes: list[str] = field(default_factory=list)


def tally_rows(t: Tally) -> list[tuple[str, str]]:
    return [
        ("acked samples", f"{t.acked:,}"),
        ("delivered (of acked)", f"{t.delivered_acked:,}"),
        ("lost", f"{t.lost:,}"),
        ("duplicated", f"{t.duplicated:,}"),
        ("delivered, never acked", f"{t.unacked_delivered:,}"),
    ]
