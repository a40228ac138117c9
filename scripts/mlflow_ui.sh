#!/usr/bin/env bash
# The MLflow UI over the pipeline's tracking DB on http://127.0.0.1:5000
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mkdir -p "$PIPELINE_STATE_DIR/mlflow"
exec .venv/bin/mlflow ui --backend-store-uri "sqlite:///$PIPELINE_STATE_DIR/mlflow/mlflow.db" \
  --default-artifact-root "$PIPELINE_STATE_DIR/mlflow/artifacts" --host 127.0.0.1 --port "${PORT:-5000}"
