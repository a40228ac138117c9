#!/usr/bin/env bash
# Free disk in the state folder: keep the newest N run folders per asset (default 3) plus each
# asset's latest materialization; delete the Dagster runs (event logs, compute logs) and MLflow runs
# (artifacts, via mlflow gc) that hold nothing kept any more; remove leftovers of dead processes,
# stale lock files and checkpoints untouched for 7 days. Prints a JSON report (bytes_freed,
# bytes_freed_by store). Extra arguments go to the CLI, e.g. --dry-run.
#   bash scripts/prune.sh            # keep 3
#   bash scripts/prune.sh 1 --dry-run
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
keep=${1:-${PIPELINE_KEEP_LAST:-3}}
shift || true
exec "$VENV/bin/python" -m pipelines.maintenance prune --keep "$keep" "$@"
