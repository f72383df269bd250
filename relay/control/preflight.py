"""What ``gpu-relay check-config`` checks about the machine it runs on, offline.

:class:`MachineProbe` answers :class:`relay.config_parts.Probe`: whether a named AWS profile exists
in the shared config and credentials files (botocore reads them; no network), and whether
``storage.path`` can be created and written (a temporary file or directory, removed at once: the
check leaves nothing behind). check-config reports each problem as a warning with its line, since a
config is often checked on another machine than the one that runs it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import botocore.session


def _botocore_profiles() -> Iterable[str]:
    profiles: Iterable[str] = botocore.session.Session().available_profiles
    return profiles


class MachineProbe:
    """The real machine; ``profiles`` lists the AWS profiles defined here (injected in tests)."""

    def __init__(self, profiles: Callable[[], Iterable[str]] = _botocore_profiles) -> None:
        self._profiles = profiles

    def profile_problem(self, profile: str) -> str | None:
        try:
            known = set(self._profiles())
        except Exception as e:  # a malformed ~/.aws/config: botocore raises its own errors
            return f'cannot read the AWS config files to look for profile "{profile}": {e}'
        if profile in known:
            return None
        where = os.environ.get("AWS_CONFIG_FILE", "~/.aws/config")
        creds = os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")
        return f'profile "{profile}" is not defined in {where} or {creds}'

    def storage_problem(self, path: Path) -> str | None:
        return storage_problem(path)


def storage_problem(path: Path) -> str | None:
    """Why the relay could not create or write ``path`` here, or None; leaves nothing behind."""
    target = Path(path)
    if target.exists():
        if not target.is_dir():
            return f"{target} exists and is not a directory"
        try:
            fd, name = tempfile.mkstemp(prefix=".gpu-relay-check-", dir=target)
            os.close(fd)
            os.unlink(name)
        except OSError as e:
            return f"cannot write in {target}: {e.strerror or e}"
        return None
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot create {target}: {parent} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".gpu-relay-check-", dir=parent))
    except OSError as e:
        return f"cannot create {target}: {parent} is not writable ({e.strerror or e})"
    return None
