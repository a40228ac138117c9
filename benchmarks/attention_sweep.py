"""Causal attention on the CPU as the sequence grows: reference vs fused (SDPA) vs sliding window.

For N doubling from --n-start to --n-max, one forward+backward of causal self-attention over
(1, heads, N, head_dim) float32 tensors, through `components.core.studies.attention_cost.attention_sweep`
(its module doc says how time and peak memory are measured; on a CPU the peak is torch's allocator
accounting from the profiler, not the process's RSS):

- reference: QKᵀ → mask → softmax → ×V, materialising the (N, N) scores: O(N²) time and memory.
- fused: torch SDPA with is_causal=True (the CPU flash kernel): O(N²) time, O(N) memory.
- window: sliding-window attention (each query sees the previous --window keys), computed block by
  block with SDPA: O(N·W) time and memory — what local attention buys when N outgrows the budget.

Prints one JSON object (and writes it with --out).

    python benchmarks/attention_sweep.py --out benchmarks/results/attention_sweep_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.core.studies.attention_cost import (  # noqa: E402
    IMPLS, attention_sweep, doubling, memory_accounting, ratio_by_n,
)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--n-start", type=int, default=256)
    ap.add_argument("--n-max", type=int, default=8192)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--time-cap-s", type=float, default=20.0, help="stop an implementation once one point takes longer")
    ap.add_argument("--memory-ceiling-gib", type=float, default=8.0, help="stop an implementation once one point's peak is larger")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    out: dict = {
        "benchmark": "attention_sweep", "device": "cpu", "dtype": "float32", "pass": "forward+backward",
        "heads": args.heads, "head_dim": args.head_dim, "window_size": args.window, "threads": args.threads,
        "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
        "memory": memory_accounting("cpu"), "loadavg_start": list(os.getloadavg()),
    }
    rows = attention_sweep(
        doubling(args.n_start, args.n_max), IMPLS, n_head=args.heads, head_dim=args.head_dim, device="cpu",
        repeats=args.reps, warmup=1, backward=True, window=args.window,
        memory_ceiling_bytes=int(args.memory_ceiling_gib * 2**30), time_cap_s=args.time_cap_s,
    )
    for impl in IMPLS:
        out[impl] = [{k: v for k, v in r.items() if k != "impl"} for r in rows if r["impl"] == impl]
    out["speedup_fused_vs_reference"] = ratio_by_n(rows, "ms", "reference", "fused")
    out["memory_ratio_reference_vs_fused"] = ratio_by_n(rows, "peak_bytes", "reference", "fused")
    out["loadavg_end"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
