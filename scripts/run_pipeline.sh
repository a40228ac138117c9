#!/usr/bin/env bash
# Set up, then materialize the whole asset graph with one config from configs/ (default: default).
#   bash scripts/run_pipeline.sh            # configs/default.yaml
#   bash scripts/run_pipeline.sh tiny       # configs/tiny.yaml
# Runs started at once (two of these, or this and the UI) share the state safely: the stores are
# created once under a lock, and the training steps take turns (Dagster pool `training`, limit 1).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-default}
[ -f "configs/$config.yaml" ] || { echo "no such config: configs/$config.yaml (have: $(ls configs | sed 's/\.yaml//' | tr '\n' ' '))" >&2; exit 2; }
bash scripts/setup.sh
source scripts/env.sh
state_init
# The file is checked first (--check-config, in the launch's own process): a bad key or value is one
# line naming it, not Dagster's traceback at launch, and no run is created.
# The run is created from the code location the UI loads (wordvec_to_transformer) and executes here,
# so the Dagster UI lists it under its job (`dg launch` records no code location: "Manually launched").
"$VENV/bin/python" -m pipelines.launch --check-config "$config" "${config}_pipeline"
echo "Done. Dagster UI: bash scripts/ui.sh   MLflow UI: bash scripts/mlflow_ui.sh   (state in $PIPELINE_STATE_DIR)"
