"""The claims of the language models and the recurrent networks (the article's part 2): beating the
count model, vanishing and exploding gradients, clipping; and the thesis at scale, from the scaling job.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..manifests import GradientStudy, LanguageModel, Scaling
from ..studies.ngram import ladder_position
from .base import Verdict, not_measured, verdict

CLIP_TOLERANCE = 1e-4  # relative: clipping scales by clip / (norm + 1e-6), then float32 rounding


# --------------------------------------------------------------------------------------------------
# Language models


def language_models_beat_the_count_model(lm: LanguageModel) -> Verdict:
    """The model learned more than counts: its validation loss is below the count model's, the
    interpolated modified Kneser–Ney n-gram whose order was chosen on held-out training data (not on
    the validation split), counted over the same training tokens and scored on the same validation
    targets. The figures place the model on the whole ladder ("between the 5-gram and the 4-gram").

    Falsifier: a validation loss at or above the count model's (an untrained or barely trained model,
    one that has only learned short-range statistics, or too little compute) fails; so does a
    comparison on other targets (another tokenizer, another block size, or a subset of the validation
    split), which says nothing."""
    base = lm.baseline
    if not base:
        return not_measured("no count model was counted on this model's labels")
    val = lm.val_loss
    block = lm.context_length
    same = {
        "same_tokenizer": base.tokenizer_sha256 == lm.tokenizer_sha256,
        "same_block_size": block is None or block == base.block_size,
        "same_targets": lm.val_targets == base.n_targets,
    }
    return verdict(
        {**same, "below_count_model": val < base.val_loss},
        {
            "on_the_ladder": ladder_position(val, base.ladder),
            "val_loss": val,
            "count_model": base.model,
            "count_model_loss": base.val_loss,
            "margin": base.val_loss - val,
            "val_targets": lm.val_targets,
            "count_model_targets": base.n_targets,
        },
    )


def clipping_bounds_gradient(lm: LanguageModel) -> Verdict:
    """At every log point the gradient norm after clipping is at most `grad_clip` (float tolerance);
    how often the norm before clipping exceeded it says whether the bound was ever needed."""
    clip = lm.grad_clip
    points = lm.grad_norms()
    if not math.isfinite(clip):
        return not_measured("the manifest records no training settings (grad_clip)")
    if clip == 0:
        return not_measured("clipping is off (grad_clip 0)", {"grad_clip": 0.0})
    if not points:
        return verdict({"gradient_norms_logged": False}, {"grad_clip": clip}, "no log point recorded grad_norm_clipped")
    before = [b for b, _ in points]
    after = [a for _, a in points]
    over = sum(b > clip for b in before)
    return verdict(
        {"clipped_norm_within_bound": max(after) <= clip * (1 + CLIP_TOLERANCE)},
        {
            "grad_clip": clip,
            "log_points": len(points),
            "max_grad_norm": max(before),
            "max_grad_norm_clipped": max(after),
            "points_over_clip": over,
        },
        ""
        if over
        else "the gradient norm never exceeded grad_clip at a log point: the bound held without being needed",
    )


# --------------------------------------------------------------------------------------------------
# Recurrent


def gradients_vanish_and_explode(gradient_study: GradientStudy) -> Verdict:
    """The contractive RNN's per-step gradient factor below 1, the expansive one's above 1. The fresh and
    trained factors of both models are figures: that the LSTM forgets more slowly is judged on models
    trained on delayed recall (`lstm_carries_gradient_further`), not on untrained ones."""
    f = {(r.model, r.variant): r.step_factor for r in gradient_study.rows}
    return verdict(
        {
            "rnn_contractive_decays": f[("rnn", "contractive")] < 1.0,
            "rnn_expansive_grows": f[("rnn", "expansive")] > 1.0,
        },
        {f"{m}_{v}": x for (m, v), x in f.items()},
    )


def clipping_tames_exploding_gradients(gradient_study: GradientStudy) -> Verdict:
    x = gradient_study.clipping
    if x is None:
        return not_measured("the gradient study ran without its clipping experiment")
    clip = gradient_study.clip_grad
    checks = {
        "unclipped_diverges": x.unclipped_diverged == 1.0,
        "clipped_does_not_diverge": x.clipped_diverged == 0.0,
        "clipped_trains": x.clipped_trained == 1.0,
    }
    m = gradient_study.metrics
    figures: dict[str, object] = {k.removeprefix("clip/"): v for k, v in m.items() if k.startswith("clip/")}
    if clip is not None and x.max_grad_norm_clipped is not None:
        checks |= {"clipped_norm_within_bound": x.max_grad_norm_clipped <= clip * (1 + CLIP_TOLERANCE)}
        figures |= {"clip_grad": clip}
    if x.steps_clip_engaged is not None:  # the clip acted: a bound never approached would prove nothing
        checks |= {"clip_engaged": x.steps_clip_engaged > 0}
    return verdict(checks, figures)


# --------------------------------------------------------------------------------------------------
# At scale: the scaling job


SCALING_Z = 1.96  # a difference beyond 1.96 σ of the two families' seed noise combined (two-sided 95 %)


def transformer_overtakes_lstm_with_compute(scaling: Scaling) -> Verdict:
    """The article's thesis at scale: as training compute grows, the Transformer overtakes the LSTM.
    Judged on the scaling job's largest budget: the Transformer's validation loss is below the LSTM's
    by more than 1.96 σ of their seed noise combined. The fitted crossings per FLOP and per second of
    training (with 95 % intervals, "never" counted) and each family's gain across the budgets are
    figures beside it.

    Falsifier: at the largest budget the Transformer is not ahead of the LSTM beyond seed noise (e.g. a
    Transformer whose attention sees only its own position, which cannot use context, or budgets too
    small for the Transformer to catch up)."""
    v = scaling.versus
    if v is None:
        return not_measured("the scaling run trained no Transformer and LSTM pair")
    z = v.lstm_minus_transformer / v.noise if v.noise > 0 else math.inf
    return verdict(
        {"transformer_ahead_at_largest_budget": z > SCALING_Z},
        {
            "largest_budget_flops": v.largest_budget,
            "lstm_minus_transformer": v.lstm_minus_transformer,
            "noise": v.noise,
            "z": z,
            "passes_lstm_per_flop": v.per_flop.median,
            "passes_lstm_per_flop_lo": v.per_flop.lo,
            "passes_lstm_per_flop_hi": v.per_flop.hi,
            "passes_lstm_per_second": v.per_second.median,
            "passes_lstm_per_second_lo": v.per_second.lo,
            "passes_lstm_per_second_hi": v.per_second.hi,
            "transformer_gain": v.transformer_drop,
            "lstm_gain": v.lstm_drop,
        },
    )


def count_model_at_scale(v: Verdict, lm_name: str, scaling: Scaling | None, tokenizer_sha256: str) -> Verdict:
    """`language_models_beat_the_count_model`'s verdict with what the scaling job saw of the model's
    family: the compute (FLOPs and training seconds) where its curve passes the count model, measured
    or extrapolated with its interval. The verdict itself is unchanged."""
    if scaling is None or lm_name not in scaling.families:
        return v
    if scaling.tokenizer_sha256 != tokenizer_sha256:
        note = "the latest scaling run was on labels of another tokenizer: its crossing is not shown"
        return replace(v, note="; ".join(n for n in (v.note, note) if n))
    fam = scaling.families[lm_name]
    extra: dict[str, Any] = {}
    for axis, c in (("flops", fam.passes_count_model_flops), ("seconds", fam.passes_count_model_seconds)):
        extra[f"scaling_passes_at_{axis}"] = c.measured if c.measured is not None else c.median
        extra[f"scaling_passes_at_{axis}_measured"] = c.measured is not None
        extra[f"scaling_passes_at_{axis}_lo"], extra[f"scaling_passes_at_{axis}_hi"] = c.lo, c.hi
    return replace(v, figures={**v.figures, **extra})
