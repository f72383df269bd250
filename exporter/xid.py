"""XID events: a thread waiting on ``backend.wait_xid`` that keeps the last XID per GPU (what
``DCGM_FI_DEV_XID_ERRORS`` reports, 0 until one happens, like DCGM) and a reset-free count per
(GPU, XID) for ``gpu_exporter_xid_errors_total``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)


class XidSource(Protocol):
    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]: ...


class XidState:
    """Thread-safe last XID per GPU and counts per (gpu, xid)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, int] = {}
        self._counts: dict[tuple[int, int], int] = {}

    def record(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._last[gpu] = xid
            self._counts[(gpu, xid)] = self._counts.get((gpu, xid), 0) + 1

    def last(self, gpu: int) -> int:
        with self._lock:
            return self._last.get(gpu, 0)

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
        for gpu, xid in events:
            log.warning("XID %d on GPU %d", xid, gpu)
            self.state.record(gpu, xid)
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
