"""Which process runs which step of which Dagster run: the evidence `recovery.py` judges a run by.

Leases. Every asset step runs inside `run_lease(run_id, step_key)`, which writes
`<state>/leases/<run_id>/<step_key>.json` (this process and its parent, each with its start time
from /proc/<pid>/stat, so a reused pid is not mistaken for it, and the host) and removes it when the
step ends, however it ends. It also writes `<state>/leases/<run_id>/_run.json`, the run's last lease,
which stays until the run has ended: between steps it still names the run worker (the step's
parent), which is alive for as long as the run is. `remove_ended_leases` removes the lease folders
of runs that have ended (recovery and retention call it).

Beside the leases, the pids Dagster itself records in a run's engine events (`event_pid_verdict`)
are evidence too; how the two are weighed is the rule in `recovery.py`. Process ids are evidence
only on the machine that wrote them: leases carry their host, those pids do not.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from .artifact_tree import remove_tree
from .procs import process_alive, process_start_epoch, process_start_ticks
from .state import leases_root

RUN_LEASE = "_run.json"
START_SLACK_S = 2.0  # /proc start times are in clock ticks since a boot time known to the second


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-\[\]]", "_", s)


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


def run_statuses(instance: Any, run_ids: Iterable[str]) -> dict[str, Any]:
    """Dagster run id → RunRecord, for the ids this instance knows (one query)."""
    from dagster import RunsFilter

    ids = sorted(set(run_ids))
    if not ids:
        return {}
    return {r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter(run_ids=ids))}


def remove_ended_leases(instance: Any, skip: set[str]) -> list[str]:
    """Lease folders of runs that have ended (or that this instance does not know and whose
    processes are all gone)."""
    root = leases_root()
    try:
        names = [e.name for e in os.scandir(root) if e.is_dir() and e.name not in skip]
    except FileNotFoundError:
        return []
    if not names:
        return []
    records = run_statuses(instance, names)
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
