"""The stores when they are services: a Dagster instance whose storage is a database server
(PostgreSQL: configs/deploy/dagster.yaml) and an MLflow tracking server (scripts/mlflow_server_pg.sh)
or tracking database, instead of the embedded SQLite files of the state folder.

Their clients retry for a long time before they give up (dagster-postgres ≈12 s per storage, an
MLflow client ≈4 min against a closed port, `mlflow server` ≈2 min against an absent database) and
then name neither the setting nor the file. So whoever opens one first asks once, with a short
timeout (`check_*`), and a store that does not answer is a `StoreUnreachable` naming what to fix:
the environment variables of dagster.yaml's `env:` values, MLFLOW_TRACKING_URI or the resource
field. Passwords never appear in messages, reports or the state folder's marker (`redact`).

The embedded default (no `storage` in dagster.yaml, a `sqlite:` tracking URI) never comes here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"  # the one setting that points everything at another MLflow store
PROBE_TIMEOUT_S = 5.0
PROBE_TTL_S = 60.0  # a store that answered is not asked again for this long (per process)
STORAGE_KEYS = ("storage", "run_storage", "event_log_storage", "schedule_storage")
_STORAGE_RE = re.compile(r"^(?:storage|run_storage|event_log_storage|schedule_storage)\s*:", re.M)

_ANSWERED: dict[str, float] = {}


class StoreUnreachable(RuntimeError):
    """A store that does not answer or cannot be configured; the message names the setting to fix."""


def redact(uri: str) -> str:
    """The URI with its password (if any) replaced by ***."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.password is None:
        return uri
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def is_server_uri(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def is_database_uri(uri: str) -> bool:
    """A URI MLflow opens with SQLAlchemy itself (`sqlite:`, `postgresql+psycopg2:`, `mysql:` ...)."""
    return bool(re.match(r"^(sqlite|postgresql|mysql|mssql)(\+[a-z0-9_]+)?:", uri))


def tracking_setting(uri: str) -> str:
    """Where a tracking URI most likely came from, for messages."""
    if os.environ.get(TRACKING_URI_ENV) == uri:
        return f"the environment variable {TRACKING_URI_ENV}"
    return f"the tracking URI (resource `mlflow`, field `tracking_uri`; or {TRACKING_URI_ENV})"


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def check_database(url: str, what: str, setting: str) -> None:
    """Connect once (no retries, PostgreSQL's connect timeout PROBE_TIMEOUT_S) or raise StoreUnreachable."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    connect_args = {"connect_timeout": int(PROBE_TIMEOUT_S)} if url.startswith("postgresql") else {}
    try:
        engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=connect_args)
    except Exception as e:  # unknown driver / malformed URL
        raise StoreUnreachable(f"{what} at {redact(url)} cannot be opened ({setting}): {_first_line(e)}") from e
    try:
        with engine.connect():
            pass
    except Exception as e:
        raise StoreUnreachable(f"{what} at {redact(url)} is unreachable ({setting}): {_first_line(e)}") from e
    finally:
        engine.dispose()


def check_tracking_store(uri: str, setting: str | None = None) -> None:
    """An MLflow server answers on `<uri>/health` (any status below 500 counts: it is there), a
    tracking database accepts a connection; else StoreUnreachable naming `setting`. SQLite files
    and other schemes pass unasked. Remembered for PROBE_TTL_S once answered."""
    if uri.startswith("sqlite:") or not (is_server_uri(uri) or is_database_uri(uri)):
        return
    if time.monotonic() - _ANSWERED.get(uri, -1e9) < PROBE_TTL_S:
        return
    setting = setting or tracking_setting(uri)
    if is_server_uri(uri):
        import requests

        try:
            status = requests.get(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S).status_code
        except requests.RequestException as e:
            raise StoreUnreachable(
                f"MLflow tracking server {redact(uri)} is unreachable (set by {setting}): {_first_line(e)}"
            ) from e
        if status >= 500:
            raise StoreUnreachable(f"MLflow tracking server {redact(uri)} answers HTTP {status} (set by {setting})")
    else:
        check_database(uri, "MLflow tracking database", f"set by {setting}")
    _ANSWERED[uri] = time.monotonic()


# ---------------------------------------------------------------------------------------------
# Dagster's instance storage


def _env_names(node: Any) -> list[str]:
    """Environment variables named by `{env: NAME}` values, in order."""
    if isinstance(node, dict):
        if set(node) == {"env"} and isinstance(node["env"], str):
            return [node["env"]]
        return [n for v in node.values() for n in _env_names(v)]
    if isinstance(node, list):
        return [n for v in node for n in _env_names(v)]
    return []


def dagster_storage(home: Path) -> dict[str, Any] | None:
    """The storage section of `<home>/dagster.yaml` when it names one, else None (the default:
    SQLite files in DAGSTER_HOME). Returns {"kind": "postgres" | "other", "key": ..., "env": [...],
    "section": ...}; `key` identifies the database (the section and its environment values, not the
    password) without importing Dagster, so it can key the state folder's marker."""
    path = home / "dagster.yaml"
    try:
        text = path.read_text()
    except OSError:
        return None
    if not _STORAGE_RE.search(text):
        return None
    import yaml

    cfg = yaml.safe_load(text) or {}
    section = {k: cfg[k] for k in STORAGE_KEYS if k in cfg}
    if not section:
        return None
    kind = "postgres" if isinstance(section.get("storage"), dict) and "postgres" in section["storage"] else "other"
    names = _env_names(section)
    ident = {"section": section, "env": {n: os.environ.get(n) for n in names if "PASSWORD" not in n.upper()}}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"kind": kind, "key": f"dagster-{kind}:{digest}", "env": names, "section": section, "path": str(path)}


def _settings(storage: dict[str, Any]) -> str:
    shown = [
        f"{n}=" + ("(set)" if "PASSWORD" in n.upper() and os.environ.get(n) else os.environ.get(n, "(not set)"))
        for n in dict.fromkeys(storage["env"])
    ]
    return ", ".join(shown) or "no environment variables"


def _gist(message: str) -> str:
    """The line of a Dagster config error that says what is wrong (an unset variable, a bad value)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    said = next((line for line in lines if "PostProcessingError:" in line), lines[0] if lines else message)
    return said.split("PostProcessingError:", 1)[-1].strip()


def postgres_url(home: Path, storage: dict[str, Any] | None = None) -> str:
    """The connection URL of a `storage: postgres:` instance, its `env:` values resolved by Dagster's
    own config processing; a missing variable is a StoreUnreachable naming it and the file."""
    storage = storage or dagster_storage(home)
    if not storage or storage["kind"] != "postgres":
        raise ValueError(f"{home / 'dagster.yaml'} does not configure `storage: postgres`")
    try:
        from dagster_postgres.utils import pg_url_from_config
    except ImportError as e:
        raise StoreUnreachable(
            f"{storage['path']} configures PostgreSQL storage, which needs dagster-postgres: pip install -e '.[deploy]'"
        ) from e
    from dagster._config import process_config
    from dagster._core.storage.config import pg_config

    where = f"{storage['path']} (storage.postgres)"
    try:
        result = process_config(pg_config(), storage["section"]["storage"]["postgres"])
    except Exception as e:  # a missing env var raises while post-processing
        raise StoreUnreachable(f"{where}: {_gist(str(e))}") from e
    if not result.success:
        raise StoreUnreachable(f"{where}: " + "; ".join(_gist(err.message) for err in result.errors or ()))
    if result.value is None:
        raise StoreUnreachable(f"{where}: Dagster's config processing gave no value")
    return pg_url_from_config(result.value)


def check_dagster_storage(home: Path) -> dict[str, Any] | None:
    """For a PostgreSQL instance: resolve its settings and connect once, else StoreUnreachable
    naming dagster.yaml and the environment variables it reads. Returns the storage (None: SQLite)."""
    storage = dagster_storage(home)
    if storage and storage["kind"] == "postgres":
        url = postgres_url(home, storage)
        check_database(
            url,
            "Dagster's instance storage (PostgreSQL)",
            f"{storage['path']} → storage.postgres, from {_settings(storage)}",
        )
        storage["target"] = redact(url)
    return storage


def open_instance(home: Path) -> Any:
    """`DagsterInstance.from_config(home)`, after the quick check of a PostgreSQL storage."""
    from dagster import DagsterInstance

    check_dagster_storage(home)
    return DagsterInstance.from_config(str(home))


def single_host(instance: Any) -> bool:
    """Whether every run of this instance runs on this machine: its storage is SQLite files (or in
    memory). A database server is shared by other machines, whose process ids mean nothing here."""
    from dagster._core.storage.runs.in_memory import InMemoryRunStorage
    from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage

    return isinstance(instance.run_storage, (SqliteRunStorage, InMemoryRunStorage))
