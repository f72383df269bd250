"""The exporter's HTTP front against a hostile pod (issue 21 points 1 and 2): memory and a real
scrape with 100 hostile connections (the real exporter in a child process, RSS from
/proc/<pid>/statm), 50 simultaneous new connections, the 64 KiB head cap, the whole-head deadline
(plain and TLS), the connection bound and the listen backlog."""

from __future__ import annotations

import shutil
import socket
import ssl
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.server import Server
from exporter.webconfig import load_web_config
from tests.exporter.hostile import Hostile, exporter_process, rss_mib, scrape_s, simultaneous
from tests.exporter.test_server import StubSource
from tests.helpers import wait_until
from tests.tls_certs import Certs, make_certs


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server(("127.0.0.1", 0), StubSource(), head_timeout=1.0, max_connections=4)
    s.start()
    yield s
    s.stop()


def _recv_all(s: socket.socket, timeout: float = 10.0) -> bytes:
    s.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
    return out


def _get(port: int, headers: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n")
        return _recv_all(s)


def test_100_hostile_connections_keep_rss_under_64_mib_and_a_scrape_under_100_ms() -> None:
    with exporter_process() as (proc, port):
        slow, big = Hostile(port, 50, "slow").start(), Hostile(port, 50, "big").start()
        try:
            # the slow heads stay open; a big head is cut (431) as soon as it passes 64 KiB and comes back,
            # so on a quiet machine few of them are open at one instant: wait for each kind's own sign
            assert wait_until(lambda: slow.open >= 45 and big.connects >= 50, timeout=20)
            peak, latencies = 0.0, []
            for _ in range(12):
                time.sleep(0.5)
                peak = max(peak, rss_mib(proc.pid))
                status, seconds = scrape_s(port)
                assert status == 200
                latencies.append(seconds)
            connects = big.connects
        finally:
            slow.stop()
            big.stop()
    assert peak < 64.0, f"RSS {peak:.1f} MiB with 100 hostile connections"
    assert statistics.median(latencies) < 0.1, latencies
    assert max(latencies) < 1.0, latencies  # headroom for a loaded 2-core machine
    assert connects > 100  # the big heads were cut (431) and came back, so the pressure was real


def test_50_simultaneous_new_connections_are_all_answered_without_a_syn_retry() -> None:
    s = Server(("127.0.0.1", 0), StubSource())
    s.start()
    try:
        latencies = simultaneous(s.address[1], 50)
    finally:
        s.stop()
    # a refused SYN is retried after 1 s; with a backlog of 5, most of the 50 waited that long
    assert max(latencies) < 0.75, sorted(latencies)[-5:]


def test_the_listen_backlog_is_at_least_1024(server: Server) -> None:
    assert server.front.request_queue_size >= 1024
    if shutil.which("ss"):
        out = subprocess.run(["ss", "-ltnH", f"sport = :{server.address[1]}"], capture_output=True, text=True,
                             timeout=10).stdout.split()
        assert int(out[2]) >= 1024, out  # Send-Q of a listening socket: its backlog


@pytest.mark.parametrize(("header_bytes", "status"), [(40_000, b"200"), (60_000, b"200"), (70_000, b"431")])
def test_request_heads_are_capped_at_64_kib_in_total(server: Server, header_bytes: int, status: bytes) -> None:
    lines = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 986) for i in range(header_bytes // 1000))
    assert _get(server.address[1], lines).startswith(b"HTTP/1.1 " + status)


def test_65_kb_header_lines_are_431_at_the_second_line_without_waiting_for_the_rest(server: Server) -> None:
    with socket.create_connection(server.address, timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        for i in range(2):  # of 99: the head never ends, the cap answers before the deadline
            s.sendall(b"X-Big-%d: %s\r\n" % (i, b"a" * 65_000))
        assert _recv_all(s).startswith(b"HTTP/1.1 431")
        assert time.monotonic() - t0 < 0.9  # before the 1 s head deadline


def test_a_trickled_head_is_cut_at_the_whole_head_deadline(server: Server) -> None:
    with socket.create_connection(server.address, timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        t0 = time.monotonic()
        cut = None
        while time.monotonic() - t0 < 8.0:  # each byte well within any per-recv timeout
            try:
                s.sendall(b"a")
                s.settimeout(0.2)
                if s.recv(1) == b"":
                    cut = time.monotonic() - t0
                    break
            except TimeoutError:
                continue
            except OSError:
                cut = time.monotonic() - t0
                break
    assert cut is not None and 0.8 < cut < 5.0, cut
    assert _get(server.address[1]).startswith(b"HTTP/1.1 200")


def test_connections_over_the_bound_get_503_at_once_and_room_comes_back(server: Server) -> None:
    held = [socket.create_connection(server.address, timeout=10) for _ in range(4)]
    try:
        assert wait_until(lambda: server.front.open_connections == 4, timeout=10)
        t0 = time.monotonic()
        with socket.create_connection(server.address, timeout=10) as extra:
            answer = _recv_all(extra)
        assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer
        assert time.monotonic() - t0 < 1.0
        assert server.front.refused == 1
    finally:
        for s in held:
            s.close()
    assert wait_until(lambda: server.front.open_connections == 0, timeout=10)
    assert _get(server.address[1]).startswith(b"HTTP/1.1 200")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


def _tls_server(tmp_path: Path, certs: Certs, **kwargs: float) -> Server:
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n")
    s = Server(("127.0.0.1", 0), StubSource(), load_web_config(str(path)), **kwargs)  # type: ignore[arg-type]
    s.start()
    return s


def test_a_trickled_tls_handshake_is_cut_at_the_head_deadline(tmp_path: Path, certs: Certs) -> None:
    s = _tls_server(tmp_path, certs, head_timeout=1.0)
    try:
        with socket.create_connection(s.address, timeout=10) as raw:
            t0 = time.monotonic()
            cut = None
            for byte in b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40:
                try:
                    raw.sendall(bytes([byte]))
                    raw.settimeout(0.3)
                    if raw.recv(1) == b"":
                        cut = time.monotonic() - t0
                        break
                except TimeoutError:
                    continue
                except OSError:
                    cut = time.monotonic() - t0
                    break
        assert cut is not None and cut < 5.0, cut
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        with socket.create_connection(s.address, timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() is not None
    finally:
        s.stop()


def test_tls_connections_over_the_bound_are_closed_at_once(tmp_path: Path, certs: Certs) -> None:
    s = _tls_server(tmp_path, certs, max_connections=1)
    try:
        with socket.create_connection(s.address, timeout=10):
            assert wait_until(lambda: s.front.open_connections == 1, timeout=10)
            t0 = time.monotonic()
            with socket.create_connection(s.address, timeout=10) as extra:
                assert _recv_all(extra) == b""  # closed without a handshake, nothing sent in clear
            assert time.monotonic() - t0 < 1.0 and s.front.refused == 1
    finally:
        s.stop()
