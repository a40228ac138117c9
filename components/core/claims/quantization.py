"""The claims of quantization and export (the article's part 5): INT8 and NF4 sizes and perplexity
costs, the whole model's size, and the export folders' reload.
"""

from __future__ import annotations

from ..manifests import ModelExport, QuantizedModels
from .base import Verdict, not_judged, not_measured, verdict

# --------------------------------------------------------------------------------------------------
# Quantization and export


def _size(quantized_models: QuantizedModels, key: str, what: str) -> Verdict:
    c = quantized_models.checks[key]
    if c.value is None:
        return not_measured(f"{what} was not among quantized_models' variants: nothing to check")
    return verdict(
        {f"{what}_within_limit": c.value <= c.limit},
        {
            "ratio_codes_and_scales": c.value,
            "limit": c.limit,
            "ratio_with_code_books": c.all_in,
            "model": quantized_models.main_model,
        },
    )


def _perplexity(quantized_models: QuantizedModels, key: str, what: str) -> Verdict:
    c = quantized_models.checks[key]
    if c.value is None:
        return not_measured(f"{what} was not measured")
    return verdict(
        {f"{what}_within_limit": c.value <= c.limit},
        {"perplexity_increase_pct": c.value, "limit_pct": c.limit, "model": quantized_models.main_model},
    )


def int8_weights_size(quantized_models: QuantizedModels) -> Verdict:
    return _size(quantized_models, "int8_size", "int8")


def nf4_weights_size(quantized_models: QuantizedModels) -> Verdict:
    return _size(quantized_models, "nf4_size", "nf4")


def int8_perplexity_cost(quantized_models: QuantizedModels) -> Verdict:
    return _perplexity(quantized_models, "int8_ppl", "int8")


def nf4_perplexity_cost(quantized_models: QuantizedModels) -> Verdict:
    return _perplexity(quantized_models, "nf4_ppl", "nf4")


def _model_size(quantized_models: QuantizedModels, variant: str) -> Verdict:
    c = quantized_models.checks.get(f"{variant}_model_size")
    if c is None or c.value is None:
        return not_judged(
            f"{variant} or fp16 was not among quantized_models' variants: the whole model was not compared"
        )
    return verdict(
        {f"{variant}_model_within_limit": c.value <= c.limit},
        {
            "model_ratio_vs_fp16": c.value,
            "limit": c.limit,
            "bytes": c.bytes,
            "fp16_bytes": c.fp16_bytes,
            "quantized_layers_ratio": c.layer_ratio,
            "quantized_share_of_params": c.quantized_share,
            "kept_float": c.kept_float,
            "model": quantized_models.main_model,
        },
    )


def int8_model_size(quantized_models: QuantizedModels) -> Verdict:
    """Fails when the whole INT8 model (quantized layers, and every part kept unquantized) takes more
    than 0.60× the memory of the whole FP16 model."""
    return _model_size(quantized_models, "int8")


def nf4_model_size(quantized_models: QuantizedModels) -> Verdict:
    """Fails when the whole NF4 model takes more than 0.35× the memory of the whole FP16 model."""
    return _model_size(quantized_models, "nf4")


def reload_reproduces_logits(model_export: ModelExport) -> Verdict:
    rows = model_export.rows
    return verdict(
        {f"{r.variant}_reloads": r.reload_ok for r in rows} or {"some_export": False},
        {
            r.variant: f"{'ok' if r.reload_ok else 'FAILED'} ({r.criterion}): max abs Δlogit "
            f"{r.reload_logits_max_abs_diff:.3g}, "
            f"val loss {r.exported_val_loss:.6f} → {r.reloaded_val_loss:.6f}"
            for r in rows
        },
    )
