"""Causal attention on the CPU as the sequence grows: reference vs fused (SDPA) vs sliding window.

For N doubling from --n-start to --n-max, one forward+backward of causal self-attention over
(1, heads, N, head_dim) float32 tensors, each point in a fresh forked process so its peak memory is
its own (max RSS growth over the process's starting size):

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
import math
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.core.models.attention import fused_attention, reference_attention  # noqa: E402


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float) -> torch.Tensor:
    """Causal attention where query t sees keys (t - window, t], one block of `window` queries at a time."""
    T = q.shape[-2]
    outs = []
    for s in range(0, T, window):
        e = min(s + window, T)
        k0 = max(0, s - window + 1)
        qi = torch.arange(s, e)[:, None]  # (bq, 1) absolute query positions
        kj = torch.arange(k0, e)[None, :]  # (1, bk) absolute key positions
        allowed = (kj <= qi) & (kj > qi - window)  # (bq, bk)
        outs.append(F.scaled_dot_product_attention(q[..., s:e, :], k[..., k0:e, :], v[..., k0:e, :], attn_mask=allowed, scale=scale))
    return torch.cat(outs, dim=-2)  # (B, nh, T, hs)


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _measure(impl: str, n: int, heads: int, head_dim: int, window: int, reps: int, threads: int, conn) -> None:
    try:
        torch.set_num_threads(threads)
        start = _rss_kib()
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, heads, n, head_dim, generator=g, requires_grad=True) for _ in range(3))
        grad = torch.randn(1, heads, n, head_dim, generator=g)
        scale = 1.0 / math.sqrt(head_dim)

        def run():
            if impl == "reference":
                y = reference_attention(q, k, v, scale=scale)[0]
            elif impl == "fused":
                y = fused_attention(q, k, v, scale=scale)
            else:
                y = sliding_window_attention(q, k, v, window, scale)
            y.backward(grad)
            q.grad = k.grad = v.grad = None

        run()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        conn.send({"n": n, "ms": 1000 * statistics.median(times), "peak_mib": (peak - start) / 1024})
    except Exception as e:  # noqa: BLE001 - report, e.g. out of memory
        conn.send({"n": n, "error": f"{type(e).__name__}: {e}"})


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
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    ctx = mp.get_context("fork")  # the child inherits the imports; no torch op ran in this process before
    out: dict = {
        "benchmark": "attention_sweep", "device": "cpu", "dtype": "float32", "pass": "forward+backward",
        "heads": args.heads, "head_dim": args.head_dim, "window": args.window, "threads": args.threads,
        "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
        "loadavg_start": list(os.getloadavg()),
    }
    for impl in ("reference", "fused", "window"):
        rows, n = [], args.n_start
        while n <= args.n_max:
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_measure, args=(impl, n, args.heads, args.head_dim, args.window, args.reps, args.threads, child))
            p.start()
            row = parent.recv() if parent.poll(600) else {"n": n, "error": "timeout"}
            p.join()
            if p.exitcode not in (0, None) and "error" not in row:
                row = {"n": n, "error": f"exit code {p.exitcode}"}
            rows.append(row)
            print(f"{impl} {json.dumps(row)}", file=sys.stderr)
            if "error" in row or row["ms"] > 1000 * args.time_cap_s:
                break
            n *= 2
        out[impl] = rows
    ok = {impl: {r["n"]: r for r in out[impl] if "ms" in r} for impl in ("reference", "fused", "window")}
    out["speedup_fused_vs_reference"] = {str(n): ok["reference"][n]["ms"] / r["ms"] for n, r in ok["fused"].items() if n in ok["reference"]}
    out["memory_ratio_reference_vs_fused"] = {
        str(n): ok["reference"][n]["peak_mib"] / max(r["peak_mib"], 1e-3) for n, r in ok["fused"].items() if n in ok["reference"]
    }
    out["loadavg_end"] = list(os.getloadavg())
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
