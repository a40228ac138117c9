"""Where a pipeline run's wall time went: each step's seconds, from the Dagster instance that ran it.

    PIPELINE_STATE_DIR=/path/to/state .venv/bin/python benchmarks/run_profile.py [--run-id ID] [--out f.json]

Reads the run (default: the newest run of `--job`, default `default_pipeline`) from the state
folder's Dagster instance (`$PIPELINE_STATE_DIR/dagster`, or `$DAGSTER_HOME`), and prints the run's
wall seconds (start to end as Dagster recorded them), each step's seconds largest first, and the
share of the run the steps account for (the rest is run start-up and Dagster between the steps).
The machine it ran on is recorded like every benchmark's (result_file.emit): run it on the machine
that executed the run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import emit  # noqa: E402


def dagster_home(state: str | None) -> Path:
    if os.environ.get("DAGSTER_HOME"):
        return Path(os.environ["DAGSTER_HOME"])
    if not state:
        raise SystemExit("run_profile: give --state or set PIPELINE_STATE_DIR (the folder the run used)")
    return Path(state) / "dagster"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", default=os.environ.get("PIPELINE_STATE_DIR"), help="the run's state folder")
    ap.add_argument("--job", default="default_pipeline", help="job whose newest run is read (without --run-id)")
    ap.add_argument("--run-id", help="the run to read")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()

    home = dagster_home(args.state)
    if not (home / "dagster.yaml").exists() and not (home / "history").exists():
        raise SystemExit(f"run_profile: {home} holds no Dagster instance")
    os.environ["DAGSTER_HOME"] = str(home)
    from dagster import DagsterInstance, RunsFilter

    with DagsterInstance.get() as inst:
        if args.run_id:
            run = inst.get_run_by_id(args.run_id)
            if run is None:
                raise SystemExit(f"run_profile: no run {args.run_id} in {home}")
        else:
            found = inst.get_runs(RunsFilter(job_name=args.job), limit=1)
            if not found:
                raise SystemExit(f"run_profile: no run of job {args.job} in {home}")
            run = found[0]
        record = inst.get_run_record_by_id(run.run_id)
        stats = inst.get_run_step_stats(run.run_id)
    steps = sorted(
        ({"step": s.step_key, "seconds": round(s.end_time - s.start_time, 2), "status": s.status.value}
         for s in stats if s.start_time and s.end_time),
        key=lambda r: -r["seconds"],
    )
    run_s = (record.end_time - record.start_time) if record.start_time and record.end_time else None
    step_total = sum(s["seconds"] for s in steps)
    emit(
        {
            "run_id": run.run_id,
            "job": run.job_name,
            "status": run.status.value,
            "run_wall_s": run_s,
            "steps_total_s": round(step_total, 2),
            "steps_share_of_run": round(step_total / run_s, 3) if run_s else None,
            "steps": steps,
            "notes": "run_wall_s: the run's start to end as Dagster recorded them (in-process executor: the steps "
            "one after another); excludes scripts/setup.sh and the process start before the run.",
        },
        args.out,
    )


if __name__ == "__main__":
    main()
