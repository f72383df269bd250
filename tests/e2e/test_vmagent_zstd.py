"""vmagent writes through gpu-relay (issue 20 point 4). The installed vmagent, default flags: every
sample it was given reaches the relay's destination, every write answered 2xx; where that vmagent
speaks the VictoriaMetrics remote-write protocol (1.88+: it has -remoteWrite.vmProtoCompressLevel),
its writes must be zstd (1.116+ sends zstd at once; older ones after the probe, which the relay
answers as VictoriaMetrics does). Debian's vmagent 1.79.5 predates that protocol and sends snappy.
A recording forwarder between vmagent and the relay keeps what vmagent sent. Then the exchange of a
vmagent 1.116, request for request (the probe older versions send, GET and POST, and a zstd
RW 1.0 body with the headers vmagent sets), against the real gpu-relay process."""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import zstandard

from relay.ingest.wire import encode_write_request
from tests.e2e.procs import running, start_relay
from tests.e2e.test_vm_interop import start_vmagent
from tests.helpers import require_binary, wait_until
from tests.rw_receiver import recording_receiver

pytestmark = pytest.mark.e2e

SERIES = 20


class _Forward(BaseHTTPRequestHandler):
    server: Forwarder
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    do_POST = do_GET

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
        req = urllib.request.Request(self.server.target + self.path, data=body if self.command == "POST" else None,
                                     headers=headers, method=self.command)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                status, answer = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, answer = e.code, e.read()
        with self.server.lock:
            self.server.seen.append((self.command, self.path, self.headers.get("Content-Encoding", ""), status))
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


class Forwarder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.target = target
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str, str, int]] = []

    def snapshot(self) -> list[tuple[str, str, str, int]]:
        with self.lock:
            return list(self.seen)


def speaks_vm_protocol(binary: str) -> bool:
    """Whether this vmagent has the VictoriaMetrics remote-write protocol (zstd): v1.88 and later."""
    flags = subprocess.run([binary, "-help"], capture_output=True, text=True, timeout=30)
    return "remoteWrite.vmProtoCompressLevel" in flags.stdout + flags.stderr


RELAY_CONFIG = """
server: {{listen: "127.0.0.1:@PORT@"}}
storage: {{path: {queues}}}
destinations:
  - name: rx
    url: {url}
    queue: {{batch_send_deadline: 200ms}}
"""


def test_the_installed_vmagent_with_default_flags_delivers_through_the_relay(tmp_path: Path) -> None:
    zstd_expected = speaks_vm_protocol(require_binary("vmagent"))
    with recording_receiver() as rx:
        relay, relay_url = start_relay(tmp_path, RELAY_CONFIG.format(queues=tmp_path / "queues", url=rx.url))
        with running(relay):
            fwd = Forwarder(relay_url)
            threading.Thread(target=fwd.serve_forever, daemon=True).start()
            try:
                agent, agent_url = start_vmagent(tmp_path, "vmagent", f"http://127.0.0.1:{fwd.server_address[1]}"
                                                 "/api/v1/write")
                with running(agent):
                    ts = int(time.time()) * 1000
                    lines = "".join(f'zstd_e2e{{series="{i}"}} {i} {ts}\n' for i in range(SERIES))
                    urllib.request.urlopen(urllib.request.Request(agent_url + "/api/v1/import/prometheus",
                                                                  data=lines.encode(), method="POST"), timeout=5)

                    def got() -> dict[str, float]:
                        return {dict(k)["series"]: v for k, t, v in rx.snapshot()
                                if dict(k).get("__name__") == "zstd_e2e" and t == ts}

                    assert wait_until(lambda: len(got()) == SERIES, timeout=30, interval=0.3), (
                        fwd.snapshot(), relay.tail(), agent.tail())
                    assert got() == {str(i): float(i) for i in range(SERIES)}
                    seen = fwd.snapshot()
                    writes = [s for s in seen if "get_vm_proto_version" not in s[1]]
                    assert writes and all(s[3] == 204 for s in writes), seen
                    assert all(s[2] == ("zstd" if zstd_expected else "snappy") for s in writes), seen
                    probes = [s for s in seen if "get_vm_proto_version" in s[1]]
                    assert all(s[3] == 200 for s in probes), seen  # 1.116+ sends no probe; older ones do
            finally:
                fwd.shutdown()
                fwd.server_close()


VMAGENT_HEADERS = {"User-Agent": "vmagent", "Content-Type": "application/x-protobuf", "Content-Encoding": "zstd",
                   "X-VictoriaMetrics-Remote-Write-Version": "1"}  # app/vmagent/remotewrite/client.go newRequest


def test_a_vmagent_1_116_exchange_against_the_relay_process(tmp_path: Path) -> None:
    with recording_receiver() as rx:
        relay, relay_url = start_relay(tmp_path, RELAY_CONFIG.format(queues=tmp_path / "queues", url=rx.url))
        with running(relay):
            for method in ("GET", "POST"):  # the probe of vmagent < 1.116 (GET, later POST with no body)
                probe = urllib.request.Request(relay_url + "/api/v1/write?get_vm_proto_version=1", method=method,
                                               data=b"" if method == "POST" else None,
                                               headers={"User-Agent": "vmagent"})
                with urllib.request.urlopen(probe, timeout=5) as r:
                    assert (r.status, r.read()) == (200, b"1")
            ts = int(time.time()) * 1000
            raw = encode_write_request([((("__name__", "vm_proto"), ("i", str(i))), [(ts, float(i))])
                                        for i in range(5)])
            body = zstandard.ZstdCompressor(level=1).compress(raw)
            write = urllib.request.Request(relay_url + "/api/v1/write", data=body, method="POST",
                                           headers=VMAGENT_HEADERS)
            with urllib.request.urlopen(write, timeout=5) as r:
                assert r.status == 204

            def got() -> set[tuple[str, float]]:
                return {(dict(k)["i"], v) for k, t, v in rx.snapshot() if t == ts}

            assert wait_until(lambda: len(got()) == 5, timeout=20, interval=0.2), relay.tail()
            assert got() == {(str(i), float(i)) for i in range(5)}
