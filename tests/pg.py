"""Real servers on 127.0.0.1 for the tests: Debian's PostgreSQL in a temporary data folder on a free
port (initdb, pg_ctl; as the `postgres` user when the tests run as root, which PostgreSQL refuses),
and an MLflow tracking server on one of its databases started by scripts/mlflow_server_pg.sh.
Both are stopped when the `with` block ends, however it ends."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
USER = "pipeline"


def pg_bin() -> Path:
    """The folder of initdb / pg_ctl: $PG_BIN, the newest /usr/lib/postgresql/*/bin, or the PATH."""
    if os.environ.get("PG_BIN"):
        return Path(os.environ["PG_BIN"])
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0
    )
    if found:
        return found[-1].parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise RuntimeError(
        "PostgreSQL is not installed (no initdb): run `bash scripts/install_test_deps.sh` (apt package postgresql)"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Postgres:
    port: int
    password: str
    folder: Path
    host: str = "127.0.0.1"
    user: str = USER

    def url(self, db: str) -> str:
        return f"postgresql+psycopg2://{self.user}:{self.password}@{self.host}:{self.port}/{db}"

    def dagster_env(self, db: str, port: int | None = None) -> dict[str, str]:
        """The settings configs/deploy/dagster.yaml reads."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(port or self.port),
            "DAGSTER_PG_DB": db,
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
        }

    def mlflow_env(self, db: str, port: int | None = None) -> dict[str, str]:
        """The settings scripts/mlflow_server_pg.sh reads."""
        return {
            "MLFLOW_PG_HOST": self.host,
            "MLFLOW_PG_PORT": str(port or self.port),
            "MLFLOW_PG_DB": db,
            "MLFLOW_PG_USER": self.user,
            "MLFLOW_PG_PASSWORD": self.password,
        }

    def sql(self, db: str, query: str, *args) -> list[tuple]:
        import psycopg2

        con = psycopg2.connect(host=self.host, port=self.port, user=self.user, password=self.password, dbname=db)
        try:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute(query, args or None)
                return cur.fetchall() if cur.description else []
        finally:
            con.close()


@contextmanager
def postgres(databases: tuple[str, ...] = (), durable: bool = False) -> Iterator[Postgres]:
    """A fresh PostgreSQL server (password authentication, user `pipeline`) with `databases` created.
    Without fsync unless `durable` (a test server's data is thrown away; a benchmark wants the default)."""
    bin_ = pg_bin()
    # Not under pytest's tmp folder: as root that one is private to root, and the server runs as `postgres`.
    folder = Path(tempfile.mkdtemp(prefix="pg-test-"))
    as_user: list[str] = []
    if os.getuid() == 0:
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(folder)
            raise RuntimeError(
                "running as root, and there is no `postgres` user to run PostgreSQL as "
                "(apt package postgresql creates it)"
            ) from None
        os.chown(folder, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    password = secrets.token_hex(12)
    pwfile = folder / "pwfile"
    pwfile.write_text(password + "\n")
    if as_user:
        os.chown(pwfile, pw.pw_uid, pw.pw_gid)
    data, log = folder / "data", folder / "server.log"
    server = None
    try:
        subprocess.run(
            [
                *as_user,
                str(bin_ / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        for _attempt in range(3):  # a free port can be taken between asking and binding
            port = free_port()
            opts = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1" + (
                "" if durable else " -c fsync=off -c full_page_writes=off"
            )
            started = subprocess.run(
                [
                    *as_user,
                    str(bin_ / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(log),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    opts,
                    "start",
                ],
                capture_output=True,
                text=True,
                timeout=90,
            )
            if started.returncode == 0:
                server = Postgres(port=port, password=password, folder=folder)
                break
        if server is None:
            raise RuntimeError(f"pg_ctl start failed: {started.stderr}\n{log.read_text() if log.exists() else ''}")
        for db in databases:
            server.sql("postgres", f'CREATE DATABASE "{db}"')
        yield server
    finally:
        if server is not None or (data / "postmaster.pid").exists():
            subprocess.run(
                [*as_user, str(bin_ / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(folder, ignore_errors=True)


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL after 3 s (a test server: nothing to save)."""
    for sig, wait_s in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def script_env(**extra: str) -> dict[str, str]:
    """The environment for a script of scripts/ run with this interpreter's virtualenv."""
    return {**os.environ, "VENV": sys.prefix, "PYTHONUNBUFFERED": "1", **extra}


@contextmanager
def mlflow_server(pg: Postgres, db: str, folder: Path) -> Iterator[str]:
    """`bash scripts/mlflow_server_pg.sh` on database `db`, artifacts in `folder/artifacts`, one
    worker, on a free port; yields its URL."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = script_env(
        **pg.mlflow_env(db),
        MLFLOW_ARTIFACTS_DESTINATION=str(folder / "artifacts"),
        MLFLOW_PORT=str(port),
        MLFLOW_WORKERS="1",
        PIPELINE_STATE_DIR=str(folder / "server-state"),
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    log = folder / "mlflow-server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["bash", "scripts/mlflow_server_pg.sh"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", proc, log)
        yield url
    finally:
        stop_group(proc)
