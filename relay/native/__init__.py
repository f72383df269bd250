"""Which native (C) parts of the relay are in use, and the switch that turns them all off.

Every hot loop has a pure-Python reference implementation; its C twin (``relay/native/<name>.c``,
the extension ``relay.native._<name>``) gives the same results, errors included (tests/test_native_*.py
compare them). ``GPU_RELAY_NATIVE=0`` (or false/no/off) makes every ``load`` answer None, so the
whole relay runs the reference code; so does a checkout where the extensions were not built.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

log = logging.getLogger("relay.native")

ENV = "GPU_RELAY_NATIVE"
# the extensions the relay's hot paths use (relay/native/<name>.c)
MODULES = ("cwire", "cdcache", "crw2", "cstage", "csnappy")
_OFF = {"0", "false", "no", "off"}
_missing: dict[str, str] = {}


def disabled() -> bool:
    """True when GPU_RELAY_NATIVE turns the native parts off."""
    return os.environ.get(ENV, "").strip().lower() in _OFF


def load(name: str) -> ModuleType | None:
    """The extension ``relay.native._<name>``, or None (disabled, or not built: the reason is kept)."""
    if disabled():
        return None
    try:
        return importlib.import_module(f"relay.native._{name}")
    except ImportError as e:
        _missing[name] = str(e)
        return None


def status() -> tuple[bool, str]:
    """(every native part in use, a sentence saying which are not and why)."""
    if disabled():
        return False, f"{ENV}={os.environ.get(ENV)} turns the native per-series core off"
    absent = [n for n in MODULES if load(n) is None]
    if not absent:
        return True, "native per-series core in use"
    why = "; ".join(f"relay.native._{n}: {_missing.get(n, 'not built')}" for n in absent)
    return False, (f"native per-series core not built ({why}); running the pure-Python reference, several "
                   "times slower: run `bash scripts/setup.sh` (needs gcc and python3-dev)")


def warn_if_python() -> bool:
    """One WARNING at start when the relay runs without its native core; True when native."""
    native, why = status()
    if not native:
        log.warning("%s", why)
    return native
