"""A language model of a finished run retrained at other learning rates, at the steps its FLOPs budget
bought, with the `tune` job's own trial (`studies.sweep.lm_trial`: full schedule, scored on the whole
validation split): a few trials of one model without running the whole sweep job.

    python benchmarks/lr_trials.py --state /path/to/state --model transformer_1head_lm \
        --lr 0.002 --lr 0.004 --lr 0.008 --out benchmarks/results/one_head_lr_cpu_avx512.json

The state folder is one a default run wrote (`PIPELINE_STATE_DIR`): its labels and the model's manifest
(architecture, training settings, the steps it trained) are read from there.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.result_file import emit, newest_in_state  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, help="the state folder of a finished run")
    ap.add_argument("--model", default="transformer_1head_lm", help="a language-model asset of that run")
    ap.add_argument("--lr", type=float, action="append", required=True, help="peak learning rate (repeat)")
    ap.add_argument("--warmup", type=int, default=None, help="warmup steps (default: the model's)")
    ap.add_argument("--out")
    args = ap.parse_args()

    from components.core.labels import load_labels
    from components.core.studies.sweep import lm_trial

    arts = Path(args.state) / "artifacts"
    m = json.loads(newest_in_state(arts / args.model, "manifest.json").read_text())
    train, val, meta = load_labels(newest_in_state(arts / "labels", "meta.json").parent)
    steps = int(m["metrics"]["steps"])
    base = {k: v for k, v in m["train_settings"].items() if k not in ("launcher", "nproc_per_node", "strategy")}
    base["flops_budget"] = None  # the steps it bought are given instead
    warmup = base["warmup_steps"] if args.warmup is None else args.warmup
    rows = []
    with tempfile.TemporaryDirectory(prefix="w2t-lr-trials-") as tmp:
        trial = lm_trial(
            m["family"],
            m["model_config"],
            base,
            train,
            val,
            int(meta["vocab_size"]),
            tmp,
            model_meta={"tokenizer_sha256": m["tokenizer_sha256"]},
        )
        for lr in args.lr:
            r = trial({"lr": lr, "min_lr": lr / 10, "warmup_steps": warmup, "max_steps": steps})
            rows.append(
                {"lr": lr, "warmup_steps": warmup, "steps": steps, "val_loss": r["val_loss"], "wall_s": r.get("wall_s")}
            )
            print(f"{args.model} lr {lr:g}: val loss {r['val_loss']:.4f}", flush=True)
    emit(
        {
            "benchmark": "lr_trials",
            "model": args.model,
            "run_val_loss": m["metrics"].get("val/loss"),
            "trained_lr": m["train_settings"]["lr"],
            "trials": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
