"""Reload the relay when its config file changes (a Kubernetes ConfigMap update, an edit).

Polls the file's identity, ``(inode, size, mtime)``, every few seconds; ``os.stat`` follows
symlinks, so the kubelet's atomic swap of the ConfigMap's ``..data`` link shows as a new inode.
Only a change calls ``on_change``: a bad file is refused (and logged by the reload) once, not at
every poll, and reloaded again only when it changes again. A file that disappears is logged once
and waited for.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger("relay.configwatch")

DEFAULT_INTERVAL_S = 3.0
Signature = tuple[int, int, int]


def file_signature(path: str, stat: Callable[[str], os.stat_result] = os.stat) -> Signature | None:
    """``(inode, size, mtime_ns)`` of ``path`` (after symlinks), or None if it cannot be read."""
    try:
        st = stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class ConfigWatcher:
    """Calls ``on_change()`` (the runtime's reload) when ``path`` changes; ``poll`` is one check."""

    def __init__(self, path: str, on_change: Callable[[], tuple[bool, str]],
                 interval_s: float = DEFAULT_INTERVAL_S,
                 stat: Callable[[str], os.stat_result] = os.stat) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.path = path
        self.on_change = on_change
        self.interval_s = interval_s
        self._stat = stat
        self._last = file_signature(path, stat)
        self._missing_logged = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> bool | None:
        """Check once. None: unchanged (or missing); else the reload's success."""
        sig = file_signature(self.path, self._stat)
        if sig is None:
            if not self._missing_logged:
                log.warning("config file %s cannot be read; keeping the running configuration", self.path)
                self._missing_logged = True
            return None
        self._missing_logged = False
        if sig == self._last:
            return None
        self._last = sig
        log.info("config file %s changed; reloading", self.path)
        ok, _message = self.on_change()  # the reload logs its own outcome, once
        return ok

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="config-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # never let the watcher die: the next change must still reload
                log.exception("config watch failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
