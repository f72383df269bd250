"""Test isolation for process-wide logging: ``main()`` of both programs calls
``telemetry_common.logs.configure``, which replaces the root logger's handlers and level; a test
that runs ``main()`` in-process must not change what later tests' ``caplog`` sees."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from telemetry_common.logs import QUIET_LIBRARIES


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quiet = {name: logging.getLogger(name).level for name in QUIET_LIBRARIES}
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)
    for name, lvl in quiet.items():
        logging.getLogger(name).setLevel(lvl)


@pytest.fixture
def rigs() -> Iterator[list[Any]]:
    """Sender rigs (tests.test_sender_faults.rig) made by a test: stopped and closed after it."""
    made: list[Any] = []
    yield made
    for r in made:
        r.sender.stop(timeout=2)
        r.queue.close()


@pytest.fixture
def runtimes() -> Iterator[list[Any]]:
    """Relay runtimes (relay.service.Runtime) made by a test: stopped after it."""
    made: list[Any] = []
    yield made
    for r in made:
        r.stop()
