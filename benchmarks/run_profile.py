"""Where a pipeline run's wall time went: each step's seconds, from the Dagster instance that ran it.

    PIPELINE_STATE_DIR=/path/to/state .venv/bin/python benchmarks/run_profile.py [--run-id ID] [--out f.json]

Reads the run (default: the newest run of `--job`, default `default_pipeline`) from the state
folder's Dagster instance (`$PIPELINE_STATE_DIR/dagster`, or `$DAGSTER_HOME`), and prints the run's
wall seconds (start to end as Dagster recorded them), each step's seconds largest first, and the
share of the run the steps account for (the rest is run start-up and Dagster between the steps).
With the run's manifests in the state folder, it also gives the figures the README quotes from the
run: the count ladder and the chosen order, each language model's loss, size and place on the
ladder, the seed spreads, and the claims' counts with every claim that did not pass.
The machine it ran on is recorded like every benchmark's (result_file.emit): run it on the machine
that executed the run.
"""

from __future__ import annotations

import argparse
import json
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


def manifest(state: Path, asset: str, run_id: str) -> dict | None:
    """The manifest one asset wrote in the run (the IO manager's layout: artifacts/<asset>/<run id>/)."""
    path = state / "artifacts" / asset / run_id / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else None


def figures(state: Path, run_id: str) -> dict | None:
    """The run's headline figures, from its ngram_baseline, model_comparison and report manifests."""
    from components.core.manifests import NgramRung
    from components.core.studies.ngram import ladder_position

    ngram, comp, report = (manifest(state, a, run_id) for a in ("ngram_baseline", "model_comparison", "report"))
    if not (ngram and comp and report):
        return None
    ladder = [NgramRung(**r) for r in ngram["rows"]]
    return {
        "count_ladder": [{k: r[k] for k in ("order", "val_loss", "heldout_loss", "types")} for r in ngram["rows"]],
        "count_model": {k: ngram["chosen"][k] for k in ("model", "order", "val_loss", "heldout_loss", "types")},
        "val_targets": ngram["n_targets"],
        "language_models": [
            {
                **{
                    k: r[k]
                    for k in (
                        "model",
                        "steps",
                        "params_embedding",
                        "params_head",
                        "params_core",
                        "val_loss",
                        "train_time_s",
                        "train_flops",
                    )
                },
                "on_the_ladder": ladder_position(r["val_loss"], ladder),
                "seeds": comp["seeds"].get(r["model"]),
            }
            for r in comp["rows"]
        ],
        "claims": report["counts"],  # the evidence alone
        "demonstrations": report.get("demonstration_counts", {}),
        "invariants": report["invariant_counts"],
        "claims_not_passed": [
            {k: c.get(k, "") for k in ("claim", "asset", "status", "kind", "reason")}
            for c in report["claims"]
            if c["status"] != "passed"
        ],
    }


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
        (
            {"step": s.step_key, "seconds": round(s.end_time - s.start_time, 2), "status": s.status.value}
            for s in stats
            if s.start_time and s.end_time
        ),
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
            "figures": figures(Path(args.state), run.run_id) if args.state else None,
            "notes": "run_wall_s: the run's start to end as Dagster recorded them (in-process executor: the steps "
            "one after another); excludes scripts/setup.sh and the process start before the run.",
        },
        args.out,
    )


if __name__ == "__main__":
    main()
