"""Give the heap's free memory back to the system after a peak: glibc's ``malloc_trim(0)``, which
returns the free pages of every arena (the main heap's top and the holes inside it, the threads'
arenas). After a window of churn or a few large request bodies, freed memory otherwise stays with the
process up to the trim threshold per arena and wherever a live allocation sits above it.

The pipeline calls :func:`trim` from its periodic ``expire`` (once a minute in the daemon), outside
its lock; it costs a walk over the free chunks (milliseconds for a few hundred MB). Where the C
library is not glibc, nothing is done (False).
"""

from __future__ import annotations

import ctypes
from typing import Any


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


def trim() -> bool:
    """``malloc_trim(0)``: True when glibc gave some memory back."""
    return _TRIM is not None and bool(_TRIM(0))
