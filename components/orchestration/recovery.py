"""Killed runs: which Dagster runs are dead, and what is done about them.

The state folder's other housekeeping lives beside this module: the leases that are the evidence
(`leases.py`, from /proc via `procs.py`), the MLflow side (`mlflow_sync.py`), the artifacts tree's
leftovers (`artifact_tree.py`) and retention (`retention.py`).

The rule (`recover_dead_runs`): a Dagster run in STARTING/STARTED is dead only when there is
evidence of its processes and every piece of it is dead:
  1. its leases name processes on this host; it is alive if any of them (a step process or its
     parent, the run worker) is alive with the recorded start time;
  2. if no leased process is alive (or it has no lease: killed before its first step, or a run
     worker that resumed it), the pids Dagster itself records in the run's engine events (the
     multiprocess executor's parent process, the run worker of `dagster dev`, the in-process
     executor's process) decide too: such a process is the same one only if it started before the
     event was written (a process that wrote at time T was alive at T; a reuse of its pid starts later);
  3. no evidence at all, or a lease from another host → never marked dead: we cannot know.
Evidence is only ever written by the live process it names, so a run between two steps (its
`_run.json` names the live worker) or one that has not reached its first event is never judged
dead. The status is read again just before marking, so a run that ended by itself meanwhile is left
as it ended. (`grace_s` can additionally skip young runs; 0 by default.) The one false "alive" left
is harmless: with the in-process executor the step's parent is whatever launched it (a shell), so
such a run stays STARTED until that parent exits.

What recovery does for a dead run: Dagster run → FAILURE (with the reason) and its pool slots freed;
its MLflow runs still RUNNING → KILLED, its MLflow parent → FAILED; its lease folder removed. Also,
on every call: `.partial-<pid>` folders (components.core.artifacts.atomic_dir) of dead pids removed,
MLflow runs still RUNNING for Dagster runs that ended (a step process killed under a live run
worker: Dagster fails the run, nobody ends the MLflow run) → KILLED, lease folders of ended runs
removed. Checkpoint scratch folders are kept: a rerun resumes from them (`prune` ages them out).

Process ids are evidence only on the machine that wrote them. Leases carry their host. The pids
of Dagster's engine events do not, so they count as "dead" evidence only when the instance's
storage is SQLite files (every run on this machine); with a database server (PostgreSQL, shared by
other machines) a run without a live lease on this host is left to Dagster's own run monitoring
(the daemon, with a run launcher that checks its workers, e.g. Kubernetes'). MLflow is reached the
same way on a server as on the local store (read-only SQL on SQLite, MlflowClient otherwise, after
one quick check that the server answers).
"""

from __future__ import annotations

import time
from typing import Any

from .artifact_tree import remove_dead_leftovers, remove_tree
from .leases import event_pid_verdict, lease_verdict, read_leases, remove_ended_leases
from .mlflow_sync import end_mlflow_runs, sync_mlflow_parents
from .state import default_tracking_uri, leases_root

__all__ = [
    "recover_dead_runs",
    "recovery_sensor",
]


def _classify(instance: Any, record: Any, grace_s: float, now: float, local_pids: bool = True) -> tuple[str, str]:
    """'alive', 'dead', 'unknown' or 'young', with the reason when dead (rule: module docstring).
    local_pids: the pids of Dagster's engine events were written on this machine (SQLite storage)."""
    run = record.dagster_run
    started = record.start_time or record.create_timestamp.timestamp()
    if now - started < grace_s:
        return "young", ""
    leases = read_leases(run.run_id)
    verdict = lease_verdict(leases)
    if verdict in ("alive", "unknown") and leases:  # alive, or a lease from another host
        return verdict, ""
    # No lease, or every leased process is gone: Dagster's own record of its run worker decides
    # too (a worker that resumed the run, or one killed before its first lease).
    by_events = event_pid_verdict(instance, run.run_id)
    if by_events == "alive":
        return "alive", ""
    if verdict == "dead":
        steps = sorted({rec.get("step_key", "?") for rec in leases})
        pids = sorted({pid for rec in leases for k in ("pid", "ppid") if (pid := rec.get(k))})
        return "dead", f"its processes are gone (leased pids {pids}, last step(s) {steps})"
    if by_events == "dead" and local_pids:
        return "dead", "the run worker recorded in its engine events is gone, and it holds no step lease"
    return "unknown", ""


def recover_dead_runs(
    instance: Any,
    tracking_uri: str | None = None,
    *,
    grace_s: float = 0.0,
    clean_leftovers: bool = True,
) -> dict[str, Any]:
    """Find Dagster runs whose processes are gone, mark them failed, tidy up (see the module doc).

    grace_s: skip runs started less than this long ago (0: the rule needs no grace, see above).
    Cheap enough for the start of every step: one run-records query, the run's lease files and
    /proc reads (plus one event query for a run whose leases are all gone or absent); MLflow (one read-only SQL
    query on the local store) is written only when a run
    must be ended. Never raises: problems are listed under "errors".
    Returns {"runs_failed": [...], "unknown": [...], "young": [...], "mlflow_killed": [...], "mlflow_parents": [...],
    "leftovers_removed": [...], "leases_removed": [...], "ms": float, "errors": [...]}.
    """
    from dagster import DagsterRunStatus, RunsFilter

    t0 = time.perf_counter()
    uri = tracking_uri or default_tracking_uri()
    report: dict[str, Any] = {
        "runs_failed": [],
        "unknown": [],
        "young": [],
        "mlflow_killed": [],
        "mlflow_parents": [],
        "leftovers_removed": [],
        "leases_removed": [],
        "errors": [],
    }
    active_statuses = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
    active: dict[str, Any] = {}
    dead: dict[str, str] = {}
    try:
        from .services import single_host

        now = time.time()
        local_pids = single_host(instance)
        for record in instance.get_run_records(RunsFilter(statuses=active_statuses)):
            run_id = record.dagster_run.run_id
            active[run_id] = record
            verdict, reason = _classify(instance, record, grace_s, now, local_pids)
            if verdict == "dead":
                dead[run_id] = reason
            elif verdict in ("unknown", "young"):
                report[verdict].append(run_id)
        for run_id, reason in dead.items():
            current = instance.get_run_by_id(run_id)  # ended by itself meanwhile?
            if current is None or current.status not in active_statuses:
                continue
            instance.report_run_failed(current, f"Marked failed by recovery: {reason}.")
            if instance.event_log_storage.supports_global_concurrency_limits:
                instance.event_log_storage.free_concurrency_slots_for_run(run_id)
            report["runs_failed"].append(run_id)
            active.pop(run_id, None)
    except Exception as e:  # never fail the caller's step over housekeeping
        report["errors"].append(f"dagster: {type(e).__name__}: {e}")

    try:
        end_mlflow_runs(instance, uri, active, set(report["runs_failed"]), report)
    except Exception as e:
        report["errors"].append(f"mlflow: {type(e).__name__}: {e}")

    try:
        for run_id in report["runs_failed"]:
            remove_tree(leases_root() / run_id)
            report["leases_removed"].append(run_id)
        report["leases_removed"] += remove_ended_leases(instance, set(active) | set(report["leases_removed"]))
        if clean_leftovers:
            report["leftovers_removed"], _ = remove_dead_leftovers()
    except Exception as e:
        report["errors"].append(f"files: {type(e).__name__}: {e}")
    report["ms"] = round((time.perf_counter() - t0) * 1000, 1)
    return report


# ---------------------------------------------------------------------------------------------
# under the daemon


def recovery_sensor(
    minimum_interval_seconds: int = 60, name: str = "recover_dead_runs", tracking_uri: str | None = None
):
    """A sensor for `dagster dev`'s daemon: every minute, `recover_dead_runs` and
    `sync_mlflow_parents`, so a killed run is marked failed (and its pool slot freed) even while no
    other step runs. Requests no runs. Add it to the Definitions' sensors."""
    import dagster as dg

    @dg.sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Marks runs whose processes are gone as failed (leases in <state>/leases); mirrors ended runs in "
        "MLflow.",
    )
    def _sensor(context):  # (no annotation: this module has postponed annotations, `dg` is local)
        report = recover_dead_runs(context.instance, tracking_uri)
        synced = sync_mlflow_parents(context.instance, tracking_uri)
        done = {k: v for k, v in {**report, **synced}.items() if v and k not in ("ms",)}
        return dg.SkipReason(f"recovery: {done or 'nothing to do'}")

    return _sensor
