"""What causal self-attention costs as the sequence grows: time and peak memory per implementation.

For each implementation and sequence length N, one pass (forward, or forward + backward) of causal
attention over (batch, n_head, N, head_dim) tensors:

- reference: QKᵀ → mask → softmax → ×V, materialising the (N, N) scores: O(N²) time and memory.
- fused: torch SDPA with is_causal=True (FlashAttention-class kernels; the CPU flash kernel on a CPU):
  O(N²) time, O(N) memory.
- window: sliding-window attention (each query sees the previous `window` keys and the first
  `n_global` positions), block by block: O(N·window) time and memory — what local attention buys
  when N outgrows the budget.
- flex: the same mask through FlexAttention (compiled, a BlockMask skipping masked key blocks). Not in
  the CPU default: torch 2.13 runs its forward on the CPU but not its backward (that point is then
  recorded as an error), and each N compiles anew (tens of seconds on 2 cores). The GPU config runs it.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Optional, get_args

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch.profiler import ProfilerActivity, profile

from ..device import DeviceSetting, median_seconds, quiet_profiler, resolve_device, synchronize
from ..models.attention import (
    SdpaBackend,
    flex_window_attention,
    fused_attention,
    reference_attention,
    sliding_window_attention,
)
from ..models.sdpa_probe import detect_sdpa_backend

if TYPE_CHECKING:  # drawn only when plotted: matplotlib is imported by the plot functions
    from matplotlib.figure import Figure


AttentionCostImpl = Literal["reference", "fused", "window", "flex"]
IMPLS = get_args(AttentionCostImpl)
DEFAULT_IMPLS = ("reference", "fused", "window")
AttentionPass = Literal["forward", "forward_backward"]
PASSES = get_args(AttentionPass)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def memory_accounting(device: torch.device | str) -> str:
    """How `peak_memory_bytes` counts on this device, in words (for the JSON of a sweep)."""
    if torch.device(device).type == "cuda":
        return "torch.cuda.max_memory_allocated during the pass minus memory_allocated before it (inputs excluded)"
    return (
        "peak of the running sum of torch CPU-allocator allocations and frees during the pass, from "
        "torch.profiler(profile_memory=True) records (inputs excluded)"
    )


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
    quiet_profiler()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # The raw event records: the aggregated profiler views attribute memory to ops and lose the order.
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        raise RuntimeError("the profiler recorded no events")
    cpu = torch.autograd.DeviceType.CPU  # pyright: ignore[reportPrivateImportUsage]
    events = [e for e in results.events() if e.name() == "[memory]" and e.device_type() == cpu]
    running = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        running += e.nbytes()  # pyright: ignore[reportAttributeAccessIssue]  # negative for a free
        peak = max(peak, running)
    return peak


def doubling(n_start: int, n_max: int) -> list[int]:
    """n_start, 2·n_start, 4·n_start, ... up to n_max."""
    ns, n = [], n_start
    while n <= n_max:
        ns.append(n)
        n *= 2
    return ns


def _pass(impl: str, q, k, v, grad, *, scale: float, window: int, sdpa_backend: str, n_global: int = 0) -> None:
    if impl == "reference":
        y = reference_attention(q, k, v, scale=scale)[0]
    elif impl == "fused":
        y = fused_attention(q, k, v, scale=scale, backend=sdpa_backend)
    elif impl == "flex":
        y = flex_window_attention(q, k, v, window, scale, n_global)  # (B, nh, N, hs)
    else:
        y = sliding_window_attention(q, k, v, window, scale, n_global)  # (B, nh, N, hs)
    if grad is not None:
        y.backward(grad)
        q.grad = k.grad = v.grad = None


def attention_sweep(
    seq_lens: Iterable[int],
    impls: Iterable[str] = DEFAULT_IMPLS,
    *,
    batch: int = 1,
    n_head: int,
    head_dim: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 3,
    warmup: int = 1,
    repeat_budget_s: float | None = None,
    backward: bool = True,
    window: int = 256,
    n_global: int = 0,
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
                q, k, v = (
                    torch.randn(shape, device=device, dtype=dtype, generator=gen, requires_grad=backward)
                    for _ in range(3)
                )
                grad = torch.randn(shape, device=device, dtype=dtype, generator=gen) if backward else None

                def run() -> None:
                    _pass(impl, q, k, v, grad, scale=scale, window=window, sdpa_backend=sdpa_backend, n_global=n_global)

                if impl == "flex":
                    run()  # compiles: kept out of the memory measurement
                peak = peak_memory_bytes(run, device)  # also the first run: where an allocation fails
                ms = 1000 * median_seconds(run, device, warmup=warmup, repeats=repeats, budget_s=repeat_budget_s)
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
        for (impl, n) in ok
        if impl == denominator and (numerator, n) in ok
    }


# --------------------------------------------------------------------------------------------------
# The study an asset runs: both passes, fitted exponents, ratios, plots.


class AttentionCostSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq_lens: list[int] = Field(
        default=[256, 512, 1024, 2048, 4096, 8192],
        description="Sequence lengths N, increasing (the CPU default doubles 256 … 8192; the GPU config goes to 64k "
        "and more).",
    )
    impls: list[str] = Field(
        default=list(DEFAULT_IMPLS),
        description="Implementations: reference (materialises N×N), fused (SDPA), window (blocked sliding window), "
        "flex (the window's mask through compiled FlexAttention; forward only on the CPU).",
    )
    passes: list[str] = Field(default=list(PASSES), description="Passes to time: inference, and training.")
    batch: int = Field(default=1, ge=1, description="Sequences per pass.")
    n_head: int = Field(default=4, ge=1, description="Attention heads.")
    head_dim: int = Field(default=32, ge=1, description="Dimensions per head.")
    window: int = Field(
        default=256,
        ge=1,
        description="Keys each query sees in the sliding window (itself and the previous window-1); at most the "
        "smallest N.",
    )
    n_global: int = Field(
        default=0,
        ge=0,
        description="Global tokens of the window and flex implementations: the first n_global positions every query "
        "sees; fewer than the smallest N.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Tensor dtype (bfloat16 on the GPU)."
    )
    repeats: int = Field(default=3, ge=1, description="Timed passes per point (the median is reported).")
    repeat_budget_s: Optional[float] = Field(
        default=3.0,
        gt=0,
        description="A point stops repeating once its timed passes add up to this many seconds (one pass at least). "
        "On the 2-core CPU the reference's forward+backward pass at N = 8192 takes about 6 s: three of them and a "
        "warm-up were a third of the step, for a figure one pass of that length already gives. null: always `repeats`.",
    )
    warmup: int = Field(
        default=0,
        ge=0,
        description="Untimed passes before timing each point, after the pass that measures its peak memory (which "
        "already runs it once: the first allocation, the kernels' first call).",
    )
    memory_ceiling_mib: float = Field(
        default=6144.0,
        gt=0,
        description="An implementation stops once one point's peak is above this (the next doubling would take about "
        "4× for the reference), so the sweep cannot take the machine down.",
    )
    time_cap_s: float = Field(
        default=20.0, gt=0, description="An implementation stops once one pass takes longer than this."
    )
    fit_from: int = Field(
        default=1024,
        ge=1,
        description="Exponents are fitted over N >= fit_from (smaller points are dominated by fixed overheads), or the "
        "top three points when fewer qualify.",
    )
    sdpa_backend: SdpaBackend = Field(default="auto", description="Pin the fused kernel on CUDA (auto: torch chooses).")
    device: DeviceSetting = Field(default="auto", description="Where to measure: 'auto' = CUDA if present, else CPU.")
    threads: int = Field(default=0, ge=0, description="torch.set_num_threads when > 0 (CPU).")
    seed: int = Field(default=0, description="Seed of the random q, k, v.")

    @field_validator("seq_lens")
    @classmethod
    def _seq_lens(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("seq_lens is empty: give the sequence lengths N to sweep, e.g. [256, 512, 1024]")
        if any(n < 1 for n in v):
            raise ValueError(f"seq_lens must be positive, got {v}")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(
                f"seq_lens must be strictly increasing (the sweep stops an implementation at its first failing N), got "
                f"{v}"
            )
        return v

    @field_validator("impls", "passes")
    @classmethod
    def _known(cls, v: list[str], info) -> list[str]:
        allowed = IMPLS if info.field_name == "impls" else PASSES
        if not v:
            raise ValueError(f"{info.field_name} is empty; use any of: {', '.join(allowed)}")
        unknown = [x for x in v if x not in allowed]
        if unknown:
            raise ValueError(f"{info.field_name} has unknown {unknown}; use any of: {', '.join(allowed)}")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _window_and_ceiling(self) -> "AttentionCostSettings":
        if {"window", "flex"} & set(self.impls) and self.window > self.seq_lens[0]:
            raise ValueError(
                f"window={self.window} is larger than the smallest N ({self.seq_lens[0]}) in seq_lens: there the "
                f"window "
                "would be full attention; lower the window or drop the small N"
            )
        if self.n_global >= self.seq_lens[0]:
            raise ValueError(
                f"n_global={self.n_global} global tokens is not fewer than the smallest N ({self.seq_lens[0]}) in "
                f"seq_lens"
            )
        # Every pass allocates at least its output (batch, n_head, N, head_dim) at the smallest N.
        smallest = self.batch * self.n_head * self.seq_lens[0] * self.head_dim * DTYPES[self.dtype].itemsize
        if self.memory_ceiling_mib * 2**20 < smallest:
            raise ValueError(
                f"memory_ceiling_mib={self.memory_ceiling_mib} is below the smallest point's output alone "
                f"({smallest / 2**20:.3f} MiB at N={self.seq_lens[0]}): no point could be measured"
            )
        return self


def fit_exponent(ns: list[float], values: list[float]) -> dict[str, float]:
    """Least squares log(value) = exponent · log(N) + c: the exponent (2 for a quadratic cost, 1 for a
    linear one), R² of the fit in log space, and the points used."""
    x, y = np.log(np.asarray(ns, dtype=np.float64)), np.log(np.maximum(np.asarray(values, dtype=np.float64), 1e-30))
    if len(x) < 2:
        return {"exponent": float("nan"), "r2": float("nan"), "points": len(x)}
    slope, intercept = np.polyfit(x, y, 1)
    ss_res, ss_tot = float(((y - (slope * x + intercept)) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    return {"exponent": float(slope), "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0, "points": len(x)}


def fit_rows(rows: list[dict], fit_from: int) -> list[dict]:
    """Per (pass, impl): time and memory exponents over N >= fit_from (at least the top three points),
    and the cost ratio of the top doubling, cost(2N)/cost(N) (the "twice the length" question)."""
    out = []
    for p in dict.fromkeys(r["pass"] for r in rows):
        for impl in dict.fromkeys(r["impl"] for r in rows if r["pass"] == p):
            ok = [r for r in rows if r["pass"] == p and r["impl"] == impl and "error" not in r]
            use = [r for r in ok if r["n"] >= fit_from]
            if len(use) < 3:
                use = ok[-3:]
            row = {
                "pass": p,
                "impl": impl,
                "n_min": use[0]["n"] if use else None,
                "n_max": use[-1]["n"] if use else None,
            }
            pair = ok[-2:] if len(ok) >= 2 and ok[-1]["n"] == 2 * ok[-2]["n"] else []  # the top doubling
            for key, name in (("ms", "time"), ("peak_bytes", "memory")):
                f = fit_exponent([r["n"] for r in use], [r[key] for r in use])
                row[f"{name}_exponent"], row[f"{name}_r2"] = f["exponent"], f["r2"]
                row[f"{name}_ratio_last_doubling"] = pair[1][key] / max(pair[0][key], 1e-12) if pair else float("nan")
            row["points"] = len(use)
            out.append(row)
    return out


def plot_attention_cost(rows: list[dict]) -> Figure:
    passes = list(dict.fromkeys(r["pass"] for r in rows))
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2 * len(passes)), layout="constrained")
    axes = fig.subplots(len(passes), 2, squeeze=False)
    for (ax_t, ax_m), p in zip(axes, passes):
        for impl in dict.fromkeys(r["impl"] for r in rows):
            ok = [r for r in rows if r["pass"] == p and r["impl"] == impl and "error" not in r]
            if not ok:
                continue
            n = [r["n"] for r in ok]
            ax_t.loglog(n, [r["ms"] for r in ok], "o-", base=2, label=impl)
            ax_m.loglog(n, [r["peak_mib"] for r in ok], "o-", base=2, label=impl)
        for ax, what in ((ax_t, "time per pass (ms)"), (ax_m, "peak memory of the pass (MiB)")):
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(what)
            ax.set_title(f"causal attention, {p}: {what.split(' (')[0]}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    return fig


@dataclass
class AttentionCostResult:
    rows: list[dict]
    fits: list[dict]
    info: dict
    figures: dict[str, Figure] = field(default_factory=dict)

    def fit(self, p: str, impl: str) -> dict | None:
        return next((f for f in self.fits if f["pass"] == p and f["impl"] == impl), None)

    def ratios_at_max(self) -> dict[str, float]:
        """reference / fused time and memory at the largest N both measured, per pass."""
        out = {}
        for p in dict.fromkeys(r["pass"] for r in self.rows):
            rs = [r for r in self.rows if r["pass"] == p]
            for key, name in (("ms", "time"), ("peak_bytes", "memory")):
                ratio = ratio_by_n(rs, key, "reference", "fused")
                if ratio:
                    n = max(ratio, key=int)
                    out[f"{p}/{name}_reference_over_fused"] = ratio[n]
                    out[f"{p}/at_n"] = int(n)
        return out

    def metrics(self) -> dict[str, float]:
        out = {}
        for f in self.fits:
            for k in (
                "time_exponent",
                "memory_exponent",
                "time_r2",
                "time_ratio_last_doubling",
                "memory_ratio_last_doubling",
            ):
                out[f"attention/{f['pass']}/{f['impl']}/{k}"] = f[k]
        out.update({f"attention/{k}": v for k, v in self.ratios_at_max().items()})
        return out

    def markdown(self) -> str:
        lines = ["| pass | impl | N | ms | peak MiB |", "| --- | --- | ---: | ---: | ---: |"]
        for r in self.rows:
            if "error" in r:
                lines.append(f"| {r['pass']} | {r['impl']} | {r['n']} | {r['error']} | |")
            else:
                lines.append(
                    f"| {r['pass']} | {r['impl']} | {r['n']} | {r['ms']:.2f} | {r['peak_mib']:.2f} |"
                    + (f" stop: {r['stop']}" if "stop" in r else "")
                )
        lines += [
            "",
            "| pass | impl | time exponent (R²) | memory exponent (R²) | cost(2N)/cost(N) time, memory |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for f in self.fits:
            lines.append(
                f"| {f['pass']} | {f['impl']} | {f['time_exponent']:.2f} ({f['time_r2']:.3f}) | "
                f"{f['memory_exponent']:.2f} ({f['memory_r2']:.3f}) "
                f"| {f['time_ratio_last_doubling']:.2f}, {f['memory_ratio_last_doubling']:.2f} |"
            )
        return "\n".join(lines)


def attention_cost(settings: AttentionCostSettings) -> AttentionCostResult:
    """The sweep for every pass in `settings`, exponents fitted, figure drawn (for an asset to log, and
    for benchmarks/attention_sweep.py: one code path)."""
    s = settings
    if s.threads > 0:
        torch.set_num_threads(s.threads)
    device, _ = resolve_device(s.device)
    dtype = DTYPES[s.dtype]
    rows = []
    for p in s.passes:
        for r in attention_sweep(
            s.seq_lens,
            s.impls,
            batch=s.batch,
            n_head=s.n_head,
            head_dim=s.head_dim,
            device=device,
            dtype=dtype,
            repeats=s.repeats,
            warmup=s.warmup,
            repeat_budget_s=s.repeat_budget_s,
            backward=p == "forward_backward",
            window=s.window,
            n_global=s.n_global,
            sdpa_backend=s.sdpa_backend,
            memory_ceiling_bytes=int(s.memory_ceiling_mib * 2**20),
            time_cap_s=s.time_cap_s,
            seed=s.seed,
        ):
            rows.append({"pass": p, **r})
    info = {
        "device": str(device),
        "dtype": s.dtype,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "memory_accounting": memory_accounting(device),
        "fused_kernel": _observed_kernel(device, dtype, s),
        "settings": s.model_dump(),
    }
    return AttentionCostResult(
        rows=rows, fits=fit_rows(rows, s.fit_from), info=info, figures={"attention_cost": plot_attention_cost(rows)}
    )


def _observed_kernel(device: torch.device, dtype: torch.dtype, s: AttentionCostSettings) -> str:
    """The SDPA kernel the fused path runs at the smallest N, as the profiler saw it."""
    try:
        d = detect_sdpa_backend(device, dtype, (s.batch, s.n_head, s.seq_lens[0], s.head_dim), s.sdpa_backend)
        return str(d.get("observed") or f"none observed ({d.get('error')})")
    except Exception as e:  # noqa: BLE001 - observation only: never fail the sweep for it
        return f"unknown ({type(e).__name__}: {e})"
