"""docs/nvidia-helm-chart.md's recipe for ``--hostname-label hostname`` (issue 21 point 11): the
rules in deploy/monitoring/rules/ join on ``Hostname``; renamed as the doc says (its sed line,
``\\bHostname\\b`` -> ``hostname``), they load in promtool and pass the waste cases whose alerts name
the node, fed series labelled ``hostname``; left as they are, the same cases fail (the joins find
nothing), which is why the doc asks for the rename."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import waste_cases
from tests.helpers import REPO_ROOT, require_binary

RULES = REPO_ROOT / "deploy" / "monitoring" / "rules"
DOC = REPO_ROOT / "docs" / "nvidia-helm-chart.md"
# the cases whose alerts carry the node label: a hung rank's pod and node, a finished job holding its
# GPUs, and the dollars (the node price joined by label_replace(..., "Hostname", ...))
CASES = ("one hung rank of 16", "a finished job sleeping", "dollars for a p5")


def doc_rename() -> tuple[str, str]:
    """The doc's sed expression: (pattern, replacement)."""
    (line,) = [ln for ln in DOC.read_text().splitlines() if "sed -i" in ln]
    m = re.search(r"'s/(.+?)/(.+?)/g'", line)
    assert m is not None, line
    return m.group(1), m.group(2)


def rename(text: str) -> str:
    pattern, replacement = doc_rename()
    return re.sub(pattern, replacement, text)


def run_cases(tmp_path: Path, rename_rules: bool) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    spec: dict[str, Any] = yaml.safe_load(waste_cases.TEST_FILE.read_text())
    spec["tests"] = [t for t in spec["tests"] if t["name"].startswith(CASES)]
    assert len(spec["tests"]) == len(CASES)
    names = [Path(p).name for p in spec["rule_files"]]
    for name in names:
        text = (RULES / name).read_text()
        (tmp_path / name).write_text(rename(text) if rename_rules else text)
    spec["rule_files"] = names
    (tmp_path / "hostname.test.yaml").write_text(rename(yaml.safe_dump(spec, sort_keys=False)))
    return subprocess.run([promtool, "test", "rules", "hostname.test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)


def test_the_doc_renames_the_label_and_nothing_else() -> None:
    assert doc_rename() == (r"\bHostname\b", "hostname")
    for path in RULES.glob("*.rules.yaml"):
        renamed = rename(path.read_text())
        assert "Hostname" not in renamed and "hostname" in renamed
        assert renamed.replace("hostname", "Hostname") == path.read_text()  # no other word touched


@pytest.mark.parametrize("name", sorted(p.name for p in RULES.glob("*.rules.yaml")))
def test_renamed_rules_load_in_promtool(tmp_path: Path, name: str) -> None:
    promtool = require_binary("promtool")
    (tmp_path / name).write_text(rename((RULES / name).read_text()))
    out = subprocess.run([promtool, "check", "rules", str(tmp_path / name)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_renamed_rules_pass_the_node_naming_waste_cases_on_hostname_series(tmp_path: Path) -> None:
    out = run_cases(tmp_path, rename_rules=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "SUCCESS" in out.stdout


def test_rules_left_unrenamed_miss_those_cases_on_hostname_series(tmp_path: Path) -> None:
    out = run_cases(tmp_path, rename_rules=False)
    assert out.returncode != 0
    assert "FAILED" in out.stdout + out.stderr
