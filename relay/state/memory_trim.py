"""Give the heap's free memory back to the system after a peak: glibc's ``malloc_trim(0)``, which
returns the free pages inside every arena and the main heap's top (a thread arena's top goes back
from ``free`` itself, past the trim threshold).
After a window of churn or a few large request bodies, freed memory otherwise stays with the
process up to the trim threshold per arena and wherever a live allocation sits above it (glibc raises
that threshold to the largest block it freed: after one 32 MiB body, up to 64 MiB an arena stays).

Large blocks go straight back: :func:`map_large_blocks` fixes glibc's mmap threshold (which would
otherwise grow to the largest block freed, up to 32 MiB), so a request body or a decoded request of
``LARGE_REQUEST_BYTES`` or more is its own mapping, unmapped when it is freed, whichever thread and
arena it came from; requests of the usual size (a few hundred KB) stay on the heap.

Two callers of :func:`trim`, for the small blocks a peak leaves behind: the pipeline's periodic
``expire`` (once a minute in the daemon), outside its lock; and the write path's
:class:`PeakTrimmer`, once a peak of large requests is over (the last large request in flight has
finished), on a timer thread a moment later (``SETTLE_S``: the connection has freed the body it
read) and at most once per ``min_interval_s``, never for a small request; the request path itself
never trims. A trim costs a walk over the free chunks (milliseconds for a few hundred MB). Where the
C library is not glibc, nothing is done (False).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

LARGE_REQUEST_BYTES = 4 << 20  # a request body this large (as sent or decoded) is a peak worth trimming after
MIN_INTERVAL_S = 1.0  # the write path trims at most this often
SETTLE_S = 0.2  # after a peak's last large request: time for its connection to send the reply and free the body


def _glibc() -> Any | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc's own symbol: musl has no malloc_trim)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _glibc()
# malloc.h: mallopt's parameters; setting either turns glibc's dynamic thresholds off
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def map_large_blocks(threshold: int = LARGE_REQUEST_BYTES) -> bool:
    """Blocks of ``threshold`` bytes or more are mmapped from now on (process-wide); the heap's top is
    given back by ``free`` past twice that (what glibc's dynamic rule would pick for this threshold,
    so the usual requests' blocks do not go back and forth to the system). True when glibc took both.
    Called once when the relay's runtime is built."""
    if _TRIM is None:
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * threshold))


def trim() -> bool:
    """``malloc_trim(0)``: True when glibc gave some memory back."""
    return _TRIM is not None and bool(_TRIM(0))


class PeakTrimmer:
    """Trims after a peak of large requests. Thread-safe. A request runs inside ``with
    trimmer.request(len(body)) as r:`` and tells ``r.saw(n)`` of any larger size it meets (its
    decoded bytes); a request that is large at some point counts in flight until its ``with`` ends."""

    def __init__(self, large_bytes: int = LARGE_REQUEST_BYTES, min_interval_s: float = MIN_INTERVAL_S, *,
                 settle_s: float = SETTLE_S, clock: Callable[[], float] = time.monotonic,
                 trim_fn: Callable[[], object] = trim) -> None:
        self.large_bytes = large_bytes
        self.min_interval_s = min_interval_s
        self.settle_s = settle_s
        self._clock = clock
        self._trim_fn = trim_fn
        self._lock = threading.Lock()
        self._in_flight = 0  # large requests not finished
        self._last = -float("inf")  # when the last trim ran
        self._timer: threading.Timer | None = None  # the trim due (after the settle time or the interval)
        self.trims = 0  # trims run (tests, debugging)

    def request(self, size: int) -> PeakRequest:
        r = PeakRequest(self)
        r.saw(size)
        return r

    def _begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def _end(self) -> None:
        """A large request is done; after the last one in flight, a trim is due: on a timer, ``SETTLE_S``
        on (the reply sent, the body its connection read freed) or at the end of the interval."""
        with self._lock:
            self._in_flight -= 1
            if self._in_flight or self._timer is not None:
                return  # the peak goes on, or a trim is already due
            wait = max(self.settle_s, self._last + self.min_interval_s - self._clock())
            self._timer = threading.Timer(wait, self._deferred)
            self._timer.daemon = True
            self._timer.start()

    def _deferred(self) -> None:
        with self._lock:
            self._timer = None
            if self._in_flight:
                return  # another peak began: its end trims
            self._last = self._clock()
        self._run()

    def _run(self) -> None:
        self._trim_fn()
        with self._lock:
            self.trims += 1

    def pending(self) -> bool:
        """A trim is due (its timer not run yet)."""
        with self._lock:
            return self._timer is not None


class PeakRequest:
    """One request's share of a :class:`PeakTrimmer` (a context manager)."""

    __slots__ = ("_large", "_owner")

    def __init__(self, owner: PeakTrimmer) -> None:
        self._owner = owner
        self._large = False

    def saw(self, size: int) -> None:
        """The request holds ``size`` bytes at once (its body, its decoded bytes)."""
        if not self._large and size >= self._owner.large_bytes:
            self._large = True
            self._owner._begin()

    def __enter__(self) -> PeakRequest:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._large:
            self._large = False
            self._owner._end()
