"""Evaluation time against the evaluation batch size, for every language model a default run trained:
the whole validation split (as the training loop crops it to the model's context), at each of
--sizes, in the dtype the model trained in, at 2 threads (the model's own asset) and at 1 thread (a
seed retraining of `model_comparison`, one thread beside another). The sizes take turns, --repeats
times, so that a change in the machine's load hits them alike; the loss at each size is recorded to
show that the size changes the figure only in its last bits (the batch is a sum of whole blocks).

    python benchmarks/eval_batch.py --state .state --out benchmarks/results/eval_batch_cpu_<kind>.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import emit, newest_in_state, trained_lm  # noqa: E402

from components.core.labels import load_labels  # noqa: E402
from components.core.train_step import evaluate  # noqa: E402

MODELS = ("rnn_lm", "lstm_lm", "transformer_lm", "transformer_1head_lm", "transformer_window_lm")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--state", required=True, help="the state folder of a finished default run")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--sizes", nargs="+", type=int, default=[16, 32, 64, 128])
    p.add_argument("--threads", nargs="+", type=int, default=[2, 1])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out")
    a = p.parse_args()
    art = Path(a.state).resolve() / "artifacts"
    _, val_all, _ = load_labels(newest_in_state(art / "labels", "meta.json").parent)
    rows = []
    for name in a.models:
        manifest, model, dtype = trained_lm(art, name)
        val = val_all.crop(min(manifest["model_config"]["block_size"], val_all.block_size))
        for threads in a.threads:
            torch.set_num_threads(threads)
            evaluate(model, val, batch_size=a.sizes[0], max_batches=4, device="cpu", dtype=dtype)  # warm-up
            seconds: dict[int, list[float]] = {b: [] for b in a.sizes}
            loss: dict[int, float] = {}
            for _ in range(a.repeats):
                for b in a.sizes:
                    t0 = time.perf_counter()
                    loss[b] = evaluate(model, val, batch_size=b, max_batches=None, device="cpu", dtype=dtype)
                    seconds[b].append(time.perf_counter() - t0)
            base = min(seconds[a.sizes[0]])
            for b in a.sizes:
                rows.append(
                    {
                        "model": name,
                        "dtype": str(dtype).removeprefix("torch."),
                        "threads": threads,
                        "eval_batch_size": b,
                        "seconds": [round(s, 3) for s in seconds[b]],
                        "seconds_min": round(min(seconds[b]), 3),
                        "time_vs_first_size": round(min(seconds[b]) / base, 3),
                        "val_loss": loss[b],
                        "val_loss_minus_first_size": loss[b] - loss[a.sizes[0]],
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    emit({"benchmark": "eval_batch", "state": str(Path(a.state)), "sizes": a.sizes, "rows": rows}, a.out)


if __name__ == "__main__":
    main()
