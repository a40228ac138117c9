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

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn

from ..data import Blocks
from ..device import resolve_device
from ..export.folder import save_weights
from ..export.generation import cache_kind
from ..export.measure import logits_of, weight_bytes
from ..export.precision import spec_of, to_precision
from ..export.precision_spec import BITS, QUANT_VARIANTS, SCHEMES, PrecisionSpec
from .quant_measure import _fmt_bytes, _max_abs_diff, eval_blocks, evaluate, measure_generation, prompt_ids
from .quant_settings import (
    BASELINE,
    INT8_MODEL_LIMIT,
    INT8_PPL_LIMIT_PCT,
    INT8_SIZE_LIMIT,
    NF4_MODEL_LIMIT,
    NF4_PPL_LIMIT_PCT,
    NF4_SIZE_LIMIT,
    QuantizationSettings,
)

if TYPE_CHECKING:  # drawn only when plotted: matplotlib is imported by the plot functions
    from matplotlib.figure import Figure

__all__ = [
    "QuantizationResult",
    "check_figures",
    "markdown_table",
    "plot_quantization",
    "quantize_and_measure",
]


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


def quantize_and_measure(
    models: dict[str, nn.Module],
    val_data: Blocks,
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
    dev, notes = _measuring_device(settings, device)
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
            disk = _save_variant(q, name, variant, out_dir, weights)
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
            # the settings put the baseline first: every later variant is measured against it
            assert base is not None and ref_logits is not None and ref_tokens is not None
            assert spec is not None  # to_precision attaches it
            row.update(
                **_size_figures(model, variant, wb, disk, base),
                **_quality_figures(q, ev, logits, tps, tokens, base, ref_logits, ref_tokens),
                **_what_is_quantized(spec),
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


def _measuring_device(
    settings: QuantizationSettings, device: str | torch.device | None
) -> tuple[torch.device, list[str]]:
    """The device to measure on: `device` when given, else the settings' (with a note when that one
    is not available and another is used)."""
    notes: list[str] = []
    if device is None:
        dev, warn = resolve_device(settings.device)
        if warn:
            notes.append(warn.replace("training", "measuring"))
    else:
        dev = torch.device(device)
    return dev, notes


def _save_variant(
    q: nn.Module, name: str, variant: str, out_dir: str | Path | None, weights: dict[str, dict[str, Path]]
) -> dict[str, int]:
    """The variant's weights file and its bytes on disk: kept as `out_dir/<model>/<variant>.safetensors`
    (recorded in `weights`), or, without `out_dir`, written to a temporary folder only to be measured."""
    if out_dir is not None:
        path = Path(out_dir) / name / f"{variant}.safetensors"
        disk = save_weights(q, path)
        weights.setdefault(name, {})[variant] = path
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="w2t-quant-") as d:
            disk = save_weights(q, Path(d) / "w.safetensors")
    return disk


def _size_figures(
    model: nn.Module, variant: str, wb: dict[str, int], disk: dict[str, int], base: dict[str, float]
) -> dict[str, Any]:
    """A variant's bytes in memory and on disk against FP32's, and its quantized layers against the
    same layers in FP16 (None where it quantizes nothing)."""
    q_params = wb["quantized_params"]
    codes_scales = wb["codes"] + wb["scales"]
    return dict(
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
    )


def _quality_figures(
    q: nn.Module,
    ev: dict[str, float],
    logits: torch.Tensor,
    tps: float,
    tokens: list[int],
    base: dict[str, float],
    ref_logits: torch.Tensor,
    ref_tokens: list[int],
) -> dict[str, Any]:
    """A variant's loss and perplexity against FP32's, its logits' distance from FP32's, its speeds,
    and the share of its greedy tokens that match FP32's."""
    return dict(
        val_loss=ev["val_loss"],
        val_ppl=ev["val_ppl"],
        dloss=ev["val_loss"] - base["loss"],
        dppl_pct=100.0 * (ev["val_ppl"] / base["ppl"] - 1.0),
        logits_max_abs_diff=_max_abs_diff(logits, ref_logits),
        eval_tokens_per_s=ev["eval_tokens_per_s"],
        gen_tokens_per_s=tps,
        cache=cache_kind(q),
        greedy_match=sum(a == b for a, b in zip(tokens, ref_tokens)) / max(len(ref_tokens), 1),
    )


def _what_is_quantized(spec: PrecisionSpec) -> dict[str, str]:
    """What a variant quantized (its Linear layers, recurrent matrices rewritten as Linear first) and
    what it kept float."""
    return dict(
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
