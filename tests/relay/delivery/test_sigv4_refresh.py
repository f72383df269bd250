"""SigV4 under slow credential refreshes (issue 8 defect 14), static keys, start-up errors."""

from __future__ import annotations

import datetime
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import botocore.credentials
import botocore.session
import pytest
import requests

from relay.config.config import SigV4Config
from relay.delivery import sigv4
from relay.delivery.sigv4 import SigV4Auth, SigV4ConfigError
from tests.helpers import isolate_aws
from tests.relay.delivery.test_sigv4 import post, write_request
from tests.sigv4_receiver import SigV4Receiver

T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture(autouse=True)
def _isolated_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_aws(monkeypatch, tmp_path)


class SlowProvider(botocore.credentials.CredentialProvider):  # type: ignore[misc]
    """Credentials valid 12 minutes from a fake clock (inside botocore's 15 min advisory window, not yet
    in the 10 min mandatory one), so every use wants a refresh; each refresh takes ``delay`` seconds
    (a slow STS or IMDS) and hands out the same keys again."""

    METHOD = "test-slow"

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.refreshes = 0
        self.in_refresh = threading.Event()

    def metadata(self) -> dict[str, str]:
        self.refreshes += 1
        self.in_refresh.set()
        time.sleep(self.delay)
        return {"access_key": "AKIDSLOW", "secret_key": "slow-secret", "token": "slow-token",
                "expiry_time": (T0 + datetime.timedelta(minutes=12)).isoformat()}

    def load(self) -> botocore.credentials.RefreshableCredentials:
        return botocore.credentials.RefreshableCredentials(
            "AKIDSLOW", "slow-secret", "slow-token", T0 + datetime.timedelta(minutes=12),
            refresh_using=self.metadata, method=self.METHOD, time_fetcher=lambda: T0,
        )


def slow_session(provider: SlowProvider) -> botocore.session.Session:
    session = botocore.session.Session()
    session.register_component("credential_provider", botocore.credentials.CredentialResolver([provider]))
    return session


def sign_all(auth: SigV4Auth, n: int) -> list[float]:
    """Sign n requests in n threads at once; seconds each took."""
    took: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        started = time.monotonic()
        auth(requests.Request("POST", "http://127.0.0.1:1/w", data=b"x").prepare())
        with lock:
            took.append(time.monotonic() - started)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return took


def test_an_advisory_refresh_that_stalls_does_not_stall_the_other_shards(tmp_path: Path) -> None:
    provider = SlowProvider(delay=1.5)
    auth = SigV4Auth(region="us-east-1", session=slow_session(provider))
    took = sign_all(auth, 6)
    assert len(took) == 6
    assert sorted(took)[4] < 0.5  # five shards signed at once with the still-valid credentials
    assert provider.refreshes == 1  # one thread refreshed (slowly), the others did not wait for it


def test_force_refresh_in_one_thread_does_not_block_signing_in_the_others() -> None:
    provider = SlowProvider(delay=1.5)
    auth = SigV4Auth(region="us-east-1", session=slow_session(provider))
    provider.delay = 0.0
    sign_all(auth, 1)  # let the advisory refresh happen once, quickly
    provider.delay = 1.5
    provider.in_refresh.clear()
    t = threading.Thread(target=auth.force_refresh)
    t.start()
    assert provider.in_refresh.wait(2)
    started = time.monotonic()
    took = sign_all(auth, 4)
    assert time.monotonic() - started < 0.7 and len(took) == 4
    t.join(5)


def test_static_keys_from_the_config_sign_and_are_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    cfg = SimpleNamespace(region="us-east-1", service="aps", profile=None, role_arn=None, external_id=None,
                          access_key="AKIDSTATIC", secret_key="static/secret+key")
    with caplog.at_level(logging.DEBUG), SigV4Receiver("AKIDSTATIC", "static/secret+key") as rx:
        auth = sigv4.from_config("amp", cfg)
        assert post(rx.url, auth, write_request("m", 1.0)) == 204
        auth.force_refresh()  # static keys stay as they are
        assert post(rx.url, auth, write_request("m", 2.0)) == 204
    assert [r.access_key for r in rx.requests] == ["AKIDSTATIC", "AKIDSTATIC"]
    assert "static/secret+key" not in caplog.text and "static/secret+key" not in repr(auth)
    assert auth.method == "static-config"


def test_only_one_of_access_key_and_secret_key_is_a_config_error() -> None:
    with pytest.raises(SigV4ConfigError, match="together"):
        SigV4Auth(region="us-east-1", access_key="AKID")


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (SigV4Config(region="us-east-1", service="aps"), "destination 'amp': no AWS credentials found"),
        (SigV4Config(region="us-east-1", service="aps", profile="nope"),
         "destination 'amp': cannot set up AWS credentials (ProfileNotFound"),
        (SigV4Config(region="", service="aps"), "destination 'amp': a region is required"),
    ],
    ids=["no-credentials", "missing-profile", "no-region"],
)
def test_credentials_that_cannot_resolve_raise_one_line_naming_the_destination(
    cfg: SigV4Config, expected: str
) -> None:
    with pytest.raises(SigV4ConfigError) as e:
        sigv4.from_config("amp", cfg)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)
