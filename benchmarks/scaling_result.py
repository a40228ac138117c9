"""The scaling job's latest run in a state folder, as a result file: every training (budget, size,
learning rate, batch, loss, FLOPs, seconds), the fits, where each family passes the count model and
where the Transformer passes the LSTM, the run's wall time, its Dagster and MLflow runs, and the
machine. With --figure, the run's plot is copied beside it.

    PIPELINE_STATE_DIR=/path/to/state .venv/bin/python benchmarks/scaling_result.py \\
        --out benchmarks/results/scaling_cpu_epyc_avx512.json --figure benchmarks/results/scaling_cpu_epyc_avx512.png

Run it on the machine that ran the job: the machine recorded is this one's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import emit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", default=os.environ.get("PIPELINE_STATE_DIR"), help="the run's state folder")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--figure", help="copy the run's scaling plot (PNG) here")
    args = ap.parse_args()
    if not args.state:
        raise SystemExit("scaling_result: give --state or set PIPELINE_STATE_DIR (the folder the run used)")
    os.environ["PIPELINE_STATE_DIR"] = args.state
    os.environ.setdefault("DAGSTER_HOME", str(Path(args.state) / "dagster"))
    import dagster as dg

    from components.core.manifests import Scaling
    from components.orchestration.io import latest_manifest

    key = dg.AssetKey("scaling_laws")
    with dg.DagsterInstance.get() as inst:
        m = latest_manifest(inst, key, Scaling)
        if m is None:
            raise SystemExit(f"scaling_result: no scaling_laws materialization in {args.state}: run the scaling job")
        run = inst.get_run_by_id(m.dagster_run_id)
        record = inst.get_run_record_by_id(m.dagster_run_id)
        stats = {s.step_key: s for s in inst.get_run_step_stats(m.dagster_run_id)}
    step = stats.get("scaling_laws")
    out = {
        "benchmark": "scaling",
        "job": run.job_name if run else None,
        "dagster_run_id": m.dagster_run_id,
        "mlflow_run_id": m.mlflow_run_id,
        "mlflow_url": m.published.mlflow_url,
        "run_wall_s": (record.end_time - record.start_time) if record and record.end_time else None,
        "step_wall_s": (step.end_time - step.start_time) if step and step.end_time else None,
        "training_seconds": sum(t.train_seconds for t in m.trials if not t.reused),
        "trainings": sum(not t.reused for t in m.trials),
        **{k: v for k, v in dataclasses.asdict(m).items() if k not in ("files", "figures", "published", "machine")},
        "summary": m.published.texts.get("summary", ""),
        "machine": {"job_ran_on": m.machine},
    }
    if args.figure:
        shutil.copyfile(m.figures["scaling"].path, args.figure)
    emit(out, args.out)


if __name__ == "__main__":
    main()
