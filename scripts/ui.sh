#!/usr/bin/env bash
# The Dagster UI (with the daemon for schedules, automation and freshness) on the state folder's
# recorded Dagster address: DAGSTER_UI_URL when the folder was first used (default
# http://127.0.0.1:3000), where every MLflow run's links back to its Dagster run and asset page point.
# A later DAGSTER_UI_URL (or PORT=…) that differs is reported, not followed (see scripts/env.sh:
# serve_address). Ctrl-C or SIGTERM stops the webserver, the daemon and the code server within
# seconds (`dg dev` alone ignores SIGTERM for over 25 s).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PORT:-}" ] && [ -z "${DAGSTER_UI_URL:-}" ]; then
  export DAGSTER_UI_URL="http://127.0.0.1:$PORT"
fi
requested="${DAGSTER_UI_URL:-}"
bash scripts/setup.sh
source scripts/env.sh
state_init
address=$(serve_address dagster "$requested")
export DAGSTER_UI_URL="$address"
port="${address##*:}"; port="${port%%/*}"
echo "Dagster UI: $address" >&2
# dg dev in a process group of its own; on Ctrl-C, SIGTERM or the script's end the whole group gets
# SIGTERM, then SIGKILL for what is left after STOP_GRACE_S.
setsid "$VENV/bin/dg" dev -h 127.0.0.1 -p "$port" &
dg_pid=$!
stop_dg() {
  trap - INT TERM EXIT
  kill -TERM -- "-$dg_pid" 2>/dev/null || return 0
  for _ in $(seq $((${STOP_GRACE_S:-3} * 10))); do
    kill -0 -- "-$dg_pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL -- "-$dg_pid" 2>/dev/null || true
}
trap 'stop_dg; exit 130' INT
trap 'stop_dg; exit 143' TERM
trap stop_dg EXIT
wait "$dg_pid"
