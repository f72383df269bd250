"""Shared test helpers: real binaries (never silently skipped in CI), free ports, waiting."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable

import pytest


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
