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
:class:`PeakTrimmer`, on a timer thread: once a peak of large requests is over (the last request in
flight has finished; ``SETTLE_S`` later, the connection has freed the body it read), and once a burst
of usual-size requests (``VOLUME_BYTES`` since the last trim: new series grow the tables that hold
them and free the old ones) is followed by ``QUIET_S`` without a request; at most once per
``min_interval_s``. Steady traffic, never quiet, is left to the minute's upkeep; the request path
itself never trims. A trim costs a walk over the free chunks (milliseconds for a few hundred MB). Where the
C library is not glibc, nothing is done (False).

``malloc_trim`` gives back the free chunks inside every arena, and the main heap's top, but not the
top of a thread's arena (glibc 2.36): that only shrinks in ``free``, on a block of 64 KiB or more, once
the top is past the trim threshold. A peak of concurrent requests leaves each thread arena it used with
a free top (up to 8 arenas a core): under the threshold (8 MiB here) it stays for good; past it, it
stays too when the blocks came back by a path that does not trim (``malloc_trim``'s own consolidation).
Freed blocks of the usual size grow those tops: the pure-Python route's per-series slices (~300 KB
each) left 115-280 MB in 63 MiB heaps after 24 concurrent 31 MiB writes, and large bodies are then
cut from those tops instead of being mmapped. So the peak's trim is :func:`trim_arenas`:
``malloc_trim``, then short threads, one in each arena, free a block there under glibc's default
threshold (``TOUCH_TRIM_THRESHOLD``), which gives its top back: 2-3 MB left after each burst.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

LARGE_REQUEST_BYTES = 4 << 20  # a request body this large (as sent or decoded) is a peak worth trimming after
MIN_INTERVAL_S = 1.0  # the write path trims at most this often
SETTLE_S = 0.2  # after a peak's last large request: time for its connection to send the reply and free the body
VOLUME_BYTES = 32 << 20  # usual-size requests adding up to this since the last trim: a burst worth a trim
QUIET_S = 2.0  # after a burst: how long the write path is quiet first (the delivery has freed its batches)
TOUCH_BYTES = 96 << 10  # freed in each arena: >= 64 KiB (free() trims the top past that), < 128 KiB (never mmapped)
TOUCH_TRIM_THRESHOLD = 128 << 10  # glibc's default M_TRIM_THRESHOLD: while the arenas are touched
TOUCH_WAIT_S = 2.0  # the most a touching thread waits for the others


def _glibc() -> Any | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc's own symbol: musl has no malloc_trim)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        libc.free.restype = None
        libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        libc.open_memstream.restype = ctypes.c_void_p
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.malloc_info.restype = ctypes.c_int
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.fclose.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()
_TRIM = None if _LIBC is None else _LIBC.malloc_trim
# malloc.h: mallopt's parameters; setting either turns glibc's dynamic thresholds off
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
ARENA_MAX = 2  # malloc arenas at most (limit_arenas): the main one and one the threads share
_arena_max: int | None = None  # what limit_arenas set
_trim_threshold: int | None = None  # what map_large_blocks set (None: glibc's dynamic thresholds)


def map_large_blocks(threshold: int = LARGE_REQUEST_BYTES) -> bool:
    """Blocks of ``threshold`` bytes or more are mmapped from now on (process-wide); the heap's top is
    given back by ``free`` past twice that (what glibc's dynamic rule would pick for this threshold,
    so the usual requests' blocks do not go back and forth to the system). True when glibc took both.
    Called once when the relay's runtime is built."""
    global _trim_threshold
    if _LIBC is None:
        return False
    if _LIBC.mallopt(_M_MMAP_THRESHOLD, threshold) and _LIBC.mallopt(_M_TRIM_THRESHOLD, 2 * threshold):
        _trim_threshold = 2 * threshold
        return True
    return False


def trim() -> bool:
    """``malloc_trim(0)``: True when glibc gave some memory back."""
    return _TRIM is not None and bool(_TRIM(0))


def arenas() -> int:
    """The malloc arenas in the process (the main one and the threads'), from ``malloc_info``; 0
    where the C library is not glibc."""
    if _LIBC is None:
        return 0
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    stream = _LIBC.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return 0
    try:
        _LIBC.malloc_info(0, stream)
    finally:
        _LIBC.fclose(stream)
    try:
        return ctypes.string_at(buf.value, size.value).count(b"<heap nr=") if buf.value else 0
    finally:
        _LIBC.free(buf.value)


def _user_arena_max() -> int | None:
    """``glibc.malloc.arena_max`` as the user set it (GLIBC_TUNABLES, or its old name MALLOC_ARENA_MAX)."""
    tunable = re.search(r"(?:^|:)glibc\.malloc\.arena_max=(\d+)", os.environ.get("GLIBC_TUNABLES", ""))
    value = tunable.group(1) if tunable else os.environ.get("MALLOC_ARENA_MAX", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def arena_limit() -> int:
    """How many arenas glibc makes at most: the user's ``glibc.malloc.arena_max``, else what
    :func:`limit_arenas` set, else glibc's default, 8 a core."""
    return _user_arena_max() or _arena_max or 8 * (os.cpu_count() or 1)


def limit_arenas(n: int = ARENA_MAX) -> bool:
    """At most ``n`` malloc arenas (the main one included), unless the user chose a number
    (``glibc.malloc.arena_max``): glibc's default, 8 a core, lets each connection's thread keep an
    arena of its own with the free memory of its last large request in it (up to the trim threshold,
    8 MiB, each). Every thread holds the GIL around almost all of its allocations, so sharing arenas
    costs little lock contention. bench/relay_series_bench.py --memory --steady 300000: 227 -> 213 B
    per active series after the burst, 157 -> 137 once the minute's upkeep ran. Called once when the
    runtime is built, before the server's threads start; True when glibc took it."""
    global _arena_max
    if _LIBC is None or _user_arena_max() is not None:
        return False
    if _LIBC.mallopt(_M_ARENA_MAX, n):
        _arena_max = n
        return True
    return False


def _touch() -> None:
    """A block freed in this thread's arena: ``free`` gives the arena's top back past the threshold."""
    assert _LIBC is not None
    _LIBC.free(_LIBC.malloc(TOUCH_BYTES))


def _touch_all(n: int) -> None:
    """:func:`_touch` here and in ``n`` new threads that wait for each other: a new thread takes an
    arena no running thread holds (while they all wait, each holds its own) and, once there are as
    many arenas as glibc makes, the next one round the ring, held or not."""
    _touch()
    if n <= 0:
        return
    barrier = threading.Barrier(n + 1)

    def touch_and_wait() -> None:
        _touch()
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(TOUCH_WAIT_S)

    threads = []
    for _ in range(n):
        t = threading.Thread(target=touch_and_wait, name="gpu-relay-trim", daemon=True)
        try:
            t.start()
        except RuntimeError:  # no more threads: the ones started go on
            barrier.abort()
            break
        threads.append(t)
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(TOUCH_WAIT_S)
    for t in threads:
        t.join(TOUCH_WAIT_S)


def trim_arenas() -> bool:
    """:func:`trim`, then the free tops of the threads' arenas, which it leaves (its consolidation
    even moves free chunks into them): short threads, one per arena (two where glibc's limit is
    reached), and this one free a block in theirs under ``TOUCH_TRIM_THRESHOLD``, then the threshold
    is put back. Costs up to 32 threads on 2 cores: after a peak, never per request."""
    if _LIBC is None:
        return False
    trimmed = trim()
    if _trim_threshold is not None:  # (where glibc's dynamic thresholds stand, setting one would end them)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, TOUCH_TRIM_THRESHOLD)
    try:
        n = arenas()
        # the threads' arenas no thread holds (the main one is malloc_trim's); at glibc's limit,
        # arenas are shared and some are held: then once round the ring as well
        _touch_all(n - 1 + (n if n >= arena_limit() else 0))
    finally:
        if _trim_threshold is not None:
            _LIBC.mallopt(_M_TRIM_THRESHOLD, _trim_threshold)
    return trimmed


class PeakTrimmer:
    """Trims after a peak (:func:`trim_arenas`). Thread-safe. A request runs inside
    ``with trimmer.request(len(body)) as r:`` and tells ``r.saw(n)`` of any larger size it meets (its
    decoded bytes). Two kinds of peak:

    - a large request (``large_bytes`` or more at some point): once the last request in flight has
      ended, a trim runs ``settle_s`` later (the reply sent, the body freed), at most once per
      ``min_interval_s``;
    - a burst of requests of the usual size, ``volume_bytes`` or more (each counted at its largest)
      since the last trim: once the write path has been quiet (no request in flight, none ended) for
      ``quiet_s``. New series leave freed blocks behind as the tables and dicts holding them grow, and
      the delivery frees its batches after the last write; without this, they stay until the minute's
      upkeep (``Pipeline.expire``). Steady traffic is never quiet, so it is never trimmed here.

    A trim that falls due while a request is in flight stands down; that request's end arms it again."""

    def __init__(self, large_bytes: int = LARGE_REQUEST_BYTES, min_interval_s: float = MIN_INTERVAL_S, *,
                 settle_s: float = SETTLE_S, volume_bytes: int = VOLUME_BYTES, quiet_s: float = QUIET_S,
                 clock: Callable[[], float] = time.monotonic, trim_fn: Callable[[], object] = trim_arenas) -> None:
        self.large_bytes = large_bytes
        self.min_interval_s = min_interval_s
        self.settle_s = settle_s
        self.volume_bytes = volume_bytes
        self.quiet_s = quiet_s
        self._clock = clock
        self._trim_fn = trim_fn
        self._lock = threading.Lock()
        self._in_flight = 0  # requests not finished
        self._large_due = False  # a large request ended since the last trim
        self._volume = 0  # bytes of the requests ended since the last trim
        self._last_end = -float("inf")  # when the last request ended
        self._last = -float("inf")  # when the last trim ran
        self._timer: threading.Timer | None = None  # the trim due (after the settle time, the interval or the quiet)
        self.trims = 0  # trims run (tests, debugging)

    def request(self, size: int) -> PeakRequest:
        with self._lock:
            self._in_flight += 1
        r = PeakRequest(self)
        r.saw(size)
        return r

    def _end(self, large: bool, size: int) -> None:
        """A request is done; once none is in flight, a trim is armed if one is due."""
        with self._lock:
            self._in_flight -= 1
            self._large_due = self._large_due or large
            self._volume += size
            self._last_end = self._clock()
            if not self._in_flight and self._timer is None:
                self._arm()

    def _arm(self) -> None:
        """Under the lock, no request in flight and no timer: a timer for the trim due, if one is."""
        now = self._clock()
        if self._large_due:
            wait = max(self.settle_s, self._last + self.min_interval_s - now)
        elif self._volume >= self.volume_bytes:
            wait = max(self._last_end + self.quiet_s - now, self._last + self.min_interval_s - now, 0.0)
        else:
            return
        self._timer = threading.Timer(wait, self._deferred)
        self._timer.daemon = True
        self._timer.start()

    def _deferred(self) -> None:
        with self._lock:
            self._timer = None
            if self._in_flight:
                return  # another request began: its end arms the trim again
            if not self._large_due and self._clock() < self._last_end + self.quiet_s:
                self._arm()  # a request came and went meanwhile: not quiet yet
                return
            self._last = self._clock()
            self._large_due = False
            self._volume = 0
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

    __slots__ = ("_done", "_large", "_owner", "_size")

    def __init__(self, owner: PeakTrimmer) -> None:
        self._owner = owner
        self._large = False
        self._size = 0  # the most it held at once
        self._done = False

    def saw(self, size: int) -> None:
        """The request holds ``size`` bytes at once (its body, its decoded bytes)."""
        if size > self._size:
            self._size = size
            self._large = self._large or size >= self._owner.large_bytes

    def __enter__(self) -> PeakRequest:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            self._done = True
            self._owner._end(self._large, self._size)
