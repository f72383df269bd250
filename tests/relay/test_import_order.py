"""The relay's packages form layers (docs/architecture.md): a package may import its own modules and
lower layers, never a higher one. Every import counts, those under TYPE_CHECKING and inside
functions included, so the rule holds for readers as well as for the interpreter."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

LAYERS = ["native", "proto", "common", "ingest", "rules", "config", "delivery", "state", "control"]
"""Lowest first. relay.native (the C cores' loader) and relay.proto (generated) sit at the bottom."""
RANK = {name: i for i, name in enumerate(LAYERS)}
RANK["proto"] = RANK["native"]


def layer_of(module: str) -> str | None:
    """The relay layer a dotted module name belongs to (None for relay itself and non-relay names)."""
    parts = module.split(".")
    if parts[0] != "relay" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in RANK else None


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, dotted module) for every import in a parsed module of ``package`` (relative ones resolved)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from relay import native` names a module; `from relay.ingest import wire` one in relay.ingest
            found += [(node.lineno, f"{base}.{a.name}" if layer_of(base) is None else base) for a in node.names]
    return found


def violations(source: str, module: str) -> list[str]:
    """What ``source`` (the text of relay module ``module``) imports from a higher layer."""
    own = layer_of(module)
    if own is None:
        return []
    package = module.rsplit(".", 1)[0]
    out = []
    for line, name in imported_modules(ast.parse(source), package):
        target = layer_of(name)
        if target is not None and RANK[target] > RANK[own]:
            out.append(f"{module}:{line}: {own} imports {name} ({target} is a higher layer)")
    return out


def relay_modules() -> list[tuple[str, Path]]:
    root = REPO_ROOT / "relay"
    mods = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(REPO_ROOT).with_suffix("")
        mods.append((".".join(rel.parts), path))  # relay.x.__init__: the package's own text, in its layer
    return mods


def test_every_relay_module_lives_in_a_layer() -> None:
    loose = [m for m, _ in relay_modules() if layer_of(m) is None and m != "relay.__init__"]
    assert loose == [], "modules outside the layered packages: " + ", ".join(loose)


def test_no_relay_module_imports_a_higher_layer() -> None:
    found = [v for m, p in relay_modules() for v in violations(p.read_text(encoding="utf-8"), m)]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(("module", "source", "bad"), [
    ("relay.state.stage", "from relay.control import service\n", True),
    ("relay.state.stage", "from relay.control.service import Runtime\n", True),
    ("relay.ingest.wire", "if TYPE_CHECKING:\n    from relay.state.pipeline import Pipeline\n", True),
    ("relay.rules.relabel", "def f():\n    import relay.config.config\n", True),
    ("relay.delivery.sender", "from ..state import stage\n", True),
    ("relay.delivery.queue.durable", "from ...control import daemon\n", True),
    ("relay.state.stage", "from relay.delivery.queue import durable\nfrom relay import native\n", False),
    ("relay.control.cli", "from relay.state import ruleset\nfrom . import daemon\n", False),
    ("relay.common.labels", "from relay import __version__\n", False),
])
def test_the_check_flags_an_upward_import_in_every_spelling(module: str, source: str, bad: bool) -> None:
    assert bool(violations(source, module)) is bad
