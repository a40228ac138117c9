"""The recurrent language models' training step in float32 against bfloat16 autocast, side by side:
the pipeline's `rnn_lm` and `lstm_lm` (their `defs.yaml` shapes and batches) in the shared loop on the
default corpus as the default run tokenizes it (bytes: BPE with 260 symbols), the two precisions
alternating every --interleave steps so that a change in the machine's load hits both alike.

Where bfloat16 is `dtype: auto`'s choice (a CPU with AMX), it is not always the faster one for a small
recurrent model: each of the 128 time steps is a small matmul, and the casts around it cost as much as
the product. The default run trains each model in the precision this benchmark measured faster.

    python benchmarks/recurrent_dtype.py --out benchmarks/results/recurrent_dtype_cpu_<kind>.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from recurrent_throughput import MODELS, OursRun, bpe_blocks, loop_settings, split_blocks  # noqa: E402
from result_file import emit  # noqa: E402

from components.core.lm import build_model, resolve_settings  # noqa: E402
from components.core.machine import cpu_identity  # noqa: E402

# The batches and rates of pipelines/defs/{rnn_lm,lstm_lm}/defs.yaml.
TRAIN = {
    "rnn": dict(batch_size=16, lr=0.004, min_lr=0.0004, warmup_steps=30, grad_clip=1.0),
    "lstm": dict(batch_size=8, lr=0.032, min_lr=0.0032, warmup_steps=30, grad_clip=1.0),
}
DTYPES = ("float32", "bfloat16")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--interleave", type=int, default=50)
    ap.add_argument("--cells", default="rnn,lstm")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    blocks, V = bpe_blocks(128, 260)
    train_blocks, val_blocks = split_blocks(blocks)
    out: dict = {
        "benchmark": "recurrent_dtype",
        "steps": args.steps,
        "interleave": args.interleave,
        "vocab_size": V,
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": cpu_identity(),
        "models": {},
    }
    tmp = tempfile.TemporaryDirectory()
    for cell in [c.strip() for c in args.cells.split(",") if c.strip()]:
        settings = resolve_settings("recurrent", MODELS[cell], V)
        runs = {}
        for dtype in DTYPES:
            ts = loop_settings(TRAIN[cell], args.steps, args.interleave, args.threads, dtype)
            torch.manual_seed(ts.seed)
            runs[dtype] = OursRun(
                build_model("recurrent", settings, V), train_blocks, val_blocks, ts, Path(tmp.name) / cell / dtype
            )
        for _ in range(0, args.steps, args.interleave):
            for dtype in DTYPES:
                runs[dtype].steps(args.interleave)
            print(f"[recurrent_dtype] {cell}: {runs[DTYPES[0]].done}/{args.steps} steps", file=sys.stderr)
        tokens = TRAIN[cell]["batch_size"] * 128
        ms = {d: 1000 * r.timed_s / r.timed_steps for d, r in runs.items()}
        out["models"][cell] = {
            "settings": settings.model_dump(),
            "batch_size": TRAIN[cell]["batch_size"],
            **{f"{d}_step_ms": ms[d] for d in DTYPES},
            **{f"{d}_tokens_per_s": tokens / ms[d] * 1000 for d in DTYPES},
            "bfloat16_over_float32_time": ms["bfloat16"] / ms["float32"],
            "faster": min(DTYPES, key=ms.get),
        }
    tmp.cleanup()
    return emit(out, args.out)


if __name__ == "__main__":
    main()
