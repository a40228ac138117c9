# Sourced by the scripts: one state folder for the Dagster instance, MLflow and asset files.
export PIPELINE_STATE_DIR="${PIPELINE_STATE_DIR:-$(pwd)/.state}"
export DAGSTER_HOME="${DAGSTER_HOME:-$PIPELINE_STATE_DIR/dagster}"
mkdir -p "$DAGSTER_HOME"
export VENV="${VENV:-.venv}"
# The scripts run the venv's own executables; say which venv that is, as its activation would. `dg`
# (scripts/ui.sh) otherwise warns on every start that "the active virtual environment does not match"
# the project's .venv, about nothing the user did or can change.
if [ -d "$VENV" ]; then
  export VIRTUAL_ENV="$(cd "$VENV" && pwd)"
fi
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
# init also records the UI addresses on the folder's first use (from DAGSTER_UI_URL and MLFLOW_UI_URL);
# every link a run records points there (see serve_address).
state_init() {
  "$VENV/bin/python" -m pipelines.maintenance init > /dev/null
}
# serve_address dagster|mlflow REQUESTED: print the address that UI must serve on, the state folder's
# recorded one, so that the links earlier runs recorded keep working; say so on stderr when REQUESTED
# (what DAGSTER_UI_URL / MLFLOW_UI_URL asked for, may be empty) differs, and fail with what to do when
# its port is taken by something else. Call after state_init.
serve_address() {
  local name=$1 requested=${2%/} recorded port label
  label=$([ "$name" = dagster ] && echo "Dagster UI" || echo "MLflow UI")
  recorded=$("$VENV/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' \
    "$PIPELINE_STATE_DIR/ui_addresses.json" "$name")
  if [ -n "$requested" ] && [ "$requested" != "$recorded" ]; then
    echo "note: the runs recorded in $PIPELINE_STATE_DIR link to the $label at $recorded: serving there, not at $requested." >&2
    echo "      (to move it: $VENV/bin/python -m pipelines.maintenance addresses --$name $requested; links recorded so far keep $recorded)" >&2
  fi
  port="${recorded##*:}"; port="${port%%/*}"
  if ! "$VENV/bin/python" -c 'import socket, sys; s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then
    echo "error: port $port of $recorded, where the runs in $PIPELINE_STATE_DIR link to the $label, is taken." >&2
    echo "       Free it, or move the address (links recorded so far keep $recorded):" >&2
    echo "       $VENV/bin/python -m pipelines.maintenance addresses --$name http://127.0.0.1:<free port>" >&2
    return 1
  fi
  echo "$recorded"
}
