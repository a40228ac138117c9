"""One prepared GPU check (H200-class, bf16), ≤ 8 minutes, written to one JSON summary.

    python scripts/gpu_check.py --out benchmarks/results/gpu_check_h200.json      # needs CUDA
    python scripts/gpu_check.py --dry-run --out /tmp/gpu_check_dry.json          # CPU, tiny, seconds

Sections (each records its own error instead of stopping the others; the JSON is rewritten after
every section, so a timeout still leaves the finished ones):

1. env        torch / CUDA / GPU name, memory, bf16 support, bitsandbytes version.
2. sdpa       which SDPA kernels run causal attention at the training shape (bf16), the dispatcher's
              own choice, and the kernel observed by the profiler with flash pinned.
3. train      GPT-2 small (12 layers, 12 heads, width 768, context 1024, vocab 50304: 124M
              parameters) through the pipeline's own model and training loop: bf16 autocast, fused
              AdamW, torch.compile, attention `fused` pinned to FlashAttention. Tokens/s and MFU
              against the GPU's dense bf16 peak (goal: MFU ≥ 45%; nanoGPT reports 37% on an A100),
              plus the aten ops and CUDA kernels observed in one step of the model.
4. sweep      causal attention alone, reference (explicit QKᵀ·softmax·V) vs fused (SDPA, flash
              pinned), forward+backward, N doubling until out of memory (or a point over the time
              cap): milliseconds and peak memory, through the study's one sweep function
              (components.core.studies.attention_cost; on CUDA torch.cuda.max_memory_allocated).
5. bnb        bitsandbytes Linear8bitLt (INT8) and Linear4bit (NF4) forward vs the fp16 layer:
              relative error, weight bytes, allocated bytes, time.
6. bnb_generate  the pipeline's quantization path (components.core.studies.quantization
              .cuda_bnb_check) on a GPT-2-medium-sized Transformer (24 layers, width 1024): per
              variant FP32/FP16/BF16/INT8/NF4, GPU bytes of the weights, peak GPU memory while
              generating, generation tokens/s (greedy, batch 1, KV cache where the model has one) and
              the max-abs logit difference from FP32.
7. ddp        multi-GPU data parallelism through the pipeline's torchrun worker (DDP, NCCL) on
              GPT-2 small (bf16, no compile): tokens/s on 1 GPU and on every GPU at the same batch per
              GPU, the speedup and scaling efficiency, and the all-reduce share of a step from the
              profiler (NCCL kernels; benchmarks/ddp_throughput.py's `measure`). Skipped, saying so,
              on a machine with one GPU.

--dry-run runs the same functions on the CPU at tiny sizes (float32, no compile; peak memory from
torch's CPU allocator records; `ddp` as 2 gloo processes), so the test suite exercises this script;
CUDA-only measurements are recorded as skipped with a reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from components.core.data import TokenBlocks  # noqa: E402
from components.core.device import autocast_context, estimate_mfu, median_seconds, peak_flops, synchronize  # noqa: E402
from components.core.models import count_parameters  # noqa: E402
from components.core.models.attention import SDPA_OPS, detect_sdpa_backend  # noqa: E402
from components.core.models.transformer import Transformer, TransformerSettings  # noqa: E402
from components.core.studies.attention_cost import attention_sweep, doubling, fit_rows, memory_accounting, ratio_by_n  # noqa: E402
from components.core.training import TrainSettings, train  # noqa: E402

MFU_GOAL = 0.45

FULL = {
    "model": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, dropout=0.0, bias=False,
                  pos_encoding="learned", attention="fused", sdpa_backend="flash"),
    "vocab_size": 50304,  # GPT-2's 50257 padded to a multiple of 64, as nanoGPT does
    "batch_size": 32,
    "steps": 60,
    "log_interval": 10,
    "device": "cuda",
    "dtype": "bfloat16",
    "compile": True,
    "sweep": dict(heads=12, head_dim=64, n_start=512, n_max=1 << 18, reps=3, time_cap_s=120.0, window=512, n_global=16, matmul_n=8192),
    "bnb": dict(in_features=4096, out_features=4096, tokens=4096, reps=20),
    "bnb_generate": dict(n_layer=24, n_embd=1024, n_head=16, vocab_size=32000, block_size=1024, prompt_tokens=32, gen_tokens=64, repeats=3),
    "ddp": dict(batch_size_per_process=16, warmup=10, steps=30, log_interval=10, compile=False),
}
DRY = {
    "model": dict(n_layer=2, n_head=2, n_embd=64, block_size=128, dropout=0.0, bias=False,
                  pos_encoding="learned", attention="fused", sdpa_backend="flash"),
    "vocab_size": 512,
    "batch_size": 4,
    "steps": 6,
    "log_interval": 2,
    "device": "cpu",
    "dtype": "float32",
    "compile": False,
    "sweep": dict(heads=2, head_dim=32, n_start=64, n_max=512, reps=2, time_cap_s=20.0, window=32, n_global=2, matmul_n=256),
    "bnb": dict(in_features=256, out_features=512, tokens=64, reps=3),
    "bnb_generate": dict(n_layer=1, n_embd=64, n_head=2, vocab_size=300, block_size=32, prompt_tokens=4, gen_tokens=3, repeats=1),
    "ddp": dict(batch_size_per_process=4, warmup=2, steps=4, log_interval=2, compile=False),
}


def section(summary: dict, name: str, out: Path | None, fn, *args) -> None:
    """Run one section; its result (or its error) goes into summary[name], and the JSON is rewritten."""
    t0 = time.perf_counter()
    try:
        summary[name] = fn(*args)
    except Exception as e:  # noqa: BLE001 - one failing section must not hide the others
        summary[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
    summary[name]["section_s"] = round(time.perf_counter() - t0, 2)
    print(f"[gpu_check] {name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=2, default=str) + "\n")


# --------------------------------------------------------------------------------------------------
# 1. environment


def env_info(device: torch.device) -> dict:
    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "cpu_count": os.cpu_count(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update({
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "sm_count": props.multi_processor_count,
            "bf16_supported": torch.cuda.is_bf16_supported(),
            "peak_bf16_tflops": (peak_flops(device) or 0) / 1e12 or None,
            "cudnn": torch.backends.cudnn.version(),
        })
    try:
        import bitsandbytes

        info["bitsandbytes"] = bitsandbytes.__version__
    except Exception as e:  # noqa: BLE001
        info["bitsandbytes"] = f"unavailable: {e}"
    return info


# --------------------------------------------------------------------------------------------------
# 2. SDPA backend at the training shape


def sdpa_info(cfg: dict, device: torch.device, dtype: torch.dtype) -> dict:
    m = cfg["model"]
    shape = (cfg["batch_size"], m["n_head"], m["block_size"], m["n_embd"] // m["n_head"])
    requested = m["sdpa_backend"] if device.type == "cuda" else "auto"
    report = detect_sdpa_backend(device, dtype, shape, requested=requested)
    report["flash_verified"] = report["observed"] == "flash"
    if device.type != "cuda":
        report["note"] = "dry run: pinning applies on CUDA only; on the CPU torch's fused flash kernel is expected"
    return report


# --------------------------------------------------------------------------------------------------
# 3. GPT-2 small training through the pipeline's loop


def observed_kernels(model: Transformer, x: torch.Tensor, y: torch.Tensor, device: torch.device, dtype: torch.dtype) -> dict:
    """SDPA aten ops and attention CUDA kernels seen in one forward+backward of the model (eager)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        with autocast_context(device, dtype):
            _, loss = model(x, y)
        loss.backward()
        synchronize(device)
    keys = {e.key for e in prof.key_averages()}
    model.zero_grad(set_to_none=True)
    return {
        "sdpa_ops": sorted(SDPA_OPS[k] for k in keys if k in SDPA_OPS),
        "attention_kernels": sorted(k for k in keys if any(s in k.lower() for s in ("flash", "fmha", "attention_kernel", "cudnn")) and not k.startswith("aten::"))[:12],
    }


def train_check(cfg: dict, device: torch.device, dtype: torch.dtype) -> dict:
    m = cfg["model"]
    settings = TransformerSettings(**m)
    torch.manual_seed(0)
    model = Transformer(settings, cfg["vocab_size"])
    T, B = settings.block_size, cfg["batch_size"]
    # Random tokens: throughput does not depend on the text; enough blocks that batches differ.
    rng = np.random.default_rng(0)
    n_blocks = max(4 * B, 256)
    x = rng.integers(1, cfg["vocab_size"], size=(n_blocks, T + 1), dtype=np.int64).astype(np.uint16)
    data = TokenBlocks(np.ascontiguousarray(x[:, :-1]), np.ascontiguousarray(x[:, 1:].astype(np.int32)))
    ts = TrainSettings(
        max_steps=cfg["steps"], batch_size=B, lr=6e-4, min_lr=6e-5, warmup_steps=5, weight_decay=0.1, beta2=0.95,
        grad_clip=1.0, eval_interval=0, eval_batches=1, log_interval=cfg["log_interval"],
        device=cfg["device"], dtype=cfg["dtype"], compile=cfg["compile"], seed=0,
    )
    with tempfile.TemporaryDirectory() as tmp:
        res = train(model, data, data, ts, tmp, resume=False)
    # Steady state: the per-interval rates after the first interval (which holds compilation/warm-up).
    rates = [h["tokens_per_s"] for h in res.history if "tokens_per_s" in h][1:]
    steady = statistics.median(rates) if rates else res.tokens_per_s
    flops_tok = model.flops_per_token(T)
    mfu, mfu_mean = estimate_mfu(flops_tok, steady, device), estimate_mfu(flops_tok, res.tokens_per_s, device)
    xb, yb = data.batch(np.arange(min(B, 4)), device)
    kernels = observed_kernels(model, xb, yb, device, dtype)
    return {
        "params": res.params,
        "params_non_embedding": count_parameters(model, non_embedding=True),
        "config": settings.model_dump(),
        "vocab_size": cfg["vocab_size"],
        "batch_size": B,
        "block_size": T,
        "tokens_per_step": B * T,
        "steps": res.steps,
        "device": res.device,
        "dtype": res.dtype,
        "compile": ts.compile,
        "fused_adamw": device.type == "cuda",
        "tokens_per_s_mean": res.tokens_per_s,  # the loop's mean over steps 2..N
        "tokens_per_s": steady,
        "step_ms": 1000 * B * T / steady,
        "flops_per_token": flops_tok,
        "achieved_tflops": flops_tok * steady / 1e12,
        "mfu": mfu,
        "mfu_mean": mfu_mean,
        "mfu_goal": MFU_GOAL,
        "mfu_goal_met": None if mfu is None else mfu >= MFU_GOAL,
        "final_train_loss": res.train_loss,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "wall_s": res.wall_s,
        "warnings": res.warnings,
        "observed_in_model": kernels,
        "flash_in_model": "flash" in kernels["sdpa_ops"] if device.type == "cuda" else None,
    }


# --------------------------------------------------------------------------------------------------
# 4. attention sweep: reference vs fused, N doubling


def matmul_peak_tflops(device: torch.device, dtype: torch.dtype, n: int) -> float:
    """Measured dense matmul throughput (n×n @ n×n, median of 5 after warm-up), TFLOP/s: the ceiling the
    fused attention kernel is compared with."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    s = median_seconds(lambda: a @ b, device, warmup=2, repeats=5)
    return 2 * n**3 / s / 1e12


def attention_flops(n: int, heads: int, head_dim: int, batch: int = 1, backward: bool = True) -> float:
    """Causal attention FLOPs as FlashAttention's papers count them: forward 4·B·H·N²·D halved by the
    causal mask; forward+backward 3.5× the forward (the backward does 2.5× the forward's matmuls)."""
    fwd = 4 * batch * heads * n * n * head_dim / 2
    return fwd * 3.5 if backward else fwd


def sweep_check(cfg: dict, device: torch.device, dtype: torch.dtype) -> dict:
    sw = cfg["sweep"]
    impls = ("reference", "fused", "window", "flex") if device.type == "cuda" else ("reference", "fused", "window")
    rows = attention_sweep(
        doubling(sw["n_start"], sw["n_max"]), impls, batch=1, n_head=sw["heads"], head_dim=sw["head_dim"],
        device=device, dtype=dtype, repeats=sw["reps"], warmup=1, backward=True, window=sw["window"], n_global=sw["n_global"],
        sdpa_backend="flash" if device.type == "cuda" else "auto", time_cap_s=sw["time_cap_s"],
    )
    peak = matmul_peak_tflops(device, dtype, sw["matmul_n"])
    results: dict = {"heads": sw["heads"], "head_dim": sw["head_dim"], "batch": 1, "dtype": str(dtype).removeprefix("torch."),
                     "pass": "forward+backward", "fused_backend": "flash (pinned)" if device.type == "cuda" else "auto (cpu)",
                     "window": sw["window"], "n_global": sw["n_global"], "peak_memory": memory_accounting(device),
                     "matmul_tflops_measured": peak}
    for impl in impls:
        mine = [r for r in rows if r["impl"] == impl]
        ok = [{"n": r["n"], "ms": r["ms"], "peak_mib": r["peak_mib"]} for r in mine if "error" not in r]
        if impl == "fused":
            for r in ok:
                r["tflops"] = attention_flops(r["n"], sw["heads"], sw["head_dim"]) / (r["ms"] / 1000) / 1e12
                r["fraction_of_matmul_peak"] = r["tflops"] / peak
        last = mine[-1] if mine else {}
        stopped = (f"failed at N={last['n']}: {last['error']}" if "error" in last
                   else last.get("stop") or f"n_max={sw['n_max']} reached")
        results[impl] = {"rows": ok, "longest_n": ok[-1]["n"] if ok else None, "stopped": stopped}
    results["fits"] = fit_rows([{"pass": "forward_backward", **r} for r in rows], sw["n_start"] * 8)
    results["speedup"] = ratio_by_n(rows, "ms", "reference", "fused")
    results["memory_ratio"] = ratio_by_n(rows, "peak_bytes", "reference", "fused")
    return results


# --------------------------------------------------------------------------------------------------
# 5. bitsandbytes INT8 / NF4


def _weight_bytes(layer) -> int:
    w = layer.weight
    n = w.numel() * w.element_size()
    scb = getattr(w, "SCB", None)  # INT8 row scales
    if scb is not None:
        n += scb.numel() * scb.element_size()
    qs = getattr(w, "quant_state", None)  # NF4 block absmax (possibly itself quantized)
    if qs is not None:
        for t in (getattr(qs, "absmax", None), getattr(getattr(qs, "state2", None), "absmax", None), getattr(qs, "code", None)):
            if isinstance(t, torch.Tensor):
                n += t.numel() * t.element_size()
    if layer.bias is not None:
        n += layer.bias.numel() * layer.bias.element_size()
    return n


def bnb_check(cfg: dict, device: torch.device) -> dict:
    import bitsandbytes as bnb

    b = cfg["bnb"]
    half = torch.float16
    torch.manual_seed(0)
    dense = torch.nn.Linear(b["in_features"], b["out_features"], bias=True).to(half)
    x = torch.randn(b["tokens"], b["in_features"], dtype=half, device=device)

    def build(kind: str) -> torch.nn.Module:
        if kind == "fp16":
            return torch.nn.Linear(b["in_features"], b["out_features"], bias=True).to(half)
        if kind == "int8":  # LLM.int8(): int8 weights, outlier features (> threshold) kept in fp16
            return bnb.nn.Linear8bitLt(b["in_features"], b["out_features"], bias=True, has_fp16_weights=False, threshold=6.0)
        return bnb.nn.Linear4bit(b["in_features"], b["out_features"], bias=True, compute_dtype=half, quant_type="nf4")

    out = {"in_features": b["in_features"], "out_features": b["out_features"], "tokens": b["tokens"], "device": str(device)}
    ref = None
    for kind in ("fp16", "int8", "nf4"):
        try:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                before = torch.cuda.memory_allocated(device)
            layer = build(kind)
            layer.load_state_dict(dense.state_dict())
            layer = layer.to(device)  # bitsandbytes quantizes the weights on this move
            allocated = torch.cuda.memory_allocated(device) - before if device.type == "cuda" else None
            with torch.no_grad():
                y = layer(x)
                synchronize(device)
                t0 = time.perf_counter()
                for _ in range(b["reps"]):
                    y = layer(x)
                synchronize(device)
            ms = 1000 * (time.perf_counter() - t0) / b["reps"]
            y = y.float()
            if ref is None:
                ref = y
            out[kind] = {
                "weight_dtype": str(layer.weight.dtype).removeprefix("torch."),
                "weight_bytes": _weight_bytes(layer),
                "allocated_bytes": allocated,
                "forward_ms": ms,
                "rel_error_vs_fp16": float((y - ref).norm() / ref.norm()),
            }
            del layer
        except Exception as e:  # noqa: BLE001 - record and go on with the next kind
            out[kind] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    if "weight_bytes" in out.get("fp16", {}):
        for kind in ("int8", "nf4"):
            if "weight_bytes" in out.get(kind, {}):
                out[kind]["bytes_ratio_vs_fp16"] = out[kind]["weight_bytes"] / out["fp16"]["weight_bytes"]
    if device.type != "cuda":
        out["note"] = "dry run: bitsandbytes' CPU path; the CUDA INT8/NF4 kernels run only on a GPU"
    return out


def bnb_generate_check(cfg: dict, device: torch.device) -> dict:
    from components.core.studies.quantization import cuda_bnb_check

    return cuda_bnb_check(device, **cfg["bnb_generate"])


# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# 7. multi-GPU data parallelism


def ddp_check(cfg: dict, device: torch.device) -> dict:
    """1 process against N (every GPU; 2 gloo processes in the dry run) at the same batch per process,
    through the pipeline's worker under torchrun."""
    from ddp_throughput import make_spec, measure, write_random_labels

    n = torch.cuda.device_count() if device.type == "cuda" else 2
    if device.type == "cuda" and n < 2:
        return {"skipped": f"needs 2 or more GPUs; this machine has {n}", "gpus": n}
    d = cfg["ddp"]
    m = cfg["model"]
    window = (d["warmup"], d["warmup"] + d["steps"])
    per = d["batch_size_per_process"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        labels = write_random_labels(tmp / "labels", cfg["vocab_size"], m["block_size"], max(64 * per, 256))

        def case(nproc: int, profile: bool) -> dict:
            train = dict(max_steps=window[1] + d["log_interval"], batch_size=per * nproc, lr=6e-4, min_lr=6e-5, warmup_steps=5,
                         grad_clip=1.0, eval_interval=0, eval_batches=1, log_interval=d["log_interval"], device=cfg["device"],
                         dtype=cfg["dtype"], compile=d["compile"], seed=0, threads=1 if device.type == "cpu" else 0)
            spec = make_spec(labels, "transformer", m, train, tmp / f"run{nproc}")
            return measure(spec, nproc, 1, window, profile=profile)

        one = case(1, False)
        many = case(n, True)
    prof = many.get("profile", {})
    return {
        "processes": n,
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "batch_size_per_process": per,
        "block_size": m["block_size"],
        "tokens_per_s_1": one["tokens_per_s"],
        "tokens_per_s_n": many["tokens_per_s"],
        "speedup": many["tokens_per_s"] / one["tokens_per_s"],
        "scaling_efficiency": many["tokens_per_s"] / (n * one["tokens_per_s"]),
        "step_ms_1": one["step_ms"],
        "step_ms_n": many["step_ms"],
        "allreduce_ms_per_step": prof.get("allreduce_ms_per_step"),
        "allreduce_share_of_step": prof.get("allreduce_share_of_step"),
        "allreduce_timed_as": prof.get("allreduce_timed_as"),
        "params": many["params"],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, seconds (what the tests run)")
    ap.add_argument("--out", help="JSON summary path")
    ap.add_argument("--steps", type=int, help="training steps (default 60; dry run 6)")
    ap.add_argument("--batch-size", type=int, help="training batch size (default 32; dry run 4)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (faster start, lower MFU)")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: sdpa,train,sweep,bnb,bnb_generate,ddp")
    args = ap.parse_args(argv)

    cfg = json.loads(json.dumps(DRY if args.dry_run else FULL))
    if args.steps:
        cfg["steps"] = args.steps
    if args.batch_size:
        cfg["batch_size"] = args.batch_size
    if args.no_compile:
        cfg["compile"] = False
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA GPU here; run it on the GPU machine, or use --dry-run for the CPU smoke run")
    device = torch.device(cfg["device"])
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[cfg["dtype"]]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as nanoGPT: fp32 matmuls outside autocast use TF32
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(os.cpu_count() or 1)

    out = Path(args.out) if args.out else None
    t0 = time.perf_counter()
    summary: dict = {"check": "gpu_check", "dry_run": args.dry_run, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "settings": cfg}
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    section(summary, "env", out, env_info, device)
    if "sdpa" not in skip:
        section(summary, "sdpa", out, sdpa_info, cfg, device, dtype)
    if "train" not in skip:
        section(summary, "train", out, train_check, cfg, device, dtype)
    if "sweep" not in skip:
        section(summary, "sweep", out, sweep_check, cfg, device, dtype)
    if "bnb" not in skip:
        section(summary, "bnb", out, bnb_check, cfg, device)
    if "bnb_generate" not in skip:
        section(summary, "bnb_generate", out, bnb_generate_check, cfg, device)
    if "ddp" not in skip:
        section(summary, "ddp", out, ddp_check, cfg, device)
    train_res = summary.get("train", {})
    summary["headline"] = {
        "gpu": summary["env"].get("gpu"),
        "tokens_per_s": train_res.get("tokens_per_s"),
        "mfu": train_res.get("mfu"),
        "mfu_goal_met": train_res.get("mfu_goal_met"),
        "sdpa_observed": summary.get("sdpa", {}).get("observed"),
        "flash_verified": summary.get("sdpa", {}).get("flash_verified"),
        "longest_n_reference": summary.get("sweep", {}).get("reference", {}).get("longest_n"),
        "longest_n_fused": summary.get("sweep", {}).get("fused", {}).get("longest_n"),
        "fused_best_fraction_of_matmul_peak": max(
            (r.get("fraction_of_matmul_peak", 0) for r in summary.get("sweep", {}).get("fused", {}).get("rows", [])), default=None
        ),
        "gen_tokens_per_s": {v: r.get("gen_tokens_per_s") for v, r in summary.get("bnb_generate", {}).get("variants", {}).items()},
        "ddp_processes": summary.get("ddp", {}).get("processes"),
        "ddp_scaling_efficiency": summary.get("ddp", {}).get("scaling_efficiency"),
        "errors": [k for k, v in summary.items() if isinstance(v, dict) and v.get("error")],
    }
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(summary, indent=2, default=str)
    if out is not None:
        out.write_text(text + "\n")
    print(text)
    return summary


if __name__ == "__main__":
    main()
