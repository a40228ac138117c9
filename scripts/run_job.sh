#!/usr/bin/env bash
# Set up, then run one job of the code location by name, as the UI would list it: the jobs off the
# default route (`scaling`, `tune`, `<config>_scaling`) after a default run has made their inputs.
#   bash scripts/run_job.sh scaling        # each family at growing FLOP budgets (about an hour on 2 cores)
#   bash scripts/run_job.sh tune           # the learning-rate and batch sweep
# State, concurrency and the exit status as in scripts/run_pipeline.sh (2: no such job).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: bash scripts/run_job.sh JOB   (e.g. scaling, tune)" >&2; exit 2; }
bash scripts/setup.sh
source scripts/env.sh
state_init
"$VENV/bin/python" -m pipelines.launch "$1"
echo "Done. Dagster UI: bash scripts/ui.sh   MLflow UI: bash scripts/mlflow_ui.sh   (state in $PIPELINE_STATE_DIR)"
