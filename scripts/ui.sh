#!/usr/bin/env bash
# The Dagster UI (with the daemon for schedules and automation) on http://127.0.0.1:3000
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
state_init
exec "$VENV/bin/dg" dev -h 127.0.0.1 -p "${PORT:-3000}"
