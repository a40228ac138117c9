"""Running the pipeline as users do — real `dagster` processes with the multiprocess executor, a
real SQLite instance and MLflow store in a temporary state folder — and reading back what they did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY_FILE = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
# What tiny_pipeline runs (the file without the sections of jobs of their own), and what tiny_scaling runs.
TINY = {**TINY_FILE, "ops": {k: v for k, v in TINY_FILE["ops"].items() if k != "scaling_laws"}}
TINY_SCALING = {
    **{k: v for k, v in TINY_FILE.items() if k != "ops"},
    "ops": {"scaling_laws": TINY_FILE["ops"]["scaling_laws"]},
}


def env_for(state: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PIPELINE_STATE_DIR": str(state),
        "DAGSTER_HOME": str(state / "dagster"),
        "PYTHONUNBUFFERED": "1",
    }


def init_state(state: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pipelines.maintenance", "init"], cwd=ROOT, env=env_for(state), check=True, timeout=300
    )


def launch(state: Path, select: str, config: dict[str, Any], name: str = "run", init: bool = True) -> subprocess.Popen:
    """`dagster asset materialize` of `select` with `config`, in its own process group; log in state/../<name>.log."""
    state.mkdir(parents=True, exist_ok=True)
    selected = select.split(",")
    config = {
        **config,
        "ops": {k: v for k, v in config.get("ops", {}).items() if k in selected},
    }  # Dagster refuses others
    cfg = state.parent / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    log = open(state.parent / f"{name}.log", "w")
    cmd = [
        str(BIN / "dagster"),
        "asset",
        "materialize",
        "-m",
        "pipelines.definitions",
        "-a",
        "defs",
        "--select",
        select,
        "-c",
        str(cfg),
    ]
    if init:  # what scripts/run_pipeline.sh does: initialise the stores (once, locked), then launch
        cmd = ["bash", "-c", f"{sys.executable} -m pipelines.maintenance init && exec " + " ".join(map(str, cmd))]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env_for(state), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def wait(proc: subprocess.Popen, timeout: float = 600) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def log_of(state: Path, name: str = "run") -> str:
    return (state.parent / f"{name}.log").read_text()


def instance(state: Path):
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(state / "dagster")))


def runs(inst) -> list:
    return list(reversed(inst.get_run_records()))  # oldest first


def materializations(inst, run_id: str) -> dict[str, Any]:
    """Asset key → its materialization (with metadata) in run `run_id`."""
    from dagster import DagsterEventType

    out = {}
    for record in inst.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records:
        mat = record.event_log_entry.dagster_event.event_specific_data.materialization
        out[mat.asset_key.to_user_string()] = mat
    return out


def manifest(inst, run_id: str, asset: str) -> dict:
    mat = materializations(inst, run_id)[asset]
    return json.loads(Path(mat.metadata["manifest_path"].value).read_text())


def check_evaluations(inst, run_id: str) -> dict[tuple[str, str], Any]:
    """(check name, asset) → its evaluation in run `run_id` (a check such as `clipping_bounds_gradient`
    runs once per language model: keyed by name alone, all but one would be lost)."""
    from dagster import DagsterEventType

    out = {}
    for record in inst.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records:
        ev = record.event_log_entry.dagster_event.event_specific_data
        out[(ev.check_name, ev.asset_key.to_user_string())] = ev
    return out


def step_errors(inst, run_id: str) -> list[str]:
    from dagster import DagsterEventType

    recs = inst.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE).records
    return [r.event_log_entry.dagster_event.event_specific_data.error.to_string() for r in recs]


def step_intervals(inst, run_id: str) -> dict[str, tuple[float, float]]:
    """Step key → (start, end) timestamps of run `run_id`'s executed steps (from its event log)."""
    from dagster import DagsterEventType

    start, end = {}, {}
    for kind, into in (
        (DagsterEventType.STEP_START, start),
        (DagsterEventType.STEP_SUCCESS, end),
        (DagsterEventType.STEP_FAILURE, end),
    ):
        for r in inst.get_records_for_run(run_id, of_type=kind).records:
            into[r.event_log_entry.step_key] = r.event_log_entry.timestamp
    return {k: (start[k], end[k]) for k in start if k in end}


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def mlflow_runs(state: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("wordvec-to-transformer")
    return client, client.search_runs([exp.experiment_id], max_results=5000)
