"""Why `memory_delay` trains each delay alone: the delay study per delay (the default) against the
same architectures trained on every delay at once (`training: mixed`), over seeds, with the study's
own code (`delay_study`) on its class defaults; and how far the mixed-trained recurrent models hold
the symbol beyond the delays they trained on (sequences up to `--extrapolate` tokens; the RNN and
the LSTM read any length, the Transformer is left out there since its positions stop at seq_len).

    python benchmarks/delay_training.py --seed 0 --seed 1 --out benchmarks/results/delay_training_cpu.json
    python benchmarks/delay_training.py --mixed-steps 1500 --extrapolate 512
    python benchmarks/delay_training.py --probes --out benchmarks/results/delay_probes_cpu.json

Per delay, an RNN has only the gradient carried back d steps to learn delay d from; mixed, the short
delays teach it to latch the symbol and the latch then holds across delays it could never have
learned alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.result_file import emit  # noqa: E402


def _summary(rows: list[dict]) -> dict:
    return {
        f"{r['model']}_{r['delay']}": {k: round(r[k], 4) for k in ("accuracy", "low", "high")} | {"n": r["n"]}
        for r in rows
    }


def one_run(training: str, seed: int, steps: int | None, extrapolate: int) -> dict:
    from components.core.studies.memory import accuracy_row, delay_study, predictions
    from components.core.studies.memory_tasks import DelaySettings, delay_task

    kw = {"training": training, "seed": seed, **({"steps": steps} if steps else {})}
    if training == "mixed":
        kw["lstm_forget_bias"] = 1.0  # the mixed study as it was: forget bias 1, lr 3e-3 for the LSTM
        kw["lrs"] = {"rnn": 3e-3, "lstm": 3e-3, "transformer": 3e-3}
    s = DelaySettings(**kw)
    t0 = time.perf_counter()
    r = delay_study(s)
    out = {
        "training": training,
        "seed": seed,
        "steps": s.steps,
        "lrs": s.lrs,
        "lstm_forget_bias": s.lstm_forget_bias,
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "accuracy": _summary(r.rows),
        "gradient_at_symbol_over_query": {
            f"{g['model']}_{g['delay']}": g["relative_to_last"] for g in r.extra["gradients"]
        },
        "models": [
            {k: m.get(k) for k in ("model", "delay", "seq_len", "train_steps", "solved_at", "train_seconds")}
            for m in r.models
        ],
    }
    if training == "mixed" and extrapolate:
        # the same trained weights on longer sequences: delays doubling up to extrapolate - 2
        delays = [d for d in (4, 8, 16, 32, 64, 128, 256, 512, 1024) if d <= extrapolate - 2]
        long = DelaySettings(delays=delays, seq_len=extrapolate, models=["rnn", "lstm"])
        val = delay_task(long, s.val_per_delay * len(delays), seed + 1)
        far = {}
        for kind in ("rnn", "lstm"):
            correct = predictions(r.trained[kind], val)[:, -1]
            for d in delays:
                row = accuracy_row(correct[val.condition == d])
                far[f"{kind}_{d}"] = {k: round(row[k], 4) for k in ("accuracy", "low", "high")}
        out["extrapolated"] = {"seq_len": extrapolate, "trained_delays": s.delays, "accuracy": far}
    return out


def alone(kind: str, delay: int, lr: float, steps: int, forget_bias: float, seq_len: int = 66) -> dict:
    """One architecture trained on one delay in `seq_len`-token sequences (seed 0, one thread): the probe
    behind the study's settings (the RNN's rate, the LSTM's forget bias and rate)."""
    import torch

    from components.core.studies.memory import build_model, predictions, train_model
    from components.core.studies.memory_tasks import DelaySettings, delay_task, disjoint_validation

    torch.set_num_threads(1)
    s = DelaySettings(
        delays=[delay],
        seq_len=seq_len,
        steps=steps,
        lrs={kind: lr},
        models=[kind],
        lstm_forget_bias=forget_bias,
        workers=1,
    )
    train = delay_task(s, s.train_sequences, s.seed)
    val = disjoint_validation(train, delay_task(s, s.val_per_delay, s.seed + 1))
    torch.manual_seed(s.seed)
    model = build_model(kind, s.vocab_size, s.seq_len, s.train)
    info = train_model(model, train, s.train, lr)
    return {
        "model": kind,
        "delay": delay,
        "lr": lr,
        "steps": steps,
        "seq_len": seq_len,
        "forget_bias": forget_bias if kind == "lstm" else None,
        "trained_steps": info["steps"],
        "solved_at": info["solved_at"],
        "accuracy": round(float(predictions(model, val)[:, -1].mean()), 4),
    }


# the probes behind DelaySettings' lrs and lstm_forget_bias: (kind, delay, lr, steps, forget bias)
PROBES = [
    *[("rnn", d, lr, 1000, 0.0) for lr in (1e-3, 3e-3, 1e-2) for d in (16, 32)],
    *[("lstm", d, 5e-3, 1000, fb) for fb in (1.0, 3.0) for d in (32, 64)],
    *[("lstm", d, 4e-3, 1000, 3.0) for d in (4, 8, 16, 32, 64)],
    *[("lstm", d, 5e-3, 1000, 3.0) for d in (4, 8, 16)],
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, action="append", help="seeds (repeat; default 0)")
    ap.add_argument("--mixed-steps", type=int, default=1500, help="steps of the mixed study (default 1500)")
    ap.add_argument(
        "--extrapolate",
        type=int,
        default=514,
        help="sequence length the mixed models are also scored at (0: not at all)",
    )
    ap.add_argument(
        "--probes",
        action="store_true",
        help="instead: the settings probes (each model on one delay in 66-token sequences, seed 0)",
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.probes:
        from components.core.workers import run_jobs

        probes = run_jobs(alone, PROBES, 2, 1)
        for p in probes:
            print(p, flush=True)
        emit({"benchmark": "delay_training_probes", "probes": probes}, args.out)
        return
    runs = []
    for seed in args.seed or [0]:
        for training, steps in (("per_delay", None), ("mixed", args.mixed_steps)):
            run = one_run(training, seed, steps, args.extrapolate)
            acc = run["accuracy"]
            print(
                f"{training} seed {seed} ({run['wall_seconds']} s): "
                + "; ".join(f"{k} {v['accuracy']:.2f}" for k, v in acc.items()),
                flush=True,
            )
            if "extrapolated" in run:
                print(
                    "  extrapolated: "
                    + "; ".join(f"{k} {v['accuracy']:.2f}" for k, v in run["extrapolated"]["accuracy"].items()),
                    flush=True,
                )
            runs.append(run)
    emit({"benchmark": "delay_training", "runs": runs}, args.out)


if __name__ == "__main__":
    main()
