#!/usr/bin/env bash
# An MLflow tracking server whose runs, metrics and registered models live in PostgreSQL and whose
# artifacts it stores and serves itself (clients upload through it: no shared disk, no cloud
# credentials on the machines that train). Point the pipeline at it with
#   export MLFLOW_TRACKING_URI=http://HOST:PORT
# Settings (environment; the password never goes on a command line):
#   MLFLOW_PG_HOST (127.0.0.1), MLFLOW_PG_PORT (5432), MLFLOW_PG_DB (mlflow; it must exist),
#   MLFLOW_PG_USER (required), MLFLOW_PG_PASSWORD (or PGPASSWORD, or ~/.pgpass),
#   MLFLOW_ARTIFACTS_DESTINATION (default <state>/mlflow/server-artifacts; s3://, gs://... work with
#     their client library installed on the server), MLFLOW_HOST (127.0.0.1; 0.0.0.0 to serve a
#     cluster), MLFLOW_PORT (5000), MLFLOW_WORKERS (2).
# Further arguments go to `mlflow server` (e.g. --allowed-hosts mlflow.internal:5000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
: "${MLFLOW_PG_USER:?set MLFLOW_PG_USER (and MLFLOW_PG_HOST, MLFLOW_PG_PORT, MLFLOW_PG_DB, MLFLOW_PG_PASSWORD)}"
[ -n "${MLFLOW_PG_PASSWORD:-}" ] && export PGPASSWORD="$MLFLOW_PG_PASSWORD"  # libpq reads it
# psycopg2 named: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, which is not installed.
uri="postgresql+psycopg2://${MLFLOW_PG_USER}@${MLFLOW_PG_HOST:-127.0.0.1}:${MLFLOW_PG_PORT:-5432}/${MLFLOW_PG_DB:-mlflow}"
artifacts="${MLFLOW_ARTIFACTS_DESTINATION:-$PIPELINE_STATE_DIR/mlflow/server-artifacts}"
# One quick connection first: `mlflow server` itself retries for about two minutes, then prints a
# traceback that names no setting.
"$VENV/bin/python" -c '
import sys
from components.orchestration.services import StoreUnreachable, check_database
try:
    check_database(sys.argv[1], "The MLflow server database (PostgreSQL)",
                   "settings MLFLOW_PG_HOST, MLFLOW_PG_PORT, MLFLOW_PG_DB, MLFLOW_PG_USER, MLFLOW_PG_PASSWORD")
except StoreUnreachable as e:
    sys.exit(f"error: {e}")
' "$uri"
case "$artifacts" in *://*) ;; *) mkdir -p "$artifacts" ;; esac
# No GenAI job-runner processes (unused here), as scripts/mlflow_ui.sh.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
exec "$VENV/bin/mlflow" server --backend-store-uri "$uri" --artifacts-destination "$artifacts" \
  --host "${MLFLOW_HOST:-127.0.0.1}" --port "${MLFLOW_PORT:-5000}" --workers "${MLFLOW_WORKERS:-2}" "$@"
