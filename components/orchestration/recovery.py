"""Killed runs, leftovers and retention of the state folder.

Leases. Every asset step runs inside `run_lease(run_id, step_key)`, which writes
`<state>/leases/<run_id>/<step_key>.json` (this process and its parent, each with its start time
from /proc/<pid>/stat, so a reused pid is not mistaken for it, and the host) and removes it when the
step ends, however it ends. It also writes `<state>/leases/<run_id>/_run.json`, the run's last lease,
which stays until the run has ended: between steps it still names the run worker (the step's
parent), which is alive for as long as the run is.

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

import json
import os
import re
import shutil
import socket
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from .state import (
    MLFLOW_EXPERIMENT,
    artifacts_root,
    checkpoints_root,
    default_tracking_uri,
    file_lock,
    leases_root,
    sqlite_path,
    state_root,
)

RUN_LEASE = "_run.json"
PARENT_ROLE = "dagster_run"  # tag dagster.role of the MLflow parent run of a Dagster run
LEFTOVER_RE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|pruning)-(?P<pid>\d+)$")
RUN_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
START_SLACK_S = 2.0  # /proc start times are in clock ticks since a boot time known to the second

# Dagster run status → MLflow parent status once the run has ended.
FINAL_MLFLOW_STATUS = {"SUCCESS": "FINISHED", "FAILURE": "FAILED", "CANCELED": "KILLED"}


# ---------------------------------------------------------------------------------------------
# processes


def process_start_ticks(pid: int) -> int | None:
    """Start time of a live process (clock ticks since boot, /proc/<pid>/stat field 22); None if
    there is no such process or it is a zombie."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = data[data.rindex(")") + 2 :].split()  # comm may hold spaces and parentheses
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def process_alive(pid: int, start_ticks: int | None = None) -> bool:
    """Alive, and (if given) the same process: same start time, so a reused pid does not count."""
    now = process_start_ticks(pid)
    return now is not None and (start_ticks is None or now == start_ticks)


_BOOT_TIME: float | None = None


def process_start_epoch(pid: int) -> float | None:
    global _BOOT_TIME
    ticks = process_start_ticks(pid)
    if ticks is None:
        return None
    if _BOOT_TIME is None:
        with open("/proc/stat") as f:
            _BOOT_TIME = float(next(line.split()[1] for line in f if line.startswith("btime")))
    return _BOOT_TIME + ticks / os.sysconf("SC_CLK_TCK")


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-\[\]]", "_", s)


# ---------------------------------------------------------------------------------------------
# leases


def lease_record(run_id: str, step_key: str) -> dict[str, Any]:
    pid, ppid = os.getpid(), os.getppid()
    return {
        "run_id": run_id,
        "step_key": step_key,
        "pid": pid,
        "pid_start": process_start_ticks(pid),
        "ppid": ppid,
        "ppid_start": process_start_ticks(ppid),
        "host": socket.gethostname(),
        "started_at": time.time(),
    }


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


@contextmanager
def run_lease(run_id: str, step_key: str) -> Iterator[Path]:
    """Declare that this process runs `step_key` of Dagster run `run_id` until the block ends.

    Writes `<state>/leases/<run_id>/<step_key>.json` and the run's last lease `_run.json`; removes
    the step's file on exit (success or exception). `_run.json` stays until the run has ended
    (`recover_dead_runs` / `prune` remove it), so a run between two steps still names its worker.
    """
    folder = leases_root() / run_id
    folder.mkdir(parents=True, exist_ok=True)
    record = lease_record(run_id, step_key)
    path = folder / f"{_safe_name(step_key)}.json"
    _write_json(path, record)
    _write_json(folder / RUN_LEASE, record)
    try:
        yield path
    finally:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def read_leases(run_id: str) -> list[dict[str, Any]]:
    out = []
    folder = leases_root() / run_id
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return out
    for e in entries:
        if e.name.endswith(".json") and not e.name.startswith("."):
            try:
                out.append(json.loads(Path(e.path).read_text()))
            except (OSError, ValueError):  # being replaced right now: the next call sees it
                continue
    return out


def lease_verdict(leases: list[dict[str, Any]]) -> str:
    """'alive', 'dead' or 'unknown' (no lease, or one from another host)."""
    if not leases:
        return "unknown"
    host = socket.gethostname()
    if any(rec.get("host") != host for rec in leases):
        return "unknown"
    for rec in leases:
        for key in ("pid", "ppid"):
            pid = rec.get(key)
            if pid and process_alive(int(pid), rec.get(f"{key}_start")):
                return "alive"
    return "dead"


def event_pid_verdict(instance: Any, run_id: str) -> str:
    """From the pids Dagster recorded in the run's engine events: 'alive', 'dead' or 'unknown'.

    A live process with a recorded pid is the same process only if it started before the event
    was written (a process that wrote at time T was alive at T, so a reuse of its pid starts later).
    """
    from dagster import DagsterEventType

    latest: dict[int, float] = {}
    for rec in instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records:
        entry = rec.event_log_entry
        data = entry.dagster_event.event_specific_data if entry.dagster_event else None
        value = (getattr(data, "metadata", None) or {}).get("pid")
        raw = getattr(value, "value", value)
        if raw is not None and str(raw).isdigit():
            latest[int(raw)] = max(latest.get(int(raw), 0.0), entry.timestamp)
    if not latest:
        return "unknown"
    for pid, ts in latest.items():
        started = process_start_epoch(pid)
        if started is not None and started <= ts + START_SLACK_S:
            return "alive"
    return "dead"


# ---------------------------------------------------------------------------------------------
# leftovers in the artifacts tree


def iter_leftovers(root: Path | None = None) -> Iterator[tuple[Path, int]]:
    """(path, pid) of every `.<name>.partial-<pid>` / `.<name>.pruning-<pid>` folder under the
    artifacts tree: beside run folders and (for partitions) one level inside them."""
    for folder, _is_run in _walk_artifacts(root or artifacts_root()):
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for e in entries:
            m = LEFTOVER_RE.match(e.name)
            if m:
                yield Path(e.path), int(m.group("pid"))


def _walk_artifacts(root: Path) -> Iterator[tuple[Path, bool]]:
    """Asset folders (False) and run folders (True) of the tree `<asset...>/<run id>/`; the content
    of run folders is not walked."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        yield folder, False
        for e in entries:
            if not e.is_dir(follow_symlinks=False) or e.name.startswith("."):
                continue
            if RUN_ID_RE.match(e.name):
                yield Path(e.path), True
            else:
                stack.append(Path(e.path))


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def remove_tree(path: Path) -> int:
    """Remove a folder (or file); returns the bytes freed."""
    if not path.exists() and not path.is_symlink():
        return 0
    size = dir_bytes(path) if path.is_dir() else path.lstat().st_size
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    return size


def remove_dead_leftovers(root: Path | None = None, dry_run: bool = False) -> tuple[list[str], int]:
    removed, freed = [], 0
    for path, pid in iter_leftovers(root):
        if process_alive(pid):
            continue
        removed.append(str(path))
        freed += dir_bytes(path) if dry_run else remove_tree(path)
    return removed, freed


# ---------------------------------------------------------------------------------------------
# MLflow


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
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            rows = con.execute(sql).fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return []
            raise
        finally:
            con.close()
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
            out.append({"run_id": r.info.run_id, "status": r.info.status, "dagster_run_id": tags["dagster.run_id"],
                        "role": tags.get("dagster.role", "")})
    return out


def _terminate(client: Any, run_id: str, status: str, reason: str, end_time_ms: int | None = None) -> None:
    client.set_tag(run_id, "dagster.recovery", reason[:5000])
    client.set_terminated(run_id, status, end_time=end_time_ms)


def _run_statuses(instance: Any, run_ids: Iterable[str]) -> dict[str, Any]:
    """Dagster run id → RunRecord, for the ids this instance knows (one query)."""
    from dagster import RunsFilter

    ids = sorted(set(run_ids))
    if not ids:
        return {}
    return {r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter(run_ids=ids))}


def _end_ms(record: Any) -> int | None:
    return int(record.end_time * 1000) if record is not None and record.end_time else None


# ---------------------------------------------------------------------------------------------
# recovery


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
        pids = sorted({rec.get(k) for rec in leases for k in ("pid", "ppid") if rec.get(k)})
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
    report: dict[str, Any] = {"runs_failed": [], "unknown": [], "young": [], "mlflow_killed": [], "mlflow_parents": [],
                              "leftovers_removed": [], "leases_removed": [], "errors": []}
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
        _end_mlflow_runs(instance, uri, active, set(report["runs_failed"]), report)
    except Exception as e:
        report["errors"].append(f"mlflow: {type(e).__name__}: {e}")

    try:
        for run_id in report["runs_failed"]:
            remove_tree(leases_root() / run_id)
            report["leases_removed"].append(run_id)
        report["leases_removed"] += _remove_ended_leases(instance, set(active) | set(report["leases_removed"]))
        if clean_leftovers:
            report["leftovers_removed"], _ = remove_dead_leftovers()
    except Exception as e:
        report["errors"].append(f"files: {type(e).__name__}: {e}")
    report["ms"] = round((time.perf_counter() - t0) * 1000, 1)
    return report


def _end_mlflow_runs(instance: Any, uri: str, active: dict[str, Any], failed: set[str], report: dict[str, Any]) -> None:
    """RUNNING MLflow runs of Dagster runs that are not running any more → KILLED; their parents
    mirror the Dagster status."""
    running = [r for r in _mlflow_runs(uri, "running") if r["dagster_run_id"] not in active]
    if not running:
        return
    records = _run_statuses(instance, {r["dagster_run_id"] for r in running})
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


def _remove_ended_leases(instance: Any, skip: set[str]) -> list[str]:
    """Lease folders of runs that have ended (or that this instance does not know and whose
    processes are all gone)."""
    root = leases_root()
    try:
        names = [e.name for e in os.scandir(root) if e.is_dir() and e.name not in skip]
    except FileNotFoundError:
        return []
    if not names:
        return []
    records = _run_statuses(instance, names)
    removed = []
    for run_id in names:
        record = records.get(run_id)
        if record is not None:
            ended = record.dagster_run.is_finished
        else:
            ended = lease_verdict(read_leases(run_id)) == "dead"
        if ended:
            remove_tree(root / run_id)
            removed.append(run_id)
    return removed


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
    records = _run_statuses(instance, {r["dagster_run_id"] for r in parents + running})
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


# ---------------------------------------------------------------------------------------------
# retention


def _asset_key_of(folder: Path, root: Path) -> tuple[str, ...]:
    return folder.relative_to(root).parts


def _newest_mtime(path: Path) -> float:
    newest = path.stat().st_mtime
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                pass
    return newest


def prune(
    keep_last: int = 3,
    instance: Any = None,
    *,
    assets: Iterable[str] | None = None,
    checkpoint_max_age_days: float | None = 7.0,
    dry_run: bool = False,
    tracking_uri: str | None = None,
) -> dict[str, Any]:
    """Retention of the state folder: `<state>/artifacts/<asset...>/<run id>/` folders, then the
    history that only they needed (`prune_history`: Dagster runs, MLflow runs and their artifacts),
    lease folders and lock files.

    Per asset folder keeps the newest `keep_last` run folders (by mtime), plus the run of the
    asset's latest materialization in the Dagster instance (what downstream steps read) and every
    run still STARTING/STARTED; deletes the rest (renamed aside first, so no half-deleted folder is
    ever visible under its run id). Partitioned assets are left alone. Also removes `.partial-<pid>`
    leftovers of dead pids, lease folders of ended runs, and (unless `checkpoint_max_age_days` is
    None) checkpoint scratch folders `<state>/checkpoints/<asset>/<hash>/` untouched for that long,
    and the empty lock files of checkpoint folders that are gone (`remove_stale_locks`).
    Then `prune_history`: a Dagster run that no longer holds anything kept (see there) is deleted
    with its event log and compute logs, and its MLflow runs with their artifacts (MLflow's own
    deletion, then its garbage collection); the SQLite stores are compacted.

    instance: the DagsterInstance (default: DAGSTER_HOME's, if it exists; without one only the
        newest `keep_last` are kept). assets: only these asset folders ("a/b" for key ["a","b"]).
    One prune at a time: returns {"skipped": ...} when another process is pruning.
    Returns {"deleted": [...], "kept": n, "bytes_freed": n, "bytes_freed_by": {"artifacts": n,
    "dagster": n, "mlflow": n, ...}, "dagster_runs_deleted": [...], "mlflow_runs_deleted": [...], ...}.
    """
    if keep_last < 1:
        raise ValueError("keep_last must be at least 1")
    t0 = time.perf_counter()
    root = artifacts_root()
    report: dict[str, Any] = {"deleted": [], "kept": 0, "bytes_freed": 0, "leftovers_removed": [],
                              "checkpoints_removed": [], "leases_removed": [], "skipped_partitioned": [],
                              "locks_removed": [], "dagster_runs_deleted": [], "mlflow_runs_deleted": [],
                              "bytes_freed_by": {}, "errors": [], "dry_run": dry_run}
    with file_lock(state_root() / ".prune.lock", blocking=False) as got:
        if not got:
            report["skipped"] = "another prune is running"
            return report
        own_instance = False
        if instance is None:
            instance, own_instance = _default_instance(), True
        try:
            _prune_locked(keep_last, instance, assets, checkpoint_max_age_days, dry_run, root, report)
            report["bytes_freed_by"]["artifacts"] = report["bytes_freed"]
            if instance is not None:
                prune_history(instance, tracking_uri or default_tracking_uri(), keep_last, dry_run, report)
            report["bytes_freed"] = sum(report["bytes_freed_by"].values())
        finally:
            if own_instance and instance is not None:
                instance.dispose()
    report["ms"] = round((time.perf_counter() - t0) * 1000, 1)
    return report


def _default_instance() -> Any:
    from .services import dagster_storage, open_instance
    from .state import dagster_home

    home = dagster_home()
    if dagster_storage(home) is None and not (home / "history" / "runs.db").exists():
        return None  # no instance yet: nothing materialized to protect
    return open_instance(home)


def _prune_locked(keep_last: int, instance: Any, assets: Iterable[str] | None, max_age_days: float | None,
                  dry_run: bool, root: Path, report: dict[str, Any]) -> None:
    # run folders, grouped by asset folder
    groups: dict[Path, list[Path]] = {}
    for folder, is_run in _walk_artifacts(root):
        if is_run:
            groups.setdefault(folder.parent, []).append(folder)
    if assets is not None:
        wanted = {root / a for a in assets}
        groups = {k: v for k, v in groups.items() if k in wanted}

    protected_runs: set[str] = set()
    latest: dict[tuple[str, ...], str | None] = {}
    partitioned: set[tuple[str, ...]] = set()
    if instance is not None and groups:
        from dagster import AssetKey, DagsterRunStatus, RunsFilter

        active = instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]))
        protected_runs = {r.dagster_run.run_id for r in active}
        keys = [AssetKey(list(_asset_key_of(f, root))) for f in groups]
        for rec in instance.get_asset_records(keys):
            entry = rec.asset_entry.last_materialization
            k = tuple(rec.asset_entry.asset_key.path)
            latest[k] = entry.run_id if entry else None
            if entry and entry.dagster_event and entry.dagster_event.partition:
                partitioned.add(k)

    for asset_folder, runs in sorted(groups.items()):
        key = _asset_key_of(asset_folder, root)
        if key in partitioned:
            report["skipped_partitioned"].append("/".join(key))
            report["kept"] += len(runs)
            continue
        stats = []
        for r in runs:
            try:
                stats.append((r.stat().st_mtime, r))
            except FileNotFoundError:
                continue
        stats.sort(reverse=True)
        keep = {r for _, r in stats[:keep_last]}
        for _, r in stats:
            if r in keep or r.name == latest.get(key) or r.name in protected_runs:
                report["kept"] += 1
                continue
            report["deleted"].append(str(r))
            if dry_run:
                report["bytes_freed"] += dir_bytes(r)
                continue
            aside = r.parent / f".{r.name}.pruning-{os.getpid()}"
            try:
                os.rename(r, aside)
            except FileNotFoundError:
                continue
            report["bytes_freed"] += remove_tree(aside)

    removed, freed = remove_dead_leftovers(root, dry_run=dry_run)
    report["leftovers_removed"] = removed
    report["bytes_freed"] += freed

    if max_age_days is not None:
        cutoff = time.time() - max_age_days * 86400
        ck = checkpoints_root()
        for asset_dir in sorted(ck.iterdir()) if ck.is_dir() else []:
            for scratch in sorted(asset_dir.iterdir()) if asset_dir.is_dir() else []:
                if _newest_mtime(scratch) < cutoff:
                    report["checkpoints_removed"].append(str(scratch))
                    report["bytes_freed"] += dir_bytes(scratch) if dry_run else remove_tree(scratch)

    if instance is not None and not dry_run:
        report["leases_removed"] = _remove_ended_leases(instance, set())
    report["locks_removed"] = remove_stale_locks(dry_run=dry_run)


def remove_stale_locks(dry_run: bool = False) -> list[str]:
    """Empty `<folder>.lock` files under the checkpoints tree whose folder is gone and that no
    process holds: each is taken (non-blocking) before it is unlinked, and a waiter that then gets
    the lock of an unlinked file notices and opens the new one (language_model.exclusive)."""
    import fcntl

    removed = []
    root = checkpoints_root()
    for lock in sorted(root.rglob("*.lock")) if root.is_dir() else []:
        if lock.with_suffix("").exists() or lock.stat().st_size:
            continue
        with open(lock, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # held: a training is using it
            if not dry_run:
                lock.unlink(missing_ok=True)
            removed.append(str(lock))
    return removed


# What a run is in Dagster's terms when nothing of it may go: it has not ended.
def _referenced_runs(instance: Any, keep_last: int, registered: set[str]) -> set[str]:
    """Dagster runs that hold something kept: not ended; a run folder still in the artifacts tree;
    the latest materialization of an asset (of every partition of a partitioned one); an MLflow
    registered model version (`registered`); the newest `keep_last` runs (recent history, failures
    included)."""
    from dagster import AssetRecordsFilter, DagsterEventType

    keep: set[str] = set(registered)
    records = instance.get_run_records(order_by="create_timestamp", ascending=False)
    keep |= {r.dagster_run.run_id for r in records if not r.dagster_run.is_finished}
    keep |= {r.dagster_run.run_id for r in records[:keep_last]}
    keep |= {folder.name for folder, is_run in _walk_artifacts(artifacts_root()) if is_run}
    for rec in instance.get_asset_records():
        entry = rec.asset_entry.last_materialization
        if entry is None:
            continue
        keep.add(entry.run_id)
        if entry.dagster_event and entry.dagster_event.partition:
            key = rec.asset_entry.asset_key
            ids = list(
                instance.get_latest_storage_id_by_partition(key, DagsterEventType.ASSET_MATERIALIZATION).values()
            )
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                result = instance.fetch_materializations(
                    AssetRecordsFilter(asset_key=key, storage_ids=chunk), limit=len(chunk)
                )
                keep |= {r.run_id for r in result.records}
    return keep


def _registered_model_runs(client: Any) -> tuple[set[str], set[str]]:
    """(MLflow run ids, Dagster run ids) behind every registered model version."""
    mlflow_ids, dagster_ids = set(), set()
    for mv in client.search_model_versions(max_results=10000):
        if mv.run_id:
            mlflow_ids.add(mv.run_id)
        if (mv.tags or {}).get("dagster.run_id"):
            dagster_ids.add(mv.tags["dagster.run_id"])
    for run_id in list(mlflow_ids):
        try:
            tag = client.get_run(run_id).data.tags.get("dagster.run_id")
        except Exception:  # a version whose run is gone already
            continue
        if tag:
            dagster_ids.add(tag)
    return mlflow_ids, dagster_ids


def _vacuum(db: Path) -> None:
    """Give a SQLite file's free pages back to the disk; skipped while another process writes."""
    if not db.is_file():
        return
    con = sqlite3.connect(str(db), timeout=1)
    try:
        con.execute("VACUUM")
    except sqlite3.OperationalError:
        pass
    finally:
        con.close()


def prune_history(instance: Any, tracking_uri: str, keep_last: int, dry_run: bool, report: dict[str, Any]) -> None:
    """Delete the Dagster runs that hold nothing kept (`_referenced_runs`) and everything of theirs:
    the run and its event log (Dagster's `delete_run`), its compute logs, its MLflow runs (deleted,
    then garbage-collected by MLflow's `gc`, which removes their artifacts). Never a run that has not
    ended, the run of an asset's latest materialization, or an MLflow run behind a registered model
    version. The SQLite stores are compacted afterwards; the bytes freed are counted per store."""
    from mlflow.tracking import MlflowClient

    from .services import check_tracking_store, is_server_uri
    from .state import dagster_home

    home, db = dagster_home(), sqlite_path(tracking_uri)
    mlflow_dir = db.parent if db else None
    before = {"dagster": dir_bytes(home), "mlflow": dir_bytes(mlflow_dir) if mlflow_dir else 0}
    try:
        if is_server_uri(tracking_uri):
            check_tracking_store(tracking_uri)
        client = MlflowClient(tracking_uri=tracking_uri)
        registered_mlflow, registered_dagster = _registered_model_runs(client)
        keep = _referenced_runs(instance, keep_last, registered_dagster)
        doomed = [r.dagster_run.run_id for r in instance.get_run_records()
                  if r.dagster_run.is_finished and r.dagster_run.run_id not in keep]
        if not doomed:
            return
        mlflow_doomed = []
        exps = [e.experiment_id for e in client.search_experiments()]
        for dagster_run_id in doomed:
            for run in client.search_runs(
                exps, filter_string=f"tags.`dagster.run_id` = '{dagster_run_id}'", max_results=50000
            ):
                if run.info.run_id not in registered_mlflow:
                    mlflow_doomed.append(run.info.run_id)
        report["dagster_runs_deleted"] = doomed
        report["mlflow_runs_deleted"] = mlflow_doomed
        if dry_run:
            return
        for run_id in mlflow_doomed:
            client.delete_run(run_id)
        if mlflow_doomed:
            _mlflow_gc(tracking_uri, mlflow_doomed)
        for run_id in doomed:
            instance.delete_run(run_id)
            remove_tree(home / "storage" / run_id)  # the local compute log manager's stdout/stderr files
            for suffix in (".db", ".db-wal", ".db-shm"):  # SQLite storage: the run's own event log file
                (home / "history" / "runs" / f"{run_id}{suffix}").unlink(missing_ok=True)
        for sqlite_db in [home / "history" / "runs.db", home / "history" / "runs" / "index.db", *( [db] if db else [])]:
            _vacuum(sqlite_db)
    except Exception as e:  # housekeeping never fails the caller
        report["errors"].append(f"history: {type(e).__name__}: {e}")
    finally:
        if not dry_run:
            report["bytes_freed_by"]["dagster"] = max(0, before["dagster"] - dir_bytes(home))
            if mlflow_dir:
                report["bytes_freed_by"]["mlflow"] = max(0, before["mlflow"] - dir_bytes(mlflow_dir))


def _mlflow_gc(tracking_uri: str, run_ids: list[str]) -> None:
    """MLflow's own garbage collection (`mlflow gc`) of these deleted runs: rows and artifacts."""
    import subprocess
    import sys

    if (
        sqlite_path(tracking_uri) is None
        and "://" in tracking_uri
        and tracking_uri.split("://")[0] in ("http", "https")
    ):
        return  # a server's backend store is the server's to collect (`mlflow gc` where it runs)
    subprocess.run(
        [sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", tracking_uri, "--tracking-uri", tracking_uri,
         "--run-ids", ",".join(run_ids)],
        check=True, capture_output=True, text=True, timeout=600,
    )


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
