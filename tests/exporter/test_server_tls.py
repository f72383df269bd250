"""TLS and basic auth end to end: the real server with a web config, real clients (requests and
the ssl module), certificates made at test time with openssl. exporter-toolkit semantics
(docs/web-configuration.md): every path is protected, probes included."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import requests

from exporter.server import Server
from exporter.webconfig import load_web_config
from tests.exporter.test_server import StubSource
from tests.tls_certs import Certs, make_certs

HASH = bcrypt.hashpw(b"right-password", bcrypt.gensalt(4)).decode()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


def serve(tmp_path: Path, text: str) -> Server:
    path = tmp_path / "web-config.yaml"
    path.write_text(text)
    server = Server(("127.0.0.1", 0), StubSource(), load_web_config(str(path)))
    server.start()
    return server


def tls_section(certs: Certs, extra: str = "") -> str:
    return f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n{extra}"


@pytest.fixture
def tls_server(tmp_path: Path, certs: Certs) -> Iterator[Server]:
    server = serve(tmp_path, tls_section(certs) + "http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    yield server
    server.stop()


@pytest.fixture
def mtls_server(tmp_path: Path, certs: Certs) -> Iterator[Server]:
    server = serve(tmp_path, tls_section(
        certs, f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs.ca}\n"))
    yield server
    server.stop()


def test_https_with_the_ca_serves_metrics_and_config_headers(tls_server: Server, certs: Certs) -> None:
    assert tls_server.url.startswith("https://127.0.0.1:")
    r = requests.get(tls_server.url + "/metrics", verify=str(certs.ca), timeout=5)
    assert r.status_code == 200 and r.content == StubSource().snap.text
    assert r.headers["X-Frame-Options"] == "deny"
    assert r.headers["X-Content-Type-Options"] == "nosniff"


def test_plain_http_to_the_tls_port_fails_and_the_server_keeps_serving(tls_server: Server, certs: Certs) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(tls_server.url.replace("https", "http") + "/metrics", timeout=5)
    assert requests.get(tls_server.url + "/health", verify=str(certs.ca), timeout=5).status_code == 200


def test_client_that_does_not_trust_the_server_cert_fails(tls_server: Server) -> None:
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(tls_server.url + "/metrics", timeout=5)  # system CAs only


def test_a_stalled_handshake_does_not_block_other_clients(tls_server: Server, certs: Certs) -> None:
    with socket.create_connection(tls_server.address, timeout=5):  # connects, never says hello
        t0 = time.monotonic()
        r = requests.get(tls_server.url + "/metrics", verify=str(certs.ca), timeout=5)
        assert r.status_code == 200 and time.monotonic() - t0 < 2.0


def test_required_client_cert_missing_or_from_another_ca_is_refused(mtls_server: Server, certs: Certs) -> None:
    for cert in (None, (str(certs.rogue_cert), str(certs.rogue_key))):
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(mtls_server.url + "/health", verify=str(certs.ca), cert=cert, timeout=5)
    r = requests.get(mtls_server.url + "/health", verify=str(certs.ca),
                     cert=(str(certs.client_cert), str(certs.client_key)), timeout=5)
    assert r.status_code == 200


def test_verify_client_cert_if_given_allows_none_but_refuses_a_bad_one(tmp_path: Path, certs: Certs) -> None:
    server = serve(tmp_path, tls_section(
        certs, f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {certs.ca}\n"))
    try:
        assert requests.get(server.url + "/health", verify=str(certs.ca), timeout=5).status_code == 200
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(server.url + "/health", verify=str(certs.ca),
                         cert=(str(certs.rogue_cert), str(certs.rogue_key)), timeout=5)
    finally:
        server.stop()


def test_min_version_tls13_refuses_a_tls12_client(tmp_path: Path, certs: Certs) -> None:
    server = serve(tmp_path, tls_section(certs, "  min_version: TLS13\n"))
    try:
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with socket.create_connection(server.address, timeout=5) as raw, pytest.raises(ssl.SSLError):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        ctx.maximum_version = ssl.TLSVersion.TLSv1_3
        with socket.create_connection(server.address, timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() == "TLSv1.3"
    finally:
        server.stop()


def test_basic_auth_over_tls_right_password_200_wrong_or_none_401_on_every_path(
    tmp_path: Path, certs: Certs
) -> None:
    server = serve(tmp_path, tls_section(certs) + f"basic_auth_users:\n  prometheus: {HASH}\n")
    try:
        url, ca = server.url, str(certs.ca)
        ok = requests.get(url + "/metrics", verify=ca, auth=("prometheus", "right-password"), timeout=5)
        assert ok.status_code == 200 and ok.content == StubSource().snap.text
        for path in ("/metrics", "/health", "/ready", "/"):
            none = requests.get(url + path, verify=ca, timeout=5)
            assert none.status_code == 401, path
            assert none.headers["WWW-Authenticate"].startswith("Basic")
        assert requests.get(url + "/metrics", verify=ca, auth=("prometheus", "wrong"), timeout=5).status_code == 401
        assert requests.get(url + "/metrics", verify=ca, auth=("root", "right-password"),
                            timeout=5).status_code == 401
    finally:
        server.stop()


def test_basic_auth_without_tls(tmp_path: Path) -> None:
    server = serve(tmp_path, f"basic_auth_users:\n  prometheus: {HASH}\n")
    try:
        assert server.url.startswith("http://")
        assert requests.get(server.url + "/metrics", timeout=5).status_code == 401
        assert requests.get(server.url + "/metrics", auth=("prometheus", "right-password"),
                            timeout=5).status_code == 200
    finally:
        server.stop()
