"""Remote-write receivers for the relay benches: a real VictoriaMetrics, or a small in-process sink.

Both answer ``rows()`` (samples received so far, cheap enough to poll) and ``contents()`` (what was
stored: samples per metric name, the label names seen), so a bench can require that a run delivered
exactly the expected samples and that a rule really dropped what it should.

``VictoriaMetrics`` is Debian's single-node ``victoria-metrics`` 1.79: ``rows()`` reads
``vm_rows_inserted_total{type="promremotewrite"}`` from its /metrics, ``contents()`` calls
``/internal/force_flush`` and reads every stored sample back through ``/api/v1/export``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import snappy

from relay.ingest import wire
from tests.helpers import free_port, wait_until


@dataclass
class Contents:
    samples: int
    names: dict[str, int]  # metric name -> samples
    label_names: set[str]
    series: int


class Receiver(Protocol):
    url: str

    def rows(self) -> int: ...

    def contents(self) -> Contents: ...

    def close(self) -> None: ...


def _get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


class VictoriaMetrics:
    """A fresh single-node victoria-metrics on 127.0.0.1 storing under ``work``; ``close()`` stops it."""

    def __init__(self, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/api/v1/write"
        self._log = open(work / "victoria-metrics.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [shutil.which("victoria-metrics") or "victoria-metrics", f"-storageDataPath={work / 'vm-data'}",
             f"-httpListenAddr=127.0.0.1:{self.port}", "-loggerLevel=ERROR", "-retentionPeriod=1"],
            stdout=self._log, stderr=subprocess.STDOUT)

        def up() -> bool:
            try:
                return _get(self.base + "/health", 1) == b"OK"
            except OSError:
                return self.proc.poll() is not None

        if not wait_until(up, timeout=30) or self.proc.poll() is not None:
            self.close()
            raise RuntimeError(f"victoria-metrics did not start: {(work / 'victoria-metrics.log').read_text()[-2000:]}")

    def metric(self, name: str) -> float:
        """One sample of VictoriaMetrics' own /metrics, e.g. ``vm_new_timeseries_created_total``."""
        for line in _get(self.base + "/metrics").decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise RuntimeError(f"victoria-metrics /metrics has no {name}")

    def rows(self) -> int:
        return int(self.metric('vm_rows_inserted_total{type="promremotewrite"}'))

    def contents(self) -> Contents:
        _get(self.base + "/internal/force_flush")
        names: dict[str, int] = {}
        label_names: set[str] = set()
        series = samples = 0
        q = urllib.parse.urlencode({"match[]": '{__name__=~".+"}', "start": "0", "end": str(int(time.time()) + 3600)})
        with urllib.request.urlopen(f"{self.base}/api/v1/export?{q}", timeout=300) as r:
            for line in r:
                row: dict[str, Any] = json.loads(line)
                metric: dict[str, str] = row["metric"]
                n = len(row["values"])
                names[metric["__name__"]] = names.get(metric["__name__"], 0) + n
                label_names.update(metric)
                series += 1
                samples += n
        return Contents(samples, names, label_names, series)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


class Sink(ThreadingHTTPServer):
    """An in-process remote-write receiver that counts samples and records metric and label names."""

    daemon_threads = True

    def __init__(self) -> None:
        self.samples = 0
        self.names: dict[str, int] = {}  # metric name -> samples
        self.label_names: set[str] = set()
        self.lock = threading.Lock()
        self._cache: dict[bytes, wire.Decision] = {}
        sink = self

        def decide(key: bytes) -> wire.Decision:
            labels = wire.decode_labels(key)
            sink.label_names.update(n for n, _ in labels)  # called by route(), under sink.lock
            return ((b"", 0, dict(labels).get("__name__", "")),)

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding not in ("snappy", ""):
                    self.send_response(415)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                raw = snappy.uncompress(body) if encoding == "snappy" else body
                with sink.lock:  # the cache is shared by the handler threads
                    routed = wire.route(raw, 1, sink._cache, decide)
                    for decision, _rest, n, _oldest in routed.per_dest[0]:
                        name = decision[2]
                        sink.names[name] = sink.names.get(name, 0) + n
                    sink.samples += routed.samples_in
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/api/v1/write"
        threading.Thread(target=self.serve_forever, name="sink", daemon=True).start()

    def rows(self) -> int:
        return self.samples

    def contents(self) -> Contents:
        with self.lock:
            return Contents(self.samples, dict(self.names), set(self.label_names), len(self._cache))

    def close(self) -> None:
        self.shutdown()
        self.server_close()
