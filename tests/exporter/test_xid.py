"""XID watcher: last XID per GPU, reset-free counts, callback, prompt stop, survives errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from exporter.xid import XidState, XidWatcher
from tests.helpers import wait_until


class ScriptedXids:
    """wait_xid returns queued batches, else blocks up to timeout on an event (like NVML would)."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int]]] = []
        self.fail_next = 0
        self._event = threading.Event()
        self.lock = threading.Lock()

    def push(self, *events: tuple[int, int]) -> None:
        with self.lock:
            self.batches.append(list(events))
        self._event.set()

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("event set broken")
        self._event.wait(timeout_s)
        with self.lock:
            self._event.clear()
            out = [e for batch in self.batches for e in batch]
            self.batches.clear()
        return out


def test_state_keeps_last_xid_per_gpu_and_zero_before_any() -> None:
    s = XidState()
    assert s.last(0) == 0
    s.record(0, 79)
    s.record(0, 48)
    s.record(1, 13)
    assert (s.last(0), s.last(1), s.last(2)) == (48, 13, 0)


def test_state_counts_every_event_by_gpu_and_code() -> None:
    s = XidState()
    for gpu, xid in [(0, 13), (0, 13), (0, 79), (3, 13)]:
        s.record(gpu, xid)
    assert s.counts() == {(0, 13): 2, (0, 79): 1, (3, 13): 1}


def test_poll_once_records_and_calls_back() -> None:
    src = ScriptedXids()
    seen: list[tuple[int, int]] = []
    w = XidWatcher(src, lambda g, x: seen.append((g, x)), timeout_s=0.01)
    src.push((2, 31), (2, 43))
    assert w.poll_once() == 2
    assert seen == [(2, 31), (2, 43)]
    assert w.state.last(2) == 43


@pytest.fixture
def running() -> Iterator[tuple[ScriptedXids, XidWatcher]]:
    src = ScriptedXids()
    w = XidWatcher(src, None, timeout_s=0.05)
    w.start()
    yield src, w
    w.stop()


def test_thread_delivers_events(running: tuple[ScriptedXids, XidWatcher]) -> None:
    src, w = running
    src.push((1, 79))
    assert wait_until(lambda: w.state.last(1) == 79, timeout=2)


def test_stop_returns_within_a_second() -> None:
    w = XidWatcher(ScriptedXids(), None, timeout_s=0.5)
    w.start()
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 1.0


def test_watcher_survives_a_failing_event_source() -> None:
    src = ScriptedXids()
    src.fail_next = 2
    w = XidWatcher(src, None, timeout_s=0.02)
    w.start()
    try:
        src.push((0, 94))
        assert wait_until(lambda: w.state.last(0) == 94, timeout=2)
        assert w.errors == 2
    finally:
        w.stop()


def test_mig_xid_lands_on_its_gpu_instance_only_and_a_gpu_wide_one_on_every_instance() -> None:
    s = XidState()
    s.record(0, 31, 2)  # nvmlEventData_t.gpuInstanceId = 2
    assert (s.last(0, 1), s.last(0, 2), s.last(0)) == (0, 31, 0)
    s.record(0, 79)  # GPU-wide, newer: every instance shows it
    assert (s.last(0, 1), s.last(0, 2)) == (79, 79)
    s.record(0, 13, 1)
    assert (s.last(0, 1), s.last(0, 2)) == (13, 79)


def test_poll_once_records_a_mig_event_on_its_instance() -> None:
    src = ScriptedXids()
    w = XidWatcher(src, timeout_s=0.01)
    src.push((0, 31, 2))  # type: ignore[arg-type]
    assert w.poll_once() == 1
    assert (w.state.last(0, 2), w.state.last(0, 1)) == (31, 0)


@pytest.mark.parametrize(
    ("code", "message"),
    [(0, "No Error"), (48, "Double Bit ECC Error"), (79, "GPU has fallen off the bus"),
     (143, "GPU Initialization Failure"), (144, "Unknown Error"), (-1, "Unknown Error")],
)
def test_xid_message_is_dcgm_exporter_4_8_2_err_msg_text(code: int, message: str) -> None:
    from exporter.xid import xid_message

    assert xid_message(code) == message
