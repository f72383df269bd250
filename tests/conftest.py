"""Test isolation for process-wide logging: ``main()`` of both programs calls
``telemetry_common.logs.configure``, which replaces the root logger's handlers and level; a test
that runs ``main()`` in-process must not change what later tests' ``caplog`` sees.

Hypothesis runs under the ``suite`` profile: no deadline (a loaded 2-core machine must not fail a
correct test for being slow) and the reproduction blob printed with every failure."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from hypothesis import settings

from telemetry_common.logs import QUIET_LIBRARIES

settings.register_profile("suite", deadline=None, print_blob=True)
settings.load_profile("suite")


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
