"""The claims of the language models and the recurrent networks (the article's part 2): beating the
n-gram baseline, vanishing and exploding gradients, clipping.
"""

from __future__ import annotations

import math

from ..manifests import GradientStudy, LanguageModel
from .base import Verdict, not_measured, verdict

CLIP_TOLERANCE = 1e-4  # relative: clipping scales by clip / (norm + 1e-6), then float32 rounding


# --------------------------------------------------------------------------------------------------
# Language models


def beats_ngram_baseline(lm: LanguageModel) -> Verdict:
    """The model learned more than counts: its validation loss is below the best smoothed n-gram's
    (interpolated Kneser–Ney bigram and trigram, counted over the same training tokens) on the same
    validation targets.

    Falsifier: a validation loss at or above the n-gram's (an untrained or barely trained model, one
    that has only learned bigram statistics) fails; so does a comparison on other targets (another
    tokenizer, another block size, or a subset of the validation split), which says nothing."""
    base = lm.baseline
    if not base:
        return not_measured("no n-gram baseline was counted on this model's labels")
    val = lm.val_loss
    block = lm.context_length
    same = {
        "same_tokenizer": base.tokenizer_sha256 == lm.tokenizer_sha256,
        "same_block_size": block is None or block == base.block_size,
        "same_targets": lm.val_targets == base.n_targets,
    }
    return verdict({**same, "below_ngram": val < base.val_loss},
                   {"val_loss": val, "ngram_loss": base.val_loss, "ngram": base.model,
                    "margin": base.val_loss - val, "val_targets": lm.val_targets, "ngram_targets": base.n_targets})


def clipping_bounds_gradient(lm: LanguageModel) -> Verdict:
    """At every log point the gradient norm after clipping is at most `grad_clip` (float tolerance);
    how often the norm before clipping exceeded it says whether the bound was ever needed."""
    clip = lm.grad_clip
    points = [h for h in lm.history if "grad_norm_clipped" in h]
    if not math.isfinite(clip):
        return not_measured("the manifest records no training settings (grad_clip)")
    if clip == 0:
        return not_measured("clipping is off (grad_clip 0)", {"grad_clip": 0.0})
    if not points:
        return verdict({"gradient_norms_logged": False}, {"grad_clip": clip}, "no log point recorded grad_norm_clipped")
    before = [float(h["grad_norm"]) for h in points]
    after = [float(h["grad_norm_clipped"]) for h in points]
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
    f = {(r["model"], r["variant"]): r["step_factor"] for r in gradient_study.rows}
    return verdict(
        {
            "rnn_contractive_decays": f[("rnn", "contractive")] < 1.0,
            "rnn_expansive_grows": f[("rnn", "expansive")] > 1.0,
        },
        {f"{m}_{v}": x for (m, v), x in f.items()},
    )


def clipping_tames_exploding_gradients(gradient_study: GradientStudy) -> Verdict:
    m = gradient_study.metrics
    if "clip/unclipped_diverged" not in m:
        return not_measured("the gradient study ran without its clipping experiment")
    clip = gradient_study.clip_grad
    checks = {
        "unclipped_diverges": m["clip/unclipped_diverged"] == 1.0,
        "clipped_does_not_diverge": m["clip/clipped_diverged"] == 0.0,
        "clipped_trains": m["clip/clipped_trained"] == 1.0,
    }
    figures = {k.removeprefix("clip/"): v for k, v in m.items() if k.startswith("clip/")}
    if clip is not None and "clip/max_grad_norm_clipped" in m:
        checks["clipped_norm_within_bound"] = m["clip/max_grad_norm_clipped"] <= clip * (1 + CLIP_TOLERANCE)
        figures["clip_grad"] = clip
    if "clip/steps_clip_engaged" in m:  # the clip acted: a bound never approached would prove nothing
        checks["clip_engaged"] = m["clip/steps_clip_engaged"] > 0
    return verdict(checks, figures)
