"""exporter.webconfig: exporter-toolkit's web-config YAML (docs/web-configuration.md), every key
applied or refused with file, line and key; bcrypt basic auth."""

from __future__ import annotations

import base64
import ssl
import time
from pathlib import Path

import bcrypt
import pytest

from exporter.webconfig import BasicAuth, WebConfigError, load_web_config, parse_web_config
from tests.tls_certs import Certs, make_certs

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_empty_file_is_plain_http_without_auth() -> None:
    cfg = parse_web_config("", "web.yml")
    assert cfg.tls is None and dict(cfg.users) == {} and cfg.headers == ()
    assert cfg.ssl_context() is None


def test_full_config_from_nvidia_chart_layout_loads(tmp_path: Path, certs: Certs) -> None:
    # The shape NVIDIA's dcgm-exporter chart 4.8.2 writes (deployment/templates/web-config-configmap.yaml).
    path = tmp_path / "web-config.yaml"
    path.write_text(
        "tls_server_config:\n"
        f'   cert_file: "{certs.server_cert}"\n'
        f'   key_file: "{certs.server_key}"\n'
        "   client_auth_type: RequireAndVerifyClientCert\n"
        f'   client_ca_file: "{certs.ca}"\n'
        "   min_version: TLS13\n"
        "http_server_config:\n"
        "  http2: true\n"
        "  headers:\n"
        "    X-Frame-Options: deny\n"
        "    Strict-Transport-Security: max-age=31536000\n"
        "basic_auth_users:\n"
        f"  prometheus: {HASH}\n"
    )
    cfg = load_web_config(str(path))
    assert cfg.tls is not None and cfg.tls.client_auth == ssl.CERT_REQUIRED
    assert cfg.tls.min_version == ssl.TLSVersion.TLSv1_3
    ctx = cfg.ssl_context()
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED
    assert cfg.headers == (("X-Frame-Options", "deny"), ("Strict-Transport-Security", "max-age=31536000"))
    assert set(cfg.users) == {"prometheus"}


def test_relative_files_are_relative_to_the_config_file(tmp_path: Path, certs: Certs) -> None:
    (tmp_path / "s.crt").write_bytes(certs.server_cert.read_bytes())
    (tmp_path / "s.key").write_bytes(certs.server_key.read_bytes())
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n")
    assert load_web_config(str(path)).ssl_context() is not None


def test_inline_cert_and_key_load(certs: Certs) -> None:
    def block(p: Path) -> str:
        return "    " + p.read_text().strip().replace("\n", "\n    ")

    text = f"tls_server_config:\n  cert: |\n{block(certs.server_cert)}\n  key: |\n{block(certs.server_key)}\n"
    assert parse_web_config(text, "w.yml").ssl_context() is not None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tls_server_confg:\n  cert_file: a\n", "w.yml:1: tls_server_confg: unknown key"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_FOO]\n",
         "w.yml:4: tls_server_config.cipher_suites: unknown cipher suite 'TLS_FOO' (cipher_suites lists the TLS 1.2"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites:\n    - TLS_RSA_WITH_RC4_128_SHA\n",
         "w.yml:5: tls_server_config.cipher_suites: TLS_RSA_WITH_RC4_128_SHA is one of Go's insecure cipher suites"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: TLS_AES_128_GCM_SHA256\n",
         "w.yml:4: tls_server_config.cipher_suites: expected a list of strings"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_allowed_sans: [x]\n",
         "w.yml:4: tls_server_config.client_allowed_sans: would not be used without client certificates"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n"
         "  client_ca_file: ca\n  client_allowed_sans: []\n",
         "w.yml:6: tls_server_config.client_allowed_sans: is empty: no client could connect"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  curve_preferences: [X25519, CurveP256]\n",
         "w.yml:4: tls_server_config.curve_preferences: curve_preferences orders the elliptic curves offered for "
         "the ECDHE key exchange; Python's ssl module can restrict the server to one curve"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  curve_preferences: [CurveP224]\n",
         "w.yml:4: tls_server_config.curve_preferences: unknown curve 'CurveP224'"),
        ("rate_limit:\n  interval: 1s\n", "w.yml:1: rate_limit.burst: is 0: the token bucket would refuse every"),
        ("rate_limit:\n  interval: 1s\n  burst: 0\n", "w.yml:3: rate_limit.burst: is 0"),
        ("rate_limit:\n  interval: 1 second\n  burst: 2\n",
         "w.yml:2: rate_limit.interval: '1 second' is not a duration"),
        ("rate_limit:\n  interval: -1s\n  burst: 2\n", "w.yml:2: rate_limit.interval: is negative"),
        ("rate_limit:\n  interval: 1s\n  burst: many\n", "w.yml:3: rate_limit.burst: expected an integer"),
        ("rate_limit:\n  period: 1s\n", "w.yml:2: rate_limit.period: unknown key (expected interval, burst)"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireClientCert\n",
         "w.yml:4: tls_server_config.client_auth_type: RequireClientCert accepts unverified"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  certfile: c\n",
         "w.yml:4: tls_server_config.certfile: unknown key"),
        ("tls_server_config:\n  key_file: b\n", "tls_server_config.cert_file: missing"),
        ("tls_server_config:\n  cert_file: a\n", "tls_server_config.key_file: missing"),
        ("tls_server_config:\n  cert_file: a\n  cert: x\n  key_file: b\n",
         "w.yml:3: tls_server_config.cert: give either cert_file or cert, not both"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n",
         "w.yml:4: tls_server_config.client_auth_type: RequireAnyClientCert accepts unverified"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Always\n",
         "unknown policy 'Always'"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
         "tls_server_config.client_ca_file: missing: RequireAndVerifyClientCert needs the CA"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: ca\n",
         "w.yml:4: tls_server_config.client_ca_file: a client CA without client_auth_type"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS9\n",
         "w.yml:4: tls_server_config.min_version: unknown TLS version 'TLS9'"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n  max_version: TLS12\n",
         "tls_server_config.min_version: is above max_version"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  prefer_server_cipher_suites: maybe\n",
         "expected true or false"),
        ("http_server_config:\n  headers:\n    X-Powered-By: me\n",
         "w.yml:3: http_server_config.headers.X-Powered-By: header not allowed"),
        ("http_server_config:\n  http3: true\n", "w.yml:2: http_server_config.http3: unknown key"),
        ("basic_auth_users:\n  alice: plaintext\n", "w.yml:2: basic_auth_users.alice: not a bcrypt hash"),
        ("basic_auth_users: [alice]\n", "w.yml:1: basic_auth_users: expected a mapping"),
        ("tls_server_config: {cert_file: [a], key_file: b}\n", "tls_server_config.cert_file: expected a string"),
        ("tls_server_config:\n  cert_file: a\n key_file: b\n", "w.yml:3: not valid YAML"),
        ("- a\n- b\n", "w.yml:1: expected a mapping"),
    ],
)
def test_invalid_configs_name_file_line_and_key(text: str, expected: str) -> None:
    with pytest.raises(WebConfigError) as err:
        parse_web_config(text, "w.yml")
    assert expected in str(err.value)


def test_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match=r"nope\.yml: cannot read"):
        load_web_config(str(tmp_path / "nope.yml"))


def test_certificate_that_does_not_load_is_an_error_at_load_time(tmp_path: Path) -> None:
    (tmp_path / "bad.crt").write_text("not a pem")
    path = tmp_path / "w.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {tmp_path}/bad.crt\n  key_file: {tmp_path}/bad.crt\n")
    with pytest.raises(WebConfigError, match=r"tls_server_config\.cert_file: cannot load certificate/key"):
        load_web_config(str(path))


def test_basic_auth_accepts_the_right_password_only() -> None:
    auth = BasicAuth({"alice": HASH.encode()})
    assert auth.enabled
    assert auth.check(basic("alice", "s3cret"))
    assert auth.check("basic " + basic("alice", "s3cret")[6:])  # scheme is case-insensitive
    assert not auth.check(basic("alice", "wrong"))
    assert not auth.check(basic("bob", "s3cret"))
    assert not auth.check(None)
    assert not auth.check("Bearer abc")
    assert not auth.check("Basic !!!notbase64")
    assert not auth.check("Basic " + base64.b64encode(b"no-colon").decode())


def test_basic_auth_caches_verdicts_so_scrapes_do_not_pay_bcrypt_each_time() -> None:
    slow = bcrypt.hashpw(b"pw", bcrypt.gensalt(12)).decode().encode()  # ~0.2 s per check
    auth = BasicAuth({"u": slow})
    t0 = time.perf_counter()
    assert auth.check(basic("u", "pw"))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(20):
        assert auth.check(basic("u", "pw"))
    assert time.perf_counter() - t0 < first


def test_no_users_means_no_auth() -> None:
    auth = BasicAuth({})
    assert not auth.enabled and auth.check(None)
