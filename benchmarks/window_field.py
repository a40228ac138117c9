"""Where the recall study's sliding-window model answers: accuracy per key-query distance, and inside
against beyond its receptive field, after a given number of steps.

It trains the `memory_recall` asset's window model with the study's own code (`build_model`,
`train_model`, `predictions`) on the study's defaults, one thread, and scores the same validation
sequences. A query is inside the field when its value (one after the key, at distance d − 1) is in
view: d ≤ rf = n_layer · (window − 1) + 1.

    python benchmarks/window_field.py --steps 2000 --steps 4000 --out benchmarks/results/window_field_cpu.json
    python benchmarks/window_field.py --steps 2000 --window 4      # the earlier default (field 7)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.result_file import emit  # noqa: E402


def one_run(steps: int, window: int) -> dict:
    import numpy as np
    import torch

    from components.core.data import IGNORE_INDEX
    from components.core.studies.memory import accuracy_row, build_model, predictions, receptive_field, train_model
    from components.core.studies.memory_tasks import RecallSettings, disjoint_validation, recall_task

    torch.set_num_threads(1)
    s = RecallSettings(window=window, steps=steps, models=["window"])
    train = recall_task(s, s.train_sequences, s.seed, s.trained_pairs)
    val = disjoint_validation(train, recall_task(s, s.val_per_pairs * len(s.pairs), s.seed + 1))
    torch.manual_seed(s.seed)
    model = build_model("window", s.vocab_size, s.seq_len, s.train, s.window)
    t0 = time.perf_counter()
    info = train_model(model, train, s.train, s.train.lrs["window"])
    seconds = time.perf_counter() - t0
    model.eval()
    ok = predictions(model, val)
    asked = val.y != IGNORE_INDEX
    rf = receptive_field(model)
    by_distance = [
        {"distance": int(d), **accuracy_row(ok[asked & (val.distance == d)])} for d in np.unique(val.distance[asked])
    ]
    asked_train = train.y != IGNORE_INDEX
    return {
        "steps": steps,
        "window": window,
        "receptive_field": rf,
        "train_seconds": seconds,
        "final_loss": info["final_loss"],
        "chance": 1.0 / s.n_values,
        "training_queries_in_field": float((train.distance[asked_train] <= rf).mean()),
        "within": accuracy_row(ok[asked & (val.distance <= rf)]),
        "beyond": accuracy_row(ok[asked & (val.distance > rf)]),
        "by_distance": by_distance,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, action="append", help="training steps (repeat for several runs)")
    ap.add_argument("--window", type=int, default=8, help="keys each query sees per layer (the study's default 8)")
    ap.add_argument("--out")
    args = ap.parse_args()
    runs = [one_run(n, args.window) for n in (args.steps or [2000])]
    for r in runs:
        w, b = r["within"], r["beyond"]
        print(
            f"steps {r['steps']}: within field {r['receptive_field']} {w['accuracy']:.2f} "
            f"[{w['low']:.2f}, {w['high']:.2f}], beyond {b['accuracy']:.2f}; {r['train_seconds']:.0f} s",
            flush=True,
        )
    emit({"benchmark": "window_field", "runs": runs}, args.out)


if __name__ == "__main__":
    main()
