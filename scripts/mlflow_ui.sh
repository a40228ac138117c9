#!/usr/bin/env bash
# The MLflow UI over the pipeline's tracking DB on the state folder's recorded MLflow address:
# MLFLOW_UI_URL when the folder was first used (default http://127.0.0.1:5000), where every link in
# Dagster's metadata, the registry and report.html points. A later MLFLOW_UI_URL that differs is
# reported, not followed (see scripts/env.sh: serve_address).
# Two uvicorn workers (MLFLOW_WORKERS) and no job-runner processes (the GenAI job runner, unused
# here): 5 processes and ≈0.8 GiB instead of 15 and ≈3 GiB with mlflow 3.17's defaults.
# Telemetry off (MLflow's own setting and DO_NOT_TRACK): no usage reports, no telemetry notice in the UI.
set -euo pipefail
cd "$(dirname "$0")/.."
requested="${MLFLOW_UI_URL:-}"
bash scripts/setup.sh
source scripts/env.sh
state_init
address=$(serve_address mlflow "$requested")
port="${address##*:}"; port="${port%%/*}"
echo "MLflow UI: $address" >&2
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
export MLFLOW_DISABLE_TELEMETRY="${MLFLOW_DISABLE_TELEMETRY:-true}" DO_NOT_TRACK="${DO_NOT_TRACK:-true}"
exec "$VENV/bin/mlflow" ui --backend-store-uri "sqlite:///$PIPELINE_STATE_DIR/mlflow/mlflow.db" \
  --default-artifact-root "$PIPELINE_STATE_DIR/mlflow/artifacts" --host 127.0.0.1 --port "$port" \
  --workers "${MLFLOW_WORKERS:-2}"
