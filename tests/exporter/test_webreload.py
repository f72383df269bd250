"""exporter.webreload: a changed web config or certificate applies without a restart (as
exporter-toolkit, which re-reads per request); a bad change is refused once and the last good
config stays."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import ssl
from pathlib import Path

import bcrypt
import pytest
import requests

from exporter.server import Server
from exporter.webconfig import WebConfig, load_web_config
from exporter.webreload import LiveWebConfig
from tests.exporter.test_server import StubSource
from tests.tls_certs import Certs, another_server_cert, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("reload"))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def bump(path: Path) -> None:
    """Make a rewrite visible even within one mtime tick."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def served_serial(port: int, ca: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        cert = tls.getpeercert()
    assert cert is not None
    return int(str(cert["serialNumber"]), 16)


def tls_dir(tmp_path: Path, certs: Certs) -> tuple[Path, Path]:
    d = tmp_path / "tls"
    d.mkdir()
    shutil.copy(certs.server_cert, d / "tls.crt")
    shutil.copy(certs.server_key, d / "tls.key")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {d}/tls.crt\n  key_file: {d}/tls.key\n")
    return d, web


def test_a_rotated_certificate_is_served_to_new_connections_without_restart(tmp_path: Path, certs: Certs) -> None:
    d, web = tls_dir(tmp_path, certs)
    server = Server(("127.0.0.1", 0), StubSource(), load_web_config(str(web)), reload_check_s=0.0)
    server.start()
    try:
        port = server.address[1]
        first = served_serial(port, certs.ca)
        new_crt, new_key = another_server_cert(certs, "rotated")
        shutil.copy(new_crt, d / "tls.crt")
        shutil.copy(new_key, d / "tls.key")
        bump(d / "tls.crt")
        second = served_serial(port, certs.ca)
        assert second != first
        assert server.web.reloads == 1
    finally:
        server.stop()


def test_changed_users_apply_and_a_bad_edit_keeps_the_last_good_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.webreload")
    web = tmp_path / "web.yml"
    hash_a = bcrypt.hashpw(b"a-pw", bcrypt.gensalt(4)).decode()
    hash_b = bcrypt.hashpw(b"b-pw", bcrypt.gensalt(4)).decode()
    web.write_text(f"basic_auth_users:\n  alice: {hash_a}\n")
    server = Server(("127.0.0.1", 0), StubSource(), load_web_config(str(web)), reload_check_s=0.0)
    server.start()
    url = server.url + "/metrics"
    try:
        assert requests.get(url, auth=("alice", "a-pw"), timeout=5).status_code == 200
        web.write_text(f"basic_auth_users:\n  bob: {hash_b}\n")
        bump(web)
        assert requests.get(url, auth=("alice", "a-pw"), timeout=5).status_code == 401
        assert requests.get(url, auth=("bob", "b-pw"), timeout=5).status_code == 200

        web.write_text("basic_auth_users:\n  bob: not-a-hash\n")
        bump(web)
        for _ in range(3):
            assert requests.get(url, auth=("bob", "b-pw"), timeout=5).status_code == 200  # last good stays
        refused = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(refused) == 1
        assert f"{web}:2: basic_auth_users.bob: not a bcrypt hash" in refused[0].getMessage()
    finally:
        server.stop()


def test_turning_tls_off_needs_a_restart(tmp_path: Path, certs: Certs, caplog: pytest.LogCaptureFixture) -> None:
    _, web = tls_dir(tmp_path, certs)
    live = LiveWebConfig(load_web_config(str(web)), check_s=0.0)
    web.write_text("")
    bump(web)
    assert live.current().ssl_context is not None
    assert "turning TLS on or off needs a restart" in caplog.text


def test_files_are_checked_at_most_every_check_s(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("")
    clock = Clock()
    loads: list[str] = []

    def loader(path: str) -> WebConfig:
        loads.append(path)
        return load_web_config(path)

    live = LiveWebConfig(load_web_config(str(web)), check_s=5.0, clock=clock, loader=loader)
    web.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    bump(web)
    assert live.current().headers == ()  # not yet due
    clock.t += 5.0
    assert live.current().headers == (("X-Frame-Options", "deny"),)
    assert loads == [str(web)]
    clock.t += 5.0
    live.current()
    assert loads == [str(web)]  # unchanged files are not re-read


def test_without_a_file_nothing_is_watched() -> None:
    live = LiveWebConfig(WebConfig(), check_s=0.0, loader=lambda p: pytest.fail("no file to read"))
    assert live.current().ssl_context is None and not live.tls
