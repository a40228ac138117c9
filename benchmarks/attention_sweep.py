"""Causal attention on the CPU as the sequence grows: reference vs fused (SDPA) vs sliding window.

For N doubling from --n-start to --n-max, one forward and one forward+backward of causal
self-attention over (1, heads, N, head_dim) float32 tensors, through the `attention_cost` asset's own
function (`components.core.studies.attention_cost.attention_cost`; its module doc says how time and
peak memory are measured; on a CPU the peak is torch's allocator accounting from the profiler, not
the process's RSS), with the fitted log-log exponents:

- reference: QKᵀ → mask → softmax → ×V, materialising the (N, N) scores: O(N²) time and memory.
- fused: torch SDPA with is_causal=True (the CPU flash kernel): O(N²) time, O(N) memory.
- window: sliding-window attention (each query sees the previous --window keys and the first
  --n-global positions), computed block by block with SDPA: O(N·W) time and memory — what local
  attention buys when N outgrows the budget.
- flex (with --impls ...,flex): the same mask through compiled FlexAttention; on the CPU its forward
  runs and its backward is refused (recorded as an error row).

Prints one JSON object (and writes it with --out).

    python benchmarks/attention_sweep.py --out benchmarks/results/attention_sweep_cpu.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_file import emit  # noqa: E402

from components.core.studies.attention_cost import AttentionCostSettings, attention_cost, doubling  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--n-start", type=int, default=256)
    ap.add_argument("--n-max", type=int, default=8192)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--n-global", type=int, default=0, help="global tokens of the window and flex implementations")
    ap.add_argument(
        "--impls",
        default="reference,fused,window",
        help="comma-separated; flex = FlexAttention (compiled; forward only on the CPU)",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--time-cap-s", type=float, default=20.0, help="stop an implementation once one point takes longer")
    ap.add_argument(
        "--memory-ceiling-gib", type=float, default=8.0, help="stop an implementation once one point's peak is larger"
    )
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    settings = AttentionCostSettings(
        seq_lens=doubling(args.n_start, args.n_max),
        impls=args.impls.split(","),
        n_global=args.n_global,
        n_head=args.heads,
        head_dim=args.head_dim,
        window=args.window,
        repeats=args.reps,
        repeat_budget_s=None,  # a benchmark times every repeat it is asked for
        warmup=1,
        memory_ceiling_mib=args.memory_ceiling_gib * 1024,
        time_cap_s=args.time_cap_s,
        device="cpu",
        threads=args.threads,
    )
    out: dict = {
        "benchmark": "attention_sweep",
        "cpu": platform.processor() or platform.machine(),
        "settings": settings.model_dump(),
        "loadavg_start": list(os.getloadavg()),
    }
    result = attention_cost(settings)  # the attention_cost asset's code path
    out.update(result.info)
    out["rows"] = result.rows
    out["fits"] = result.fits
    out["reference_over_fused_at_max_n"] = result.ratios_at_max()
    out["loadavg_end"] = list(os.getloadavg())
    return emit(out, args.out)


if __name__ == "__main__":
    main()
