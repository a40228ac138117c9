"""RoPE's rotation of queries and keys in bfloat16, the training step's path, against the four-pass
formula it replaced, side by side in one process, forward and backward.

bfloat16 has no complex type. The reference rotates each channel pair with four strided passes over
the pairs' halves in bfloat16 (`x0·cos − x1·sin`, `x1·cos + x0·sin`, rounding after each product and
sum). The pipeline's `rotate_pairs_into` copies the pairs to float32, rotates them as complex numbers in
one pass and rounds once into bfloat16. Both are timed on the shapes the default run trains and
evaluates with (the projection layout (B, T, 2, nh, hs) of queries and keys), alternating `--rounds`
times so that a change in the machine's load hits both alike; the error is against the rotation in
float64 of the same bfloat16 inputs.

    python benchmarks/rope_rotation.py --out benchmarks/results/rope_rotation_cpu_<kind>.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import emit  # noqa: E402

from components.core.models.positional import RotaryEmbedding, channel_pairs, rotate_pairs_into  # noqa: E402

# (name, B, T, nh, hs): where the default run rotates in bfloat16.
SHAPES = [
    ("transformer_lm training step (batch 4)", 4, 128, 4, 32),
    ("transformer_lm evaluation (batch 16)", 16, 128, 4, 32),
    ("transformer_ablations training step (batch 16)", 16, 64, 4, 16),
    ("nanoGPT baby GPT step (batch 12)", 12, 64, 4, 32),
]


def four_pass(out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The replaced bfloat16 rotation: four strided passes over the pairs' halves."""
    (x0, x1), (o0, o1) = channel_pairs(x).unbind(-1), channel_pairs(out).unbind(-1)
    torch.mul(x0, cos, out=o0).addcmul_(x1, sin, value=-1)
    torch.mul(x1, cos, out=o1).addcmul_(x0, sin)


def per_call_us(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def measure(B: int, T: int, nh: int, hs: int, rounds: int, calls: int) -> dict:
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(B, T, 3, nh, hs, generator=g).to(torch.bfloat16)
    rope = RotaryEmbedding(hs, T)
    rot, _ = rope.rotation_tables(0, T, torch.bfloat16, qkv.device)
    cos, sin = (t[:T, None, None, :].to(torch.bfloat16) for t in (rope.cos, rope.sin))
    x, out = qkv[:, :, :2], torch.empty_like(qkv)[:, :, :2]
    runs = {
        "four_pass_bfloat16": lambda: four_pass(out, x, cos, sin),
        "float32_complex": lambda: rotate_pairs_into(out, x, rot),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()  # warm up
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name].append(per_call_us(fn, calls))
    exact = torch.view_as_complex(channel_pairs(x.double().contiguous())) * rot.to(torch.complex128)
    exact = torch.view_as_real(exact).flatten(-2)
    errors = {}
    for name, fn in runs.items():
        fn()
        errors[name] = float((out.double() - exact).abs().max())
    best = {k: min(v) for k, v in times.items()}
    return {
        "shape_B_T_nh_hs": [B, T, nh, hs],
        "us_per_call_best": best,
        "us_per_call_all": times,
        "max_abs_error_vs_float64": errors,
        "speedup": best["four_pass_bfloat16"] / best["float32_complex"],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = {
        "benchmark": "rope_rotation",
        "reference": "four_pass_bfloat16 (the rotation before this change)",
        "threads": args.threads,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "shapes": {name: measure(B, T, nh, hs, args.rounds, args.calls) for name, B, T, nh, hs in SHAPES},
    }
    return emit(out, args.out)


if __name__ == "__main__":
    main()
