#!/usr/bin/env bash
# The MLflow UI over the pipeline's tracking DB on $MLFLOW_UI_URL (default http://127.0.0.1:5000;
# the port is taken from it, so the links in Dagster's metadata and this server agree).
# Two uvicorn workers (MLFLOW_WORKERS) and no job-runner processes (the GenAI job runner, unused
# here): 5 processes and ≈0.8 GiB instead of 15 and ≈3 GiB with mlflow 3.17's defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
state_init
port="${MLFLOW_UI_URL##*:}"; port="${port%%/*}"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
exec "$VENV/bin/mlflow" ui --backend-store-uri "sqlite:///$PIPELINE_STATE_DIR/mlflow/mlflow.db" \
  --default-artifact-root "$PIPELINE_STATE_DIR/mlflow/artifacts" --host 127.0.0.1 --port "$port" \
  --workers "${MLFLOW_WORKERS:-2}"
