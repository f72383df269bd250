"""exporter.webtls: Go's cipher and curve names, the SAN allow-list's matching (Go's spelling of
IPs), and contexts that do what cipher_suites and curve_preferences ask."""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from exporter.webtls import (
    GO_CIPHERS_TLS12,
    TlsConfig,
    TlsSettingError,
    build_ssl_context,
    cipher_reason,
    curve_reason,
    peer_sans,
    sans_allowed,
)
from tests.tls_certs import Certs, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


def tls(certs: Certs, **kw: Any) -> TlsConfig:
    base: dict[str, Any] = dict(cert_file=str(certs.server_cert), key_file=str(certs.server_key), cert=None,
                                key=None, client_ca_file=None, client_ca=None, client_auth=ssl.CERT_NONE,
                                min_version=ssl.TLSVersion.TLSv1_2, max_version=ssl.TLSVersion.TLSv1_3)
    return TlsConfig(**(base | kw))


@pytest.mark.parametrize(("name", "ok"), [
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", True), ("TLS_AES_256_GCM_SHA384", True),
    ("TLS_RSA_WITH_AES_128_CBC_SHA", True), ("TLS_RSA_WITH_RC4_128_SHA", False),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", False), ("ECDHE-RSA-AES128-GCM-SHA256", False),
])
def test_cipher_names_are_gos(name: str, ok: bool) -> None:
    assert (cipher_reason(name) is None) == ok


def test_every_mapped_cipher_is_an_openssl_name() -> None:
    offered = {c["name"] for c in ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).get_ciphers()}
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.set_ciphers("ALL:@SECLEVEL=0")
    offered |= {c["name"] for c in ctx.get_ciphers()}
    assert set(GO_CIPHERS_TLS12.values()) <= offered


@pytest.mark.parametrize(("names", "needle"), [
    ([], None), (["X25519"], None), (["CurveP521"], None), (["X25519", "CurveP256"], "one curve"),
    (["P-256"], "unknown curve 'P-256'"),
])
def test_curve_lists(names: list[str], needle: str | None) -> None:
    reason = curve_reason(names)
    assert (reason is None) if needle is None else (reason is not None and needle in reason)


@pytest.mark.parametrize(("sans", "expected"), [
    ((("DNS", "prom.monitoring.svc"),), ["prom.monitoring.svc"]),
    ((("IP Address", "10.0.0.7"),), ["10.0.0.7"]),
    ((("IP Address", "2001:DB8:0:0:0:0:0:1\n"),), ["2001:db8::1"]),
    ((("IP Address", "::FFFF:10.1.2.3"),), ["10.1.2.3"]),
    ((("email", "sre@example.com"), ("URI", "spiffe://c/ns/m/sa/p"), ("DirName", "x")),
     ["sre@example.com", "spiffe://c/ns/m/sa/p"]),
    ((), []),
])
def test_peer_sans_in_gos_spelling(sans: tuple[tuple[str, str], ...], expected: list[str]) -> None:
    assert peer_sans({"subjectAltName": sans}) == expected


def test_sans_allowed_needs_an_exact_match() -> None:
    cert = {"subjectAltName": (("DNS", "prom.monitoring.svc"),)}
    assert sans_allowed(cert, ("prom.monitoring.svc",))
    assert not sans_allowed(cert, ("monitoring.svc", "PROM.monitoring.svc"))
    assert not sans_allowed(None, ("prom.monitoring.svc",)) and not sans_allowed({}, ("x",))


def test_cipher_suites_become_the_tls12_cipher_list_in_order(certs: Certs) -> None:
    names = ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")
    ctx = build_ssl_context(tls(certs, cipher_suites=names))
    tls12 = [c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 == ["ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256"]


def test_tls13_names_only_leave_tls13_only_or_nothing(certs: Certs) -> None:
    ctx = build_ssl_context(tls(certs, cipher_suites=("TLS_AES_128_GCM_SHA256",)))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    with pytest.raises(TlsSettingError, match=r"only TLS 1\.3 suites"):
        build_ssl_context(tls(certs, cipher_suites=("TLS_AES_128_GCM_SHA256",),
                              max_version=ssl.TLSVersion.TLSv1_2))


def test_a_pem_that_does_not_load_names_the_key(certs: Certs) -> None:
    with pytest.raises(TlsSettingError) as err:
        build_ssl_context(tls(certs, cert_file=str(certs.ca.parent / "missing.crt")))
    assert err.value.key == "cert_file"
    with pytest.raises(TlsSettingError) as err:
        build_ssl_context(tls(certs, client_ca_file=str(certs.ca.parent / "missing.crt"),
                              client_auth=ssl.CERT_REQUIRED))
    assert err.value.key == "client_ca_file"
