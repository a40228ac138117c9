"""Measurements shared by the quantization study (`studies.quantization`), its export check
(`studies.quant_export`) and the CUDA check on one large GPU (`cuda_bnb_check`, called by
scripts/gpu_check.py): the evaluation blocks, validation loss and perplexity, greedy generation
timing, and the max-abs logit difference. No settings classes here (no pydantic): the GPU check imports
`cuda_bnb_check` from here.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

from ..data import IGNORE_INDEX, PAD_ID, Blocks, TokenBlocks
from ..errors import ConfigError, PipelineInputError
from ..export.generation import cache_kind, generate_tokens
from ..export.measure import cross_entropy_sum, logits_of, weight_bytes
from ..export.precision import to_precision
from ..export.precision_spec import VARIANTS


def check_variants(v: list[str]) -> list[str]:
    """A non-empty list of known precision variants without repeats (else ValueError naming them)."""
    unknown = [x for x in v if x not in VARIANTS]
    if unknown:
        raise ValueError(f"variants: {unknown} unknown; use some of: {', '.join(VARIANTS)}")
    if not v or len(set(v)) != len(v):
        raise ValueError(f"variants must be a non-empty list without repeats, got {v}")
    return v


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return str(n)


# --------------------------------------------------------------------------------------------------
# Measurements


def eval_blocks(model: nn.Module, val_data: Blocks, n_blocks: int) -> TokenBlocks:
    """The first `n_blocks` validation blocks with targets, cropped to the model's context."""
    block = getattr(getattr(model, "config", None), "block_size", None) or val_data.block_size
    data = val_data.crop(min(block, val_data.block_size))
    keep = np.flatnonzero((np.asarray(data.y) != IGNORE_INDEX).any(axis=1))[:n_blocks]
    if len(keep) == 0:
        raise PipelineInputError("the validation split has no targets; rebuild the labels")
    return TokenBlocks(np.ascontiguousarray(data.x[keep]), np.ascontiguousarray(data.y[keep]))


@torch.no_grad()
def evaluate(model: nn.Module, blocks: TokenBlocks, batch_size: int, device: torch.device) -> dict[str, float]:
    """Token-weighted mean cross-entropy over `blocks`, its perplexity, and forward tokens/s."""
    total, count, seconds = 0.0, 0, 0.0
    for i in range(0, blocks.n_blocks, batch_size):
        x, y = blocks.batch(np.arange(i, min(i + batch_size, blocks.n_blocks)), device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        logits = logits_of(model, x)  # (B, T, V) float32
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds += time.perf_counter() - t0
        s, n = cross_entropy_sum(logits, y)
        total, count = total + s, count + n
    loss = total / max(count, 1)
    return {
        "val_loss": loss,
        "val_ppl": math.exp(min(loss, 50.0)),
        "targets": count,
        "eval_tokens_per_s": blocks.x.size / max(seconds, 1e-9),
    }


def prompt_ids(val_data: TokenBlocks, n: int) -> list[int]:
    ids = [int(t) for t in val_data.x[0, :n] if int(t) != PAD_ID]
    return ids or [int(val_data.x[0, 0])]


def measure_generation(
    model: nn.Module, prompt: list[int], gen_tokens: int, repeats: int, device: torch.device
) -> tuple[float, list[int]]:
    """(tokens/s, the greedy continuation): median of `repeats` timed runs after one warm-up."""
    idx = torch.tensor([prompt], dtype=torch.long, device=device)  # (1, t)
    out = generate_tokens(model, idx, min(2, gen_tokens))  # warm-up (allocations, first-call paths)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = generate_tokens(model, idx, gen_tokens)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return gen_tokens / statistics.median(times), out[0, len(prompt) :].tolist()


def _max_abs_diff(a: torch.Tensor, ref: torch.Tensor) -> float:
    finite = torch.isfinite(ref)  # the [PAD] column is -inf in every variant
    return float((a - ref)[finite].abs().max()) if finite.any() else 0.0


# --------------------------------------------------------------------------------------------------
# The CUDA path on one large GPU (called by scripts/gpu_check.py)


def cuda_bnb_check(
    device: str | torch.device = "cuda",
    *,
    n_layer: int = 24,
    n_embd: int = 1024,
    n_head: int = 16,
    vocab_size: int = 32000,
    block_size: int = 1024,
    prompt_tokens: int = 32,
    gen_tokens: int = 64,
    repeats: int = 3,
    variants: tuple[str, ...] = ("fp16", "bf16", "int8", "nf4"),
    keep_dtype: str = "float32",
    compute_dtype: str = "float32",
    on_variant: Callable[[str, dict], None] | None = None,
) -> dict[str, Any]:
    """bitsandbytes on a GPU through the same code path: a GPT-2-medium-sized Transformer
    (random weights; speed and memory do not depend on them) at each variant — GPU memory of the
    weights, peak memory while generating, generation tokens/s (greedy, batch 1) and the max-abs
    logit difference from FP32 on one batch. Works on the CPU too, with small sizes (for tests).
    `keep_dtype` (what INT8/NF4 keep unquantized: embeddings, tied head, norms, biases) and
    `compute_dtype` (NF4's matmul dtype) are the quantized variants' own; float16 for both compares
    them like for like with the fp16 variant (the study's defaults keep float32). `on_variant(name,
    row)` is called as each variant's row is measured (a caller can save it before the next starts)."""
    from ..models.transformer import Transformer, TransformerSettings

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("cuda_bnb_check: no CUDA device available")
    torch.manual_seed(0)
    settings: dict[str, Any] = {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "block_size": block_size}
    model = Transformer(TransformerSettings(**settings), vocab_size).eval()
    params = sum(p.numel() for p in model.parameters())
    idx = torch.randint(4, vocab_size, (1, prompt_tokens), device=dev)
    out: dict[str, Any] = {
        "device": str(dev),
        "name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "params": params,
        "model": settings,
        "vocab_size": vocab_size,
        "quantized_keep_dtype": keep_dtype,
        "quantized_compute_dtype": compute_dtype,
        "variants": {},
    }
    try:
        import bitsandbytes

        out["bitsandbytes"] = bitsandbytes.__version__
    except Exception as e:  # reported, and the quantized variants then fail with a clear ConfigError
        out["bitsandbytes"] = f"unavailable: {e}"
    ref = None
    for variant in ("fp32", *[v for v in variants if v != "fp32"]):
        row: dict[str, Any] = {}
        before = 0  # bytes allocated before the variant was built (CUDA only)
        try:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
                before = torch.cuda.memory_allocated(dev)
            q = to_precision(model, variant, device=dev, keep_dtype=keep_dtype, compute_dtype=compute_dtype)
            row["weight_bytes"] = weight_bytes(q)["total"]
            if dev.type == "cuda":
                row["gpu_allocated_bytes"] = torch.cuda.memory_allocated(dev) - before
            logits = logits_of(q, idx)
            if ref is None:
                ref = logits
            row["logits_max_abs_diff"] = _max_abs_diff(logits, ref)
            tps, _ = measure_generation(q, idx[0].tolist(), gen_tokens, repeats, dev)
            row["gen_tokens_per_s"] = tps
            row["cache"] = cache_kind(q)
            if dev.type == "cuda":
                row["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(dev) - before
            del q
        except Exception as e:  # one variant failing (e.g. a missing backend) is reported, not fatal
            row["error"] = f"{type(e).__name__}: {e}"
        out["variants"][variant] = row
        if on_variant is not None:
            on_variant(variant, row)
    base = out["variants"].get("fp16", {}).get("weight_bytes")
    for _v, row in out["variants"].items():
        if base and "weight_bytes" in row:
            row["weight_bytes_vs_fp16"] = row["weight_bytes"] / base
    return out
