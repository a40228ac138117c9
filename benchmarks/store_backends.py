"""The whole graph on configs/tiny.yaml against the embedded stores (Dagster on SQLite files, MLflow
on a SQLite file) and against services (Dagster on PostgreSQL with configs/deploy/dagster.yaml, an
MLflow server on PostgreSQL started by scripts/mlflow_server_pg.sh, artifacts uploaded through it),
both on this machine's loopback. Each run is a fresh Python process: `maintenance init` work
(ensure_stores), then the graph in process as `dg launch --job tiny_pipeline` runs it (steps one
after another). Backends alternate in the order ABBA, so a load that drifts steadily hits both
alike; the load average is recorded beside every run. Wall time on a shared machine swings with the
other work on it, so CPU time is measured too: the pipeline process's, plus for PostgreSQL what the
servers spent meanwhile (the PostgreSQL and MLflow server process trees, ended children included). Needs PostgreSQL
(bash scripts/install_test_deps.sh).

    .venv/bin/python benchmarks/store_backends.py --repeats 2 --out benchmarks/results/store_backends_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the servers of the tests: tests/pg.py
from result_file import emit  # noqa: E402


def _stat(pid: int) -> list[str] | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rindex(")") + 2 :].split()  # fields from 3 (state) on


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a process and its descendants, with their reaped children (utime, stime,
    cutime, cstime of each live process in the tree)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))):
            parent[int(entry.name)] = int(st[1])
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [c for c, p in parent.items() if p == pid and c not in tree]
    ticks = 0
    for pid in tree:
        st = _stat(pid)
        if st:
            ticks += sum(int(x) for x in st[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def run_one() -> dict:
    """In a fresh process whose environment names the stores: init, then the tiny graph."""
    import dagster as dg
    import yaml

    from components.orchestration.services import open_instance
    from components.orchestration.state import dagster_home, ensure_stores
    from pipelines.definitions import DEFAULT_ROUTE, defs

    cpu = lambda: sum(os.times()[:4])  # noqa: E731  (this process and its waited-for children)
    cpu0 = cpu()
    t0 = time.perf_counter()
    ensure_stores(dagster=True)
    instance = open_instance(dagster_home())
    init_s = time.perf_counter() - t0
    config = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    t0 = time.perf_counter()
    result = dg.materialize(
        list(defs.assets) + list(defs.asset_checks),
        resources=defs.resources,
        run_config=config,
        selection=DEFAULT_ROUTE,
        instance=instance,
        raise_on_error=False,
    )  # what tiny_pipeline runs
    graph_s = time.perf_counter() - t0
    n = len(result.get_asset_materialization_events())
    instance.dispose()
    return {
        "success": result.success,
        "materializations": n,
        "init_s": round(init_s, 2),
        "graph_s": round(graph_s, 1),
        "cpu_s": round(cpu() - cpu0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one()))
        return

    import pg

    folder = Path(tempfile.mkdtemp(prefix="store-backends-"))
    runs = []
    # PostgreSQL with its default durability (fsync on), as the SQLite files have theirs.
    with (
        pg.postgres(("dagster", "mlflow"), durable=True) as server,
        pg.mlflow_server(server, "mlflow", folder / "mlflow") as url,
    ):
        for i in range(args.repeats):
            for backend in (
                ("sqlite", "postgres") if i % 2 == 0 else ("postgres", "sqlite")
            ):  # ABBA: a drifting load hits both alike
                state = folder / f"{backend}-{i}"
                home = state / "dagster"
                home.mkdir(parents=True)
                env = {
                    **os.environ,
                    "PIPELINE_STATE_DIR": str(state),
                    "DAGSTER_HOME": str(home),
                    "PYTHONPATH": str(ROOT),
                }
                env.pop("MLFLOW_TRACKING_URI", None)
                if backend == "postgres":
                    db = f"dagster_{i}"
                    server.sql("postgres", f'CREATE DATABASE "{db}"')
                    shutil.copy(ROOT / "configs" / "deploy" / "dagster.yaml", home / "dagster.yaml")
                    env.update(server.dagster_env(db), MLFLOW_TRACKING_URI=url)
                load_before = os.getloadavg()
                servers = [
                    int((server.folder / "data" / "postmaster.pid").read_text().split()[0]),
                    *(
                        int(p.name)
                        for p in Path("/proc").iterdir()
                        if p.name.isdigit()
                        and (st := _stat(int(p.name)))
                        and int(st[1]) == os.getpid()
                        and "mlflow" in Path(f"/proc/{p.name}/cmdline").read_bytes().decode(errors="replace")
                    ),
                ]
                servers_cpu0 = sum(tree_cpu_s(pid) for pid in servers)
                t0 = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, __file__, "--one"], cwd=ROOT, env=env, capture_output=True, text=True
                )
                wall = time.perf_counter() - t0
                servers_cpu = sum(tree_cpu_s(pid) for pid in servers) - servers_cpu0
                if proc.returncode != 0:
                    raise SystemExit(proc.stderr[-4000:])
                row = {
                    "backend": backend,
                    "repeat": i,
                    **json.loads(proc.stdout.strip().splitlines()[-1]),
                    "process_s": round(wall, 1),
                    "servers_cpu_s": round(servers_cpu, 1),
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                }
                print(json.dumps(row), flush=True)
                if not row["success"]:
                    raise SystemExit(f"the {backend} run failed: no result written")
                runs.append(row)
    shutil.rmtree(folder, ignore_errors=True)

    def mean(backend: str, key: str) -> float:
        values = [r[key] for r in runs if r["backend"] == backend]
        return round(sum(values) / len(values), 1)

    for r in runs:
        r["total_cpu_s"] = round(r["cpu_s"] + (r["servers_cpu_s"] if r["backend"] == "postgres" else 0.0), 1)
    summary = {
        b: {k + "_mean": mean(b, k) for k in ("graph_s", "process_s", "cpu_s", "servers_cpu_s", "total_cpu_s")}
        for b in ("sqlite", "postgres")
    }
    summary["postgres_over_sqlite_wall"] = round(
        summary["postgres"]["graph_s_mean"] / summary["sqlite"]["graph_s_mean"], 3
    )
    summary["postgres_over_sqlite_total_cpu"] = round(
        summary["postgres"]["total_cpu_s_mean"] / summary["sqlite"]["total_cpu_s_mean"], 3
    )
    out = {
        "benchmark": "store_backends",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": "configs/tiny.yaml, whole graph in process; postgres = configs/deploy/dagster.yaml + "
        "scripts/mlflow_server_pg.sh "
        "(1 worker) on one local PostgreSQL 15 server (default durability, fsync on); sqlite = the embedded defaults",
        "runs": runs,
        "summary": summary,
    }
    emit(out, args.out)


if __name__ == "__main__":
    main()
