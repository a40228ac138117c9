"""Retention of the state folder (`prune`): old run folders of the artifacts tree, the Dagster and
MLflow history that only they needed (`prune_history`), leftovers of dead processes, checkpoint
scratch folders untouched for long, lease folders of ended runs and stale lock files.

What is kept: per asset folder the newest `keep_last` run folders, the run of the asset's latest
materialization (what downstream steps read; every partition's for a partitioned asset, whose
folders are left alone), every run that has not ended, and every MLflow run behind a registered
model version. See `prune` and `prune_history`; `scripts/prune.sh` and `python -m
pipelines.maintenance` run it, and a step prunes its own asset when `keep_last()` is above 0 (`stage.py`).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable

from .artifact_tree import dir_bytes, remove_dead_leftovers, remove_tree, walk_artifacts
from .leases import remove_ended_leases
from .state import artifacts_root, checkpoints_root, default_tracking_uri, file_lock, sqlite_path, state_root


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
    report: dict[str, Any] = {
        "deleted": [],
        "kept": 0,
        "bytes_freed": 0,
        "leftovers_removed": [],
        "checkpoints_removed": [],
        "leases_removed": [],
        "skipped_partitioned": [],
        "locks_removed": [],
        "dagster_runs_deleted": [],
        "mlflow_runs_deleted": [],
        "bytes_freed_by": {},
        "errors": [],
        "dry_run": dry_run,
    }
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


def _prune_locked(
    keep_last: int,
    instance: Any,
    assets: Iterable[str] | None,
    max_age_days: float | None,
    dry_run: bool,
    root: Path,
    report: dict[str, Any],
) -> None:
    # run folders, grouped by asset folder
    groups: dict[Path, list[Path]] = {}
    for folder, is_run in walk_artifacts(root):
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
        report["leases_removed"] = remove_ended_leases(instance, set())
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
    keep |= {folder.name for folder, is_run in walk_artifacts(artifacts_root()) if is_run}
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
                chunk = ids[start : start + 500]
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
        doomed = [
            r.dagster_run.run_id
            for r in instance.get_run_records()
            if r.dagster_run.is_finished and r.dagster_run.run_id not in keep
        ]
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
        for sqlite_db in [home / "history" / "runs.db", home / "history" / "runs" / "index.db", *([db] if db else [])]:
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
        [
            sys.executable,
            "-m",
            "mlflow",
            "gc",
            "--backend-store-uri",
            tracking_uri,
            "--tracking-uri",
            tracking_uri,
            "--run-ids",
            ",".join(run_ids),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
