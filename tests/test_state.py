"""The state folder: stores created once under concurrency, dead runs recovered, retention.

Real processes, real SQLite stores (Dagster instance in DAGSTER_HOME, MLflow DB), one temporary
state folder for the module (creating the stores costs seconds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

N_PROCS = 4


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A fresh state folder whose stores were created by N processes started at the same moment."""
    state = tmp_path_factory.mktemp("shared") / "state"
    env = {
        **os.environ,
        "PIPELINE_STATE_DIR": str(state),
        "DAGSTER_HOME": str(state / "dagster"),
        "PYTHONPATH": str(ROOT),
    }
    go = state.parent / "go"
    code = textwrap.dedent(
        f"""
        import json, os, sys, time
        from components.orchestration.state import ensure_stores
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        print(json.dumps(ensure_stores()))
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(N_PROCS)
    ]
    time.sleep(0.3)
    go.touch()  # all call ensure_stores within a few ms; the loser(s) wait on the lock, then find it done
    results = [p.communicate(timeout=120) for p in procs]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_STATE_DIR", str(state))
        mp.setenv("DAGSTER_HOME", str(state / "dagster"))
        yield {"state": state, "procs": procs, "results": results}


@pytest.fixture(scope="module")
def instance(stores):
    import dagster as dg

    inst = dg.DagsterInstance.from_config(str(stores["state"] / "dagster"))
    yield inst
    inst.dispose()


@pytest.fixture(scope="module")
def client(stores):
    from mlflow.tracking import MlflowClient

    from components.orchestration.state import local_tracking_uri

    return MlflowClient(tracking_uri=local_tracking_uri())


def test_concurrent_ensure_stores_creates_each_store_once(stores, instance, client):
    for p, (_out, err) in zip(stores["procs"], stores["results"]):
        assert p.returncode == 0, err[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in stores["results"]]
    assert sorted(tuple(r["initialized"]) for r in reports) == [()] * (N_PROCS - 1) + [("dagster", "mlflow")]

    # both stores work, from this process too
    assert instance.get_run_records(limit=1) == []
    exp = client.get_experiment_by_name("wordvec-to-transformer")
    assert exp.artifact_location == (stores["state"] / "mlflow" / "artifacts").as_uri()
    run = client.create_run(exp.experiment_id)
    client.set_terminated(run.info.run_id)

    # dagster.yaml written and valid: run monitoring on, the training pool limited to 1
    assert instance.run_monitoring_enabled
    assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
    assert {p.name: p.limit for p in instance.event_log_storage.get_pool_limits()}["training"] == 1
    # the legacy instance-wide auto-materialize flag is unpaused, so the UI's "Auto-materialize" badge
    # agrees with the running automation sensor
    from dagster._daemon.asset_daemon import get_auto_materialize_paused

    assert not get_auto_materialize_paused(instance)

    # later calls are cheap no-ops, in a new process (marker) and in this one
    from components.orchestration import state as st

    st._READY.clear()
    t = time.perf_counter()
    assert st.ensure_stores()["initialized"] == []
    assert st.ensure_stores()["initialized"] == []
    assert time.perf_counter() - t < 0.05


def test_dagster_yaml_never_overwrites_a_users_file(tmp_path):
    from components.orchestration.state import write_dagster_yaml

    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: true\n")
    assert not write_dagster_yaml(tmp_path)
    assert (tmp_path / "dagster.yaml").read_text() == "telemetry:\n  enabled: true\n"
    (tmp_path / "dagster.yaml").write_text("  \n")
    assert write_dagster_yaml(tmp_path)
    assert "run_monitoring" in (tmp_path / "dagster.yaml").read_text()


def test_process_identity_survives_pid_reuse():
    from components.orchestration.procs import process_alive, process_start_ticks

    me = process_start_ticks(os.getpid())
    assert me is not None and process_alive(os.getpid(), me)
    assert not process_alive(os.getpid(), me + 1)  # same pid, another start time: another process
    p = subprocess.Popen(["sleep", "30"])
    p.kill()
    p.wait()
    assert not process_alive(p.pid)


def test_run_lease_is_removed_on_error_and_keeps_the_run_record(stores):
    from components.orchestration.leases import RUN_LEASE, read_leases, run_lease
    from components.orchestration.state import leases_root

    run_id = str(uuid.uuid4())
    with pytest.raises(RuntimeError):
        with run_lease(run_id, "corpus") as path:
            rec = json.loads(path.read_text())
            assert rec["pid"] == os.getpid() and rec["ppid"] == os.getppid() and rec["pid_start"]
            raise RuntimeError("boom")
    assert not path.exists()
    assert [p.name for p in (leases_root() / run_id).iterdir()] == [RUN_LEASE]
    assert read_leases(run_id)[0]["step_key"] == "corpus"


def _job():
    import dagster as dg

    @dg.op
    def noop():
        return None

    @dg.job(name="fake_pipeline")
    def fake():
        noop()

    return fake


def _started_run(instance, pid_event: int | None = None) -> str:
    """A Dagster run record in STARTED, as a run worker leaves it when killed."""
    from dagster._core.events import DagsterEvent, DagsterEventType, EngineEventData

    run = instance.create_run_for_job(_job())
    instance.report_dagster_event(
        DagsterEvent(DagsterEventType.RUN_START.value, job_name=run.job_name), run_id=run.run_id
    )
    if pid_event is not None:
        instance.report_engine_event(
            f"Executing steps in process (pid: {pid_event})", run, EngineEventData.in_process(pid_event)
        )
    return run.run_id


def _mlflow_runs(client, dagster_run_id: str, parent_status: str = "RUNNING"):
    exp = client.get_experiment_by_name("wordvec-to-transformer").experiment_id
    parent = client.create_run(exp, tags={"dagster.run_id": dagster_run_id, "dagster.role": "dagster_run"}).info.run_id
    child = client.create_run(exp, tags={"dagster.run_id": dagster_run_id, "mlflow.parentRunId": parent}).info.run_id
    if parent_status != "RUNNING":
        client.set_terminated(parent, parent_status)
    return parent, child


def _killed_step(run_id: str, final: Path) -> int:
    """A real step process (child of a real 'run worker' shell) holding a lease and a partial output
    folder, killed with SIGKILL together with its parent. Returns the step's pid."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from components.orchestration.leases import run_lease
        from components.core.artifacts import atomic_dir
        with run_lease({run_id!r}, "rnn_lm"), atomic_dir({str(final)!r}) as tmp:
            (tmp / "weights.bin").write_bytes(b"x" * 1000)
            print(os.getpid(), flush=True)
            time.sleep(60)
        """
    )
    worker = subprocess.Popen(
        ["sh", "-c", f'"{sys.executable}" -c "$CODE" & wait'],
        env={**os.environ, "CODE": code, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pid = int(worker.stdout.readline())
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    for _ in range(200):  # the step process is re-parented to init and reaped there
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.01)
    return pid


def test_recover_dead_runs_fails_killed_runs_and_leaves_live_ones(stores, instance, client):
    from dagster import DagsterRunStatus

    from components.orchestration.leases import run_lease
    from components.orchestration.recovery import recover_dead_runs
    from components.orchestration.state import artifacts_root, checkpoints_root, leases_root, local_tracking_uri

    # 1. killed during training: lease + partial folder of a SIGKILLed process, MLflow runs RUNNING
    dead = _started_run(instance)
    dead_parent, dead_child = _mlflow_runs(client, dead)
    final = artifacts_root() / "rnn_lm" / dead
    step_pid = _killed_step(dead, final)
    partial = final.parent / f".{dead}.partial-{step_pid}"
    assert partial.is_dir() and (leases_root() / dead / "rnn_lm.json").exists()
    scratch = checkpoints_root() / "rnn_lm" / "abc123"
    scratch.mkdir(parents=True)
    (scratch / "state.pt").write_bytes(b"resume me")

    # 2. killed before any lease: Dagster's own engine event names a dead pid; parent FINISHED between steps
    p = subprocess.Popen(["sleep", "30"])
    p.kill()
    p.wait()
    dead2 = _started_run(instance, pid_event=p.pid)
    dead2_parent, dead2_child = _mlflow_runs(client, dead2, parent_status="FINISHED")
    client.set_terminated(dead2_child, "FINISHED")

    # 3. live: a lease of this very process, held open; its partial folder is kept
    live = _started_run(instance)
    live_parent, live_child = _mlflow_runs(client, live)
    live_partial = artifacts_root() / "rnn_lm" / f".{live}.partial-{os.getpid()}"
    live_partial.mkdir(parents=True)

    # 4. live per Dagster's engine event only (this process's pid), and 5. no evidence at all
    live2 = _started_run(instance, pid_event=os.getpid())
    unknown = _started_run(instance)

    with run_lease(live, "transformer_lm"):
        report = recover_dead_runs(instance, local_tracking_uri())
        assert report["errors"] == []
        assert sorted(report["runs_failed"]) == sorted([dead, dead2])
        assert instance.get_run_by_id(dead).status == DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(dead2).status == DagsterRunStatus.FAILURE
        for run_id in (live, live2, unknown):
            assert instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTED
        assert unknown in report["unknown"]

        status = lambda r: client.get_run(r).info.status  # noqa: E731
        assert (status(dead_child), status(dead_parent)) == ("KILLED", "FAILED")
        assert (status(dead2_child), status(dead2_parent)) == ("FINISHED", "FAILED")
        assert (status(live_child), status(live_parent)) == ("RUNNING", "RUNNING")

        assert not partial.exists() and not final.exists()
        assert live_partial.is_dir()
        assert scratch.is_dir()  # a rerun resumes from it
        assert not (leases_root() / dead).exists()
        assert (leases_root() / live / "transformer_lm.json").exists()

        # nothing left to do: this is the cost every step pays
        again = recover_dead_runs(instance, local_tracking_uri())
        assert again["runs_failed"] == [] and again["mlflow_killed"] == []
        print(f"recover_dead_runs, nothing to do: {again['ms']} ms")
        assert again["ms"] < 1000

    # with a grace period, a run that just started is not judged
    young = _started_run(instance, pid_event=p.pid)
    report = recover_dead_runs(instance, local_tracking_uri(), grace_s=60)
    assert young in report["young"] and young not in report["runs_failed"]
    for run_id in (live, live2, unknown, young):  # tidy up for the other tests
        instance.report_run_canceled(instance.get_run_by_id(run_id))


def test_sync_mlflow_parents_mirrors_ended_runs(stores, instance, client):
    import dagster as dg

    from components.orchestration.mlflow_sync import sync_mlflow_parents
    from components.orchestration.state import local_tracking_uri

    @dg.asset
    def ok():
        return 1

    @dg.asset
    def broken():
        raise RuntimeError("fails before its MLflow child exists")

    good = dg.materialize([ok], instance=instance).run_id
    bad = dg.materialize([broken], instance=instance, raise_on_error=False).run_id
    good_parent, _ = _mlflow_runs(client, good, parent_status="FAILED")
    bad_parent, bad_child = _mlflow_runs(client, bad, parent_status="FINISHED")
    report = sync_mlflow_parents(instance, local_tracking_uri())
    assert good_parent in report["parents_updated"] and bad_parent in report["parents_updated"]
    assert bad_child in report["children_killed"]
    assert client.get_run(good_parent).info.status == "FINISHED"
    assert client.get_run(bad_parent).info.status == "FAILED"
    assert client.get_run(bad_child).info.status == "KILLED"
    assert sync_mlflow_parents(instance, local_tracking_uri())["parents_updated"] == []


def test_prune_keeps_newest_and_latest_materialization(stores, instance):
    import dagster as dg

    from components.orchestration.retention import prune
    from components.orchestration.state import artifacts_root, checkpoints_root

    @dg.asset(name="embeddings_eval")
    def asset():
        return 1

    latest = dg.materialize([asset], instance=instance).run_id
    folder = artifacts_root() / "embeddings_eval"
    now = time.time()
    runs = [str(uuid.uuid4()) for _ in range(5)]
    for i, run_id in enumerate([latest, *runs]):  # the latest materialization is the oldest folder
        d = folder / run_id
        d.mkdir(parents=True)
        (d / "data.bin").write_bytes(b"x" * 1000)
        os.utime(d, (now - 1000 + i, now - 1000 + i))
    p = subprocess.Popen(["sleep", "30"])
    p.kill()
    p.wait()
    leftover = folder / f".{uuid.uuid4()}.partial-{p.pid}"
    leftover.mkdir()
    (leftover / "half.bin").write_bytes(b"x" * 500)
    old = checkpoints_root() / "embeddings_eval" / "old"
    fresh = checkpoints_root() / "embeddings_eval" / "fresh"
    for d in (old, fresh):
        d.mkdir(parents=True)
        (d / "ckpt.pt").write_bytes(b"x" * 100)
    os.utime(old / "ckpt.pt", (now - 10 * 86400, now - 10 * 86400))
    os.utime(old, (now - 10 * 86400, now - 10 * 86400))

    dry = prune(2, instance, assets=["embeddings_eval"], dry_run=True)
    assert len(dry["deleted"]) == 3 and all((folder / r).exists() for r in runs)

    report = prune(2, instance, assets=["embeddings_eval"])
    kept = sorted(p.name for p in folder.iterdir())
    assert kept == sorted([latest, runs[-1], runs[-2]])
    assert report["bytes_freed_by"]["artifacts"] == 3 * 1000 + 500 + 100  # (the total adds the history it freed)
    assert not leftover.exists() and not old.exists() and fresh.exists()


def test_ui_addresses_are_recorded_on_first_use_and_move_only_when_asked(tmp_path, monkeypatch):
    """The links a run records and the addresses the UI scripts serve on come from one record, made
    by the folder's first user: a later DAGSTER_UI_URL / MLFLOW_UI_URL does not move it."""
    from components.orchestration.state import record_ui_addresses, ui_addresses
    from components.orchestration.tracking import MlflowTracker, dagster_run_url

    monkeypatch.setenv("PIPELINE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_UI_URL", raising=False)
    monkeypatch.setenv("DAGSTER_UI_URL", "http://127.0.0.1:3311/")
    assert ui_addresses() == {"dagster": "http://127.0.0.1:3311", "mlflow": "http://127.0.0.1:5000"}
    monkeypatch.setenv("DAGSTER_UI_URL", "http://127.0.0.1:4444")
    monkeypatch.setenv("MLFLOW_UI_URL", "http://127.0.0.1:5511")
    assert dagster_run_url("r") == "http://127.0.0.1:3311/runs/r"
    assert MlflowTracker().resolved_ui_url() == "http://127.0.0.1:5000"
    assert MlflowTracker(ui_url="http://h:1/").resolved_ui_url() == "http://h:1"  # the resource's field wins
    record_ui_addresses(mlflow="http://127.0.0.1:5511")
    assert MlflowTracker().resolved_ui_url() == "http://127.0.0.1:5511" and dagster_run_url("r").startswith(
        "http://127.0.0.1:3311/"
    )
    with pytest.raises(ValueError, match="MLFLOW_UI_URL.*with a port"):
        monkeypatch.setenv("PIPELINE_STATE_DIR", str(tmp_path / "other"))
        monkeypatch.setenv("MLFLOW_UI_URL", "http://127.0.0.1")
        ui_addresses()
    assert not (tmp_path / "other" / "ui_addresses.json").exists()  # nothing half-recorded


def test_training_progress_reaches_mlflow_in_batches_and_all_of_it_by_the_flush(client):
    """A training's log points (`log_progress`) wait for the next batch, at most METRICS_FLUSH_S apart;
    `log_metrics` sends them with its own at once; every point keeps its step."""
    from components.orchestration.tracking import AssetRun

    experiment = client.create_experiment(f"progress-{uuid.uuid4().hex[:8]}")
    run = AssetRun(client, client.create_run(experiment).info.run_id, experiment, "")
    run.METRICS_FLUSH_S = 3600.0
    for step in (10, 20, 30):
        run.log_progress({"train/loss": 3.0 - step / 100, "lr": 1e-3}, step)
    assert client.get_metric_history(run.run_id, "train/loss") == []  # one batch later, not one transaction each
    run.log_metrics({"val/loss": 2.5}, 30)
    assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "train/loss")] == [
        (10, 2.9),
        (20, 2.8),
        (30, 2.7),
    ]
    run.METRICS_FLUSH_S = 0.0  # due: the next point sends the batch
    run.log_progress({"train/loss": 2.6}, 40)
    assert client.get_run(run.run_id).data.metrics == {"train/loss": 2.6, "lr": 1e-3, "val/loss": 2.5}
