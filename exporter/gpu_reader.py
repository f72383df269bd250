"""One GPU's read thread for the collector, reused every cycle."""

from __future__ import annotations

import threading
from collections.abc import Callable


class GpuReader:
    """One GPU's read thread: started on first use, then reused every cycle (a thread start costs
    about 0.5 ms on a busy node; a wake-up a few us). ``submit`` refuses while a read still runs."""

    def __init__(self, name: str, fn: Callable[[], None]) -> None:
        self._fn = fn
        self._go = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def busy(self) -> bool:
        return not self._done.is_set()

    def submit(self) -> None:
        self._done.clear()
        self._go.set()
        if not self._thread.is_alive():
            self._thread.start()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(max(0.0, timeout_s))

    def close(self) -> None:
        """Ends the thread after its current read (a hung one ends when NVML returns)."""
        self._closed = True
        self._go.set()

    def _loop(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._closed:
                return
            try:
                self._fn()
            finally:
                self._done.set()
