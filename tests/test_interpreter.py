"""relay.interpreter: the GC and GIL settings the relay runs with, and that `gpu-relay run` applies
them once it has started (and not when it refuses to start)."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay import daemon, interpreter
from tests.helpers import free_port, wait_until


@pytest.fixture
def pristine() -> Iterator[interpreter.Settings]:
    """The interpreter's settings before the test, put back after it (the suite runs with defaults)."""
    before = interpreter.current()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield before
    finally:
        interpreter.restore(before)
        for s, h in handlers.items():
            signal.signal(s, h)


def test_tune_freezes_start_up_objects_raises_the_thresholds_and_the_switch_interval(
        pristine: interpreter.Settings) -> None:
    gc.unfreeze()
    before = interpreter.tune()
    assert before.gc_threshold == pristine.gc_threshold and not before.frozen
    assert gc.get_threshold() == interpreter.GC_THRESHOLD
    assert sys.getswitchinterval() == pytest.approx(interpreter.SWITCH_INTERVAL_S)
    assert gc.get_freeze_count() > 1000  # this process's modules, at least
    assert interpreter.current().frozen


def test_restore_puts_every_setting_back(pristine: interpreter.Settings) -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    sys.setswitchinterval(0.005)
    before = interpreter.tune()
    interpreter.restore(before)
    assert gc.get_threshold() == (700, 10, 10)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    assert gc.get_freeze_count() == 0


def test_the_settings_are_the_ones_measured_not_the_defaults() -> None:
    # a young threshold of a request's burst, not of a few series; a switch interval above CPython's 5 ms
    assert interpreter.GC_THRESHOLD[0] >= 10_000
    assert interpreter.SWITCH_INTERVAL_S > 0.005
    assert interpreter.SWITCH_INTERVAL_S <= 0.05  # a waiting request never waits longer than this for its turn


def _config(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "relay.yaml"
    path.write_text(f"server: {{listen: '127.0.0.1:{port}'}}\nstorage: {{path: {tmp_path / 'q'}}}\n"
                    "destinations:\n  - name: local\n    url: http://127.0.0.1:1/api/v1/write\n")
    return path


def test_run_tunes_the_interpreter_once_it_has_started(tmp_path: Path, pristine: interpreter.Settings) -> None:
    gc.unfreeze()
    port = free_port()
    seen: list[interpreter.Settings] = []

    def watch_then_stop() -> None:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(ready, timeout=20)
        wait_until(lambda: interpreter.current().frozen, timeout=5)
        seen.append(interpreter.current())
        os.kill(os.getpid(), signal.SIGTERM)  # run()'s handler: a graceful stop

    t = threading.Thread(target=watch_then_stop, daemon=True)
    t.start()
    assert daemon.run(str(_config(tmp_path, port)), watch_interval_s=0) == 0
    t.join(10)
    assert seen, "the relay did not become ready"
    assert seen[0].frozen and seen[0].gc_threshold == interpreter.GC_THRESHOLD
    assert seen[0].switch_interval_s == pytest.approx(interpreter.SWITCH_INTERVAL_S)


def test_a_refused_start_leaves_the_interpreter_alone(tmp_path: Path, pristine: interpreter.Settings) -> None:
    gc.unfreeze()
    bad = tmp_path / "relay.yaml"
    bad.write_text("server: {listen: '127.0.0.1:1'}\ndestinations: []\nnot_a_key: 1\n")
    assert daemon.run(str(bad), watch_interval_s=0) == 1
    assert gc.get_threshold() == pristine.gc_threshold
    assert sys.getswitchinterval() == pytest.approx(pristine.switch_interval_s)
    assert gc.get_freeze_count() == 0
