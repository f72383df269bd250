"""Where the API server is and how jobwatch authenticates: kubeconfig files, in-cluster, precedence."""

from __future__ import annotations

import base64
import os
import ssl
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from telemetry_common.kubeapi import KubeClient, KubeError
from telemetry_common.kubeconfig import KubeConfigError, TokenSource, from_kubeconfig, in_cluster, resolve
from tests.jobwatch.fake_apiserver import FakeAPIServer, gpu_pod
from tests.tls_certs import make_certs


def _write(path: Path, cluster: Mapping[str, object], user: Mapping[str, object], ctx: str = "c") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": ctx,
        "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ml"}}]}))
    return path


def test_kubeconfig_http_server_with_token(tmp_path: Path) -> None:
    cfg = from_kubeconfig([str(_write(tmp_path / "kc", {"server": "http://127.0.0.1:8080/"}, {"token": "abc"}))])
    assert cfg.server == "http://127.0.0.1:8080"
    assert cfg.token is not None and cfg.token.get() == "abc"
    assert cfg.ssl_context is None
    assert cfg.namespace == "ml"


def test_token_file_is_reread_when_it_rotates(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text("first\n")
    src = TokenSource(path=str(tok))
    assert src.get() == "first"
    tok.write_text("second-token\n")
    os.utime(tok, (time.time() + 5, time.time() + 5))
    assert src.get() == "second-token"
    tok.unlink()
    assert src.get() == ""  # unreadable: no token (the request then gets a 401), never a crash


def test_relative_token_file_is_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("rel")
    cfg = from_kubeconfig([str(_write(tmp_path / "kc", {"server": "http://h:1"}, {"tokenFile": "tok"}))])
    assert cfg.token is not None and cfg.token.get() == "rel"


@pytest.mark.parametrize(
    ("cluster", "user", "message"),
    [
        ({"server": "h:1"}, {"token": "x"}, "must be an http:// or https:// URL"),
        ({"server": "https://h:1", "certificate-authority-data": "%%%"}, {"token": "x"}, "not base64"),
        ({"server": "https://h:1", "certificate-authority": "/nonexistent/ca.crt"}, {"token": "x"},
         "certificate-authority"),
        ({"server": "http://h:1"}, {"exec": {"command": "aws"}}, "credential plugins are not supported"),
        ({"server": "https://h:1"}, {"client-certificate": "/x.crt"}, "client-certificate without client-key"),
    ],
)
def test_bad_kubeconfig_names_the_field(tmp_path: Path, cluster: dict[str, object], user: dict[str, object],
                                        message: str) -> None:
    with pytest.raises(KubeConfigError, match=message) as err:
        from_kubeconfig([str(_write(tmp_path / "kc", cluster, user))])
    assert str(tmp_path / "kc") in str(err.value)


def test_missing_context_and_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="no entry named 'nope'"):
        from_kubeconfig([str(_write(tmp_path / "kc", {"server": "http://h:1"}, {}, ctx="nope"))])
    with pytest.raises(KubeConfigError, match="cannot read"):
        from_kubeconfig([str(tmp_path / "absent")])
    (tmp_path / "bad").write_text("a: [")
    with pytest.raises(KubeConfigError, match="not YAML"):
        from_kubeconfig([str(tmp_path / "bad")])


def test_a_token_never_appears_in_an_error(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError) as err:
        from_kubeconfig([str(_write(tmp_path / "kc", {"server": "ftp://h"}, {"token": "s3cr3t-token"}))])
    assert "s3cr3t" not in str(err.value)


def test_kubeconfig_list_merges_first_wins(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.write_text(yaml.safe_dump({"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k",
                                                                                               "user": "u"}}]}))
    b = _write(tmp_path / "b", {"server": "http://merged:1"}, {"token": "t"}, ctx="other")
    cfg = from_kubeconfig([str(a), str(b)])
    assert cfg.server == "http://merged:1"


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    (sa / "ca.crt").write_bytes(certs.ca.read_bytes())
    (sa / "namespace").write_text("gpu-telemetry")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = in_cluster(env, str(sa))
    assert cfg.server == "https://[fd00::1]:443"
    assert cfg.token is not None and cfg.token.get() == "sa-token"
    assert cfg.namespace == "gpu-telemetry"
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster({}, str(sa))
    with pytest.raises(KubeConfigError, match="no service account token"):
        in_cluster(env, str(tmp_path))


def test_precedence_flag_then_env_then_in_cluster(tmp_path: Path) -> None:
    flag = _write(tmp_path / "flag", {"server": "http://flag:1"}, {"token": "t"})
    env_file = _write(tmp_path / "env", {"server": "http://env:1"}, {"token": "t"})
    env = {"KUBECONFIG": str(env_file), "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443",
           "HOME": str(tmp_path)}
    assert resolve(str(flag), env).server == "http://flag:1"
    assert resolve(None, env).server == "http://env:1"
    with pytest.raises(KubeConfigError, match="in-cluster"):
        resolve(None, {**env, "KUBECONFIG": ""}, sa_root=str(tmp_path / "nosa"))
    with pytest.raises(KubeConfigError, match="no --kubeconfig"):
        resolve(None, {"HOME": str(tmp_path)})


def test_https_fake_api_server_with_ca_data(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    with FakeAPIServer(certs=certs) as fake:
        fake.apply("pods", gpu_pod("p1"))
        client = KubeClient(from_kubeconfig([str(fake.kubeconfig(tmp_path / "kc"))]), timeout=5)
        assert [p["metadata"]["name"] for p in client.list("/api/v1/pods").items] == ["p1"]
        # without the CA the server's certificate is not trusted
        plain = KubeClient(from_kubeconfig([str(fake.kubeconfig(tmp_path / "kc2", ca=False))]), timeout=5)
        with pytest.raises(KubeError) as err:
            plain.list("/api/v1/pods")
        assert err.value.status is None and "SSL" in err.value.reason
        # insecure-skip-tls-verify accepts it
        doc = yaml.safe_load((tmp_path / "kc2").read_text())
        doc["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
        (tmp_path / "kc3").write_text(yaml.safe_dump(doc))
        insecure = KubeClient(from_kubeconfig([str(tmp_path / "kc3")]), timeout=5)
        assert len(insecure.list("/api/v1/pods").items) == 1


def test_client_certificate_data_is_loaded(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    user = {"client-certificate-data": base64.b64encode(certs.client_cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(certs.client_key.read_bytes()).decode()}
    cluster = {"server": "https://127.0.0.1:1", "certificate-authority": str(certs.ca)}
    cfg = from_kubeconfig([str(_write(tmp_path / "kc", cluster, user))])
    assert isinstance(cfg.ssl_context, ssl.SSLContext)
    assert cfg.token is None
