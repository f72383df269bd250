"""The web config's TLS side: Go's cipher and curve names mapped to OpenSSL, the server-side
``ssl.SSLContext`` a ``TlsConfig`` asks for, and exporter-toolkit's client SAN allow-list.

Semantics are exporter-toolkit's (``web/tls_config.go``), which dcgm-exporter 4.8.2 serves with:

- ``cipher_suites``: Go's names from ``tls.CipherSuites()``. The TLS 1.2 ones become the OpenSSL
  cipher list, in the given order (Go, like OpenSSL here, cannot configure TLS 1.3 suites: their
  names are accepted and change nothing). A list with TLS 1.3 names only leaves no TLS 1.2 suite, so
  only TLS 1.3 can be negotiated, as in Go. Go's insecure suites (RC4, 3DES, CBC-SHA256) are unknown
  names to the toolkit and are refused here with that reason; a suite this OpenSSL does not offer is
  refused naming it.
- ``curve_preferences``: ``CurveP256``, ``CurveP384``, ``CurveP521``, ``X25519``. Python's ``ssl``
  can restrict the key exchange to one group (``set_ecdh_curve``, which with OpenSSL 3 sets the only
  group for TLS 1.2 and 1.3), not set an ordered list: one curve is honoured, a longer list is refused
  with that reason.
- ``client_allowed_sans``: after the handshake the client certificate's DNS, e-mail, IP and URI SANs
  are compared, as exact strings (IPs in Go's spelling), with the list; no match, or no certificate,
  closes the connection before a request is read (the toolkit aborts the handshake).
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

# Go's tls.CipherSuites() names (TLS 1.0-1.2) -> OpenSSL's.
GO_CIPHERS_TLS12 = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
GO_CIPHERS_TLS13 = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
GO_INSECURE_CIPHERS = (
    "TLS_RSA_WITH_RC4_128_SHA", "TLS_RSA_WITH_3DES_EDE_CBC_SHA", "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", "TLS_ECDHE_RSA_WITH_RC4_128_SHA", "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
)
# exporter-toolkit's curve names -> OpenSSL's short names.
GO_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}


class TlsSettingError(ValueError):
    """A TLS setting this OpenSSL cannot honour: ``key`` (under tls_server_config) and why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class TlsConfig:
    cert_file: str | None
    key_file: str | None
    cert: str | None
    key: str | None
    client_ca_file: str | None
    client_ca: str | None
    client_auth: ssl.VerifyMode
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion
    cipher_suites: tuple[str, ...] = ()  # Go names, checked
    curve: str | None = None  # a Go curve name, checked
    client_allowed_sans: tuple[str, ...] | None = None


def cipher_reason(name: str) -> str | None:
    """None when ``name`` is one of Go's ``tls.CipherSuites()``, else why it is refused."""
    if name in GO_CIPHERS_TLS12 or name in GO_CIPHERS_TLS13:
        return None
    if name in GO_INSECURE_CIPHERS:
        return (f"{name} is one of Go's insecure cipher suites, which exporter-toolkit refuses "
                "(cipher_suites lists the TLS 1.2 suites the server may negotiate)")
    return (f"unknown cipher suite {name!r} (cipher_suites lists the TLS 1.2 suites the server may "
            "negotiate, by Go's names, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")


def curve_reason(names: list[str]) -> str | None:
    """None when ``names`` is one known curve (or none: OpenSSL's defaults), else why it is refused."""
    unknown = [n for n in names if n not in GO_CURVES]
    if unknown:
        return (f"unknown curve {unknown[0]!r} (curve_preferences lists the elliptic curves offered for "
                "the ECDHE key exchange; expected " + ", ".join(GO_CURVES) + ")")
    if len(names) > 1:
        return ("curve_preferences orders the elliptic curves offered for the ECDHE key exchange; Python's "
                "ssl module can restrict the server to one curve but cannot set a preference order: "
                "list exactly one of " + ", ".join(GO_CURVES))
    return None


def build_ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """A server-side context; ``TlsSettingError`` (naming the key) when a PEM does not load or OpenSSL
    cannot do what a cipher or curve setting asks."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = tls.min_version
    ctx.maximum_version = tls.max_version
    _ciphers(ctx, tls)
    if tls.curve is not None:
        if ssl.OPENSSL_VERSION_INFO < (3,) and tls.max_version >= ssl.TLSVersion.TLSv1_3:
            raise TlsSettingError("curve_preferences", f"{ssl.OPENSSL_VERSION} restricts the curve for "
                                  "TLS 1.2 only; set max_version: TLS12 or remove curve_preferences")
        ctx.set_ecdh_curve(GO_CURVES[tls.curve])
    try:
        if tls.cert_file is not None and tls.key_file is not None:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
        else:
            _load_inline_chain(ctx, tls)
    except (OSError, ssl.SSLError) as exc:
        raise TlsSettingError("cert_file", f"cannot load certificate/key: {exc}") from exc
    ctx.verify_mode = tls.client_auth
    try:
        if tls.client_ca_file is not None:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        elif tls.client_ca is not None:
            ctx.load_verify_locations(cadata=tls.client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise TlsSettingError("client_ca_file", f"cannot load client CA: {exc}") from exc
    return ctx


def _ciphers(ctx: ssl.SSLContext, tls: TlsConfig) -> None:
    tls12 = [GO_CIPHERS_TLS12[n] for n in tls.cipher_suites if n in GO_CIPHERS_TLS12]
    if not tls.cipher_suites:
        return
    if not tls12:  # Go: no TLS 1.2 suite in the list, so only TLS 1.3 handshakes succeed
        if tls.max_version < ssl.TLSVersion.TLSv1_3:
            raise TlsSettingError("cipher_suites", "lists only TLS 1.3 suites, but max_version is below TLS13: "
                                  "no connection could be made")
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        return
    try:
        ctx.set_ciphers(":".join(tls12))
    except ssl.SSLError:
        raise TlsSettingError("cipher_suites", f"none of the listed suites is available in {ssl.OPENSSL_VERSION}") \
            from None
    offered = {c["name"] for c in ctx.get_ciphers()}
    missing = [go for go in tls.cipher_suites if go in GO_CIPHERS_TLS12 and GO_CIPHERS_TLS12[go] not in offered]
    if missing:
        raise TlsSettingError("cipher_suites", f"{missing[0]} is not available in {ssl.OPENSSL_VERSION} "
                              "(at its security level); remove it")


def _load_inline_chain(ctx: ssl.SSLContext, tls: TlsConfig) -> None:
    """``ssl`` loads chains from files only: inline PEMs go through a private temp dir."""
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-tls-") as tmp:
        names = []
        for name, file_value, inline in (("cert.pem", tls.cert_file, tls.cert), ("key.pem", tls.key_file, tls.key)):
            if file_value is not None:
                names.append(file_value)
                continue
            target = os.path.join(tmp, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(inline or "")
            names.append(target)
        ctx.load_cert_chain(names[0], names[1])


def _go_ip(text: str) -> str:
    """An IP SAN as Go's ``net.IP.String()`` writes it (IPv6 compressed, lower case; v4-mapped as v4)."""
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return text.strip()
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def peer_sans(peercert: dict[str, Any] | None) -> list[str]:
    """The DNS, e-mail, IP and URI SANs of a certificate as ``SSLSocket.getpeercert()`` returns it."""
    out = []
    for kind, value in (peercert or {}).get("subjectAltName", ()):
        if kind in ("DNS", "email", "URI"):
            out.append(str(value))
        elif kind == "IP Address":
            out.append(_go_ip(str(value)))
    return out


def sans_allowed(peercert: dict[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """exporter-toolkit's VerifyPeerCertificate: some SAN of the client certificate is in ``allowed``."""
    return any(san in allowed for san in peer_sans(peercert))
