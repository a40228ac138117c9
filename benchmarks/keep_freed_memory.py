"""Training speed with freed memory kept by the process (components/core/heap.py) against glibc's
defaults (PIPELINE_KEEP_FREED_MEMORY=0), for the language models a default run trained: each
model's own settings and data, --steps steps, at its own threads. The setting is process-wide and
cannot be undone, so each training runs in a fresh child process; the two sides take turns,
--repeats times, so that a change in the machine's load hits them alike. Recorded per side: the
training's tokens/s (the loop's own mean, evaluation excluded), the child's minor page faults, and
the final loss, which must be the same on both sides.

    python benchmarks/keep_freed_memory.py --state .state --out benchmarks/results/keep_freed_memory_cpu_<kind>.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import emit, newest_in_state  # noqa: E402

from components.core.heap import ENV  # noqa: E402

MODELS = ("rnn_lm", "lstm_lm", "transformer_lm")

CHILD = """
import json, sys
from components.core.labels import load_labels
from components.core.lm import SamplingSettings, train_lm
from components.core.train_settings import TrainSettings
manifest, labels, steps, out = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
train, val, meta = load_labels(labels)
own = {k: v for k, v in manifest["train_settings"].items() if k in TrainSettings.model_fields}
ts = TrainSettings(**{**own, "max_steps": steps, "flops_budget": None, "eval_interval": 0, "eval_batches": 4})
res = train_lm(manifest["family"], manifest["model_config"], ts, train, val, int(meta["vocab_size"]), out,
               sampling=SamplingSettings(num_samples=0), resume=False)
print(json.dumps({"tokens_per_s": res.metrics["train/tokens_per_s_mean"], "loss": res.metrics["train/loss"]}))
"""


def run_child(manifest: dict, labels: Path, steps: int, keep: bool) -> dict:
    env = {**os.environ, ENV: "1" if keep else "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-c", CHILD, json.dumps(manifest), str(labels), str(steps), out]
        done = subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["minor_page_faults"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--state", required=True, help="the state folder of a finished default run")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out")
    a = p.parse_args()
    art = Path(a.state).resolve() / "artifacts"
    labels = newest_in_state(art / "labels", "meta.json").parent
    rows = []
    for name in a.models:
        manifest = json.loads(newest_in_state(art / name, "manifest.json").read_text())
        sides: dict[str, list[dict]] = {"kept": [], "glibc_default": []}
        for _ in range(a.repeats):
            for side in sides:
                sides[side].append(run_child(manifest, labels, a.steps, keep=side == "kept"))
                print(name, side, json.dumps(sides[side][-1]), file=sys.stderr, flush=True)
        best = {side: max(r["tokens_per_s"] for r in runs) for side, runs in sides.items()}
        rows.append(
            {
                "model": name,
                "steps": a.steps,
                "runs": sides,
                "tokens_per_s_best": best,
                "ratio_tokens_per_s_kept": round(best["kept"] / best["glibc_default"], 3),
                "minor_page_faults_ratio": round(
                    min(r["minor_page_faults"] for r in sides["kept"])
                    / min(r["minor_page_faults"] for r in sides["glibc_default"]),
                    3,
                ),
                "same_loss": len({r["loss"] for runs in sides.values() for r in runs}) == 1,
            }
        )
    emit({"benchmark": "keep_freed_memory", "state": str(Path(a.state)), "rows": rows}, a.out)


if __name__ == "__main__":
    main()
