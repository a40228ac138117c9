#!/usr/bin/env bash
# Create .venv (or the folder in $VENV) and install the project with its dev tools, once;
# re-installs only when pyproject.toml changes. Scripts started at once wait for each other here
# (a lock in the venv folder) instead of installing into the same venv twice.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
[ -f "$stamp" ] && [ -x "$VENV/bin/python" ] && exit 0
mkdir -p "$VENV"
exec 9> "$VENV/.setup.lock"
flock 9
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if [ ! -f "$stamp" ]; then
  "$VENV/bin/pip" install -q --upgrade pip
  # torch first and pinned: on a CPU machine this is the CPU build (the project accepts 2.6-2.14).
  "$VENV/bin/pip" install -q "torch==2.13.0"
  "$VENV/bin/pip" install -q -e ".[dev,deploy]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
