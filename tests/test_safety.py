"""The pipeline operated as users do: runs at the same time, killed runs, swapped files, bad
configs. Real `dagster` processes, real SQLite stores, the tiny config."""

import copy
import os
import signal
import time
from pathlib import Path

import dagster as dg
import pytest
from cli import (
    TINY,
    instance,
    launch,
    log_of,
    manifest,
    materializations,
    mlflow_runs,
    overlap,
    runs,
    step_errors,
    step_intervals,
    wait,
)

INGEST = "corpus,tokenizer,labels"


def tiny(**patches) -> dict:
    """configs/tiny.yaml with `patches`, on Dagster's default multiprocess executor (a process per
    step, as runs launched from the asset graph or by automation execute) unless a test sets one."""
    cfg = copy.deepcopy(TINY)
    cfg.pop("execution", None)
    for dotted, value in patches.items():
        node = cfg["ops"]
        *path, last = dotted.split(".")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return cfg


def run_ids_by_log(inst) -> list[str]:
    return [r.dagster_run.run_id for r in runs(inst)]


@pytest.fixture(scope="module")
def set_up_state(tmp_path_factory):
    """Two runs started at once on a FRESH state folder: both succeed (the stores are initialised once)."""
    state = tmp_path_factory.mktemp("concurrent") / "state"
    procs = [launch(state, INGEST, tiny(), name=f"fresh{i}") for i in range(2)]
    codes = [wait(p, timeout=600) for p in procs]
    assert codes == [0, 0], [log_of(state, f"fresh{i}")[-3000:] for i in range(2)]
    return state


@pytest.mark.slow  # Dagster CLI runs of the pipeline (the module state: two at once)
def test_two_runs_on_a_fresh_folder_both_succeed_with_their_own_inputs(set_up_state):
    inst = instance(set_up_state)
    ids = run_ids_by_log(inst)
    assert len(ids) == 2 and all(inst.get_run_by_id(i).status == dg.DagsterRunStatus.SUCCESS for i in ids)
    for run_id in ids:
        labels, tok = manifest(inst, run_id, "labels"), manifest(inst, run_id, "tokenizer")
        assert labels["tokenizer_sha256"] == tok["sha256"] and run_id in labels["path"] and run_id in tok["path"]
    # Steps ran in separate processes (multiprocess executor): each Dagster run converged on one
    # MLflow parent with one child per asset, and nothing is left RUNNING.
    _, all_runs = mlflow_runs(set_up_state)
    assert {r.info.status for r in all_runs} == {"FINISHED"}
    parents = {
        r.data.tags["dagster.run_id"]: r.info.run_id
        for r in all_runs
        if r.data.tags.get("dagster.role") == "dagster_run"
    }
    assert sorted(parents) == sorted(ids)
    for parent in parents.values():
        children = sorted(
            r.data.tags["dagster.asset_key"] for r in all_runs if r.data.tags.get("mlflow.parentRunId") == parent
        )
        assert children == ["corpus", "labels", "tokenizer"]


@pytest.mark.slow  # Dagster CLI runs of the pipeline (the module state: two at once)
def test_concurrent_runs_with_different_configs_never_mix_data(set_up_state):
    """Configs that differ only in vocabulary size, each training an LSTM: each reads its own run's files."""
    state = set_up_state
    select = INGEST + ",ngram_baseline,lstm_lm"
    vocab = {"a": 512, "b": 700}
    # Each run executes its steps in its own process (in_process executor: what the config jobs use);
    # the two runs still share the state folder and the stores at the same time.
    configs = {
        k: {**tiny(**{"tokenizer.config.vocab_size": v}), "execution": {"config": {"in_process": {}}}}
        for k, v in vocab.items()
    }
    before = {r.dagster_run.run_id for r in runs(instance(state))}
    procs = {k: launch(state, select, configs[k], name=f"mix_{k}") for k in vocab}
    codes = {k: wait(p, timeout=600) for k, p in procs.items()}
    assert codes == {"a": 0, "b": 0}, {k: log_of(state, f"mix_{k}")[-3000:] for k in procs}
    inst = instance(state)
    # The two new runs, by id (retention may have deleted an older run that holds nothing kept).
    new = [r.dagster_run for r in runs(inst) if r.dagster_run.run_id not in before]
    assert len(new) == 2
    seen = set()
    for run in new:
        rid = run.run_id
        tok, labels, lm = (manifest(inst, rid, a) for a in ("tokenizer", "labels", "lstm_lm"))
        assert labels["tokenizer_sha256"] == tok["sha256"] == lm["tokenizer_sha256"]
        assert lm["inputs"] == {"labels": rid, "tokenizer": rid}
        assert labels["vocab_size"] == lm["vocab_size"] == tok["vocab_size"]
        seen.add(tok["vocab_size"])
    assert seen == set(vocab.values())
    # The `training` pool (limit 1) holds across runs: the two runs' lstm_lm steps took turns.
    a, b = (step_intervals(inst, run.run_id)["lstm_lm"] for run in new)
    assert not overlap(a, b), (a, b)


@pytest.mark.slow  # Dagster CLI runs of the pipeline (the module state: two at once)
def test_killed_run_is_marked_failed_and_the_rerun_resumes(set_up_state, tmp_path):
    state = set_up_state
    cfg = tiny(**{"lstm_lm.config.train.max_steps": 400, "lstm_lm.config.train.checkpoint_interval": 10})
    proc = launch(state, INGEST + ",ngram_baseline,lstm_lm", cfg, name="killed")
    checkpoints = state / "checkpoints" / "lstm_lm"
    deadline = time.time() + 300
    while not list(checkpoints.rglob("train_state.pt")):
        assert proc.poll() is None, log_of(state, "killed")[-3000:]
        assert time.time() < deadline, "no checkpoint within 300 s"
        time.sleep(0.5)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    inst = instance(state)
    killed = runs(inst)[-1].dagster_run
    assert killed.status == dg.DagsterRunStatus.STARTED  # nothing told Dagster yet

    # The rerun is what the asset graph launches for a selection: the multiprocess executor, here with
    # a second training asset that could run beside it.
    rerun = launch(state, "rnn_lm,lstm_lm", cfg, name="rerun")
    assert wait(rerun, timeout=600) == 0, log_of(state, "rerun")[-3000:]
    inst = instance(state)
    assert inst.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.FAILURE
    rerun_id = runs(inst)[-1].dagster_run.run_id
    mat = materializations(inst, rerun_id)["lstm_lm"]
    assert mat.metadata["resumed_from_step"].value >= 10
    # Two training steps in separate processes, yet one at a time (pool `training`, limit 1).
    steps = step_intervals(inst, rerun_id)
    assert not overlap(steps["rnn_lm"], steps["lstm_lm"]), steps
    _, all_runs = mlflow_runs(state)
    assert "RUNNING" not in {r.info.status for r in all_runs}
    killed_mlflow = [r for r in all_runs if r.data.tags.get("dagster.run_id") == killed.run_id]
    assert killed_mlflow and {r.info.status for r in killed_mlflow} <= {"KILLED", "FAILED", "FINISHED"}
    assert any(r.info.status in ("KILLED", "FAILED") for r in killed_mlflow)
    assert not list((state / "artifacts").rglob(".*partial*"))
    assert not list(checkpoints.rglob("model.safetensors"))  # the finished training removed its scratch


@pytest.mark.slow  # Dagster CLI runs of the pipeline (the module state: two at once)
def test_a_swapped_tokenizer_is_refused(set_up_state):
    """A tokenizer.json replaced by another of the same size: the hash check names the file."""
    state = set_up_state
    latest = instance(state).get_latest_materialization_event(dg.AssetKey("tokenizer"))
    path = Path(latest.asset_materialization.metadata["tokenizer_path"].value)
    text = path.read_text()
    path.write_text(text.replace('"[UNK]"', '"[UNQ]"', 1))
    assert len(path.read_text()) == len(text) != 0
    proc = launch(state, "labels", tiny(), name="swapped")
    assert wait(proc, timeout=300) != 0
    errors = "\n".join(step_errors(instance(state), runs(instance(state))[-1].dagster_run.run_id))
    assert "tokenizer file" in errors and str(path) in errors and "SHA-256" in errors, errors


def test_a_bad_config_fails_in_seconds_listing_every_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_DIR", str(tmp_path / "state"))
    from test_pipeline import materialize

    cfg = tiny(
        **{"lstm_lm.config.train.lr": -1.0, "gradient_study.config.seq_len": 64, "rnn_lm.config.model.block_size": 64}
    )
    t0 = time.time()
    result = materialize(cfg)
    elapsed = time.time() - t0
    assert not result.success and not result.get_asset_materialization_events()
    errors = "\n".join(e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure)
    assert "ops.lstm_lm.config.train.lr" in errors
    assert "ops.gradient_study.config.seq_len=64 exceeds labels.block_size=32" in errors
    assert "ops.rnn_lm.config.model.block_size=64 exceeds labels.block_size=32" in errors
    assert elapsed < 60, elapsed
