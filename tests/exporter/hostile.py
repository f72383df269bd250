"""Hostile and ordinary HTTP clients for the exporter's front (issue 21 points 1 and 2), shared by
tests/exporter/test_server_front.py and bench/exporter_front_bench.py.

- ``Hostile``: connections that keep the server busy the way a pod on the node could: ``slow`` sends
  a request head a byte every ``trickle_s`` (never finishing), ``big`` sends 99 header lines of
  65 kB each; each reconnects as soon as the server cuts it, so the pressure stays constant.
- ``scrape_s``: one GET /metrics on a new connection, timed to the last body byte.
- ``simultaneous``: ``n`` new connections started at once (a barrier), each one GET; latencies.
- ``keepalive_scrapers``: ``n`` keep-alive clients scraping for ``seconds``; answers and failures.
- ``rss_mib``: resident memory of a process from ``/proc/<pid>/statm``.
- ``exporter_process``: the real ``gpu-exporter`` (simulated GPUs) in a child process.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
BIG_LINE = b"a" * 65_000


def rss_mib(pid: int) -> float:
    """Resident set size in MiB (``/proc/<pid>/statm``'s second field, in pages)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@contextlib.contextmanager
def exporter_process(gpus: int = 8, extra: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``gpu-exporter --backend simulated`` on a free loopback port, ready (its /health answers)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "--backend", "simulated", "--simulate-gpus", str(gpus),
         "--listen", f"127.0.0.1:{port}", "--log-level", "error", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if not wait_until(lambda: _answers(port), timeout=30):
            proc.kill()
            raise RuntimeError(f"gpu-exporter did not start: {proc.communicate(timeout=10)[1][-2000:]!r}")
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        return scrape_s(port, "/metrics")[0] == 200
    except OSError:
        return False


def scrape_s(port: int, path: str = "/metrics", timeout: float = 10.0) -> tuple[int, float]:
    """(status, seconds) of one GET on a new connection, to the last body byte."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - t0
    finally:
        conn.close()


class Hostile:
    """``n`` hostile connections of one ``kind`` (``slow`` or ``big``), reconnecting until ``stop()``."""

    def __init__(self, port: int, n: int, kind: str, trickle_s: float = 0.5) -> None:
        if kind not in ("slow", "big"):
            raise ValueError(kind)
        self.port, self.n, self.kind, self.trickle_s = port, n, kind, trickle_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.connects = 0
        self.open = 0
        self._lock = threading.Lock()

    def start(self) -> Hostile:
        for i in range(self.n):
            t = threading.Thread(target=self._run, name=f"hostile-{self.kind}-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                    with self._lock:
                        self.connects += 1
                        self.open += 1
                    try:
                        self._slow(s) if self.kind == "slow" else self._big(s)
                    finally:
                        with self._lock:
                            self.open -= 1
            except OSError:
                self._stop.wait(0.05)

    def _slow(self, s: socket.socket) -> None:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        while not self._stop.wait(self.trickle_s):
            s.sendall(b"a")  # OSError once the server has cut the connection

    def _big(self, s: socket.socket) -> None:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        for i in range(99):
            if self._stop.is_set():
                return
            s.sendall(b"X-Big-%d: %s\r\n" % (i, BIG_LINE))
        s.sendall(b"\r\n")
        s.recv(4096)


def simultaneous(port: int, n: int, path: str = "/health", timeout: float = 30.0) -> list[float]:
    """Latency of each of ``n`` GETs on new connections started together (inf: failed)."""
    barrier = threading.Barrier(n)
    out = [float("inf")] * n

    def one(i: int) -> None:
        barrier.wait()
        with contextlib.suppress(OSError, http.client.HTTPException):
            status, seconds = scrape_s(port, path, timeout)
            if status == 200:
                out[i] = seconds

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return out


def keepalive_scrapers(port: int, n: int, seconds: float, timeout: float = 10.0) -> tuple[int, int, float]:
    """``n`` keep-alive clients scraping /metrics back to back for ``seconds``: (answers, failures,
    worst seconds of one answer)."""
    answers, failures, worst = [0] * n, [0] * n, [0.0] * n
    barrier = threading.Barrier(n)
    end = time.monotonic() + seconds

    def one(i: int) -> None:
        barrier.wait()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/metrics")
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    raise http.client.HTTPException(resp.status)
                answers[i] += 1
                worst[i] = max(worst[i], time.perf_counter() - t0)
            except (OSError, http.client.HTTPException):
                failures[i] += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.close()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + timeout + 5)
    return sum(answers), sum(failures), max(worst)
