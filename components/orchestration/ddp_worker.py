"""One rank of a data-parallel training launched by a language-model asset: the core's worker
(`components.core.distributed.run_worker`) with Dagster Pipes and MLflow on rank 0.

torchrun starts this module in every rank (`python -m components.orchestration.ddp_worker SPEC`).
Ranks other than 0 only train. Rank 0 opens Dagster Pipes and
- logs the metrics of every log point to the asset's nested MLflow run, whose id and tracking URI
  come in the Pipes extras (`mlflow_run_id`, `mlflow_tracking_uri`), through the same `AssetRun`
  as in-process training: the same names and steps, live while training, kept for a run that dies;
- sends each progress line to the step's log in Dagster (Pipes log);
- reports the materialization at the end: the headline metrics, the world size and backend, and
  the SHA-256 of the checkpoint weights and of train_result.json, which the asset checks before it
  publishes (`language_model.py`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from components.core.artifacts import sha256_file
from components.core.checkpoint import CHECKPOINT_DIR, WEIGHTS_FILE
from components.core.distributed import RESULT_FILE, load_spec, rank_from_env, read_train_result, worker_main

MLFLOW_RUN_ID = "mlflow_run_id"
MLFLOW_TRACKING_URI = "mlflow_tracking_uri"


def materialization_metadata(out_dir: str | Path) -> dict[str, Any]:
    """What rank 0 reports through Pipes: headline numbers and the hashes of the files it wrote."""
    from .tracking import finite_metrics  # (imports dagster: rank 0 only)

    out_dir = Path(out_dir)
    result, extra = read_train_result(out_dir / RESULT_FILE)
    return {
        **finite_metrics(result.metrics()),
        "resumed_from_step": result.resumed_from,
        "world_size": int(extra["world_size"]),
        "backend": str(extra["backend"]),
        "strategy": str(extra["strategy"]),
        "train_result_sha256": sha256_file(out_dir / RESULT_FILE),
        "weights_sha256": sha256_file(out_dir / CHECKPOINT_DIR / WEIGHTS_FILE),
    }


def main(spec_path: str) -> None:
    rank, _, _ = rank_from_env()
    if rank != 0:
        worker_main(spec_path)
        return
    from dagster_pipes import open_dagster_pipes
    from mlflow.tracking import MlflowClient

    from .stage import progress_line
    from .tracking import AssetRun

    with open_dagster_pipes() as pipes:
        run = AssetRun(
            MlflowClient(tracking_uri=pipes.get_extra(MLFLOW_TRACKING_URI)), pipes.get_extra(MLFLOW_RUN_ID), "", ""
        )
        worker_main(
            spec_path,
            log_metrics=run.log_metrics,
            progress=lambda point, step, max_steps, eta_s: pipes.log.info(progress_line(point, step, max_steps, eta_s)),
        )
        pipes.report_asset_materialization(metadata=materialization_metadata(load_spec(spec_path).out_dir))


if __name__ == "__main__":
    main(sys.argv[1])
