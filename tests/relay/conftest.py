"""Rigs the relay's tests share: sender rigs and runtimes made by a test, stopped after it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def rigs() -> Iterator[list[Any]]:
    """Sender rigs (tests.relay.delivery.test_sender_faults.rig) made by a test: stopped and closed after it."""
    made: list[Any] = []
    yield made
    for r in made:
        r.sender.stop(timeout=2)
        r.queue.close()


@pytest.fixture
def runtimes() -> Iterator[list[Any]]:
    """Relay runtimes (relay.control.service.Runtime) made by a test: stopped after it."""
    made: list[Any] = []
    yield made
    for r in made:
        r.stop()
