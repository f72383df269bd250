"""Structural stand-ins for the exporter's CSV rows and pod owners, shared by render and collector tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Spec:
    field: str
    kind: str
    help: str


@dataclass(frozen=True)
class Pod:
    pod: str
    namespace: str
    container: str
