"""Shared test helpers: real binaries (never silently skipped in CI), free ports, waiting."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout's top folder."""
TEST_DATA = REPO_ROOT / "tests" / "data"
"""Fixtures the tests share (configs, recorded charts, relabel tables)."""


def require_binary(name: str) -> str:
    """Path of a binary the test needs. Missing: skip locally, but fail when CI is set."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed (run scripts/setup.sh)"
        if os.environ.get("CI"):
            pytest.fail(f"CI: {msg}", pytrace=False)
        pytest.skip(msg)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


AWS_CREDENTIAL_VARS = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
)


def isolate_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An AWS environment with no profiles, no credentials and no instance-metadata lookups."""
    for var in AWS_CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
