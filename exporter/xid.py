"""XID events: a thread waiting on ``backend.wait_xid`` that keeps the last XID per GPU and per MIG
GPU instance (what ``DCGM_FI_DEV_XID_ERRORS`` reports, 0 until one happens, like DCGM) and a
reset-free count per (GPU, XID) for ``gpu_exporter_xid_errors_total``, and the recent events with
their time (the last ``MAX_RECENT``) for ``DCGM_EXP_XID_ERRORS_COUNT``'s window.

An event NVML ties to a GPU instance (``nvmlEventData_t.gpuInstanceId``) lands on that instance's
series only; a GPU-wide event on the GPU and every instance of it. ``xid_message`` gives
dcgm-exporter 4.8.2's ``err_msg`` label text for an ``err_code``.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Protocol

from exporter.backend import XidEvent

log = logging.getLogger(__name__)
UNKNOWN_XID = "Unknown Error"  # dcgm-exporter's err_msg for a code outside its table
MAX_RECENT = 4096  # timed events kept for windowed counts (an XID storm beyond it counts the newest)


@cache
def _messages() -> dict[int, str]:
    text = resources.files("exporter").joinpath("data", "xid-messages.json").read_text(encoding="utf-8")
    return {int(k): v for k, v in json.loads(text)["messages"].items()}


def xid_message(code: int) -> str:
    """The ``err_msg`` dcgm-exporter 4.8.2 prints for ``err_code`` (0: "No Error")."""
    return _messages().get(code, UNKNOWN_XID)


class XidSource(Protocol):
    def wait_xid(self, timeout_s: float) -> Sequence[XidEvent]: ...


class XidState:
    """Thread-safe last XID per (gpu, GPU instance or None) and counts per (gpu, xid)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._seq = itertools.count(1)
        self._last: dict[tuple[int, int | None], tuple[int, int]] = {}  # -> (sequence, xid)
        self._counts: dict[tuple[int, int], int] = {}
        self._recent: deque[tuple[float, int, int]] = deque(maxlen=MAX_RECENT)  # (clock, gpu, xid)

    def record(self, gpu: int, xid: int, gpu_instance: int | None = None) -> None:
        with self._lock:
            self._last[(gpu, gpu_instance)] = (next(self._seq), xid)
            self._counts[(gpu, xid)] = self._counts.get((gpu, xid), 0) + 1
            self._recent.append((self._clock(), gpu, xid))

    def window(self, gpu: int, window_s: float) -> Counter[int]:
        """XID code -> events on the GPU (any of its instances) in the last ``window_s`` seconds."""
        since = self._clock() - window_s
        with self._lock:
            return Counter(x for t, g, x in self._recent if g == gpu and t >= since)

    def last(self, gpu: int, gpu_instance: int | None = None) -> int:
        """The latest XID for the GPU (``gpu_instance`` None) or for one of its GPU instances: the
        newer of a GPU-wide event and one on that instance; 0 when none."""
        with self._lock:
            wide = self._last.get((gpu, None), (0, 0))
            own = self._last.get((gpu, gpu_instance), (0, 0)) if gpu_instance is not None else (0, 0)
            return max(wide, own)[1]

    def counts(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return dict(self._counts)


class XidWatcher:
    """Runs ``wait_xid`` in a loop on one daemon thread; ``stop()`` returns within ~timeout_s."""

    def __init__(
        self,
        backend: XidSource,
        on_xid: Callable[[int, int], None] | None = None,
        state: XidState | None = None,
        timeout_s: float = 0.5,
    ) -> None:
        self.state = state if state is not None else XidState()
        self._backend = backend
        self._on_xid = on_xid
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout_s + 1.0)
            self._thread = None

    def poll_once(self) -> int:
        """One wait; returns how many events arrived. Used by the loop and by tests."""
        events = self._backend.wait_xid(self._timeout_s)
        for event in events:
            gpu, xid = event[0], event[1]
            gi = event[2] if len(event) > 2 else None
            where = f"GPU {gpu}" if gi is None else f"GPU {gpu} GPU instance {gi}"
            log.warning("XID %d (%s) on %s", xid, xid_message(xid), where, extra={"gpu": gpu, "xid": xid})
            self.state.record(gpu, xid, gi)
            if self._on_xid is not None:
                self._on_xid(gpu, xid)
        return len(events)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # a broken event source must not kill the exporter
                self.errors += 1
                if self.errors == 1:
                    log.error("XID event wait failed, retrying: %s", exc)
                self._stop.wait(self._timeout_s)
