"""What each precision costs: bytes, accuracy and speed of a trained model at FP32, FP16, BF16 and
through bitsandbytes at INT8 (LLM.int8), NF4 and FP4 — and the "parameters × bytes per parameter"
arithmetic checked against the files actually written.

Per model and variant (`quantize_and_measure`):
- bytes of the weights in memory (each storage once; quantization scales and code books included)
  and on disk (the variant's .safetensors file, header included);
- the quantized layers alone against the same layers in FP16: codes + scales (what grows with the
  parameter count, checked ≤ 0.55× for INT8 and ≤ 0.30× for NF4) and everything (plus the fixed
  per-layer code books: 16 + 256 floats, ~1.1 KB per 4-bit layer whatever its size);
- validation loss and perplexity on the first `eval_batches × batch_size` validation blocks, and
  the change against FP32 (cross-entropy always computed in float32 from the model's logits);
- the max-abs difference of the logits from FP32 on a fixed batch (the first `logit_blocks` blocks);
- generation tokens/s: greedy, batch 1, `gen_tokens` new tokens after a `prompt_tokens` prompt from
  the validation split, median of `repeats`; through the model's `generate`, with its KV cache when
  it has one (the recurrent models carry their state); and how many greedy tokens match FP32's.

What is quantized and what stays float is decided by `export.precision.to_precision` (LayerNorms
and biases stay float, in `keep_dtype`, FP16 by default; the output head tied to the embedding is
quantized too with `quantize_embedding`, the embedding reading its rows from the head's codes;
recurrent matrices are rewritten as Linear layers first) and reported per row. The article's claim
is about the whole model: each row gives the whole model against the whole FP16 model
(`memory_vs_fp16`, judged ≤ 0.60× for INT8 and ≤ 0.35× for NF4) beside the quantized layers' own
ratio; and its generation speed against the float variant that computes in the same dtype, the
difference per token being the cost of dequantizing. On a CPU the 4-bit and 8-bit layers run bitsandbytes' CPU kernels:
they save memory, not time — dequantizing costs more than FP32 GEMMs of this size; on a GPU the
same code path runs the CUDA kernels (see `cuda_bnb_check`).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch
import torch.nn as nn
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..data import IGNORE_INDEX, PAD_ID, TokenBlocks
from ..device import DeviceSetting, resolve_device
from ..errors import ConfigError, PipelineInputError
from ..export.folder import (
    ExportInfo,
    cache_kind,
    export_model,
    generate,
    generate_tokens,
    load_benchmark,
    load_export,
    load_weights,
    read_header,
    save_weights,
)
from ..export.precision import (
    BITS,
    QUANT_VARIANTS,
    SCHEMES,
    VARIANTS,
    DtypeName,
    cross_entropy_sum,
    logits_of,
    spec_of,
    to_precision,
    weight_bytes,
)

if TYPE_CHECKING:  # drawn only when plotted: matplotlib is imported by the plot functions
    from matplotlib.figure import Figure


BASELINE = "fp32"
INT8_SIZE_LIMIT = 0.55  # INT8 codes + scales ≤ 0.55 × the same layers in FP16
NF4_SIZE_LIMIT = 0.30
INT8_PPL_LIMIT_PCT = 1.0  # perplexity increase over FP32, percent
NF4_PPL_LIMIT_PCT = 5.0
INT8_MODEL_LIMIT = 0.60  # the whole INT8 model in memory ≤ 0.60 × the whole FP16 model (the article: about half)
NF4_MODEL_LIMIT = 0.35  # the whole NF4 model ≤ 0.35 × FP16 (the article: about a quarter)
BLOCKSIZES = (64, 128, 256, 512, 1024, 2048, 4096)



def check_variants(v: list[str]) -> list[str]:
    """A non-empty list of known precision variants without repeats (else ValueError naming them)."""
    unknown = [x for x in v if x not in VARIANTS]
    if unknown:
        raise ValueError(f"variants: {unknown} unknown; use some of: {', '.join(VARIANTS)}")
    if not v or len(set(v)) != len(v):
        raise ValueError(f"variants must be a non-empty list without repeats, got {v}")
    return v

class QuantizationSettings(BaseModel):
    """Which precisions, and how each is measured."""

    model_config = ConfigDict(extra="forbid")

    # list[str], checked against the one `Variant` Literal: Dagster's config schema has no list-of-Literal type.
    variants: list[str] = Field(
        list(VARIANTS),
        description=f"Precisions to build and measure, of {', '.join(VARIANTS)}; fp32 (the baseline) must be among "
            f"them.",
    )
    compute_dtype: DtypeName = Field(
        "float32", description="dtype the 4-bit layers (nf4, fp4) compute their matmuls in."
    )
    keep_dtype: DtypeName = Field(
        "float16",
        description="dtype of what the quantized variants keep unquantized (norms, biases; the embedding when not "
            "quantized).",
    )
    quantize_embedding: bool = Field(
        True,
        description="Quantize the output head tied to the token embedding too (the embedding reads its rows from the "
            "head's codes).",
    )
    int8_threshold: float = Field(
        6.0,
        ge=0.0,
        description="LLM.int8 outlier threshold: input columns with a value above it are multiplied in 16 bit (0 = all "
            "int8).",
    )
    blocksize: int = Field(
        64, description="Weights per absmax block of the 4-bit variants (64 … 4096, a power of two)."
    )
    double_quant: bool = Field(
        True, description="Quantize the 4-bit absmax scales to 8 bit too (QLoRA's double quantization)."
    )
    eval_batches: int = Field(
        8, ge=1, description="Validation batches evaluated per variant (the first blocks, deterministic)."
    )
    batch_size: int = Field(8, ge=1, description="Blocks per evaluation batch.")
    logit_blocks: int = Field(2, ge=1, description="Blocks of the fixed batch whose logits are compared with FP32.")
    prompt_tokens: int = Field(
        16, ge=1, description="Prompt length for the generation timing (from the first validation block)."
    )
    gen_tokens: int = Field(32, ge=1, description="New tokens generated per timed generation (greedy, batch 1).")
    repeats: int = Field(3, ge=1, description="Timed generations per variant; the median is reported.")
    device: DeviceSetting = Field("auto", description="Where to run: 'auto' = CUDA if present, else the CPU.")

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: list[str]) -> list[str]:
        check_variants(v)
        if BASELINE not in v:
            raise ValueError(f"variants must include {BASELINE!r}: every change is measured against it (got {v})")
        return [BASELINE, *[x for x in v if x != BASELINE]]

    @field_validator("blocksize")
    @classmethod
    def _blocksize(cls, v: int) -> int:
        if v not in BLOCKSIZES:
            raise ValueError(f"blocksize must be one of {BLOCKSIZES}, got {v}")
        return v

    def precision_kwargs(self) -> dict[str, Any]:
        return {
            "keep_dtype": self.keep_dtype,
            "compute_dtype": self.compute_dtype,
            "int8_threshold": self.int8_threshold,
            "blocksize": self.blocksize,
            "double_quant": self.double_quant,
            "quantize_embedding": self.quantize_embedding,
        }


@dataclass
class QuantizationResult:
    rows: list[dict]  # one per (model, variant)
    metrics: dict[str, float]
    figures: dict[str, Figure]
    markdown: str
    weights: dict[str, dict[str, Path]]  # model -> variant -> the variant's .safetensors (when out_dir was given)
    models: dict[str, dict[str, nn.Module]] = field(default_factory=dict)  # kept only with keep_models=True
    warnings: list[str] = field(default_factory=list)
    device: str = "cpu"

    def row(self, model: str, variant: str) -> dict:
        for r in self.rows:
            if r["model"] == model and r["variant"] == variant:
                return r
        raise KeyError((model, variant))


# --------------------------------------------------------------------------------------------------
# Measurements


def eval_blocks(model: nn.Module, val_data: TokenBlocks, n_blocks: int) -> TokenBlocks:
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
    return gen_tokens / statistics.median(times), out[0, len(prompt):].tolist()


def _max_abs_diff(a: torch.Tensor, ref: torch.Tensor) -> float:
    finite = torch.isfinite(ref)  # the [PAD] column is -inf in every variant
    return float((a - ref)[finite].abs().max()) if finite.any() else 0.0


def quantize_and_measure(
    models: dict[str, nn.Module],
    val_data: TokenBlocks,
    settings: QuantizationSettings,
    device: str | torch.device | None = None,
    *,
    out_dir: str | Path | None = None,
    keep_models: bool = False,
    log: Any = None,
) -> QuantizationResult:
    """Build every variant of every model, measure it, and (with `out_dir`) save each variant's
    weights to `out_dir/<model>/<variant>.safetensors` (rebuildable alone: `export.folder.load_weights`).
    The models passed in are not modified. `log(str)` receives progress lines."""
    notes: list[str] = []
    if device is None:
        dev, warn = resolve_device(settings.device)
        if warn:
            notes.append(warn.replace("training", "measuring"))
    else:
        dev = torch.device(device)
    n_blocks = settings.eval_batches * settings.batch_size
    rows: list[dict] = []
    weights: dict[str, dict[str, Path]] = {}
    kept: dict[str, dict[str, nn.Module]] = {}
    for name, model in models.items():
        model = model.eval()
        blocks = eval_blocks(model, val_data, n_blocks)
        fixed = torch.from_numpy(blocks.x[: settings.logit_blocks].astype(np.int64)).to(dev)  # (b, T)
        prompt = prompt_ids(blocks, settings.prompt_tokens)
        ref_logits, ref_tokens, base = None, None, None
        for variant in settings.variants:
            t0 = time.perf_counter()
            q = to_precision(model, variant, device=dev, **settings.precision_kwargs())
            spec = spec_of(q)
            wb = weight_bytes(q)
            row: dict[str, Any] = {"model": name, "variant": variant, "scheme": SCHEMES[variant]}
            if out_dir is not None:
                path = Path(out_dir) / name / f"{variant}.safetensors"
                disk = save_weights(q, path)
                weights.setdefault(name, {})[variant] = path
            else:
                import tempfile

                with tempfile.TemporaryDirectory(prefix="w2t-quant-") as d:
                    disk = save_weights(q, Path(d) / "w.safetensors")
            ev = evaluate(q, blocks, settings.batch_size, dev)
            logits = logits_of(q, fixed)
            if variant == BASELINE:
                ref_logits = logits
            tps, tokens = measure_generation(q, prompt, settings.gen_tokens, settings.repeats, dev)
            if variant == BASELINE:
                ref_tokens, base = (
                    tokens,
                    {"memory": wb["total"], "disk": disk["bytes"], "loss": ev["val_loss"], "ppl": ev["val_ppl"]},
                )
            q_params = wb["quantized_params"]
            codes_scales = wb["codes"] + wb["scales"]
            row.update(
                params=int(sum(p.numel() for p in model.parameters())),
                quantized_params=q_params,
                memory_bytes=wb["total"],
                disk_bytes=disk["bytes"],
                memory_vs_fp32=wb["total"] / base["memory"],
                disk_vs_fp32=disk["bytes"] / base["disk"],
                quantized_layer_bytes=wb["quantized_layers"] if q_params else None,
                quantized_layer_fp16_bytes=wb["quantized_layers_fp16"] if q_params else None,
                layer_ratio_vs_fp16=codes_scales / (2 * q_params) if q_params else None,
                layer_ratio_vs_fp16_all=wb["quantized_layers"] / wb["quantized_layers_fp16"] if q_params else None,
                scale_bytes=wb["scales"],
                codebook_bytes=wb["codebooks"],
                bits_per_quantized_param=8 * codes_scales / q_params if q_params else float(BITS[variant]),
                val_loss=ev["val_loss"],
                val_ppl=ev["val_ppl"],
                dloss=ev["val_loss"] - base["loss"],
                dppl_pct=100.0 * (ev["val_ppl"] / base["ppl"] - 1.0),
                logits_max_abs_diff=_max_abs_diff(logits, ref_logits),
                eval_tokens_per_s=ev["eval_tokens_per_s"],
                gen_tokens_per_s=tps,
                cache=cache_kind(q),
                greedy_match=sum(a == b for a, b in zip(tokens, ref_tokens)) / max(len(ref_tokens), 1),
                quantized=(
                    f"{len(spec.modules)} Linear layers"
                    + (
                        f" (recurrent {', '.join(spec.recurrent_as_linear)} rewritten as Linear)"
                        if spec.recurrent_as_linear
                        else ""
                    )
                )
                if spec.quantized
                else "-",
                kept_float="; ".join(spec.kept_float),
                eval_targets=ev["targets"],
                seconds=time.perf_counter() - t0,
            )
            rows.append(row)
            if keep_models:
                kept.setdefault(name, {})[variant] = q
            if log:
                log(
                    f"{name} {variant}: {wb['total']} B in memory, val ppl {ev['val_ppl']:.3f} ({row['dppl_pct']:+.2f} "
                    f"%), {tps:.0f} tokens/s"
                )
            del q
    _like_for_like(rows, settings)
    metrics = _metrics(rows)
    return QuantizationResult(
        rows=rows,
        metrics=metrics,
        figures={"quantization": plot_quantization(rows)},
        markdown=markdown_table(rows, settings, dev),
        weights=weights,
        models=kept,
        warnings=notes,
        device=str(dev),
    )


COMPUTE_VARIANT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _like_for_like(rows: list[dict], settings: QuantizationSettings) -> None:
    """Per row, in place: the whole model against the whole FP16 model (`memory_vs_fp16`), and the
    generation speed against the float variant that computes in the same dtype (LLM.int8 multiplies
    in float16; the 4-bit layers in `compute_dtype`): `gen_vs_same_dtype` (its tokens/s over that
    variant's) and `dequant_ms_per_token` (the extra time per token: unpacking codes and scales)."""
    by = {(r["model"], r["variant"]): r for r in rows}
    for r in rows:
        fp16 = by.get((r["model"], "fp16"))
        r["memory_vs_fp16"] = r["memory_bytes"] / fp16["memory_bytes"] if fp16 else None
        ref_variant = (
            {"int8": "fp16"}.get(r["variant"], COMPUTE_VARIANT[settings.compute_dtype])
            if r["variant"] in QUANT_VARIANTS
            else None
        )
        ref = by.get((r["model"], ref_variant)) if ref_variant else None
        r["gen_reference"] = ref_variant if ref else None
        r["gen_vs_same_dtype"] = r["gen_tokens_per_s"] / ref["gen_tokens_per_s"] if ref else None
        r["dequant_ms_per_token"] = 1000 / r["gen_tokens_per_s"] - 1000 / ref["gen_tokens_per_s"] if ref else None


def _metrics(rows: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        p = f"quant/{r['model']}/{r['variant']}"
        for k in (
            "memory_bytes",
            "disk_bytes",
            "val_loss",
            "val_ppl",
            "dppl_pct",
            "logits_max_abs_diff",
            "gen_tokens_per_s",
            "eval_tokens_per_s",
            "layer_ratio_vs_fp16",
            "layer_ratio_vs_fp16_all",
            "greedy_match",
            "memory_vs_fp32",
            "memory_vs_fp16",
            "gen_vs_same_dtype",
            "dequant_ms_per_token",
        ):
            if r.get(k) is not None:
                out[f"{p}/{k}"] = float(r[k])
    return out


def check_figures(rows: list[dict], model: str) -> dict[str, dict[str, Any]]:
    """The asset checks' figures for `model`: size ratios and perplexity increases of int8 and nf4,
    with their limits (a variant that was not measured has value None)."""
    by = {r["variant"]: r for r in rows if r["model"] == model}

    def get(v: str, k: str):
        return by[v][k] if v in by else None

    return {
        "int8_size": {
            "value": get("int8", "layer_ratio_vs_fp16"),
            "limit": INT8_SIZE_LIMIT,
            "all_in": get("int8", "layer_ratio_vs_fp16_all"),
        },
        "nf4_size": {
            "value": get("nf4", "layer_ratio_vs_fp16"),
            "limit": NF4_SIZE_LIMIT,
            "all_in": get("nf4", "layer_ratio_vs_fp16_all"),
        },
        "int8_ppl": {"value": get("int8", "dppl_pct"), "limit": INT8_PPL_LIMIT_PCT},
        "nf4_ppl": {"value": get("nf4", "dppl_pct"), "limit": NF4_PPL_LIMIT_PCT},
        **{
            f"{v}_model_size": _model_size(by, v, limit)
            for v, limit in (("int8", INT8_MODEL_LIMIT), ("nf4", NF4_MODEL_LIMIT))
        },
    }


def _model_size(by: dict[str, dict], variant: str, limit: float) -> dict[str, Any]:
    """The whole model in memory (every weight, quantized or kept, scales and code books) against the
    whole FP16 model; None when either was not measured."""
    if variant not in by or "fp16" not in by:
        return {"value": None, "limit": limit}
    q, h = by[variant], by["fp16"]
    return {
        "value": q["memory_bytes"] / h["memory_bytes"],
        "limit": limit,
        "bytes": q["memory_bytes"],
        "fp16_bytes": h["memory_bytes"],
        "layer_ratio": q["layer_ratio_vs_fp16"],
        "quantized_share": q["quantized_params"] / q["params"] if q["params"] else None,
        "kept_float": q["kept_float"],
    }


# --------------------------------------------------------------------------------------------------
# Reporting


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return str(n)


def markdown_table(rows: list[dict], settings: QuantizationSettings, device: torch.device) -> str:
    head = (
        "| model | variant | memory | disk | ×FP32 | whole model ×FP16 | quantized layers vs FP16 (codes+scales / all) "
        "| val ppl | Δppl "
        "| max abs Δlogit | gen tok/s | vs float of the same compute dtype (dequant ms/token) | cache | greedy = FP32 |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        ratio = (
            "-"
            if r["layer_ratio_vs_fp16"] is None
            else f"{r['layer_ratio_vs_fp16']:.3f} / {r['layer_ratio_vs_fp16_all']:.3f}"
        )
        whole = "-" if r.get("memory_vs_fp16") is None else f"{r['memory_vs_fp16']:.3f}"
        like = (
            "-"
            if r.get("gen_vs_same_dtype") is None
            else f"{r['gen_vs_same_dtype']:.2f}× {r['gen_reference']} ({r['dequant_ms_per_token']:+.2f})"
        )
        lines.append(
            f"| {r['model']} | {r['variant']} | {_fmt_bytes(r['memory_bytes'])} | {_fmt_bytes(r['disk_bytes'])} | "
            f"{r['memory_vs_fp32']:.2f} | {whole} | {ratio} "
            f"| {r['val_ppl']:.3f} | {r['dppl_pct']:+.2f} % | {r['logits_max_abs_diff']:.3g} | "
            f"{r['gen_tokens_per_s']:.0f} | {like} | {r['cache']} "
            f"| {100 * r['greedy_match']:.0f} % |"
        )
    notes = sorted(
        {
            f"- {r['model']} ({r['variant']}): quantized {r['quantized']}; kept float: {r['kept_float']}"
            for r in rows
            if r["variant"] in QUANT_VARIANTS
        }
    )
    return "\n".join(
        [
            f"Device {device}; 4-bit compute dtype {settings.compute_dtype} (LLM.int8 multiplies in float16); "
            f"unquantized tensors in "
            f"{settings.keep_dtype}; tied embedding/head "
            f"{'quantized (the embedding reads the head codes)' if settings.quantize_embedding else 'kept float'}; "
            f"LLM.int8 threshold {settings.int8_threshold}; 4-bit blocks of "
            f"{settings.blocksize}{' with double quantization' if settings.double_quant else ''}.",
            "",
            *lines,
            "",
            "What the quantized variants quantize and keep:",
            *notes,
        ]
    )


def plot_quantization(rows: list[dict]) -> Figure:
    """Bars per variant, one colour per model: bytes in memory, Δ perplexity vs FP32, generation tokens/s."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.8))
    axes = fig.subplots(1, 3)
    width = 0.8 / max(len(models), 1)
    x = np.arange(len(variants))
    panels = [
        ("memory_bytes", "weights in memory (MB)", 1e-6),
        ("dppl_pct", "Δ perplexity vs FP32 (%)", 1.0),
        ("gen_tokens_per_s", "generation tokens/s", 1.0),
    ]
    for ax, (key, title, scale) in zip(axes, panels):
        for i, m in enumerate(models):
            by = {r["variant"]: r for r in rows if r["model"] == m}
            vals = [by[v][key] * scale if v in by else np.nan for v in variants]
            ax.bar(x + (i - (len(models) - 1) / 2) * width, vals, width, label=m)
        ax.set_xticks(x, variants)
        ax.set_title(title)
        ax.axhline(0, color="black", lw=0.5)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------------
# Export folders, their reload check and load times


class ExportSettings(BaseModel):
    """Which variants become export folders, their generation defaults, and the reload/load-time checks."""

    model_config = ConfigDict(extra="forbid")

    variants: list[str] = Field(list(VARIANTS), description=f"Variants to export as folders, of {', '.join(VARIANTS)}.")
    max_new_tokens: int = Field(64, ge=1, description="generation_config.json: new tokens per generation.")
    temperature: float = Field(0.8, ge=0.0, description="generation_config.json: softmax temperature (0 = greedy).")
    top_k: Optional[int] = Field(
        50, ge=1, description="generation_config.json: sample among the k most likely tokens (None = all)."
    )
    load_repeats: int = Field(
        5, ge=1, description="Timed loads per file (safetensors vs torch.load); the median is reported."
    )
    sample_prompt: str = Field("The", description="Prompt of the sample generated from each reloaded folder.")
    sample_tokens: int = Field(30, ge=1, description="New tokens of that sample.")
    sample_seed: int = Field(0, description="Seed of that sample.")

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: list[str]) -> list[str]:
        return check_variants(v)


@dataclass
class ExportReport:
    exports: dict[str, ExportInfo]  # variant -> the folder written
    rows: list[dict]  # per variant: sizes, reload check, load times
    samples: dict[str, str]  # variant -> text generated from the reloaded folder
    metrics: dict[str, float]
    markdown: str

    @property
    def all_reloads_pass(self) -> bool:
        return all(r["reload_ok"] for r in self.rows)


def export_and_verify(
    weights: dict[str, str | Path],
    out_root: str | Path,
    *,
    tokenizer_path: str | Path,
    tokenizer_sha256: str,
    model_config: dict,
    train_settings: dict,
    provenance: dict,
    val_data: TokenBlocks,
    eval_settings: QuantizationSettings,
    settings: ExportSettings,
    study_val_loss: dict[str, float] | None = None,
    device: str | torch.device = "cpu",
) -> ExportReport:
    """For each variant (its weights file from `quantize_and_measure`): write the export folder
    `out_root/<variant>`, rebuild the model from that folder alone, and check it reproduces the
    exported model — logits bit for bit for the float variants; for the quantized ones the same
    evaluation (validation loss on the study's blocks, logits difference reported) — then time the
    safetensors load against torch.load and generate a sample from the folder."""
    dev = torch.device(device)
    out_root = Path(out_root)
    missing = [v for v in settings.variants if v not in weights]
    if missing:
        raise ConfigError(
            f"variants {missing} were not built by quantized_models (it built {sorted(weights)}); add them to its "
            f"variants or drop them here"
        )
    generation = {
        "max_new_tokens": settings.max_new_tokens,
        "temperature": settings.temperature,
        "top_k": settings.top_k,
    }
    exports, rows, samples = {}, [], {}
    for variant in settings.variants:
        model = load_weights(weights[variant], dev)
        blocks = eval_blocks(model, val_data, eval_settings.eval_batches * eval_settings.batch_size)
        fixed = torch.from_numpy(blocks.x[: eval_settings.logit_blocks].astype(np.int64)).to(dev)
        info = export_model(
            model,
            variant,
            out_root / variant,
            tokenizer_path=tokenizer_path,
            config=model_config,
            train_settings=train_settings,
            provenance=provenance,
            tokenizer_sha256=tokenizer_sha256,
            generation=generation,
        )
        loaded = load_export(info.path, dev)
        reloaded = loaded[0]
        a, b = logits_of(model, fixed), logits_of(reloaded, fixed)
        bit_exact = bool(torch.equal(a, b))
        ev_a = evaluate(model, blocks, eval_settings.batch_size, dev)
        ev_b = evaluate(reloaded, blocks, eval_settings.batch_size, dev)
        same_eval = abs(ev_a["val_loss"] - ev_b["val_loss"]) <= 1e-6 * max(1.0, abs(ev_a["val_loss"]))
        quantized = variant in QUANT_VARIANTS
        study = (study_val_loss or {}).get(variant)
        times = load_benchmark(info.path / "model.safetensors", repeats=settings.load_repeats, device=dev)
        gen = generate(
            info.path,
            settings.sample_prompt,
            max_new_tokens=settings.sample_tokens,
            seed=settings.sample_seed,
            loaded=loaded,
        )
        samples[variant] = settings.sample_prompt + gen.text
        exports[variant] = info
        rows.append(
            {
                "variant": variant,
                "scheme": info.scheme,
                "folder_bytes": sum(f["bytes"] for f in info.files.values()),
                "weights_bytes": info.weights_bytes,
                "header_bytes": info.header_bytes,
                "reload_logits_max_abs_diff": _max_abs_diff(b, a),
                "reload_bit_exact": bit_exact,
                "exported_val_loss": ev_a["val_loss"],
                "reloaded_val_loss": ev_b["val_loss"],
                "study_val_loss": study,
                "study_val_loss_rel_diff": abs(ev_b["val_loss"] - study) / abs(study) if study else None,
                "reload_ok": bool(same_eval if quantized else bit_exact),
                "criterion": "same validation loss" if quantized else "bit-exact logits",
                "safetensors_mmap_ms": 1e3 * times["safetensors_mmap_s"],
                "safetensors_load_file_ms": 1e3 * times["safetensors_load_file_s"],
                "torch_load_ms": 1e3 * times["torch_load_s"],
                "torch_load_mmap_ms": 1e3 * times["torch_load_mmap_s"],
                **(
                    {
                        "safetensors_to_gpu_ms": 1e3 * times["safetensors_to_gpu_s"],
                        "torch_load_to_gpu_ms": 1e3 * times["torch_load_to_gpu_s"],
                    }
                    if "safetensors_to_gpu_s" in times
                    else {}
                ),
                "load_speedup_vs_torch_load": times["speedup_mmap_vs_torch_load"],
                "sample_tokens_per_s": gen.new_tokens / max(gen.seconds, 1e-9),
            }
        )
    metrics: dict[str, float] = {}
    for r in rows:
        for k in (
            "weights_bytes",
            "reload_logits_max_abs_diff",
            "safetensors_mmap_ms",
            "torch_load_ms",
            "load_speedup_vs_torch_load",
        ):
            metrics[f"export/{r['variant']}/{k}"] = float(r[k])
        metrics[f"export/{r['variant']}/reload_ok"] = float(r["reload_ok"])
    return ExportReport(
        exports=exports, rows=rows, samples=samples, metrics=metrics, markdown=export_markdown(rows, samples)
    )


def export_markdown(rows: list[dict], samples: dict[str, str]) -> str:
    lines = [
        "| variant | folder | model.safetensors | reload | max abs Δlogit | val loss (exported / reloaded) | "
        "safetensors mmap | torch.load | speed-up |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {_fmt_bytes(r['folder_bytes'])} | {_fmt_bytes(r['weights_bytes'])} | "
            f"{'ok' if r['reload_ok'] else 'FAILED'} ({r['criterion']}) "
            f"| {r['reload_logits_max_abs_diff']:.3g} | {r['exported_val_loss']:.5f} / {r['reloaded_val_loss']:.5f} "
            f"| {r['safetensors_mmap_ms']:.2f} ms | {r['torch_load_ms']:.2f} ms | "
            f"{r['load_speedup_vs_torch_load']:.1f}× |"
        )
    lines += ["", "Samples generated from each reloaded folder:", ""]
    lines += [f"- **{v}**: {t[:300]!r}" for v, t in samples.items()]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Weights arithmetic


REFERENCE_SIZES: dict[str, float] = {
    "GPT-2 small": 124e6,
    "1.3B": 1.3e9,
    "7B": 7e9,
    "13B": 13e9,
    "70B": 70e9,
}
PRECISION_BYTES = {"FP32": 4.0, "FP16": 2.0, "INT8": 1.0, "INT4": 0.5}
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def file_accounting(path: str | Path) -> dict[str, Any]:
    """Split a weights file written by `save_weights` into what the arithmetic predicts and the rest:
    codes of the quantized layers, their scales (SCB, absmax, nested absmax), code books and packed
    quantization state, float tensors, and the header — from the safetensors header alone (plus the
    small packed-state tensors, read for the layers' shapes)."""
    import json

    from safetensors import safe_open

    path = Path(path)
    header, header_bytes = read_header(path)
    meta = header.get("__metadata__", {}) or {}
    spec = json.loads(meta.get("quantization", "{}"))
    variant = meta.get("variant", "")
    modules = set(spec.get("modules", []))
    parts = {"codes": 0, "scales": 0, "codebooks": 0, "float": 0}
    q_params = f_params = 0
    float_bytes_per_param: dict[str, int] = {}
    states: list[str] = []
    for k, v in header.items():
        if k == "__metadata__":
            continue
        nbytes = v["data_offsets"][1] - v["data_offsets"][0]
        numel = int(np.prod(v["shape"])) if v["shape"] else 1
        layer = next((m for m in modules if k.startswith(m + ".")), None)
        leaf = k[len(layer) + 1:] if layer else ""
        if layer and leaf == "weight":
            parts["codes"] += nbytes
            if variant == "int8":
                q_params += numel
        elif layer and leaf in ("SCB", "weight.absmax", "weight.nested_absmax"):
            parts["scales"] += nbytes
        elif layer and leaf != "bias":
            parts["codebooks"] += nbytes
            if "quant_state" in leaf:
                states.append(k)
        else:
            parts["float"] += nbytes
            f_params += numel
            float_bytes_per_param[v["dtype"]] = float_bytes_per_param.get(v["dtype"], 0) + numel
    if states:
        with safe_open(str(path), framework="pt") as f:
            for k in states:
                shape = json.loads(bytes(f.get_tensor(k).tolist()).decode())["shape"]
                q_params += int(np.prod(shape))
    bits = BITS.get(variant, 32)
    predicted = q_params * bits / 8 + sum(n * DTYPE_BYTES.get(dt, 4) for dt, n in float_bytes_per_param.items())
    size = path.stat().st_size
    return {
        "variant": variant,
        "file_bytes": size,
        "header_bytes": header_bytes,
        **{f"{k}_bytes": v for k, v in parts.items()},
        "quantized_params": q_params,
        "float_params": f_params,
        "params": q_params + f_params,
        "predicted_bytes": predicted,
        "overhead_bytes": size - predicted,
        "overhead_pct": 100.0 * (size - predicted) / predicted if predicted else 0.0,
        # What the overhead does not explain (0 up to half a byte of 4-bit padding): the check on the arithmetic.
        "unexplained_bytes": size - predicted - parts["scales"] - parts["codebooks"] - header_bytes,
        "bits_per_quantized_param": 8 * (parts["codes"] + parts["scales"]) / q_params if q_params else float(bits),
        "bits_per_quantized_param_all": 8 * (parts["codes"] + parts["scales"] + parts["codebooks"]) / q_params
        if q_params
        else float(bits),
        "float_dtypes": ", ".join(sorted(float_bytes_per_param)),
    }


@dataclass
class ArithmeticResult:
    reference_rows: list[dict]
    measured_rows: list[dict]
    metrics: dict[str, float]
    figure: Figure
    markdown: str


def weights_arithmetic(
    files: dict[str, dict[str, str | Path]], params: dict[str, int], reference: dict[str, float] | None = None
) -> ArithmeticResult:
    """Parameters × bytes per parameter at FP32/FP16/INT8/INT4 for this project's models (`params`:
    name → count) and reference sizes up to 70B, next to the measured bytes of our files (`files`:
    model → variant → .safetensors path), overheads included; measured INT8/NF4 bits per parameter
    (scales included) are carried over to the reference sizes."""
    reference = dict(REFERENCE_SIZES if reference is None else reference)
    measured = []
    for model, by_variant in files.items():
        for _variant, path in by_variant.items():
            acc = file_accounting(path)
            measured.append({"model": model, **acc})
    measured_bits = {}
    for m in measured:
        if m["variant"] in ("int8", "nf4", "fp4") and m["variant"] not in measured_bits:
            measured_bits[m["variant"]] = m["bits_per_quantized_param"]
    ref_rows = []
    for name, n in [*((f"{k} (ours)", v) for k, v in params.items()), *reference.items()]:
        row: dict[str, Any] = {"model": name, "params": int(n)}
        for prec, b in PRECISION_BYTES.items():
            row[f"{prec}_GB"] = n * b / 1e9
        for v, bits in measured_bits.items():
            row[f"{v}_measured_bits_GB"] = n * bits / 8 / 1e9
        ref_rows.append(row)
    metrics: dict[str, float] = {}
    for r in ref_rows:
        key = r["model"].replace(" (ours)", "").replace(" ", "_")
        for prec in PRECISION_BYTES:
            metrics[f"arith/{key}/{prec}_GB"] = r[f"{prec}_GB"]
    for m in measured:
        metrics[f"arith/{m['model']}/{m['variant']}/overhead_pct"] = m["overhead_pct"]
        metrics[f"arith/{m['model']}/{m['variant']}/bits_per_quantized_param"] = m["bits_per_quantized_param"]
        metrics[f"arith/{m['model']}/{m['variant']}/file_bytes"] = float(m["file_bytes"])
    return ArithmeticResult(
        reference_rows=ref_rows, measured_rows=measured, metrics=metrics, figure=plot_arithmetic(ref_rows),
        markdown=arithmetic_markdown(ref_rows, measured, measured_bits),
    )


def arithmetic_markdown(ref_rows: list[dict], measured: list[dict], bits: dict[str, float]) -> str:
    lines = [
        "| model | parameters | FP32 | FP16 | INT8 | INT4 |"
        + "".join(f" {v} at measured {b:.3f} bits |" for v, b in bits.items()),
        "|" + "---|" * (6 + len(bits)),
    ]
    for r in ref_rows:
        cells = [f"{r[f'{p}_GB']:.4g} GB" for p in PRECISION_BYTES] + [
            f"{r[f'{v}_measured_bits_GB']:.4g} GB" for v in bits
        ]
        lines.append(f"| {r['model']} | {r['params']:,} | " + " | ".join(cells) + " |")
    seventy = next((r for r in ref_rows if r["model"] == "70B"), None)
    if seventy:
        lines += [
            "",
            f"70B parameters × 2 bytes = {seventy['FP16_GB']:.0f} GB in FP16 (the article's \"70B ≈ 140 GB\"); "
            f"INT8 {seventy['INT8_GB']:.0f} GB, INT4 {seventy['INT4_GB']:.0f} GB before scales"
            + (
                f", {seventy['nf4_measured_bits_GB']:.1f} GB at NF4's measured {bits['nf4']:.3f} bits per weight"
                if "nf4" in bits
                else ""
            )
            + ".",
        ]
    lines += [
        "",
        "Our files: predicted (quantized params × bits/8 + float params × their dtype's bytes) against the bytes on "
        "disk.",
        "",
        "| model | variant | params (quantized / float) | predicted | on disk | overhead | of which scales | code "
        "books + state | header | unexplained | bits per quantized weight (+code books) |",
        "|" + "---|" * 11,
    ]
    for m in measured:
        lines.append(
            f"| {m['model']} | {m['variant']} | {m['quantized_params']:,} / {m['float_params']:,} "
            f"({m['float_dtypes']}) | {m['predicted_bytes']:,.0f} | {m['file_bytes']:,} "
            f"| {m['overhead_bytes']:+,.0f} ({m['overhead_pct']:+.1f} %) | {m['scales_bytes']:,} | "
            f"{m['codebooks_bytes']:,} | {m['header_bytes']:,} | {m['unexplained_bytes']:g} "
            f"| {m['bits_per_quantized_param']:.3f} ({m['bits_per_quantized_param_all']:.3f}) |"
        )
    return "\n".join(lines)


def plot_arithmetic(ref_rows: list[dict]) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    names = [r["model"] for r in ref_rows]
    x = np.arange(len(names))
    width = 0.8 / len(PRECISION_BYTES)
    for i, p in enumerate(PRECISION_BYTES):
        ax.bar(x + (i - (len(PRECISION_BYTES) - 1) / 2) * width, [r[f"{p}_GB"] for r in ref_rows], width, label=p)
    ax.set_yscale("log")
    ax.set_xticks(x, names, rotation=20, fontsize=8)
    ax.set_ylabel("GB of weights")
    ax.set_title("parameters × bytes per parameter")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


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
    settings = {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "block_size": block_size}
    model = Transformer(TransformerSettings(**settings), vocab_size).eval()
    params = sum(p.numel() for p in model.parameters())
    idx = torch.randint(4, vocab_size, (1, prompt_tokens), device=dev)
    out: dict[str, Any] = {"device": str(dev), "name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                           "params": params, "model": settings, "vocab_size": vocab_size,
                           "quantized_keep_dtype": keep_dtype, "quantized_compute_dtype": compute_dtype, "variants": {}}
    try:
        import bitsandbytes

        out["bitsandbytes"] = bitsandbytes.__version__
    except Exception as e:  # reported, and the quantized variants then fail with a clear ConfigError
        out["bitsandbytes"] = f"unavailable: {e}"
    ref = None
    for variant in ("fp32", *[v for v in variants if v != "fp32"]):
        row: dict[str, Any] = {}
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
