"""What a language model's settings buy against the n-gram baseline, on a labels folder of a run.

Each trial trains one model (its family's default shape, with the settings given) with a full
schedule ending at its step count, and records the validation loss on the whole validation split
at every evaluation, its wall time and tokens/s; the Kneser–Ney bigram and trigram are scored on the
same targets. Wall times depend on the machine and its load: the result records both.

    python benchmarks/lm_vs_ngram.py --labels .state/artifacts/labels/<run id> \\
        --trial transformer:steps=1500,lr=4e-3 --trial rnn:steps=1500,lr=5e-3 \\
        --out benchmarks/results/lm_vs_ngram_cpu.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.result_file import emit  # noqa: E402

SHAPES = {
    "transformer": (
        "transformer",
        dict(
            n_layer=4,
            n_head=4,
            n_embd=128,
            block_size=128,
            pos_encoding="rope",
            attention="fused",
            param_budget=1_000_000,
        ),
    ),
    "rnn": ("recurrent", dict(cell="rnn", n_embd=128, hidden_size=256, n_layer=1, param_budget=1_000_000)),
    "lstm": ("recurrent", dict(cell="lstm", n_embd=128, hidden_size=256, n_layer=1, param_budget=1_000_000)),
}


def parse_trial(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    if name not in SHAPES:
        raise SystemExit(f"--trial {text!r}: model must be one of {sorted(SHAPES)}")
    kv = dict(p.split("=", 1) for p in rest.split(",") if p)
    return name, kv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", required=True)
    ap.add_argument(
        "--trial",
        action="append",
        default=[],
        help="model:steps=N,lr=X[,batch_size=..,warmup_steps=..,eval_interval=..]",
    )
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()

    from components.core.labels import load_labels
    from components.core.lm import SamplingSettings, train_lm
    from components.core.studies.ngram import NgramSettings, ngram_baseline
    from components.core.training import TrainSettings

    tr, va, meta = load_labels(args.labels)
    V = int(meta["vocab_size"])
    ngram = ngram_baseline(tr, va, V, NgramSettings(orders=[2, 3], block_size=128))
    trials = []
    for spec in args.trial:
        name, kv = parse_trial(spec)
        family, model = SHAPES[name]
        steps, lr = int(kv.pop("steps", 500)), float(kv.pop("lr", 2e-3))
        train = dict(max_steps=steps, batch_size=16, block_size=128, lr=lr, min_lr=lr / 10, warmup_steps=30,
                     eval_interval=max(steps // 6, 1), eval_batches=None, threads=args.threads)
        train.update({k: type(train.get(k, 0))(v) if k in train else v for k, v in kv.items()})
        t0 = time.perf_counter()
        res = train_lm(
            family,
            model,
            TrainSettings(**train),
            tr,
            va,
            V,
            Path(os.environ.get("TMPDIR", "/tmp")) / f"lm_vs_ngram_{name}",
            sampling=SamplingSettings(num_samples=0),
            resume=False,
        )
        m = res.metrics
        trials.append(
            {
                "model": name,
                "train": train,
                "val_loss": m["val/loss"],
                "val_targets": m["val/targets"],
                "margin_over_best_ngram": ngram.best["val_loss"] - m["val/loss"],
                "params": m["params"],
                "tokens": steps * train["batch_size"] * 128,
                "tokens_per_s": m["train/tokens_per_s_mean"],
                "wall_s": time.perf_counter() - t0,
                "dtype": res.dtype if hasattr(res, "dtype") else m.get("dtype"),
                "curve": [(h["step"], h["val/loss"]) for h in res.history if "val/loss" in h],
            }
        )
        print(trials[-1], file=sys.stderr, flush=True)
    emit({"benchmark": "lm_vs_ngram", "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
          "load_avg_1m": os.getloadavg()[0], "labels": meta, "ngram": ngram.rows, "trials": trials}, args.out)


if __name__ == "__main__":
    main()
