"""HPC job mapping (``--hpc-job-mapping-dir``), as dcgm-exporter 4.8.2's hpcMapper reads it.

The directory holds one file per GPU, named by its GPU id (``0``, ``1``) or, for a MIG GPU
instance, ``<gpu>.<GPU instance id>`` (``2.0``); each line of a file is one job id (Slurm's prolog
writes them). Every series of that GPU is repeated once per job with an ``hpc_job`` attribute; a
GPU without a file (or with an empty one) keeps its series as they are. Other names and
directories are ignored. The directory is read every collection cycle (dcgm-exporter: every
scrape). A directory missing at start is logged once (ERROR, as dcgm-exporter does) and then
silently waited for; one that disappears later is logged once until it is back; an unreadable file
is logged once per file and skipped.
"""

from __future__ import annotations

import logging
import os
import re

log = logging.getLogger("exporter.hpc")
_GPU_FILE = re.compile(r"^\d+(\.\d+)?$")
MAX_FILE_BYTES = 1 << 20  # a mapping file larger than this is not a job list


class HpcJobMap:
    """``read()`` -> {"<gpu>[.<gi>]": [job, ...]}; never raises."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._missing = False
        self._bad: set[str] = set()
        log.info("HPC job mapping is enabled and watches the %r directory", directory)
        if not os.path.isdir(directory):
            self._missing = True
            log.error("HPC job mapping file directory %r not found at start; waiting for it", directory)

    def read(self) -> dict[str, list[str]]:
        try:
            entries = list(os.scandir(self.directory))
        except OSError as exc:
            if not self._missing:
                self._missing = True
                log.error("HPC job mapping directory %r cannot be read, series carry no hpc_job: %s",
                          self.directory, exc)
            return {}
        if self._missing:
            self._missing = False
            log.info("HPC job mapping directory %r is readable", self.directory)
        out: dict[str, list[str]] = {}
        for entry in entries:
            if not _GPU_FILE.match(entry.name) or not entry.is_file():
                continue
            jobs = self._jobs(entry.path)
            if jobs:
                out[entry.name] = jobs
        return out

    def _jobs(self, path: str) -> list[str]:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            if path not in self._bad:
                self._bad.add(path)
                log.warning("HPC job mapping file %r cannot be read, skipped: %s", path, exc)
            return []
        if len(text) > MAX_FILE_BYTES:
            if path not in self._bad:
                self._bad.add(path)
                log.warning("HPC job mapping file %r is over %d bytes, skipped", path, MAX_FILE_BYTES)
            return []
        self._bad.discard(path)
        return [line.strip() for line in text.splitlines() if line.strip()]
