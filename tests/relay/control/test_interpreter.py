"""relay.interpreter: the GC, GIL and malloc settings the relay runs with, and that `gpu-relay run` applies
them once it has started (and not when it refuses to start)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.control import daemon, interpreter
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


class FakeLibc:
    """A C library as ctypes shows it: mallopt(param, value) answers 1 on success, 0 if refused."""

    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def mallopt(self, param: object, value: object) -> int:
        self.calls.append((getattr(param, "value", param), getattr(value, "value", value)))  # type: ignore[arg-type]
        return self.answer


def test_tune_malloc_fixes_the_mmap_and_trim_thresholds() -> None:
    libc = FakeLibc()
    assert interpreter.tune_malloc(libc) is True
    assert sorted(libc.calls) == sorted([(interpreter.M_MMAP_THRESHOLD, interpreter.MMAP_THRESHOLD_BYTES),
                                         (interpreter.M_TRIM_THRESHOLD, interpreter.TRIM_THRESHOLD_BYTES)])
    assert (interpreter.M_TRIM_THRESHOLD, interpreter.M_MMAP_THRESHOLD) == (-1, -3)  # <malloc.h>


def test_tune_malloc_says_so_when_refused_or_not_glibc() -> None:
    assert interpreter.tune_malloc(FakeLibc(answer=0)) is False
    assert interpreter.tune_malloc(None) is False


def test_this_machine_s_glibc_takes_both_thresholds() -> None:
    libc = interpreter.glibc()
    assert libc is not None, "Debian's Python runs on glibc"
    assert interpreter.tune_malloc(libc) is True


_CHURN = """
import random, sys, threading
from relay.control import interpreter
if sys.argv[1] == "tuned":
    assert interpreter.tune_malloc(interpreter.glibc())
def minflt():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])
def work(seed):  # a request's buffers: hundreds of KB to MB, on several threads
    r = random.Random(seed)
    for _ in range(60):
        b = bytearray(r.randrange(200_000, 3_000_000))
        b[::4096] = b"x" * len(b[::4096])
        del b
before = minflt()
for rnd in range(3):
    ts = [threading.Thread(target=work, args=(i + 10 * rnd,)) for i in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
print(minflt() - before)
"""


def test_fixed_thresholds_cut_the_page_faults_of_large_buffer_churn() -> None:
    faults = {}
    for mode in ("defaults", "tuned"):
        out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, timeout=120,
                             check=True)
        faults[mode] = int(out.stdout.strip())
    assert faults["tuned"] * 2 < faults["defaults"], faults


def _record_tune_malloc(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Replace interpreter.tune_malloc by a recorder of the libc it is given (the test process keeps its malloc)."""
    calls: list[object] = []

    def record(libc: object) -> bool:
        calls.append(libc)
        return True

    monkeypatch.setattr(interpreter, "tune_malloc", record)
    return calls


def _config(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "relay.yaml"
    path.write_text(f"server: {{listen: '127.0.0.1:{port}'}}\nstorage: {{path: {tmp_path / 'q'}}}\n"
                    "destinations:\n  - name: local\n    url: http://127.0.0.1:1/api/v1/write\n")
    return path


def test_run_tunes_the_interpreter_once_it_has_started(tmp_path: Path, pristine: interpreter.Settings,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    gc.unfreeze()
    port = free_port()
    tuned_malloc = _record_tune_malloc(monkeypatch)
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
    assert len(tuned_malloc) == 1 and tuned_malloc[0] is not None  # this process's glibc, once


def test_a_refused_start_leaves_the_interpreter_alone(tmp_path: Path, pristine: interpreter.Settings,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    gc.unfreeze()
    tuned_malloc = _record_tune_malloc(monkeypatch)
    bad = tmp_path / "relay.yaml"
    bad.write_text("server: {listen: '127.0.0.1:1'}\ndestinations: []\nnot_a_key: 1\n")
    assert daemon.run(str(bad), watch_interval_s=0) == 1
    assert gc.get_threshold() == pristine.gc_threshold
    assert sys.getswitchinterval() == pytest.approx(pristine.switch_interval_s)
    assert gc.get_freeze_count() == 0
    assert not tuned_malloc
