#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs lint, types and the whole test suite twice: with
# the relay's native core, and with it turned off (GPU_RELAY_NATIVE=0: the pure-Python reference).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k relabel`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"; .venv/bin/ruff check exporter relay telemetry_common tests bench scripts setup.py
echo "== mypy"; .venv/bin/mypy
echo "== pytest (native core)"; .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
echo "== pytest (GPU_RELAY_NATIVE=0: pure-Python reference)"
GPU_RELAY_NATIVE=0 .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
