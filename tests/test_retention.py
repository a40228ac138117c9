"""Retention over the whole state folder: run folders, Dagster run history, MLflow runs and their
artifacts, lease folders and lock files, over repeated real runs of a few assets of configs/tiny.yaml
against a persistent SQLite instance and MLflow store."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest

from cli import TINY

SELECTION = ["corpus", "tokenizer", "labels"]


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@pytest.fixture
def state(tmp_path, monkeypatch):
    from components.orchestration.state import ensure_stores

    state = tmp_path / "state"
    monkeypatch.setenv("PIPELINE_STATE_DIR", str(state))
    monkeypatch.setenv("DAGSTER_HOME", str(state / "dagster"))
    monkeypatch.setenv("PIPELINE_KEEP_LAST", "1")
    ensure_stores()
    return state


def run_once(instance) -> str:
    from pipelines.definitions import defs

    cfg = {**TINY, "ops": {k: v for k, v in TINY["ops"].items() if k in SELECTION}}
    result = dg.materialize(
        list(defs.assets), resources=defs.resources, run_config=cfg, selection=SELECTION, instance=instance, raise_on_error=False,
    )
    assert result.success
    return result.run_id


def test_the_state_folder_stays_bounded_over_repeated_runs(state):
    """Keeping one materialization per asset, the state folder (Dagster history, MLflow runs and
    artifacts, run folders) is no bigger after the fifth run than after the second; what the latest
    run holds is all there; prune reports what it freed by kind."""
    from mlflow.tracking import MlflowClient

    from components.orchestration.recovery import prune
    from components.orchestration.state import local_tracking_uri

    instance = dg.DagsterInstance.get()
    try:
        sizes, runs, reports = [], [], []
        for _ in range(5):
            runs.append(run_once(instance))
            reports.append(prune(1, instance))
            sizes.append({p.name: tree_bytes(p) for p in state.iterdir() if p.is_dir()} | {"total": tree_bytes(state)})
        print(sizes)
        assert sizes[-1]["total"] <= sizes[1]["total"] * 1.05, sizes
        for part in ("dagster", "mlflow", "artifacts"):
            assert sizes[-1][part] <= sizes[1][part] * 1.05 + 64 * 1024, (part, sizes)
        # Only the runs still referenced are left: the latest (holding every asset's latest materialization).
        left = {r.dagster_run.run_id for r in instance.get_run_records()}
        assert left == {runs[-1]}, (left, runs)
        for key in SELECTION:
            assert instance.get_latest_materialization_event(dg.AssetKey(key)).run_id == runs[-1]
        client = MlflowClient(tracking_uri=local_tracking_uri())
        tagged = {r.data.tags.get("dagster.run_id") for r in client.search_runs(
            [e.experiment_id for e in client.search_experiments()], max_results=1000)}
        assert tagged == {runs[-1]}
        freed = reports[-1]
        assert freed["dagster_runs_deleted"] and freed["mlflow_runs_deleted"] and freed["bytes_freed"] > 0
        assert set(freed["bytes_freed_by"]) >= {"artifacts", "dagster", "mlflow"}
    finally:
        instance.dispose()
