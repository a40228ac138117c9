"""The pipeline on services, as on a cluster: a Dagster instance on PostgreSQL
(configs/deploy/dagster.yaml) and an MLflow server on PostgreSQL (scripts/mlflow_server_pg.sh),
both real, on 127.0.0.1 (tests/pg.py); and what happens when either does not answer.

The graph materialized here is the part that touches every store: corpus → tokenizer → labels →
rnn_lm with their checks (Dagster: runs, event log, asset checks, the `training` pool's slots, the
upstream lookup of a later run; MLflow: parent and nested runs, params, metrics and their history,
file artifacts through the server). The other assets write through the same code paths.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pg
import pytest
from cli import TINY, check_evaluations, materializations, step_errors

pytestmark = pytest.mark.services  # a PostgreSQL server per module, and an MLflow server on it

ROOT = Path(__file__).resolve().parents[1]
DEPLOY_YAML = ROOT / "configs" / "deploy" / "dagster.yaml"
SUBSET = ["corpus", "tokenizer", "labels", "ngram_baseline", "rnn_lm"]


def subset_config(assets) -> dict:
    return {"ops": {k: v for k, v in TINY["ops"].items() if k in assets}}


def materialize(selection, instance, config=None):
    from pipelines.definitions import defs

    return dg.materialize(
        list(defs.assets) + list(defs.asset_checks),
        resources=defs.resources,
        selection=selection,
        run_config=config or subset_config(selection),
        instance=instance,
        raise_on_error=False,
    )


def maintenance(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.maintenance", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, time.monotonic() - t0


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """PostgreSQL with the databases `dagster` and `mlflow`, and an MLflow server on the latter."""
    folder = tmp_path_factory.mktemp("services")
    with pg.postgres(("dagster", "mlflow")) as server:
        with pg.mlflow_server(server, "mlflow", folder / "mlflow") as url:
            yield server, url, folder


@pytest.fixture(scope="module")
def deployed(servers):
    """DAGSTER_HOME holding configs/deploy/dagster.yaml, MLFLOW_TRACKING_URI at the server, the
    stores initialised by `maintenance init` (as every script does), then the subset materialized."""
    server, url, folder = servers
    home = folder / "dagster_home"
    home.mkdir()
    shutil.copy(DEPLOY_YAML, home / "dagster.yaml")
    env = {
        "PIPELINE_STATE_DIR": str(folder / "state"),
        "DAGSTER_HOME": str(home),
        "MLFLOW_TRACKING_URI": url,
        **server.dagster_env("dagster"),
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        init, init_s = maintenance("init", env={**os.environ})
        assert init.returncode == 0, init.stderr
        inst = dg.DagsterInstance.from_config(str(home))
        try:
            t0 = time.monotonic()
            result = materialize(SUBSET, inst)
            run_s = time.monotonic() - t0
            assert result.success, "\n".join(step_errors(inst, result.run_id))
            print(
                f"\nmaintenance init {init_s:.1f} s; {SUBSET} on PostgreSQL + MLflow server {run_s:.1f} s; load "
                f"{os.getloadavg()}"
            )
            yield {
                "server": server,
                "url": url,
                "folder": folder,
                "home": home,
                "env": env,
                "inst": inst,
                "init": json.loads(init.stdout),
                "run_id": result.run_id,
            }
        finally:
            inst.dispose()


def test_init_creates_the_stores_on_the_servers(deployed):
    server, home, report = deployed["server"], deployed["home"], deployed["init"]["stores"]
    assert report["initialized"] == ["dagster", "mlflow"]
    assert (
        report["dagster_storage"]
        == f"postgresql+psycopg2://pipeline:***@127.0.0.1:{server.port}/dagster?connect_timeout=10"
    )
    assert not (home / "history").exists()  # no SQLite storage beside the PostgreSQL one
    # The training pool's limit is in PostgreSQL: every process of every machine sees it.
    assert server.sql("dagster", 'SELECT concurrency_key, "limit" FROM concurrency_limits') == [("training", 1)]
    marker = (deployed["folder"] / "state" / ".stores-ready.json").read_text()
    assert server.password not in marker and server.password not in json.dumps(deployed["init"])
    assert list(json.loads(marker)["mlflow"]) == [deployed["url"]]
    # The embedded default left alone: no SQLite MLflow store in the state folder.
    assert not (deployed["folder"] / "state" / "mlflow" / "mlflow.db").exists()


def test_materializations_and_checks_are_in_postgres(deployed):
    server, run_id, inst = deployed["server"], deployed["run_id"], deployed["inst"]
    rows = server.sql(
        "dagster",
        "SELECT asset_key FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
        run_id,
    )
    assert sorted(json.loads(k)[0] for (k,) in rows) == sorted(SUBSET)
    assert server.sql("dagster", "SELECT status FROM runs WHERE run_id = %s", run_id) == [("SUCCESS",)]
    checks = {key: ev.passed for key, ev in check_evaluations(inst, run_id).items()}
    assert checks[("labels_are_shifted_inputs", "labels")] and checks[("clipping_bounds_gradient", "rnn_lm")]
    assert ("tokenizer_is_healthy", "tokenizer") in checks
    assert ("language_models_beat_the_count_model", "rnn_lm") in checks
    # The training step took and gave back its pool slot in PostgreSQL.
    assert server.sql(
        "dagster",
        "SELECT count(*) FROM concurrency_slots WHERE concurrency_key = 'training' AND run_id IS NOT NULL AND NOT "
        "deleted",
    ) == [(0,)]


def test_mlflow_server_has_one_parent_nested_runs_metrics_and_artifacts(deployed):
    from mlflow.tracking import MlflowClient

    url, run_id, server, folder = deployed["url"], deployed["run_id"], deployed["server"], deployed["folder"]
    client = MlflowClient(url)
    exp = client.get_experiment_by_name("wordvec-to-transformer")
    assert exp.artifact_location.startswith("mlflow-artifacts:")  # served (and stored) by the server
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`dagster.run_id` = '{run_id}'")
    parents = [r for r in runs if r.data.tags.get("dagster.role") == "dagster_run"]
    assert len(parents) == 1
    children = {
        r.data.tags["dagster.asset_key"]: r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id
    }
    assert sorted(children) == sorted(SUBSET) and len(runs) == len(SUBSET) + 1
    assert {r.info.status for r in runs} == {"FINISHED"}
    tok, lm = children["tokenizer"], children["rnn_lm"]
    assert tok.data.params["vocab_size"] == "512" and tok.data.metrics["roundtrip_ok"] == 1.0
    assert children["corpus"].data.metrics["documents"] == 24
    assert lm.data.metrics["val/loss"] > 0 and len(client.get_metric_history(lm.info.run_id, "train/loss")) >= 3
    # Artifacts went through the server into its artifact folder, none into the state folder.
    assert "tokenizer.json" in [a.path for a in client.list_artifacts(tok.info.run_id)]
    stored = folder / "mlflow" / "artifacts" / exp.experiment_id
    assert (stored / tok.info.run_id / "artifacts" / "tokenizer.json").is_file()
    assert (stored / lm.info.run_id / "artifacts" / "loss_curve.png").is_file()  # a figure, through publish
    # Runs and metrics are rows in the server's PostgreSQL database.
    assert server.sql("mlflow", "SELECT status FROM runs WHERE run_uuid = %s", lm.info.run_id) == [("FINISHED",)]
    # Dagster's metadata links to the run on that server.
    meta = materializations(deployed["inst"], run_id)["rnn_lm"].metadata
    assert meta["mlflow_run_id"].value == lm.info.run_id and meta["mlflow_url"].value.startswith(
        f"{url}/#/experiments/"
    )


def test_a_later_run_reads_its_upstream_from_the_postgres_event_log(deployed):
    first, inst = deployed["run_id"], deployed["inst"]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in deployed["env"].items():
            mp.setenv(k, v)
        result = materialize(["rnn_lm"], inst)
    assert result.success, "\n".join(step_errors(inst, result.run_id))
    mat = materializations(inst, result.run_id)["rnn_lm"]
    manifest = json.loads(Path(mat.metadata["manifest_path"].value).read_text())
    assert manifest["inputs"] == {"labels": first, "tokenizer": first}


def test_recovery_on_postgres_trusts_leases_not_foreign_pids(deployed):
    """A run whose leased processes on this host are dead is failed (MLflow runs on the server
    ended); a run with no lease is not judged from Dagster's recorded pids, which on a shared
    database may belong to another machine."""
    from mlflow.tracking import MlflowClient
    from test_state import _killed_step, _mlflow_runs, _started_run

    from components.orchestration.recovery import recover_dead_runs
    from components.orchestration.state import artifacts_root

    inst, url = deployed["inst"], deployed["url"]
    client = MlflowClient(url)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in deployed["env"].items():
            mp.setenv(k, v)
        dead = _started_run(inst)
        parent, child = _mlflow_runs(client, dead)
        _killed_step(dead, artifacts_root() / "rnn_lm" / dead)
        gone = subprocess.Popen(["sleep", "30"])
        gone.kill()
        gone.wait()
        foreign = _started_run(inst, pid_event=gone.pid)  # no lease; its recorded pid is not running here
        report = recover_dead_runs(inst)  # the tracking URI from MLFLOW_TRACKING_URI
        try:
            assert report["errors"] == [] and report["runs_failed"] == [dead], report
            assert foreign in report["unknown"]
            assert inst.get_run_by_id(dead).status == dg.DagsterRunStatus.FAILURE
            assert inst.get_run_by_id(foreign).status == dg.DagsterRunStatus.STARTED
            assert (client.get_run(child).info.status, client.get_run(parent).info.status) == ("KILLED", "FAILED")
        finally:
            inst.report_run_canceled(inst.get_run_by_id(foreign))


def test_unreachable_postgres_names_the_setting(deployed):
    """A wrong DAGSTER_PG_PORT: `maintenance init` (what every script runs first) fails naming it
    and dagster.yaml, instead of dagster-postgres's retries and a message that names neither."""
    server, folder = deployed["server"], deployed["folder"]
    home = folder / "dagster_home_wrong_port"
    home.mkdir()
    shutil.copy(DEPLOY_YAML, home / "dagster.yaml")
    closed = pg.free_port()
    env = {
        **os.environ,
        **deployed["env"],
        "DAGSTER_HOME": str(home),
        "PIPELINE_STATE_DIR": str(folder / "state_wrong_port"),
        **server.dagster_env("dagster", port=closed),
    }
    runs_before = server.sql("dagster", "SELECT count(*) FROM runs")
    proc, seconds = maintenance("init", env=env)
    print(f"\nunreachable PostgreSQL: init failed after {seconds:.1f} s; load {os.getloadavg()}")
    assert proc.returncode == 1
    assert f"DAGSTER_PG_PORT={closed}" in proc.stderr and str(home / "dagster.yaml") in proc.stderr
    assert "Connection refused" in proc.stderr and "Traceback" not in proc.stderr
    assert server.password not in proc.stderr
    assert server.sql("dagster", "SELECT count(*) FROM runs") == runs_before
    marker = folder / "state_wrong_port" / ".stores-ready.json"
    assert not marker.exists() or "dagster" not in json.loads(marker.read_text())
    # An unset variable is named as well.
    env.pop("DAGSTER_PG_PASSWORD")
    proc, _ = maintenance("init", env=env)
    assert proc.returncode == 1 and 'environment variable "DAGSTER_PG_PASSWORD" which is not set' in proc.stderr


def test_unreachable_mlflow_server_fails_the_step_cleanly(deployed):
    """MLFLOW_TRACKING_URI at a closed port: the step fails in seconds (MLflow's client would retry
    for minutes) naming the variable; no materialization, no MLflow run, no output folder."""
    from mlflow.tracking import MlflowClient

    from components.orchestration.state import artifacts_root, leases_root

    inst, url = deployed["inst"], deployed["url"]
    bad = f"http://127.0.0.1:{pg.free_port()}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**deployed["env"], "MLFLOW_TRACKING_URI": bad}.items():
            mp.setenv(k, v)
        t0 = time.monotonic()
        result = materialize(["corpus"], inst)
        seconds = time.monotonic() - t0
        proc, init_s = maintenance("init", env={**os.environ})
    print(
        f"\nunreachable MLflow server: step failed after {seconds:.1f} s, init after {init_s:.1f} s; load "
        f"{os.getloadavg()}"
    )
    assert not result.success and not result.get_asset_materialization_events()
    errors = step_errors(inst, result.run_id)
    assert any(
        f"MLflow tracking server {bad} is unreachable (set by the environment variable MLFLOW_TRACKING_URI)" in e
        for e in errors
    ), errors
    assert (
        not (artifacts_root() / "corpus" / result.run_id).exists()
        and not (leases_root() / result.run_id / "corpus.json").exists()
    )
    client = MlflowClient(url)
    assert (
        client.search_runs(
            [client.get_experiment_by_name("wordvec-to-transformer").experiment_id],
            filter_string=f"tags.`dagster.run_id` = '{result.run_id}'",
        )
        == []
    )
    assert proc.returncode == 1 and "MLFLOW_TRACKING_URI" in proc.stderr and "Traceback" not in proc.stderr


def test_mlflow_server_script_names_its_settings_when_the_database_is_unreachable(servers, tmp_path):
    server, _, _ = servers
    closed = pg.free_port()
    env = pg.script_env(
        **server.mlflow_env("mlflow", port=closed),
        MLFLOW_PORT=str(pg.free_port()),
        PIPELINE_STATE_DIR=str(tmp_path / "state"),
    )
    proc = subprocess.run(
        ["bash", "scripts/mlflow_server_pg.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "MLFLOW_PG_PORT" in proc.stderr and f"127.0.0.1:{closed}/mlflow is unreachable" in proc.stderr, proc.stderr
    assert server.password not in proc.stderr + proc.stdout
    # and without a user it says which variable to set
    env.pop("MLFLOW_PG_USER")
    proc = subprocess.run(
        ["bash", "scripts/mlflow_server_pg.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and "MLFLOW_PG_USER" in proc.stderr
