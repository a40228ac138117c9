"""Why associative recall (MQAR) plateaus: what the trained models answer, against what a model that
copies *any* value of its context, without binding it to its key, would score.

The `memory_recall` asset's Transformer, as first set up (trained on a mix of 1-8 pairs, 8 keys, 8
values, batch 32: `FIRST_SETTINGS`), ended at about 0.57, 0.40 and 0.34 with 2, 4 and 8 pairs
whatever its steps. This trains the recall study's models (its own `build_model` / `train_model`,
one thread) under a grid of variants and, for each number of pairs, records:

- `accuracy`: the answer is the key's value;
- `in_context`: the answer is one of the values in the sequence (binding or not);
- `copy_any`: the expected accuracy of a model that picks uniformly among the sequence's value
  tokens (with repeats), computed from the validation data alone: the no-binding ceiling.

    python benchmarks/mqar_diagnosis.py --out benchmarks/results/mqar_diagnosis_cpu.json
    python benchmarks/mqar_diagnosis.py --variant base --variant steps=2000,train_sequences=65536

`--defaults` starts every variant from the recall study's current defaults instead (trained on 8
pairs only, 16 keys, 16 values, batch 128, 2,000 steps), e.g. to count the seeds on which it binds:

    python benchmarks/mqar_diagnosis.py --defaults --variant seed=0 --variant seed=1 --variant seed=2 \
        --variant seed=3 --variant seed=4 --out benchmarks/results/mqar_binding_seeds_cpu_avx2.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.result_file import emit  # noqa: E402

# The setting the committed diagnosis (`mqar_diagnosis_cpu.json`) was measured from: the mix of pair
# counts on which the Transformer learns only which tokens are values.
FIRST_SETTINGS = {"train_pairs": [1, 2, 4, 8], "n_keys": 8, "n_values": 8, "batch_size": 32, "steps": 600}

DEFAULT_VARIANTS = [
    "base",
    "steps=2000",
    "steps=2000,train_sequences=65536",
    "steps=2000,train_sequences=65536,param_budget=100000",
    "steps=2000,train_sequences=65536,lr=0.001",
    "steps=2000,train_sequences=65536,lr=0.01",
    "steps=2000,train_sequences=65536,n_layer=3",
    "steps=2000,train_sequences=65536,n_head=1",
    "steps=2000,train_sequences=65536,batch_size=128",
    "steps=8000,train_sequences=65536",
    "steps=8000,train_sequences=65536,param_budget=100000,lr=0.001",
]


def parse_variant(text: str) -> dict:
    if text == "base":
        return {}
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        try:
            out[key] = float(value) if key == "lr" else int(value)
        except ValueError:
            raise SystemExit(f"--variant {text!r}: {part!r} is not key=number (e.g. steps=2000,lr=0.001)") from None
    return out


def diagnose(model, val, s) -> list[dict]:
    import numpy as np
    import torch

    from components.core.data import IGNORE_INDEX

    val0 = 1 + s.n_keys
    rows = []
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(val.x))
    pred = logits.argmax(-1).numpy()
    asked = val.y != IGNORE_INDEX
    is_val = (val.x >= val0) & (val.x < val0 + s.n_values)
    for p in s.pairs:
        acc, inctx, copy_any = [], [], []
        for i in np.flatnonzero(val.condition == p):
            values = val.x[i][is_val[i]]
            for t in np.flatnonzero(asked[i]):
                acc.append(pred[i, t] == val.y[i, t])
                inctx.append(pred[i, t] in values)
                copy_any.append(np.mean(values == val.y[i, t]))
        if acc:
            rows.append(
                {
                    "pairs": p,
                    "n": len(acc),
                    "accuracy": float(np.mean(acc)),
                    "in_context": float(np.mean(inctx)),
                    "copy_any": float(np.mean(copy_any)),
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", help="base, or key=value,... of RecallSettings (lr= the model's)")
    ap.add_argument("--model", default="transformer", help="rnn, lstm, transformer or window")
    ap.add_argument(
        "--defaults",
        action="store_true",
        help="start every variant from the recall study's current "
        "defaults, not from FIRST_SETTINGS (the mix the committed diagnosis measured)",
    )
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch

    from components.core.studies.memory import build_model, train_model
    from components.core.studies.memory_tasks import RecallSettings, disjoint_validation, recall_task

    torch.set_num_threads(1)
    results = []
    for spec in args.variant or DEFAULT_VARIANTS:
        kw = parse_variant(spec)
        lr = kw.pop("lr", None)
        s = RecallSettings(models=[args.model], **({} if args.defaults else FIRST_SETTINGS) | kw)
        lr = lr if lr is not None else s.lrs[args.model]
        train = recall_task(s, s.train_sequences, s.seed, s.trained_pairs)
        val = disjoint_validation(train, recall_task(s, s.val_per_pairs * len(s.pairs), s.seed + 1))
        torch.manual_seed(s.seed)
        model = build_model(args.model, s.vocab_size, s.seq_len, s.train, s.window)
        t0 = time.perf_counter()
        info = train_model(model, train, s.train, lr)
        row = {
            "variant": spec,
            "start": "defaults" if args.defaults else "first settings",
            "settings": s.model_dump(
                include={
                    "train_pairs",
                    "pairs",
                    "n_keys",
                    "n_values",
                    "batch_size",
                    "steps",
                    "seed",
                    "train_sequences",
                    "param_budget",
                    "n_layer",
                    "n_head",
                }
            ),
            "model": args.model,
            "lr": lr,
            "parameters": sum(p.numel() for p in model.parameters()),
            "final_train_loss": info["final_loss"],
            "train_seconds": time.perf_counter() - t0,
            "by_pairs": diagnose(model, val, s),
        }
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    emit({"benchmark": "mqar_diagnosis", "results": results}, args.out)


if __name__ == "__main__":
    main()
