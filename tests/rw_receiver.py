"""A recording remote-write receiver for tests: decodes every POST and keeps its samples.

It can be scripted to answer a sequence of statuses before succeeding."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import snappy

from relay.proto import remote_v1_pb2

Series = tuple[tuple[str, str], ...]


class _Handler(BaseHTTPRequestHandler):
    server: RecordingServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        srv = self.server
        with srv.lock:
            srv.requests.append(dict(self.headers.items()))
            status = srv.script.pop(0) if srv.script else 204
        if status < 300:
            req = remote_v1_pb2.WriteRequest()
            req.ParseFromString(snappy.uncompress(body))
            with srv.lock:
                for ts in req.timeseries:
                    key = tuple((lb.name, lb.value) for lb in ts.labels)
                    for s in ts.samples:
                        srv.samples.add((key, s.timestamp, s.value))
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


class RecordingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.samples: set[tuple[Series, int, float]] = set()
        self.requests: list[dict[str, str]] = []
        self.script: list[int] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/api/v1/write"

    def snapshot(self) -> set[tuple[Series, int, float]]:
        with self.lock:
            return set(self.samples)


@contextmanager
def recording_receiver() -> Iterator[RecordingServer]:
    srv = RecordingServer()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)
