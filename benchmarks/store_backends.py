"""The whole graph on configs/tiny.yaml against the embedded stores (Dagster on SQLite files, MLflow
on a SQLite file) and against services (Dagster on PostgreSQL with configs/deploy/dagster.yaml, an
MLflow server on PostgreSQL started by scripts/mlflow_server_pg.sh, artifacts uploaded through it),
both on this machine's loopback. Each run is a fresh Python process: `maintenance init` work
(ensure_stores), then the graph in process as `dg launch --job tiny_pipeline` runs it (steps one
after another). Backends alternate, so a change in the machine's load hits both alike; the load
average is recorded beside every run. Needs PostgreSQL (bash scripts/install_postgres.sh).

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


def run_one() -> dict:
    """In a fresh process whose environment names the stores: init, then the tiny graph."""
    import dagster as dg
    import yaml

    from components.orchestration.services import open_instance
    from components.orchestration.state import dagster_home, ensure_stores
    from pipelines.definitions import defs

    t0 = time.perf_counter()
    ensure_stores(dagster=True)
    instance = open_instance(dagster_home())
    init_s = time.perf_counter() - t0
    config = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    t0 = time.perf_counter()
    result = dg.materialize(list(defs.assets) + list(defs.asset_checks), resources=defs.resources, run_config=config,
                            instance=instance, raise_on_error=False)
    graph_s = time.perf_counter() - t0
    n = len(result.get_asset_materialization_events())
    instance.dispose()
    return {"success": result.success, "materializations": n, "init_s": round(init_s, 2), "graph_s": round(graph_s, 1)}


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
    with pg.postgres(("dagster", "mlflow"), durable=True) as server, pg.mlflow_server(server, "mlflow", folder / "mlflow") as url:
        for i in range(args.repeats):
            for backend in ("sqlite", "postgres"):
                state = folder / f"{backend}-{i}"
                home = state / "dagster"
                home.mkdir(parents=True)
                env = {**os.environ, "PIPELINE_STATE_DIR": str(state), "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
                env.pop("MLFLOW_TRACKING_URI", None)
                if backend == "postgres":
                    db = f"dagster_{i}"
                    server.sql("postgres", f'CREATE DATABASE "{db}"')
                    shutil.copy(ROOT / "configs" / "deploy" / "dagster.yaml", home / "dagster.yaml")
                    env.update(server.dagster_env(db), MLFLOW_TRACKING_URI=url)
                load_before = os.getloadavg()
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, __file__, "--one"], cwd=ROOT, env=env, capture_output=True, text=True)
                wall = time.perf_counter() - t0
                if proc.returncode != 0:
                    raise SystemExit(proc.stderr[-4000:])
                row = {"backend": backend, "repeat": i, **json.loads(proc.stdout.strip().splitlines()[-1]),
                       "process_s": round(wall, 1), "loadavg_before": [round(x, 2) for x in load_before],
                       "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
                print(json.dumps(row), flush=True)
                if not row["success"]:
                    raise SystemExit(f"the {backend} run failed: no result written")
                runs.append(row)
    shutil.rmtree(folder, ignore_errors=True)

    def mean(backend: str, key: str) -> float:
        values = [r[key] for r in runs if r["backend"] == backend]
        return round(sum(values) / len(values), 1)

    summary = {b: {"graph_s_mean": mean(b, "graph_s"), "process_s_mean": mean(b, "process_s")} for b in ("sqlite", "postgres")}
    summary["postgres_over_sqlite"] = round(summary["postgres"]["graph_s_mean"] / summary["sqlite"]["graph_s_mean"], 3)
    out = {
        "benchmark": "store_backends",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": "configs/tiny.yaml, whole graph in process; postgres = configs/deploy/dagster.yaml + scripts/mlflow_server_pg.sh "
                    "(1 worker) on one local PostgreSQL 15 server (default durability, fsync on); sqlite = the embedded defaults",
        "runs": runs,
        "summary": summary,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
