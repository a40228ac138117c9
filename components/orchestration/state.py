"""Where all state lives, and its one-time, race-free initialisation.

One folder, overridable by the PIPELINE_STATE_DIR environment variable. Inside it: `dagster/`
(DAGSTER_HOME: the instance, SQLite, unless DAGSTER_HOME points elsewhere), `mlflow/` (tracking DB
and artifacts), `artifacts/` (asset files, laid out by asset / run), `checkpoints/` (resumable
training scratch), `leases/` (which process runs which step; see `leases.py`). Paths are absolute
so every step process shares them.

`ensure_stores()` creates the Dagster and MLflow SQLite stores exactly once, under an exclusive
lock, whoever comes first: two processes that each create a fresh SQLite store race in their
schema migrations (Alembic) and leave it broken for good ("more than one head", "table
_alembic_tmp_tags already exists"). A marker file makes every later call a few `stat`s.

The same holds for stores that are services (`services.py`): a Dagster instance on PostgreSQL
(its dagster.yaml names the storage) is migrated once and gets the pool limit; an MLflow tracking
server or database (MLFLOW_TRACKING_URI) is asked once per process whether it answers, and gets the
experiment. One that does not answer fails in seconds with the setting to fix.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterator

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ENV_VAR = "PIPELINE_STATE_DIR"
MLFLOW_EXPERIMENT = "wordvec-to-transformer"
TRAINING_POOL = "training"  # the Dagster concurrency pool of the training assets (limit 1)

INIT_LOCK = ".init.lock"
MARKER = ".stores-ready.json"

# Written into $DAGSTER_HOME/dagster.yaml when that file is missing or empty (a user's non-empty
# file is never touched). Checked against dagster 1.13.27's instance schema by tests/test_state.py.
DAGSTER_YAML = """\
# Written by `python -m pipelines.maintenance init` (components/orchestration/state.py) because this
# file was missing or empty. Edit freely: a non-empty dagster.yaml is never overwritten.
telemetry:
  enabled: false
nux:
  enabled: false

# The daemon (`dagster dev`) fails runs stuck in STARTING or CANCELING and frees the pool slots of
# ended runs. With the default run launcher it cannot see a run worker that died in STARTED: that
# is what `python -m pipelines.maintenance recover` (called by every step, the scripts and the
# recovery sensor) does from the process leases in <state>/leases.
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  cancel_timeout_seconds: 180
  poll_interval_seconds: 60
  free_slots_after_run_end_seconds: 60

concurrency:
  pools:
    # Pools without their own limit get this one: the training assets' pool `training` runs one
    # step at a time across all runs (enforced by the run's executor, so it holds for
    # `dagster job execute` too, without the daemon). Per pool: dagster instance concurrency set training 2
    default_limit: 1
  runs:
    # Runs launched from the UI, schedules and sensors queue beyond this (2-core machine).
    max_concurrent_runs: 4

# Tick history of schedules and sensors (the automation sensor ticks every 30 s).
retention:
  schedule:
    purge_after_days: 30
  sensor:
    purge_after_days:
      skipped: 1
      failure: 30
      success: 30
  auto_materialize:
    purge_after_days:
      skipped: 1
      failure: 30
      success: 30
"""


def state_root() -> Path:
    root = Path(os.environ.get(ENV_VAR) or PROJECT_ROOT / ".state").expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def artifacts_root() -> Path:
    return state_root() / "artifacts"


def mlflow_root() -> Path:
    return state_root() / "mlflow"


def checkpoints_root() -> Path:
    return state_root() / "checkpoints"


def leases_root() -> Path:
    return state_root() / "leases"


def dagster_home() -> Path:
    """DAGSTER_HOME if set, else `<state>/dagster` (what scripts/env.sh exports)."""
    home = os.environ.get("DAGSTER_HOME")
    return Path(home).expanduser().resolve() if home else state_root() / "dagster"


def local_tracking_uri() -> str:
    """The MLflow SQLite store inside the state folder (absolute, so step processes share it)."""
    return f"sqlite:///{mlflow_root() / 'mlflow.db'}"


def default_tracking_uri() -> str:
    """MLFLOW_TRACKING_URI when set (a server, e.g. http://127.0.0.1:5000, or a database), else the
    local SQLite store. What the tracker, recovery and maintenance use unless given a URI."""
    from .services import TRACKING_URI_ENV

    return os.environ.get(TRACKING_URI_ENV) or local_tracking_uri()


def experiment_artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: a server decides (None: its artifact root, e.g.
    `mlflow-artifacts:/` served through it); a store opened directly keeps them beside a SQLite
    file, else in the state folder."""
    from .services import is_server_uri

    if is_server_uri(uri):
        return None
    db = sqlite_path(uri)
    return ((db.parent if db else mlflow_root()) / "artifacts").as_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///...` URI, None for any other URI."""
    if not uri.startswith("sqlite:///"):
        return None
    rest = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(rest).expanduser().resolve()


@contextlib.contextmanager
def file_lock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive fcntl lock on `path` (created if needed); yields False if `blocking` is False and
    another process holds it. Released when the block ends or the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_dagster_yaml(home: Path | None = None) -> bool:
    """Write the project's dagster.yaml into DAGSTER_HOME if it is missing or empty. True if written."""
    home = home or dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    if path.exists() and path.read_text().strip():
        return False
    tmp = path.with_name(f".dagster.yaml.{os.getpid()}.tmp")
    tmp.write_text(DAGSTER_YAML)
    os.replace(tmp, path)
    return True


_VERSION_RE = re.compile(r"^(?:__version__|VERSION)\s*=\s*['\"]([^'\"]+)['\"]", re.M)


def _version(package: str) -> str:
    """The installed version of dagster / mlflow, without importing it (≈0.1 ms, not the ≈15 ms of
    importlib.metadata): from the loaded module, else from the package's version.py."""
    mod = sys.modules.get(f"{package}.version")
    if mod is not None:
        v = getattr(mod, "__version__", None) or getattr(mod, "VERSION", None)
        if v:
            return str(v)
    try:
        import importlib.util

        spec = importlib.util.find_spec(package)
        if spec and spec.origin:
            m = _VERSION_RE.search((Path(spec.origin).parent / "version.py").read_text())
            if m:
                return m.group(1)
    except (ImportError, OSError, ValueError):
        pass
    import importlib.metadata

    return importlib.metadata.version(package)


def _read_marker(root: Path) -> dict[str, Any]:
    try:
        return json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def _write_marker(root: Path, marker: dict[str, Any]) -> None:
    tmp = root / f"{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(marker, indent=2, sort_keys=True))
    os.replace(tmp, root / MARKER)


def _dagster_key(home: Path) -> str:
    """The marker's key of the instance's storage: DAGSTER_HOME for SQLite files, else the database
    that its dagster.yaml names (services.dagster_storage)."""
    from .services import dagster_storage

    storage = dagster_storage(home)
    return storage["key"] if storage else str(home)


def _dagster_ready(marker: dict[str, Any], home: Path) -> bool:
    key = _dagster_key(home)
    return (
        marker.get("dagster", {}).get(key) == _version("dagster")
        and (key != str(home) or (home / "history" / "runs.db").exists())
        and (home / "dagster.yaml").exists()
        and (home / "dagster.yaml").stat().st_size > 0
    )


def _mlflow_key(uri: str) -> str:
    from .services import redact

    return redact(uri)


def _mlflow_ready(marker: dict[str, Any], uri: str) -> bool:
    if marker.get("mlflow", {}).get(_mlflow_key(uri)) != _version("mlflow"):
        return False
    db = sqlite_path(uri)
    return db is None or db.exists()


_READY: set[tuple[str, str]] = set()  # (kind, target) known ready in this process


def ensure_stores(
    tracking_uri: str | None = None, dagster: bool | None = None, setting: str | None = None
) -> dict[str, Any]:
    """Create the Dagster instance's storage and the MLflow store once, safely under concurrency.

    tracking_uri: the MLflow store (default: MLFLOW_TRACKING_URI, else the SQLite DB in the state
        folder). A SQLite or other database store is created and migrated here, with the experiment
        `wordvec-to-transformer` (artifacts in `<state>/mlflow/artifacts`); a server (http://...)
        migrates its own database: here it must answer (once per process), and gets the experiment
        (artifacts where the server keeps them).
    dagster: initialise DAGSTER_HOME's instance too (default: when DAGSTER_HOME is set; without it
        Dagster runs on ephemeral instances and there is nothing to create). Also writes
        dagster.yaml when missing or empty, and the `training` pool limit (1). Its storage is SQLite
        files in DAGSTER_HOME unless dagster.yaml names another (configs/deploy/dagster.yaml:
        PostgreSQL), which must answer.
    setting: where tracking_uri came from, for the error when it does not answer.
    A store that does not answer raises services.StoreUnreachable, naming the setting, in seconds.

    Cheap when already done (an in-process set, else a marker file and a few `stat`s); otherwise
    takes an exclusive lock on `<state>/.init.lock`, so N processes starting at once create each
    store exactly once. A new dagster/mlflow version re-runs the migrations once. Returns what it did.
    """
    from .services import check_tracking_store, redact

    uri = tracking_uri or default_tracking_uri()
    do_dagster = bool(os.environ.get("DAGSTER_HOME")) if dagster is None else dagster
    home = dagster_home()
    todo_dagster = do_dagster and ("dagster", str(home)) not in _READY
    todo_mlflow = ("mlflow", uri) not in _READY
    report: dict[str, Any] = {
        "dagster_home": str(home) if do_dagster else None,
        "tracking_uri": redact(uri),
        "initialized": [],
    }
    if not (todo_dagster or todo_mlflow):
        return report
    if todo_mlflow:
        check_tracking_store(uri, setting)  # a server or database answers, else a clear error (no-op for SQLite)
    root = state_root()
    marker = _read_marker(root)
    if todo_dagster and _dagster_ready(marker, home):
        _READY.add(("dagster", str(home)))
        todo_dagster = False
    if todo_mlflow and _mlflow_ready(marker, uri):
        _READY.add(("mlflow", uri))
        todo_mlflow = False
    if not (todo_dagster or todo_mlflow):
        return report
    with file_lock(root / INIT_LOCK):
        marker = _read_marker(root)  # another process may have finished while we waited
        if todo_dagster and not _dagster_ready(marker, home):
            report["dagster_yaml_written"] = write_dagster_yaml(home)
            report["dagster_storage"] = _init_dagster(home)
            marker.setdefault("dagster", {})[_dagster_key(home)] = _version("dagster")
            _write_marker(root, marker)
            report["initialized"].append("dagster")
        if todo_mlflow and not _mlflow_ready(marker, uri):
            if _init_mlflow(uri):
                marker.setdefault("mlflow", {})[_mlflow_key(uri)] = _version("mlflow")
                _write_marker(root, marker)
                report["initialized"].append("mlflow")
    if do_dagster:
        _READY.add(("dagster", str(home)))
    _READY.add(("mlflow", uri))
    return report


def _init_dagster(home: Path) -> str:
    """Create (or migrate) the instance's storage (SQLite files, or the database its dagster.yaml
    names, which must answer first); set the training pool's limit once. Returns where it is."""
    from .services import open_instance

    with contextlib.redirect_stdout(io.StringIO()):  # upgrade() prints progress lines
        instance = open_instance(home)
        try:
            instance.upgrade()
            instance.get_run_records(limit=1)
            storage = instance.event_log_storage
            if storage.supports_global_concurrency_limits:
                if not any(p.name == TRAINING_POOL for p in storage.get_pool_limits()):
                    storage.set_concurrency_slots(TRAINING_POOL, 1)
            unpause_legacy_auto_materialize(instance)
            return _storage_name(instance, home)
        finally:
            instance.dispose()


def unpause_legacy_auto_materialize(instance: Any) -> None:
    """Clear the instance-wide "auto-materialize paused" flag of Dagster's pre-sensor automation
    (unset means paused). With automation run by sensors (the default since 1.9, and here the
    `downstream_automation` sensor) nothing reads it any more, but the UI's job and asset-group pages
    still show it as the "Auto-materialize off/on" badge: unpaused, the badge agrees with the
    sensor, which starts running. Whether automation runs is the sensor's switch (Automation page)."""
    from dagster._daemon.asset_daemon import get_auto_materialize_paused, set_auto_materialize_paused

    if get_auto_materialize_paused(instance):
        set_auto_materialize_paused(instance, False)


def _storage_name(instance: Any, home: Path) -> str:
    from .services import check_dagster_storage, single_host

    if single_host(instance):
        return f"sqlite: {home}"
    storage = check_dagster_storage(home)  # (answered a moment ago)
    return (storage or {}).get("target") or type(instance.run_storage).__name__


def _init_mlflow(uri: str) -> bool:
    """Create / migrate a tracking database (SQLite file or server database opened directly) and the
    experiment; for a server, only the experiment (the server migrates its own database)."""
    from .services import is_database_uri, is_server_uri

    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    elif not (is_server_uri(uri) or is_database_uri(uri)):
        return False  # another kind of store (databricks, ...): left to its owner
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    try:
        client.search_experiments(max_results=1)  # creates the tables of a fresh DB
    except MlflowException as e:
        if "out-of-date database schema" not in str(e):
            raise
        from mlflow.store.db.utils import _upgrade_db, create_sqlalchemy_engine_with_retry

        engine = create_sqlalchemy_engine_with_retry(uri)
        _upgrade_db(engine)
        engine.dispose()
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
    exp = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
    if exp is None:
        try:
            client.create_experiment(MLFLOW_EXPERIMENT, artifact_location=experiment_artifact_location(uri))
        except MlflowException:  # a process on another machine created it meanwhile (a shared server)
            if client.get_experiment_by_name(MLFLOW_EXPERIMENT) is None:
                raise
    elif exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    return True


# --- the UIs' addresses -----------------------------------------------------------------------
# Every link a run records (Dagster metadata `mlflow_url`, `report_url`; the Dagster run's
# `mlflow/parent_run_url`; MLflow's `dagster.run_url`, descriptions and registry tags; the links in
# report.html) is an absolute URL into the other UI, frozen when the asset is built. So that they
# keep working, a state folder has one pair of addresses, recorded by whatever uses the folder first
# (from DAGSTER_UI_URL and MLFLOW_UI_URL, else the defaults): every later run links there, and
# scripts/ui.sh and scripts/mlflow_ui.sh serve there, saying so when a different address is asked for.
UI_ADDRESSES = "ui_addresses.json"
DEFAULT_UI_ADDRESSES = {"dagster": "http://127.0.0.1:3000", "mlflow": "http://127.0.0.1:5000"}
UI_ADDRESS_ENV = {"dagster": "DAGSTER_UI_URL", "mlflow": "MLFLOW_UI_URL"}


def _check_address(url: str, setting: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ValueError(f"{setting}: {url!r} is not an http(s) address with a port, such as http://127.0.0.1:3000")
    return url.strip().rstrip("/")


def ui_addresses() -> dict[str, str]:
    """The state folder's recorded UI addresses (`<state>/ui_addresses.json`), recorded on first use
    from DAGSTER_UI_URL / MLFLOW_UI_URL (else the defaults); later changes of those variables do not
    move them (see `record_ui_addresses`)."""
    path = state_root() / UI_ADDRESSES
    try:
        recorded = json.loads(path.read_text())
        if all(isinstance(recorded.get(k), str) for k in DEFAULT_UI_ADDRESSES):
            return {k: recorded[k] for k in DEFAULT_UI_ADDRESSES}
    except FileNotFoundError:
        pass
    except ValueError as e:
        raise ValueError(f"{path}: not the JSON of the UI addresses ({e}); delete it to record them again") from e
    wanted = {
        k: _check_address(os.environ.get(env) or DEFAULT_UI_ADDRESSES[k], env) for k, env in UI_ADDRESS_ENV.items()
    }
    tmp = path.with_name(f"{UI_ADDRESSES}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(wanted, indent=1))
    try:
        os.link(tmp, path)  # first writer wins; a process that lost the race reads the winner's
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return ui_addresses()


def record_ui_addresses(dagster: str | None = None, mlflow: str | None = None) -> dict[str, str]:
    """Move the recorded addresses (links recorded from then on point there; those recorded
    before keep the old address)."""
    current = ui_addresses()
    new = {**current, **{k: _check_address(v, f"--{k}") for k, v in (("dagster", dagster), ("mlflow", mlflow)) if v}}
    path = state_root() / UI_ADDRESSES
    tmp = path.with_name(f"{UI_ADDRESSES}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(new, indent=1))
    os.replace(tmp, path)
    return new
