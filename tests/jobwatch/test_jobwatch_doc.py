"""docs/jobwatch.md stays true: its config example loads, and every flag of gpu-jobwatch is in its table."""

from __future__ import annotations

import re
from pathlib import Path

from jobwatch.config import load_file, parser
from tests.helpers import REPO_ROOT

DOC = (REPO_ROOT / "docs" / "jobwatch.md").read_text(encoding="utf-8")


def test_the_docs_prices_example_loads_and_prices_a_p5_gpu_hour(tmp_path: Path) -> None:
    (example,) = re.findall(r"```yaml\n(.*?)```", DOC, re.S)
    path = tmp_path / "jobwatch.yaml"
    path.write_text(example)
    cfg = load_file(str(path))
    assert cfg.prices.price_for({"node.kubernetes.io/instance-type": "p5.48xlarge"}) == 6.88
    assert cfg.prices.price_for({"node.kubernetes.io/instance-type": "g5.xlarge"}) == 4.0


def test_every_flag_is_in_the_docs_table() -> None:
    flags = {o for a in parser()._actions for o in a.option_strings if o.startswith("--")}
    flags -= {"--help", "--version"}
    missing = sorted(f for f in flags if f"`{f}`" not in DOC)
    assert flags and missing == []
