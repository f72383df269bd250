"""The web-config keys exporter-toolkit added, end to end on the real server with real clients
(issue 21 point 7): rate_limit (429, before auth, on every path), cipher_suites and
curve_preferences (what a handshake can negotiate), client_allowed_sans (a client certificate
without an allowed SAN, or none, cannot get a request in)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import requests

from exporter.server import Server
from exporter.webconfig import load_web_config
from tests.exporter.test_server import StubSource
from tests.tls_certs import Certs, _leaf, make_certs

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def san_client(certs: Certs) -> tuple[str, str]:
    d = certs.ca.parent
    _leaf(d, "san-client", "ca", "subjectAltName=DNS:prometheus.monitoring.svc,IP:10.0.0.7,"
          "URI:spiffe://cluster/ns/monitoring/sa/prometheus\nextendedKeyUsage=clientAuth\n")
    return str(d / "san-client.crt"), str(d / "san-client.key")


def serve(tmp_path: Path, text: str) -> Server:
    path = tmp_path / "web-config.yaml"
    path.write_text(text)
    server = Server(("127.0.0.1", 0), StubSource(), load_web_config(str(path)))
    server.start()
    return server


@pytest.fixture
def stop() -> Iterator[list[Server]]:
    servers: list[Server] = []
    yield servers
    for s in servers:
        s.stop()


def tls_section(certs: Certs, extra: str = "") -> str:
    return f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n{extra}"


def test_rate_limit_answers_429_over_the_burst_before_auth_on_every_path(tmp_path: Path, stop: list[Server]) -> None:
    server = serve(tmp_path, f"rate_limit:\n  interval: 1h\n  burst: 3\nbasic_auth_users:\n  prom: {HASH}\n")
    stop.append(server)
    ok = requests.get(server.url + "/metrics", auth=("prom", "pw"), timeout=5)
    assert ok.status_code == 200
    assert requests.get(server.url + "/health", timeout=5).status_code == 401  # a token, then auth
    assert requests.get(server.url + "/", auth=("prom", "pw"), timeout=5).status_code == 200
    for path in ("/metrics", "/health", "/ready", "/nope"):
        r = requests.get(server.url + path, auth=("prom", "pw"), timeout=5)
        assert (r.status_code, r.content) == (429, b"Too Many Requests\n"), path
        assert "WWW-Authenticate" not in r.headers


def test_rate_limit_interval_0_is_no_limit(tmp_path: Path, stop: list[Server]) -> None:
    server = serve(tmp_path, "rate_limit:\n  interval: 0s\n  burst: 0\n")
    stop.append(server)
    assert {requests.get(server.url + "/health", timeout=5).status_code for _ in range(20)} == {200}


def _handshake(server: Server, certs: Certs, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(server.address, timeout=5)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _client(certs: Certs, tls12: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def test_cipher_suites_limit_what_a_tls12_client_can_negotiate(tmp_path: Path, certs: Certs,
                                                               stop: list[Server]) -> None:
    server = serve(tmp_path, tls_section(certs, "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n"))
    stop.append(server)
    ctx = _client(certs, tls12=True)
    with _handshake(server, certs, ctx) as tls:
        assert tls.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"
    ctx.set_ciphers("ECDHE-ECDSA-AES256-GCM-SHA384")
    with pytest.raises(ssl.SSLError):
        _handshake(server, certs, ctx)


def test_curve_preferences_with_one_curve_refuse_a_client_without_it(tmp_path: Path, certs: Certs,
                                                                     stop: list[Server]) -> None:
    server = serve(tmp_path, tls_section(certs, "  curve_preferences: [CurveP384]\n"))
    stop.append(server)
    for tls12 in (True, False):
        ctx = _client(certs, tls12)
        with _handshake(server, certs, ctx) as tls:
            assert tls.version() is not None  # the client's defaults include P-384
        ctx.set_ecdh_curve("prime256v1")
        with pytest.raises(ssl.SSLError):
            _handshake(server, certs, ctx)


def _get(server: Server, certs: Certs, cert: tuple[str, str] | None) -> int:
    r = requests.get(server.url + "/health", verify=str(certs.ca), cert=cert, timeout=5)
    return r.status_code


@pytest.mark.parametrize("allowed", ["prometheus.monitoring.svc", "10.0.0.7",
                                     "spiffe://cluster/ns/monitoring/sa/prometheus"])
def test_client_allowed_sans_admit_a_certificate_with_a_listed_san_only(
    tmp_path: Path, certs: Certs, san_client: tuple[str, str], stop: list[Server], allowed: str
) -> None:
    server = serve(tmp_path, tls_section(certs, f"  client_auth_type: RequireAndVerifyClientCert\n"
                                                f"  client_ca_file: {certs.ca}\n"
                                                f"  client_allowed_sans: ['{allowed}']\n"))
    stop.append(server)
    assert _get(server, certs, san_client) == 200
    with pytest.raises((requests.exceptions.ConnectionError, requests.exceptions.SSLError)):
        _get(server, certs, (str(certs.client_cert), str(certs.client_key)))  # signed by the CA, no SAN


def test_client_allowed_sans_refuse_a_client_without_a_certificate_when_one_is_optional(
    tmp_path: Path, certs: Certs, san_client: tuple[str, str], stop: list[Server]
) -> None:
    server = serve(tmp_path, tls_section(certs, f"  client_auth_type: VerifyClientCertIfGiven\n"
                                                f"  client_ca_file: {certs.ca}\n"
                                                "  client_allowed_sans: [prometheus.monitoring.svc]\n"))
    stop.append(server)
    with pytest.raises((requests.exceptions.ConnectionError, requests.exceptions.SSLError)):
        _get(server, certs, None)
    assert _get(server, certs, san_client) == 200
