"""Retention over the whole state folder: run folders, Dagster run history, MLflow runs and their
artifacts, lease folders and lock files, over repeated real runs of a few assets of configs/tiny.yaml
against a persistent SQLite instance and MLflow store."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from cli import TINY

SELECTION = ["corpus", "tokenizer"]


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
        list(defs.assets),
        resources=defs.resources,
        run_config=cfg,
        selection=SELECTION,
        instance=instance,
        raise_on_error=False,
    )
    assert result.success
    return result.run_id


@pytest.mark.slow
def test_the_state_folder_stays_bounded_over_repeated_runs(state):
    """Keeping one materialization per asset, the state folder (Dagster history, MLflow runs and
    artifacts, run folders) is no bigger after the fourth run than after the second; what the latest
    run holds is all there, as is a run that has not ended and the MLflow run behind a registered
    model version (with its artifacts); prune reports what it freed per store."""
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
    from mlflow.tracking import MlflowClient

    from components.orchestration.retention import prune
    from components.orchestration.state import local_tracking_uri

    instance = dg.DagsterInstance.get()
    client = MlflowClient(tracking_uri=local_tracking_uri())
    experiments = lambda: [e.experiment_id for e in client.search_experiments()]  # noqa: E731
    try:
        sizes, runs, reports = [], [], []
        for i in range(4):
            runs.append(run_once(instance))
            if i == 0:
                # A live run (started, not ended), and a model version registered from the first run's MLflow run.
                live = instance.add_run(
                    DagsterRun(
                        job_name="live_job",
                        run_id="0" * 8 + "-0000-4000-8000-" + "0" * 12,
                        status=DagsterRunStatus.STARTED,
                    )
                )
                (backing,) = client.search_runs(
                    experiments(), f"tags.`dagster.asset_key` = 'tokenizer' and tags.`dagster.run_id` = '{runs[0]}'"
                )
                client.create_registered_model("kept_model")
                version = client.create_model_version(
                    "kept_model", f"{backing.info.artifact_uri}", run_id=backing.info.run_id
                )
                kept_artifacts = Path(backing.info.artifact_uri.removeprefix("file://"))
                assert any(kept_artifacts.rglob("*"))
            reports.append(prune(1, instance))
            sizes.append({p.name: tree_bytes(p) for p in state.iterdir() if p.is_dir()} | {"total": tree_bytes(state)})
        print(sizes)
        assert sizes[-1]["total"] <= sizes[1]["total"] * 1.02, sizes
        for part in ("dagster", "mlflow", "artifacts"):
            assert sizes[-1][part] <= sizes[1][part] * 1.02 + 16 * 1024, (part, sizes)
        # Left: the latest run (every asset's latest materialization), the live run, the registered version's run.
        left = {r.dagster_run.run_id for r in instance.get_run_records()}
        assert left == {runs[-1], live.run_id, runs[0]}, (left, runs)
        for key in SELECTION:
            assert instance.get_latest_materialization_event(dg.AssetKey(key)).run_id == runs[-1]
        tagged = {r.data.tags.get("dagster.run_id") for r in client.search_runs(experiments(), max_results=1000)}
        assert tagged == {runs[0], runs[-1]}
        assert client.get_model_version("kept_model", version.version).run_id == backing.info.run_id and any(
            kept_artifacts.rglob("*")
        )
        freed = [r for r in reports if r["dagster_runs_deleted"]]
        assert freed and all(r["errors"] == [] for r in reports), reports
        assert {runs[1], runs[2]} <= {d for r in freed for d in r["dagster_runs_deleted"]}
        assert (
            sum(r["bytes_freed_by"]["dagster"] for r in freed) > 0
            and sum(r["bytes_freed_by"]["mlflow"] for r in freed) > 0
        )
    finally:
        instance.dispose()


def test_stale_lock_files_go_and_held_ones_stay(tmp_path, monkeypatch):
    """An empty lock file of a checkpoint folder that is gone is removed; one that a training holds
    (`exclusive`), or whose folder exists, stays; a lock taken again afterwards works on a new file."""
    from components.orchestration.language_model import exclusive
    from components.orchestration.retention import remove_stale_locks
    from components.orchestration.state import checkpoints_root

    monkeypatch.setenv("PIPELINE_STATE_DIR", str(tmp_path / "state"))
    asset = checkpoints_root() / "rnn_lm"
    asset.mkdir(parents=True)
    stale, live, held = asset / "aaa.lock", asset / "bbb.lock", asset / "ccc"
    stale.touch()
    live.touch()
    (asset / "bbb").mkdir()
    with exclusive(held):
        assert remove_stale_locks() == [str(stale)]
        assert not stale.exists() and live.exists() and held.with_name("ccc.lock").exists()
    assert remove_stale_locks() == [str(held.with_name("ccc.lock"))]
    with exclusive(held):
        assert held.with_name("ccc.lock").exists()


def test_a_model_run_records_its_vocabulary_and_tokenizer(state):
    """The language model's MLflow run has vocab_size and tokenizer_sha256 among its params (runs on
    different tokenizers compare side by side), and so does its registered model's run."""
    from mlflow.tracking import MlflowClient

    from components.orchestration.state import local_tracking_uri
    from pipelines.definitions import defs

    selection = ["corpus", "tokenizer", "labels", "ngram_baseline", "rnn_lm"]
    cfg = {**TINY, "ops": {k: v for k, v in TINY["ops"].items() if k in selection}}
    cfg["ops"]["rnn_lm"] = {
        "config": {
            **cfg["ops"]["rnn_lm"]["config"],
            "train": {**cfg["ops"]["rnn_lm"]["config"]["train"], "max_steps": 4, "flops_budget": None},
        }
    }
    instance = dg.DagsterInstance.get()
    try:
        result = dg.materialize(
            list(defs.assets),
            resources=defs.resources,
            run_config=cfg,
            selection=selection,
            instance=instance,
            raise_on_error=False,
        )
        assert result.success
        labels = result.output_for_node("labels")
    finally:
        instance.dispose()
    client = MlflowClient(tracking_uri=local_tracking_uri())
    (run,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.`dagster.asset_key` = 'rnn_lm'"
    )
    assert run.data.params["vocab_size"] == str(labels.vocab_size)
    assert run.data.params["tokenizer_sha256"] == labels.tokenizer_sha256
