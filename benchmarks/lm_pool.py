"""The default run's five language models trained one after another at the machine's threads (as the
five assets run now, one step at a time) against side by side in two worker processes with one torch
thread each (`components.core.workers`, as `model_comparison`'s seed retrainings run), through the
shared loop (`train_lm`) with each asset's model and training settings from configs/default.yaml,
a --fraction of each model's steps in a default run (its FLOPs budget), on random tokens of the
tokenizer's vocabulary at the models' context. The two take turns --repeats times, so that a change
in the machine's load hits them alike.

What it answers: how much of the trainings' wall time the two cores give back when the models share
them, the largest lever left on a default run's time that leaves every recipe as it is.

    python benchmarks/lm_pool.py --out benchmarks/results/lm_pool_cpu_<kind>.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import emit  # noqa: E402

from components.core.data import TokenBlocks  # noqa: E402
from components.core.heap import keep_freed_memory  # noqa: E402
from components.core.lm import SamplingSettings, prepare_lm, steps_for_budget, train_lm  # noqa: E402
from components.core.train_settings import TrainSettings  # noqa: E402
from components.core.workers import one_thread_each, run_jobs  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
FAMILIES = {
    "rnn_lm": "recurrent",
    "lstm_lm": "recurrent",
    "transformer_lm": "transformer",
    "transformer_1head_lm": "transformer",
    "transformer_window_lm": "transformer",
}


def _train(name, family, model, ts, train_data, val_data, vocab_size, out_dir) -> tuple[str, float, float]:
    """One model's training (here or in a worker): its name, wall seconds and final training loss."""
    t0 = time.perf_counter()
    res = train_lm(
        family,
        model,
        ts,
        train_data,
        val_data,
        vocab_size,
        out_dir,
        sampling=SamplingSettings(num_samples=0),
        resume=False,
    )
    return name, time.perf_counter() - t0, float(res.metrics["train/loss"])


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--fraction", type=float, default=0.25, help="of each model's steps in the default run (its FLOPs budget)"
    )
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out")
    a = p.parse_args()
    if not a.fraction > 0:
        p.error(f"--fraction {a.fraction}: must be above 0 (a share of each model's default steps)")
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats}: must be at least 1")
    keep_freed_memory()  # as a training process and every worker does
    ops = yaml.safe_load(CONFIG.read_text())["ops"]
    vocab = int(ops["tokenizer"]["config"]["vocab_size"])
    rng = np.random.default_rng(0)
    data = {}
    jobs, steps = [], {}
    for name, family in FAMILIES.items():
        cfg = ops[name]["config"]
        T = int(cfg["model"]["block_size"])
        if T not in data:
            tokens = rng.integers(1, vocab, size=(4097, T + 1))
            data[T] = (
                TokenBlocks(tokens[:4096, :-1].astype(np.uint16), tokens[:4096, 1:].astype(np.int32)),
                TokenBlocks(tokens[4096:, :-1].astype(np.uint16), tokens[4096:, 1:].astype(np.int32)),
            )
        # The asset's training settings less its launcher's (the assets train in process by default).
        own = {k: v for k, v in cfg["train"].items() if k in TrainSettings.model_fields}
        full = steps_for_budget(
            prepare_lm(family, cfg["model"], TrainSettings(**{**own, "max_steps": 1}), data[T][0], vocab),
            TrainSettings(**{**own, "max_steps": 1}),
        ).max_steps
        steps[name] = max(1, round(full * a.fraction))
        ts = TrainSettings(
            **{**own, "max_steps": steps[name], "flops_budget": None, "eval_interval": 0, "checkpoint_interval": 0}
        )
        jobs.append((name, family, cfg["model"], ts, *data[T], vocab))
    seconds: dict[str, list[float]] = {"one_after_another": [], "side_by_side": []}
    per_model: dict[str, dict[str, list[float]]] = {k: {n: [] for n in FAMILIES} for k in seconds}
    losses: dict[str, dict[str, float]] = {k: {} for k in seconds}
    with tempfile.TemporaryDirectory() as tmp:
        # Warm-up, untimed: each model a few steps here, so that neither side pays the process's first
        # kernels (a default run pays them once, before its first training); forked workers inherit it.
        for j in jobs:
            _train(
                *j[:3], j[3].model_copy(update={"max_steps": 3, "warmup_steps": 1}), *j[4:], Path(tmp) / "warm" / j[0]
            )
        for r in range(a.repeats):
            for mode in seconds:
                workers = 2 if mode == "side_by_side" else 1
                run = [(*j[:3], one_thread_each(j[3], workers), *j[4:], Path(tmp) / f"{mode}{r}" / j[0]) for j in jobs]
                t0 = time.perf_counter()
                out = run_jobs(_train, run, workers, threads=1)
                seconds[mode].append(time.perf_counter() - t0)
                for name, s, loss in out:
                    per_model[mode][name].append(s)
                    losses[mode][name] = loss
                print(mode, round(seconds[mode][-1], 1), file=sys.stderr, flush=True)
    best = {k: min(v) for k, v in seconds.items()}
    # Two workers kept busy to the end: half the sum of the trainings' own times beside each other.
    packed = sum(min(v) for v in per_model["side_by_side"].values()) / 2
    emit(
        {
            "benchmark": "lm_pool",
            "config": "configs/default.yaml",
            "fraction_of_default_steps": a.fraction,
            "steps": steps,
            "models": list(FAMILIES),
            "seconds": {k: [round(s, 2) for s in v] for k, v in seconds.items()},
            "time_side_by_side_over_one_after_another": round(best["side_by_side"] / best["one_after_another"], 3),
            "side_by_side_packed_s": round(packed, 2),
            "time_packed_over_one_after_another": round(packed / best["one_after_another"], 3),
            "model_seconds": {k: {n: [round(s, 2) for s in v] for n, v in m.items()} for k, m in per_model.items()},
            "final_train_loss": losses,
            "notes": "one_after_another: each training at the asset's own threads (0: torch's default, the "
            "machine's cores); side_by_side: two workers, one thread each, the jobs in the assets' order; "
            "side_by_side_packed_s: half the sum of each training's least time side by side, the wall time had "
            "neither worker waited for the other at the end. "
            "Random tokens: the step time of these models does not depend on the token values.",
        },
        a.out,
    )


if __name__ == "__main__":
    main()
