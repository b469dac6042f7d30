#!/usr/bin/env bash
# The whole check: generated code in sync with protos/, lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
PYTHON=.venv/bin/python scripts/check_protos.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
