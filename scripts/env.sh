# Sourced by the scripts: one state folder for the Dagster instance, MLflow and asset files.
export PIPELINE_STATE_DIR="${PIPELINE_STATE_DIR:-$(pwd)/.state}"
export DAGSTER_HOME="${DAGSTER_HOME:-$PIPELINE_STATE_DIR/dagster}"
mkdir -p "$DAGSTER_HOME"
export VENV="${VENV:-.venv}"
# Where the MLflow UI is: scripts/mlflow_ui.sh listens on its port, and every asset's `mlflow_url`
# link (resource MlflowTracker) points there. Set it once for both, e.g. http://127.0.0.1:5050.
# With MLFLOW_TRACKING_URI at a server (scripts/mlflow_server_pg.sh), the links default to it.
case "${MLFLOW_TRACKING_URI:-}" in
  http://*|https://*) export MLFLOW_UI_URL="${MLFLOW_UI_URL:-$MLFLOW_TRACKING_URI}" ;;
  *) export MLFLOW_UI_URL="${MLFLOW_UI_URL:-http://127.0.0.1:5000}" ;;
esac
# Where the Dagster UI is: scripts/ui.sh listens on its port, and every MLflow run's links back to its
# Dagster run and asset page (tags dagster.run_url, dagster.asset_url) point there.
export DAGSTER_UI_URL="${DAGSTER_UI_URL:-http://127.0.0.1:3000}"
# Create the Dagster and MLflow stores (and dagster.yaml, when missing or empty) exactly once, under
# a lock, whoever starts first; a no-op (≈30 ms) once done. Then mark runs whose processes are gone
# as failed (frees their pool slots, which a new run's training step would otherwise wait for).
# Call after scripts/setup.sh.
state_init() {
  "$VENV/bin/python" -m pipelines.maintenance init > /dev/null
}
