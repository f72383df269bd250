"""SigV4 signing end to end: relay.sigv4 + each transport (HttpTransport, the relay's default, and
RequestsTransport) + Sender against a verifying receiver.

No network: credentials come from env (monkeypatch) or an injected botocore session; config files
and instance metadata are switched off.
"""

from __future__ import annotations

import datetime
import http.server
import logging
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.credentials
import botocore.session
import pytest
import snappy
from prometheus_client import CollectorRegistry

from relay.common.metrics import RelayMetrics
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.sender import Sender, SenderSettings
from relay.delivery.sigv4 import SigV4Auth, SigV4ConfigError
from relay.delivery.transport import HttpTransport, RequestsTransport
from relay.proto import remote_v1_pb2
from tests.helpers import isolate_aws, wait_until
from tests.sigv4_receiver import EXPIRED_BODY, Scripted, SigV4Receiver, verify_sigv4

AK, SK, TOKEN = "AKIDTESTENV", "secret/env/key+1", "session-token-env"


Transport = HttpTransport | RequestsTransport
TRANSPORT: list[type[HttpTransport] | type[RequestsTransport]] = [HttpTransport]


@pytest.fixture(autouse=True, params=[HttpTransport, RequestsTransport], ids=["http", "requests"])
def _transport(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test runs with each transport: both must sign what the receiver verifies."""
    TRANSPORT[0] = request.param
    yield
    TRANSPORT[0] = HttpTransport


@pytest.fixture(autouse=True)
def _isolated_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_aws(monkeypatch, tmp_path)


@pytest.fixture
def env_creds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AK)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SK)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)


@pytest.fixture
def rx() -> Iterator[SigV4Receiver]:
    with SigV4Receiver(AK, SK, region="us-east-1", service="aps", token=TOKEN) as r:
        yield r


def write_request(name: str, value: float, ts: int = 1_700_000_000_000) -> bytes:
    wr = remote_v1_pb2.WriteRequest()
    series = wr.timeseries.add()
    for n, v in (("__name__", name), ("gpu", "0")):
        lb = series.labels.add()
        lb.name, lb.value = n, v
    sample = series.samples.add()
    sample.value, sample.timestamp = value, ts
    return bytes(wr.SerializeToString())


def make_sender(url: str, transport: Transport, tmp_path: Path, on_auth_error: str = "hold") -> Sender:
    queue = DurableQueue(tmp_path / "q.db", 1 << 20)
    return Sender(
        "amp", url, queue, transport, SenderSettings(min_backoff=0.001, max_backoff=0.01,
                                                     on_auth_error="drop" if on_auth_error == "drop" else "hold"),
        RelayMetrics(CollectorRegistry()), auth_refresh=transport.refresh_credentials,
    )


def post(url: str, auth: SigV4Auth, payload: bytes) -> int:
    return TRANSPORT[0](auth=auth).post(url, snappy.compress(payload), {"Content-Type": "x"}, 5).status


# -- configuration -----------------------------------------------------------------------------
@pytest.mark.parametrize("region", ["", None])
def test_missing_region_is_a_value_error_naming_the_field(env_creds: None, region: Any) -> None:
    with pytest.raises(ValueError, match=r"sigv4\.region") as e:
        SigV4Auth(region=region)
    assert isinstance(e.value, SigV4ConfigError) and e.value.field == "region"


def test_no_credentials_anywhere_is_a_config_error() -> None:
    with pytest.raises(SigV4ConfigError, match="no AWS credentials"):
        SigV4Auth(region="us-east-1")


def test_repr_and_logs_never_show_secrets(env_creds: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    auth = SigV4Auth(region="us-east-1")
    auth.force_refresh()
    text = repr(auth) + caplog.text
    assert "us-east-1" in repr(auth) and auth.method == "env"
    assert SK not in text and TOKEN not in text


# -- signing end to end ------------------------------------------------------------------------
def test_env_credentials_sign_a_request_the_receiver_verifies(env_creds: None, rx: SigV4Receiver) -> None:
    assert post(rx.url, SigV4Auth(region="us-east-1"), write_request("DCGM_FI_DEV_GPU_UTIL", 42.0)) == 204
    [req] = rx.requests
    assert req.reason == "ok" and req.access_key == AK
    assert req.headers["x-amz-security-token"] == TOKEN
    labels = (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0"))
    assert rx.samples() == [(labels, ((1_700_000_000_000, 42.0),))]
    assert rx.series() == [labels] and (rx.accepted, rx.rejected) == (1, 0)


def test_sender_delivers_through_sigv4_with_required_headers_signed(
    env_creds: None, rx: SigV4Receiver, tmp_path: Path
) -> None:
    sender = make_sender(rx.url, TRANSPORT[0](auth=SigV4Auth(region="us-east-1")), tmp_path)
    body = snappy.compress(write_request("m", 1.0) + write_request("n", 2.0))
    result = sender.send_batch(body, 2, time.time())
    assert result.ok and result.status == 204
    assert [dict(labels)["__name__"] for labels in rx.series()] == ["m", "n"]
    signed = rx.requests[0].headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    must = {"host", "content-type", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"}
    assert must <= set(signed)
    sender.queue.close()


def test_wrong_secret_is_rejected_with_403_and_the_batch_dropped_under_on_auth_error_drop(
    monkeypatch: pytest.MonkeyPatch, rx: SigV4Receiver, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AK)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    sender = make_sender(rx.url, TRANSPORT[0](auth=SigV4Auth(region="us-east-1")), tmp_path, on_auth_error="drop")
    result = sender.send_batch(snappy.compress(write_request("m", 1.0)), 1, time.time())
    assert (result.ok, result.status, result.reason, result.dropped_samples) == (False, 403, "http_403", 1)
    assert rx.requests[0].reason == "signature does not match" and rx.series() == []
    assert (rx.accepted, rx.rejected) == (0, 1)
    sender.queue.close()


def test_a_403_for_a_wrong_secret_holds_the_batch_until_the_refreshed_chain_has_the_right_one(
    monkeypatch: pytest.MonkeyPatch, rx: SigV4Receiver, tmp_path: Path
) -> None:
    """Issue 20 point 5: on_auth_error: hold (the default) keeps the batch and retries, credentials
    refreshed first; once the environment holds the right secret, the next retry signs with it."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AK)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    sender = make_sender(rx.url, TRANSPORT[0](auth=SigV4Auth(region="us-east-1")), tmp_path)
    results: list[object] = []
    t = threading.Thread(target=lambda: results.append(
        sender.send_batch(snappy.compress(write_request("m", 1.0)), 1, time.time())), daemon=True)
    t.start()
    try:
        assert wait_until(lambda: rx.rejected >= 2, timeout=10)
        assert sender.state() == "auth_blocked" and rx.accepted == 0 and results == []
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SK)  # the operator fixed the secret
        t.join(30)
        result = results[0]
        assert getattr(result, "ok", False) and getattr(result, "dropped_samples", -1) == 0
        assert rx.accepted == 1 and [dict(labels)["__name__"] for labels in rx.series()] == ["m"]
        assert sender.state() == "sending"
    finally:
        sender.stop(timeout=1)
        t.join(5)
        sender.queue.close()


@pytest.mark.parametrize(
    ("region", "service"), [("eu-west-1", "aps"), ("us-east-1", "execute-api")], ids=["region", "service"]
)
def test_signature_for_another_scope_is_rejected(env_creds: None, rx: SigV4Receiver, region: str,
                                                 service: str) -> None:
    assert post(rx.url, SigV4Auth(region=region, service=service), write_request("m", 1.0)) == 403
    assert rx.requests[0].reason == "credential scope does not match"


def test_user_header_added_after_signing_breaks_nothing_but_tampered_body_is_rejected(
    env_creds: None, rx: SigV4Receiver
) -> None:
    import requests

    auth = SigV4Auth(region="us-east-1")
    prepared = requests.Request("POST", rx.url, data=snappy.compress(write_request("m", 1.0)),
                                headers={"Content-Type": "application/x-protobuf"}).prepare()
    signed = auth(prepared)
    signed.body = snappy.compress(write_request("m", 2.0))
    signed.headers["Content-Length"] = str(len(signed.body))
    with requests.Session() as s:
        assert s.send(signed).status_code == 403
    assert rx.requests[0].reason == "body does not match x-amz-content-sha256"


# -- refreshing credentials --------------------------------------------------------------------
class RotatingProvider(botocore.credentials.CredentialProvider):  # type: ignore[misc]
    """Hands out AKID1, AKID2, ... each valid for one hour from a fake clock."""

    METHOD = "test-rotating"

    def __init__(self) -> None:
        super().__init__()
        self.now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
        self.issued = 0

    def metadata(self) -> dict[str, str]:
        self.issued += 1
        return {
            "access_key": f"AKID{self.issued}",
            "secret_key": f"secret-{self.issued}",
            "token": f"token-{self.issued}",
            "expiry_time": (self.now + datetime.timedelta(hours=1)).isoformat(),
        }

    def load(self) -> botocore.credentials.RefreshableCredentials:
        m = self.metadata()
        return botocore.credentials.RefreshableCredentials(
            m["access_key"], m["secret_key"], m["token"], datetime.datetime.fromisoformat(m["expiry_time"]),
            refresh_using=self.metadata, method=self.METHOD, time_fetcher=lambda: self.now,
        )


@pytest.fixture
def rotating() -> tuple[botocore.session.Session, RotatingProvider]:
    provider = RotatingProvider()
    session = botocore.session.Session()
    session.register_component("credential_provider", botocore.credentials.CredentialResolver([provider]))
    return session, provider


def test_refreshable_credentials_are_renewed_before_they_expire(
    rotating: tuple[botocore.session.Session, RotatingProvider]
) -> None:
    session, provider = rotating
    with SigV4Receiver("AKID1", "secret-1", token="token-1") as rx:
        rx.add_credentials("AKID2", "secret-2", "token-2")
        auth = SigV4Auth(region="us-east-1", session=session)
        assert auth.method == "test-rotating"
        assert post(rx.url, auth, write_request("m", 1.0)) == 204
        provider.now += datetime.timedelta(minutes=50)  # inside botocore's 15 min advisory window
        assert post(rx.url, auth, write_request("m", 2.0)) == 204
    assert [r.access_key for r in rx.requests] == ["AKID1", "AKID2"]
    assert all(r.reason == "ok" for r in rx.requests)


def test_403_expired_token_forces_a_refresh_and_the_retry_succeeds(
    rotating: tuple[botocore.session.Session, RotatingProvider], tmp_path: Path
) -> None:
    session, provider = rotating
    with SigV4Receiver("AKID1", "secret-1", token="token-1") as rx:
        rx.add_credentials("AKID2", "secret-2", "token-2")
        rx.script([Scripted(403, {}, EXPIRED_BODY)])  # AWS revoked AKID1 early
        sender = make_sender(rx.url, TRANSPORT[0](auth=SigV4Auth(region="us-east-1", session=session)),
                             tmp_path)
        result = sender.send_batch(snappy.compress(write_request("m", 1.0)), 1, time.time())
        sender.queue.close()
    assert result.ok and result.retried == 1
    assert [(r.access_key, r.status) for r in rx.requests] == [("AKID1", 403), ("AKID2", 204)]
    assert rx.requests[1].headers["retry-attempt"] == "1"
    assert provider.issued == 2


def test_force_refresh_rereads_static_env_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "OLD")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "old-secret")
    with SigV4Receiver("NEW", "new-secret") as rx:
        auth = SigV4Auth(region="us-east-1")
        assert post(rx.url, auth, write_request("m", 1.0)) == 403
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "NEW")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "new-secret")
        auth.force_refresh()
        assert post(rx.url, auth, write_request("m", 1.0)) == 204


# -- assume role (role_arn, external_id) against a fake STS on loopback ------------------------
ROLE_ARN = "arn:aws:iam::123456789012:role/amp-writer"
STS_XML = """<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleResult><Credentials><AccessKeyId>ASIAROLE</AccessKeyId><SecretAccessKey>role-secret</SecretAccessKey>
<SessionToken>role-token</SessionToken><Expiration>{expiry}</Expiration></Credentials>
<AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/amp-writer/gpu-relay</Arn>
<AssumedRoleId>AROAEXAMPLE:gpu-relay</AssumedRoleId></AssumedRoleUser></AssumeRoleResult>
<ResponseMetadata><RequestId>test</RequestId></ResponseMetadata></AssumeRoleResponse>"""


class FakeSTS:
    """Answers AssumeRole with fixed credentials after checking the caller's own SigV4 signature."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, list[str]], str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                creds = {AK: botocore.credentials.Credentials(AK, SK, TOKEN)}
                ok, reason, _ = verify_sigv4("POST", f"http://{headers['host']}{self.path}", headers, body,
                                             creds, "us-east-1", "sts")
                outer.calls.append((urllib.parse.parse_qs(body.decode()), reason))
                expiry = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))
                out = STS_XML.format(expiry=expiry.strftime("%Y-%m-%dT%H:%M:%SZ")).encode()
                self.send_response(200 if ok else 403)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_role_arn_assumes_the_role_with_external_id_and_signs_with_its_credentials(
    env_creds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    sts = FakeSTS()
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.url)
    try:
        with SigV4Receiver("ASIAROLE", "role-secret", token="role-token") as rx:
            auth = SigV4Auth(region="us-east-1", role_arn=ROLE_ARN, external_id="ext-42")
            assert auth.method == "assume-role"
            assert post(rx.url, auth, write_request("m", 1.0)) == 204
            assert post(rx.url, auth, write_request("m", 2.0)) == 204  # cached, not re-assumed
    finally:
        sts.close()
    assert [r.access_key for r in rx.requests] == ["ASIAROLE", "ASIAROLE"]
    [(form, reason)] = sts.calls
    assert reason == "ok"  # the STS call itself was signed with the env (source) credentials
    assert form["Action"] == ["AssumeRole"] and form["RoleArn"] == [ROLE_ARN]
    assert form["ExternalId"] == ["ext-42"] and form["RoleSessionName"] == ["gpu-relay"]
