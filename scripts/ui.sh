#!/usr/bin/env bash
# The Dagster UI (with the daemon for schedules, automation and freshness) on $DAGSTER_UI_URL
# (default http://127.0.0.1:3000; the port is taken from it, so the links that MLflow runs carry back
# to their Dagster run and asset pages and this server agree). PORT=… still works when
# DAGSTER_UI_URL is unset.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PORT:-}" ] && [ -z "${DAGSTER_UI_URL:-}" ]; then
  export DAGSTER_UI_URL="http://127.0.0.1:$PORT"
fi
bash scripts/setup.sh
source scripts/env.sh
state_init
port="${DAGSTER_UI_URL##*:}"; port="${port%%/*}"
exec "$VENV/bin/dg" dev -h 127.0.0.1 -p "$port"
