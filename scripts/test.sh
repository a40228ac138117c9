#!/usr/bin/env bash
# Set up (once) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_test_deps.sh  # PostgreSQL and Chromium from apt, when missing
bash scripts/setup.sh
VENV=${VENV:-.venv}
# The pruned bitsandbytes that travels to a lent GPU (from the registry, ~5 MB kept): its test runs here too.
[ -d .gpu_carry/site/bitsandbytes ] || PYTHON="$VENV/bin/python" bash scripts/gpu_carry.sh
# Lint and types first (rules in pyproject.toml's [tool.ruff] and [tool.pyright]): an error fails the test
# command before pytest runs.
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
# Types (basic mode, [tool.pyright] in pyproject.toml), against the venv's packages.
"$VENV/bin/pyright" --pythonpath "$VENV/bin/python"
# pytest exits 5 when it collects no test: that is a failure here, like any non-zero code.
exec "$VENV/bin/python" -m pytest -q "$@"
