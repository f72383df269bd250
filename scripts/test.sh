#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs lint, types and the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k relabel`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"; .venv/bin/ruff check exporter relay telemetry_common tests bench scripts
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
