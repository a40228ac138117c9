# Sourced by the scripts: one state folder for the Dagster instance, MLflow and asset files.
export PIPELINE_STATE_DIR="${PIPELINE_STATE_DIR:-$(pwd)/.state}"
export DAGSTER_HOME="${DAGSTER_HOME:-$PIPELINE_STATE_DIR/dagster}"
mkdir -p "$DAGSTER_HOME"
[ -f "$DAGSTER_HOME/dagster.yaml" ] || : > "$DAGSTER_HOME/dagster.yaml"
