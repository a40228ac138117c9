"""MLflow runs that outlive their Dagster run: reconciliation of the MLflow tracking store with the
Dagster instance.

Every asset step has an MLflow run tagged with its Dagster run id (`dagster.run_id`), nested under
one parent per Dagster run (tag `dagster.role` = dagster_run). When a Dagster run ends without its
MLflow runs being ended (a killed process, or a step killed under a live run worker: Dagster fails
the run, nobody ends the MLflow run), the runs still RUNNING → KILLED and the parent mirrors the
Dagster status (`end_mlflow_runs`, called by `recovery.recover_dead_runs`; `sync_mlflow_parents`,
called by the recovery sensor and maintenance). Runs that the instance does not know are left alone.

MLflow is reached the same way on a server as on the local store (read-only SQL on SQLite,
MlflowClient otherwise, after one quick check that the server answers).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from .leases import run_statuses
from .state import MLFLOW_EXPERIMENT, default_tracking_uri, sqlite_path

PARENT_ROLE = "dagster_run"  # tag dagster.role of the MLflow parent run of a Dagster run

# Dagster run status → MLflow parent status once the run has ended.
FINAL_MLFLOW_STATUS = {"SUCCESS": "FINISHED", "FAILURE": "FAILED", "CANCELED": "KILLED"}


def _select(db, sql: str, read_only: bool) -> list:
    con = sqlite3.connect(f"file:{db}?mode={'ro' if read_only else 'rw'}", uri=True, timeout=30)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _mlflow_runs(tracking_uri: str, where: str, role: str | None = None) -> list[dict[str, str]]:
    """MLflow runs tagged with a Dagster run id: run_id, status, dagster_run_id, role.

    `where`: 'running' (status RUNNING) or 'parents' (role dagster_run, any status). For the local
    SQLite store this is one read-only SQL query (no MLflow import, a few ms); otherwise MlflowClient.
    """
    db = sqlite_path(tracking_uri)
    if db is not None:
        if not db.exists():
            return []
        sql = (
            "SELECT r.run_uuid, r.status, d.value, COALESCE(ro.value, '') FROM runs r "
            "JOIN tags d ON d.run_uuid = r.run_uuid AND d.key = 'dagster.run_id' "
            "LEFT JOIN tags ro ON ro.run_uuid = r.run_uuid AND ro.key = 'dagster.role' "
            "WHERE r.lifecycle_stage = 'active' AND "
        )
        sql += "r.status = 'RUNNING'" if where == "running" else f"ro.value = '{PARENT_ROLE}'"
        try:
            rows = _select(db, sql, read_only=True)
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return []
            if "readonly database" not in str(e):
                raise
            # A writer killed mid-transaction (a killed run) left a hot journal, which only a
            # read-write connection may roll back: this one does so on its first read, then selects.
            rows = _select(db, sql, read_only=False)
        return [{"run_id": r[0], "status": r[1], "dagster_run_id": r[2], "role": r[3]} for r in rows]
    from mlflow.tracking import MlflowClient

    from .services import check_tracking_store

    check_tracking_store(tracking_uri)  # seconds, not the client's minutes of retries, when it is down
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
    if exp is None:
        return []
    filt = "attributes.status = 'RUNNING'" if where == "running" else f"tags.`dagster.role` = '{PARENT_ROLE}'"
    out = []
    for r in client.search_runs([exp.experiment_id], filter_string=filt, max_results=5000):
        tags = r.data.tags
        if "dagster.run_id" in tags:
            out.append(
                {
                    "run_id": r.info.run_id,
                    "status": r.info.status,
                    "dagster_run_id": tags["dagster.run_id"],
                    "role": tags.get("dagster.role", ""),
                }
            )
    return out


def _terminate(client: Any, run_id: str, status: str, reason: str, end_time_ms: int | None = None) -> None:
    client.set_tag(run_id, "dagster.recovery", reason[:5000])
    client.set_terminated(run_id, status, end_time=end_time_ms)


def _end_ms(record: Any) -> int | None:
    return int(record.end_time * 1000) if record is not None and record.end_time else None


def end_mlflow_runs(instance: Any, uri: str, active: dict[str, Any], failed: set[str], report: dict[str, Any]) -> None:
    """RUNNING MLflow runs of Dagster runs that are not running any more → KILLED; their parents
    mirror the Dagster status."""
    running = [r for r in _mlflow_runs(uri, "running") if r["dagster_run_id"] not in active]
    if not running:
        return
    records = run_statuses(instance, {r["dagster_run_id"] for r in running})
    client = None
    for r in running:
        record = records.get(r["dagster_run_id"])
        if record is None:  # a run of another instance (e.g. an ephemeral test instance): not ours to judge
            continue
        status = record.dagster_run.status.value
        if status not in FINAL_MLFLOW_STATUS:  # queued / starting / started / canceling: leave it
            continue
        if client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
        end = _end_ms(record)
        if r["role"] == PARENT_ROLE:
            _terminate(client, r["run_id"], FINAL_MLFLOW_STATUS[status], f"Dagster run {status}", end)
            report["mlflow_parents"].append(r["run_id"])
        else:
            why = (
                "its process was killed"
                if r["dagster_run_id"] in failed
                else f"the Dagster run ended ({status}) while it ran"
            )
            _terminate(client, r["run_id"], "KILLED", why, end)
            report["mlflow_killed"].append(r["run_id"])
    # Parents that were FINISHED between two steps of a run that then died.
    if failed:
        for p in _mlflow_runs(uri, "parents"):
            if (
                p["dagster_run_id"] in failed
                and p["status"] != "FAILED"
                and p["run_id"] not in report["mlflow_parents"]
            ):
                if client is None:
                    from mlflow.tracking import MlflowClient

                    client = MlflowClient(tracking_uri=uri)
                _terminate(client, p["run_id"], "FAILED", "Dagster run FAILURE (killed)")
                report["mlflow_parents"].append(p["run_id"])


def sync_mlflow_parents(instance: Any, tracking_uri: str | None = None) -> dict[str, Any]:
    """MLflow parent runs (tag dagster.role=dagster_run) of ended Dagster runs get the matching
    status: SUCCESS → FINISHED, FAILURE → FAILED, CANCELED → KILLED (end time: the run's). Also ends
    children still RUNNING under an ended run (KILLED). Runs this instance does not know are left
    alone. Returns {"parents_updated": [...], "children_killed": [...], "ms": float}."""
    t0 = time.perf_counter()
    uri = tracking_uri or default_tracking_uri()
    report: dict[str, Any] = {"parents_updated": [], "children_killed": []}
    parents = _mlflow_runs(uri, "parents")
    running = [r for r in _mlflow_runs(uri, "running") if r["role"] != PARENT_ROLE]
    records = run_statuses(instance, {r["dagster_run_id"] for r in parents + running})
    client = None

    def get_client():
        nonlocal client
        if client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
        return client

    for r in running:
        record = records.get(r["dagster_run_id"])
        status = record.dagster_run.status.value if record else None
        if status in FINAL_MLFLOW_STATUS:
            _terminate(
                get_client(), r["run_id"], "KILLED", f"the Dagster run ended ({status}) while it ran", _end_ms(record)
            )
            report["children_killed"].append(r["run_id"])
    for p in parents:
        record = records.get(p["dagster_run_id"])
        status = record.dagster_run.status.value if record else None
        want = FINAL_MLFLOW_STATUS.get(status or "")
        if want and p["status"] != want:
            _terminate(get_client(), p["run_id"], want, f"mirrors Dagster run {status}", _end_ms(record))
            report["parents_updated"].append(p["run_id"])
    report["ms"] = round((time.perf_counter() - t0) * 1000, 1)
    return report
