"""Running gpu-relay and vmagent for the benches: start a fresh process, feed it requests, measure it.

``measure`` starts a program, posts a payload, waits until the receiver (bench/receivers.py) holds the
expected samples and has stayed unchanged for a settle time, and reads back what it stores. CPU is
user+system of every thread of the program (/proc/PID/stat), peak RSS its VmHWM. See bench/relay_bench.py.
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.receivers import Contents, Receiver, Sink, VictoriaMetrics
from bench.rw_payload import DROP_LABELS, KEEP, PER_REQUEST, RW1_HEADERS, Payload
from tests.helpers import free_port, wait_until

SENDERS = 4  # concurrent requests, like a few Prometheus shards
FLUSH_S = 1.0  # batch_send_deadline (gpu-relay) and -remoteWrite.flushInterval (vmagent) in every run
KEEP4_RELABEL = (f"- source_labels: [__name__]\n  regex: {'|'.join(KEEP)}\n  action: keep\n"
                 f"- regex: {'|'.join(DROP_LABELS)}\n  action: labeldrop\n")
# the same rules as gpu-relay destination keys
KEEP4_RULES = "    write_relabel_configs:\n" + "".join(f"      {ln}\n" for ln in KEEP4_RELABEL.splitlines())


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` figure in KiB: ``VmRSS`` (now) or ``VmHWM`` (peak RSS)."""
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith(field + ":"):
            return int(ln.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def rss_mb(pid: int) -> float:
    return status_kib(pid, "VmRSS") / 1024


def post_all(url: str, reqs: Sequence[bytes], headers: Mapping[str, str] = RW1_HEADERS) -> None:
    """POST every request, ``SENDERS`` at a time, each sender on its own keep-alive connection as
    Prometheus's remote-write shards keep theirs; 429/5xx/network errors are retried like Prometheus
    (a failed connection is replaced)."""
    parts = urlsplit(url)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
    local = threading.local()
    opened: list[http.client.HTTPConnection] = []

    def one(body: bytes) -> None:
        last: Exception | str | None = None
        for _ in range(100):
            conn: http.client.HTTPConnection | None = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection(host, port, timeout=60)
                opened.append(conn)
            try:
                conn.request("POST", path, body=body, headers=dict(headers))
                resp = conn.getresponse()
                text = resp.read()
                if resp.will_close:
                    conn.close()
                    local.conn = None
                if resp.status < 300:
                    return
                if resp.status not in (408, 429) and resp.status < 500:
                    raise RuntimeError(f"{url} answered {resp.status}: {text[:200]!r}")
                last = f"{resp.status} {text[:200]!r}"
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                local.conn = None
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"could not post to {url}: {last}")

    try:
        with ThreadPoolExecutor(SENDERS) as ex:
            list(ex.map(one, reqs))
    finally:
        for c in opened:
            c.close()


@dataclass
class Proc:
    """A started program: its process, its write URL and its log."""

    name: str
    popen: subprocess.Popen[bytes]
    write_url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited {self.popen.returncode}: "
                               f"{self.log_path.read_text(errors='replace')[-2000:]}")


@contextmanager
def _started(name: str, args: list[str], ready: str, write_url: str, work: Path) -> Iterator[Proc]:
    log_path = work / f"{name}.log"
    with open(log_path, "wb") as log:
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            def up() -> bool:
                try:
                    with urllib.request.urlopen(ready, timeout=1) as r:
                        return bool(r.status == 200)
                except Exception:
                    return p.poll() is not None

            proc = Proc(name, p, write_url, log_path)
            if not wait_until(up, timeout=30):
                raise RuntimeError(f"{name} did not start: {log_path.read_text(errors='replace')[-2000:]}")
            proc.alive()
            yield proc
        finally:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def relay_config(port: int, queue_dir: Path, sink_url: str, rules: str = "", min_shards: int | None = None) -> str:
    """A one-destination gpu-relay config. ``rules``: extra destination keys, YAML at 4 spaces' indent.
    ``min_shards``: None leaves the relay's default (1: it runs what sending needs, up to max_shards 4)."""
    fixed = "" if min_shards is None else f", min_shards: {min_shards}"
    return (f"server: {{listen: '127.0.0.1:{port}'}}\nstorage: {{path: {queue_dir}}}\n"
            f"destinations:\n  - name: sink\n    url: {sink_url}\n{rules}"
            f"    queue: {{max_samples_per_send: {PER_REQUEST}, batch_send_deadline: {FLUSH_S:g}s, max_shards: 4"
            f"{fixed}}}\n")


def start_relay(rules: str, work: Path, rx_url: str, min_shards: int | None = None) -> AbstractContextManager[Proc]:
    """A fresh gpu-relay (one destination with ``rules``, forwarding to ``rx_url``), stopped on exit."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cfg = work / "relay.yaml"
    cfg.write_text(relay_config(port, work / "q", rx_url, rules, min_shards))
    base = f"http://127.0.0.1:{port}"
    return _started("gpu-relay", [str(Path(sys.executable).parent / "gpu-relay"), "run", "--config", str(cfg)],
                    base + "/-/ready", base + "/api/v1/write", work)


def start_vmagent(relabel: str, work: Path, rx_url: str) -> AbstractContextManager[Proc]:
    """A fresh vmagent 1.79 (``-remoteWrite.urlRelabelConfig`` = ``relabel`` if given), stopped on exit."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = [shutil.which("vmagent") or "vmagent", f"-httpListenAddr=127.0.0.1:{port}", f"-remoteWrite.url={rx_url}",
            f"-remoteWrite.tmpDataPath={work / 'q'}", f"-remoteWrite.flushInterval={FLUSH_S:g}s", "-loggerLevel=ERROR"]
    if relabel:
        (work / "relabel.yml").write_text(relabel)
        args.append(f"-remoteWrite.urlRelabelConfig={work / 'relabel.yml'}")
    base = f"http://127.0.0.1:{port}"
    return _started("vmagent", args, base + "/health", base + "/api/v1/write", work)


def feed(proc: Proc, rx: Receiver, reqs: Sequence[bytes], headers: Mapping[str, str], until_rows: int,
         timeout: float = 600) -> tuple[float, float]:
    """Post ``reqs`` to ``proc`` and wait until ``rx`` holds ``until_rows`` samples in all; returns the CPU
    seconds ``proc`` spent meanwhile and the wall seconds."""
    c0 = cpu_seconds(proc.pid)
    w0 = time.monotonic()
    post_all(proc.write_url, reqs, headers)
    if not wait_until(lambda: rx.rows() >= until_rows, timeout=timeout, interval=0.05):
        proc.alive()
        raise RuntimeError(f"{proc.name}: receiver got {rx.rows()} of {until_rows} samples")
    return cpu_seconds(proc.pid) - c0, time.monotonic() - w0


@dataclass
class Result:
    cpu: float  # seconds of CPU from the first request until the receiver had everything
    wall: float  # seconds from the first request until then
    rss_mb: float  # peak RSS (VmHWM) of the program
    delivered: int
    contents: Contents

    @property
    def names(self) -> dict[str, int]:
        return self.contents.names

    @property
    def label_names(self) -> set[str]:
        return self.contents.label_names


def _settled(rx: Receiver, settle_s: float) -> tuple[int, float]:
    """Wait until ``rx`` has been unchanged for ``settle_s``; returns its rows and when they last changed."""
    last, changed = rx.rows(), time.monotonic()
    while time.monotonic() - changed < settle_s:
        time.sleep(0.05)
        now = rx.rows()
        if now != last:
            last, changed = now, time.monotonic()
    return last, changed


def measure(start: Callable[[str], AbstractContextManager[Proc]], rx: Receiver, pl: Payload, expected: int | None,
            settle_s: float = 1.5, at_least: int = 0) -> Result:
    """Start a program (``start(receiver URL)``), post ``pl`` and wait for ``rx``. ``expected``: the exact
    sample count the receiver must reach; None: wait until it has ``at_least`` samples and has been quiet for
    ``settle_s`` (outputs whose count depends on timing, like aggregation windows). In both cases the receiver
    must stay unchanged for ``settle_s`` afterwards and hold exactly what arrived, so over-delivery is caught."""
    with start(rx.url) as proc:
        c0 = cpu_seconds(proc.pid)
        w0 = time.monotonic()
        if expected is not None:
            cpu, wall = feed(proc, rx, pl.requests, pl.headers, expected)
            rows, _ = _settled(rx, settle_s)
        else:
            post_all(proc.write_url, pl.requests, pl.headers)
            if not wait_until(lambda: rx.rows() >= max(at_least, 1), timeout=300, interval=0.05):
                raise RuntimeError(f"{proc.name}: receiver got {rx.rows()} samples, expected {at_least} or more")
            rows, changed = _settled(rx, settle_s)
            cpu, wall = cpu_seconds(proc.pid) - c0, changed - w0  # cpu includes settle_s idling (about 1 ms/s)
            rows, _ = _settled(rx, settle_s)
        peak = status_kib(proc.pid, "VmHWM") / 1024
        proc.alive()
    got = rx.contents()
    if (expected is not None and rows != expected) or got.samples != rows:
        raise RuntimeError(f"{proc.name}: receiver counted {rows} samples and stores {got.samples}, "
                           f"expected {expected if expected is not None else rows}")
    return Result(cpu, wall, peak, rows, got)


def run_relay(rules: str, pl: Payload, expected: int | None, work: Path, settle_s: float = 1.5,
              at_least: int = 0, receiver: str = "sink", min_shards: int | None = None) -> Result:
    """One fresh gpu-relay (one destination with ``rules``) fed ``pl`` into a fresh receiver (``"sink"``: the
    in-process one, ``"vm"``: victoria-metrics); see ``measure`` for ``expected``, ``at_least``, ``settle_s``."""
    rx: Receiver = VictoriaMetrics(work / "rx") if receiver == "vm" else Sink()
    try:
        return measure(lambda url: start_relay(rules, work, url, min_shards), rx, pl, expected, settle_s, at_least)
    finally:
        rx.close()


def run_vmagent(relabel: str, pl: Payload, expected: int | None, work: Path, settle_s: float = 1.5,
                receiver: str = "sink") -> Result:
    """One fresh vmagent 1.79 fed ``pl`` into a fresh receiver; as ``run_relay``."""
    rx: Receiver = VictoriaMetrics(work / "rx") if receiver == "vm" else Sink()
    try:
        return measure(lambda url: start_vmagent(relabel, work, url), rx, pl, expected, settle_s)
    finally:
        rx.close()
