"""dcgm-exporter's collectors CSV: ``FIELD, type, help`` rows, parsed the way dcgm-exporter does.

Rules (``internal/pkg/counters/counter_config.go``): lines starting with ``#`` are comments,
blank lines are skipped, a row has exactly 3 comma-separated fields (CSV quoting allowed, so a
quoted help may contain commas), surrounding spaces are trimmed, the type is ``gauge``,
``counter`` or ``label``, and an unknown field name is fatal.

Names: a row may name a DCGM field, a deprecated alias (``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``) or a
dcgm-exporter 1.x name (``dcgm_sm_clock``, etc/1.x-compatibility-metrics.csv): the series is exported
under the name the row lists and read from the field it resolves to (``CounterSpec.read_as``), as
go-dcgm's ``GetFieldID`` does for dcgm-exporter 4.8.2. A name listed twice (the 1.x file lists
``dcgm_fi_prof_pcie_tx_bytes`` twice) is accepted as dcgm-exporter accepts it: one warning naming
both lines, the first row kept, so the series is exported once.

Default file: dcgm-exporter's ``/etc/dcgm-exporter/default-counters.csv`` when it exists (the image
ships dcgm-exporter 4.8.2's three CSVs there, ``exporter/data/dcgm-exporter.*.csv``), else the
built-in set. A file whose text is one of those shipped CSVs is treated as built-in by
``filter_supported`` (absent non-PROF rows are one INFO line, not a warning at every start).
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources

from exporter.fields import KINDS, canonical

DEFAULT_RESOURCE = "default-counters.csv"
DCGM_DEFAULT_PATH = "/etc/dcgm-exporter/default-counters.csv"
# dcgm-exporter 4.8.2's etc/*.csv as shipped in exporter/data/ (the Dockerfile copies them to /etc/dcgm-exporter/)
SHIPPED_CSVS = ("default-counters.csv", "dcp-metrics-included.csv", "1.x-compatibility-metrics.csv")

log = logging.getLogger("exporter.counters")


@dataclass(frozen=True, slots=True)
class CounterSpec:
    field: str  # the name as listed: the exported series name (a DCGM field, an alias or a 1.x name)
    kind: str  # gauge | counter | label (the CSV's choice, which may differ from the field's usual kind)
    help: str
    line: int  # 1-based line in the source file
    builtin: bool = False  # from the built-in default set, not a user's file
    source: str = ""  # the DCGM field read for it when the name is an alias or a 1.x name

    @property
    def read_as(self) -> str:
        """The field the backend reads for this row (its own name unless an alias or 1.x name)."""
        return self.source or self.field


class CountersError(ValueError):
    """A bad collectors file; ``str`` reads ``counters.csv:12: unknown field 'DCGM_FI_DEV_FOO'``."""

    def __init__(self, source: str, line: int, message: str) -> None:
        super().__init__(f"{source}:{line}: {message}")
        self.source = source
        self.line = line
        self.message = message


def _split_row(text: str) -> list[str]:
    rows = list(csv.reader([text], skipinitialspace=True, strict=True))
    return [cell.strip() for cell in rows[0]] if rows else []


def parse_counters(text: str, source: str = "<default>") -> list[CounterSpec]:
    """Parse a collectors CSV. Raises ``CountersError`` naming the source and line; a duplicate
    name is warned once (both lines named) and kept once."""
    specs: list[CounterSpec] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            cells = _split_row(stripped)
        except csv.Error as exc:
            raise CountersError(source, number, f"malformed CSV row ({exc}): {stripped!r}") from None
        if len(cells) != 3:
            raise CountersError(
                source, number, f"expected 3 fields (FIELD, type, help), got {len(cells)}: {stripped!r}"
            )
        name, kind, help_ = cells
        field = canonical(name)
        if field is None:
            raise CountersError(source, number, f"unknown field {name!r}")
        if kind not in KINDS:
            raise CountersError(
                source, number, f"field {name!r}: unknown type {kind!r} (want gauge, counter or label)"
            )
        if name in seen:
            log.warning("%s:%d: field %s is listed again (first on line %d); exporting it once, as on line %d",
                        source, number, name, seen[name], seen[name])
            continue
        seen[name] = number
        specs.append(CounterSpec(name, kind, help_, number, source="" if field == name else field))
    return specs


def shipped_text(name: str) -> str:
    """One of dcgm-exporter 4.8.2's CSVs as shipped (``SHIPPED_CSVS``)."""
    return resources.files("exporter").joinpath("data", f"dcgm-exporter.{name}").read_text(encoding="utf-8")


def default_path() -> str | None:
    """``-f``'s default: dcgm-exporter's default path when it exists, else None (the built-in set)."""
    return DCGM_DEFAULT_PATH if os.path.isfile(DCGM_DEFAULT_PATH) else None


def default_text() -> str:
    """The built-in default collectors CSV (dcgm-exporter 4.8.2's default set)."""
    return resources.files("exporter").joinpath("data", DEFAULT_RESOURCE).read_text(encoding="utf-8")


def load_counters(path: str | None) -> list[CounterSpec]:
    """The collectors from ``path``, or the built-in default when ``path`` is None.

    A file that cannot be read raises ``CountersError`` (line 0) with the OS reason."""
    if path is None:
        return [replace(s, builtin=True) for s in parse_counters(default_text(), "<default>")]
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CountersError(path, 0, f"cannot read collectors file: {exc}") from None
    specs = parse_counters(text, path)
    if any(text == shipped_text(name) for name in SHIPPED_CSVS):
        specs = [replace(s, builtin=True) for s in specs]
    return specs


def filter_supported(
    specs: Sequence[CounterSpec], supported: set[str], log: logging.Logger
) -> list[CounterSpec]:
    """Drop rows the GPUs cannot report, warning once per row like dcgm-exporter does.

    Rows of the built-in default set that this node cannot report (e.g. NVLink bandwidth on a PCIe
    GPU) are dropped with one INFO line instead: they are ours, not the user's, and would warn at
    every start. PROF rows keep dcgm-exporter's "Skipping line" warning everywhere (profiling
    refused or absent is worth saying). Label rows always pass (they become labels; a missing value
    renders as an empty label)."""
    kept: list[CounterSpec] = []
    quiet: list[str] = []
    for spec in specs:
        if spec.kind == "label" or spec.read_as in supported:
            kept.append(spec)
        elif spec.builtin and not spec.field.startswith("DCGM_FI_PROF_"):
            quiet.append(spec.field)
        else:
            log.warning("Skipping line %d ('%s'): metric not enabled", spec.line, spec.field)
    if quiet:
        log.info("default counters not available on this node, not exported: %s", ", ".join(quiet))
    return kept
