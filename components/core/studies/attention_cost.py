"""What causal self-attention costs as the sequence grows: time and peak memory per implementation.

For each implementation and sequence length N, one pass (forward, or forward + backward) of causal
attention over (batch, n_head, N, head_dim) tensors:

- reference: QKᵀ → mask → softmax → ×V, materialising the (N, N) scores: O(N²) time and memory.
- fused: torch SDPA with is_causal=True (FlashAttention-class kernels; the CPU flash kernel on a CPU):
  O(N²) time, O(N) memory.
- window: sliding-window attention (each query sees the previous `window` keys): O(N·window) time and
  memory — what local attention buys when N outgrows the budget.

Time: the median of `repeats` timed passes after `warmup` untimed ones (synchronized on CUDA).

Peak memory (`peak_memory_bytes`): the most bytes of tensors allocated during one pass and alive at
once, on top of what was allocated before it (the inputs q, k, v and the output gradient):
- CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus memory_allocated before.
- CPU: the running sum of torch's CPU-allocator events (every allocation +bytes, every free −bytes)
  in time order, as torch.profiler records them with profile_memory=True; the peak of that sum.
  Allocations outside torch's allocator (Python objects, the profiler itself) are not counted.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Literal, get_args

import torch
from torch.profiler import ProfilerActivity, profile

from ..device import median_seconds, synchronize
from ..models.attention import fused_attention, reference_attention, sliding_window_attention

AttentionCostImpl = Literal["reference", "fused", "window"]
IMPLS = get_args(AttentionCostImpl)


def memory_accounting(device: torch.device | str) -> str:
    """How `peak_memory_bytes` counts on this device, in words (for the JSON of a sweep)."""
    if torch.device(device).type == "cuda":
        return "torch.cuda.max_memory_allocated during the pass minus memory_allocated before it (inputs excluded)"
    return ("peak of the running sum of torch CPU-allocator allocations and frees during the pass, from "
            "torch.profiler(profile_memory=True) records (inputs excluded)")


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes of tensors allocated by `fn()` and alive at once (see the module doc for how)."""
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # The raw event records: the aggregated profiler views attribute memory to ops and lose the order.
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    running = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        running += e.nbytes()  # negative for a free
        peak = max(peak, running)
    return peak


def doubling(n_start: int, n_max: int) -> list[int]:
    """n_start, 2·n_start, 4·n_start, ... up to n_max."""
    ns, n = [], n_start
    while n <= n_max:
        ns.append(n)
        n *= 2
    return ns


def _pass(impl: str, q, k, v, grad, *, scale: float, window: int, sdpa_backend: str) -> None:
    if impl == "reference":
        y = reference_attention(q, k, v, scale=scale)[0]
    elif impl == "fused":
        y = fused_attention(q, k, v, scale=scale, backend=sdpa_backend)
    else:
        y = sliding_window_attention(q, k, v, window, scale)  # (B, nh, N, hs)
    if grad is not None:
        y.backward(grad)
        q.grad = k.grad = v.grad = None


def attention_sweep(
    seq_lens: Iterable[int],
    impls: Iterable[str] = IMPLS,
    *,
    batch: int = 1,
    n_head: int,
    head_dim: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 3,
    warmup: int = 1,
    backward: bool = True,
    window: int = 256,
    sdpa_backend: str = "auto",
    memory_ceiling_bytes: int | None = None,
    time_cap_s: float | None = None,
    seed: int = 0,
) -> list[dict]:
    """One row per (implementation, N), N increasing: {"impl", "n", "ms", "peak_bytes", "peak_mib"}.

    A point that fails (out of memory, a kernel that cannot run the shape) is recorded as
    {"impl", "n", "error"} and ends that implementation's sweep, as does a point whose peak exceeds
    `memory_ceiling_bytes` or whose median exceeds `time_cap_s` (its row then says why under "stop").
    `sdpa_backend` pins the fused kernel on CUDA ("auto" lets torch choose).
    """
    device = torch.device(device)
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        raise ValueError(f"unknown attention implementation(s) {unknown}; use any of: {', '.join(IMPLS)}")
    scale = 1.0 / math.sqrt(head_dim)
    rows = []
    for impl in impls:
        for n in sorted(seq_lens):
            gen = torch.Generator(device=device).manual_seed(seed)
            shape = (batch, n_head, n, head_dim)
            try:
                q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=gen, requires_grad=backward) for _ in range(3))
                grad = torch.randn(shape, device=device, dtype=dtype, generator=gen) if backward else None

                def run() -> None:
                    _pass(impl, q, k, v, grad, scale=scale, window=window, sdpa_backend=sdpa_backend)

                peak = peak_memory_bytes(run, device)  # also the first run: where an allocation fails
                ms = 1000 * median_seconds(run, device, warmup=warmup, repeats=repeats)
            except RuntimeError as e:  # torch.OutOfMemoryError is one
                what = "out of memory" if isinstance(e, torch.OutOfMemoryError) else str(e).splitlines()[0]
                rows.append({"impl": impl, "n": n, "error": f"{type(e).__name__}: {what}"})
                break
            finally:
                q = k = v = grad = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            row = {"impl": impl, "n": n, "ms": ms, "peak_bytes": peak, "peak_mib": peak / 2**20}
            if memory_ceiling_bytes is not None and peak > memory_ceiling_bytes:
                row["stop"] = f"peak {peak} bytes is over the memory ceiling of {memory_ceiling_bytes}"
            elif time_cap_s is not None and ms > 1000 * time_cap_s:
                row["stop"] = f"{ms:.0f} ms per pass is over the time cap of {time_cap_s} s"
            rows.append(row)
            if "stop" in row:
                break
    return rows


def ratio_by_n(rows: list[dict], key: str, numerator: str, denominator: str) -> dict[str, float]:
    """{str(N): row_numerator[key] / row_denominator[key]} over the N both implementations measured."""
    ok = {(r["impl"], r["n"]): r for r in rows if "error" not in r}
    return {
        str(n): ok[(numerator, n)][key] / max(ok[(denominator, n)][key], 1e-9)
        for (impl, n) in ok if impl == denominator and (numerator, n) in ok
    }
