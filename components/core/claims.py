"""The article's claims, each judged on a run's own artifacts, and the invariants kept apart from them.

One function per check. It takes the manifest (the plain JSON dict an asset hands downstream) of the
asset whose output it judges, reads the files that manifest names when it needs them, and returns a
`Verdict`: whether it held, its sub-checks and the measured figures. The asset checks call these
functions and so does the run's report, so a check and the report never disagree.

`CLAIMS` lists every check with its kind:
- an article **claim** (`kind="claim"`): an empirical statement of the article that this run could
  contradict. It names the article's section, says in Chinese and in English what it claims, and its
  `falsifier` says which result would fail it; a test builds that world and asserts the failure.
  Only these are counted in the report's headline.
- an **invariant** (`kind="invariant"`): true by construction of the code (a zeroed PAD row, softmax
  rows summing to one, the byte arithmetic of a format). A failure is a bug: a blocking integrity
  check, listed apart and never counted as evidence for the article.
A verdict that measured nothing is "not judged" (`Verdict.judged` false): never counted as passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

LANGUAGE_MODELS = "*language models*"  # a claim judged on every language-model asset
KINDS = ("claim", "invariant")
SQRT2 = math.sqrt(2.0)
ONEHOT_TOLERANCE = 1e-9  # one-hot distances are √2 up to float rounding
SPREAD_OVER_RANDOM = 1.5  # learned distances' std/mean at least this × that of random directions
ROW_SUM_TOLERANCE = 1e-5
CLIP_TOLERANCE = 1e-4  # relative: clipping scales by clip / (norm + 1e-6), then float32 rounding
TOPK_MARGIN = 1e-4  # nats: a loss "rises" by more than float rounding between attention paths

# The article's sections as this project reads them (the `section` of each claim).
SECTIONS = {
    "1.1": "One-hot vectors and learned word vectors",
    "1.2": "What word vectors learn: similarity and analogy (king − man + woman ≈ queen)",
    "2.1": "Recurrent networks: one word after another",
    "2.2": "Vanishing and exploding gradients; clipping",
    "2.3": "The LSTM's gates",
    "3.1": "Attention: a weighted mix of every word",
    "3.2": "Positional encoding",
    "3.3": "Multi-head attention, the FFN and the residual stream",
    "4.1": "Long context: the N² score matrix and fused kernels",
    "4.2": "Generation: the KV cache against a recurrent state",
    "5.1": "Quantization: INT8 and 4-bit",
    "5.2": "Export and reload",
}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    checks: dict[str, bool]
    figures: dict[str, Any]  # numbers, short strings
    note: str = ""
    judged: bool = True  # False: nothing was measured to judge (never counted as passed)


def verdict(checks: dict[str, bool], figures: dict[str, Any] | None = None, note: str = "") -> Verdict:
    checks = {k: bool(v) for k, v in checks.items()}
    return Verdict(passed=bool(checks) and all(checks.values()), checks=checks, figures=dict(figures or {}), note=note)


def not_judged(note: str, figures: dict[str, Any] | None = None) -> Verdict:
    """Nothing to judge (the stage did not measure it in this configuration): not passed, and says why."""
    return Verdict(passed=False, checks={}, figures=dict(figures or {}), note=note, judged=False)


not_measured = not_judged  # the older name


@dataclass(frozen=True)
class Claim:
    name: str  # the asset check's name
    asset: str  # the asset whose manifest is judged, or LANGUAGE_MODELS
    statement: str  # in English, the project's own words
    judge: Callable[[dict], Verdict] = field(repr=False)
    blocking: bool = False
    warn: bool = False  # a finding of a trained model or a timing: a warning, not an error, when it fails
    kind: str = "claim"  # "claim": the article's, the run could contradict it; "invariant": true by construction
    section: str = ""  # the article's section it tests (`SECTIONS`)
    statement_zh: str = ""  # the statement in Chinese
    falsifier: str = ""  # the result that fails it

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.name}: kind {self.kind!r} is not one of {KINDS}")


# --------------------------------------------------------------------------------------------------
# Embeddings


def pad_row_is_zero(word_embeddings: dict) -> Verdict:
    from .embeddings import load_embeddings

    emb = load_embeddings(word_embeddings["path"])
    return verdict(
        {"pad_row_is_zero": (emb.vectors[0] == 0).all(), "all_finite": np.isfinite(emb.vectors).all()},
        {"pad_row_norm": float(np.linalg.norm(emb.vectors[0]))},
    )


def pad_excluded_from_similarity(word_embeddings: dict, n_words: int = 200, topn: int = 5) -> Verdict:
    """[PAD]'s row is zero (no direction, so no cosine with anything), the similarity search leaves it
    out, and it is never among the nearest neighbours of the `n_words` most frequent words."""
    from .data import PAD_ID
    from .embeddings import WordIndex, load_embeddings
    from .embeddings.evaluate import nearest_neighbours
    from .embeddings.vocab import PAD

    emb = load_embeddings(word_embeddings["path"])
    words = emb.vocab.words
    index = WordIndex(words, emb.vectors)
    probes = index.words[:n_words]
    neighbours = nearest_neighbours(index, probes, topn)
    hits = sum(w == PAD for nb in neighbours.values() for w, _ in nb)
    return verdict(
        {
            "pad_row_is_zero": (emb.vectors[PAD_ID] == 0).all(),
            "pad_not_searchable": PAD_ID not in set(index.rows.tolist()),
            "pad_never_a_neighbour": hits == 0,
        },
        {
            "pad_token": words[PAD_ID],
            "pad_row_norm": float(np.linalg.norm(emb.vectors[PAD_ID])),
            "words_probed": len(neighbours),
            "neighbours_listed": sum(len(nb) for nb in neighbours.values()),
            "pad_in_neighbours": hits,
        },
    )


def onehot_equidistant_learned_not(embedding_eval: dict) -> Verdict:
    m = embedding_eval["metrics"]
    if "distance/learned_cv" not in m:
        return not_measured("embedding_eval measured no pairwise distances (fewer than 3 searchable words)")
    figures = {k.removeprefix("distance/"): m[k] for k in sorted(m) if k.startswith("distance/")}
    return verdict(
        {
            "onehot_all_sqrt2": max(abs(m["distance/onehot_min"] - SQRT2), abs(m["distance/onehot_max"] - SQRT2))
            <= ONEHOT_TOLERANCE,
            "learned_spread_beyond_random": m["distance/learned_cv"] >= SPREAD_OVER_RANDOM * m["distance/random_cv"],
        },
        {**figures, "sqrt2": SQRT2, "spread_over_random_needed": SPREAD_OVER_RANDOM},
    )


def word_vectors_carry_similarity(embedding_eval: dict) -> Verdict:
    """Fails when the WordSim353 Spearman correlation's 95 % bootstrap interval reaches 0, or when
    related pairs (human score ≥ 7) are not closer than unrelated ones (≤ 3) beyond their interval."""
    m = embedding_eval["metrics"]
    if "wordsim353/spearman_lo" not in m:
        return not_judged("fewer than 10 WordSim353 pairs are in the vocabulary: nothing to correlate")
    checks = {"spearman_interval_above_zero": m["wordsim353/spearman_lo"] > 0}
    if "wordsim353/related_minus_unrelated_lo" in m:
        checks["related_closer_than_unrelated"] = m["wordsim353/related_minus_unrelated_lo"] > 0
    return verdict(
        checks,
        {
            k.removeprefix("wordsim353/"): v
            for k, v in m.items()
            if k.startswith("wordsim353/") and k != "wordsim353/oov"
        },
    )


def king_man_woman_queen(embedding_eval: dict) -> Verdict:
    """Fails when queen ranks no better for king − man + woman than the 5th percentile of random
    words' ranks for the same query, or when the analogy accuracy's 95 % interval reaches chance
    (one right answer among the searchable words)."""
    m = embedding_eval["metrics"]
    if "king/target_rank" not in m or "analogy/accuracy_lo" not in m:
        return not_judged("king, man, woman or queen is not among the searchable words, or no analogy was answerable")
    return verdict(
        {
            "queen_ranks_above_random_words": m["king/target_rank"] < m["king/random_rank_p05"],
            "analogy_accuracy_above_chance": m["analogy/accuracy_lo"] > m["analogy/chance"],
        },
        {
            "queen_rank": m["king/target_rank"],
            "candidates": m["king/candidates"],
            "random_rank_median": m["king/random_rank_median"],
            "random_rank_p05": m["king/random_rank_p05"],
            "analogy_accuracy": m.get("analogy/accuracy", m["analogy/correct"] / max(m["analogy/answered"], 1)),
            "analogy_accuracy_lo": m["analogy/accuracy_lo"],
            "analogy_accuracy_hi": m["analogy/accuracy_hi"],
            "chance": m["analogy/chance"],
            "answered": m["analogy/answered"],
            "coverage": m["analogy/coverage"],
        },
        "Corpus size limits it: word2vec's analogies need tens of millions of words (gensim reaches about 40 % on "
        "text8's 17 M); "
        "on a corpus of well under a million words, ours and gensim's score alike (benchmarks/results, word2vec vs "
        "gensim).",
    )


# --------------------------------------------------------------------------------------------------
# Language models


def beats_ngram_baseline(lm: dict) -> Verdict:
    """The model learned more than counts: its validation loss is below the best smoothed n-gram's
    (interpolated Kneser–Ney bigram and trigram, counted over the same training tokens) on the same
    validation targets.

    Falsifier: a validation loss at or above the n-gram's (an untrained or barely trained model, one
    that has only learned bigram statistics) fails; so does a comparison on other targets (another
    tokenizer, another block size, or a subset of the validation split), which says nothing."""
    base = lm.get("baseline")
    if not base:
        return not_measured("no n-gram baseline was counted on this model's labels")
    val = float(lm["metrics"]["val/loss"])
    block = (lm.get("train_settings") or {}).get("block_size")
    same = {
        "same_tokenizer": base.get("tokenizer_sha256") == lm.get("tokenizer_sha256"),
        "same_block_size": block is None or int(block) == int(base["block_size"]),
        "same_targets": int(lm["metrics"].get("val/targets", -1)) == int(base["n_targets"]),
    }
    return verdict({**same, "below_ngram": val < float(base["val_loss"])},
                   {"val_loss": val, "ngram_loss": float(base["val_loss"]), "ngram": base.get("model", ""),
                    "margin": float(base["val_loss"]) - val, "val_targets": int(lm["metrics"].get("val/targets", -1)),
                    "ngram_targets": int(base["n_targets"])})


def clipping_bounds_gradient(lm: dict) -> Verdict:
    """At every log point the gradient norm after clipping is at most `grad_clip` (float tolerance);
    how often the norm before clipping exceeded it says whether the bound was ever needed."""
    clip = float((lm.get("train_settings") or {}).get("grad_clip", math.nan))
    points = [h for h in lm.get("history", []) if "grad_norm_clipped" in h]
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


def gradients_vanish_and_explode(gradient_study: dict) -> Verdict:
    f = {(r["model"], r["variant"]): r["step_factor"] for r in gradient_study["rows"]}
    return verdict(
        {
            "rnn_contractive_decays": f[("rnn", "contractive")] < 1.0,
            "rnn_expansive_grows": f[("rnn", "expansive")] > 1.0,
            "lstm_fresh_decays_slower_than_rnn": f[("lstm", "fresh")] > f[("rnn", "fresh")],
        },
        {f"{m}_{v}": x for (m, v), x in f.items()},
    )


def clipping_tames_exploding_gradients(gradient_study: dict) -> Verdict:
    m = gradient_study["metrics"]
    if "clip/unclipped_diverged" not in m:
        return not_measured("the gradient study ran without its clipping experiment")
    clip = gradient_study.get("clip_grad")
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


# --------------------------------------------------------------------------------------------------
# Transformer


def position_breaks_order_symmetry(transformer_ablations: dict) -> Verdict:
    m = transformer_ablations["metrics"]
    no_pe, with_pe = m["permutation/no_pe_rel_err"], m["permutation/with_pe_rel_err"]
    # Without PE the outputs permute with the inputs up to float32 rounding (~1e-7); with PE the
    # error must stand well clear of that noise (small models at init are only mildly position-aware).
    return verdict(
        {"no_pe_equivariant": no_pe < 1e-5, "with_pe_not_equivariant": with_pe > 100 * max(no_pe, 1e-7)},
        {"no_pe_rel_err": no_pe, "with_pe_rel_err": with_pe},
    )


def sqrt_d_keeps_softmax_unsaturated(transformer_ablations: dict) -> Verdict:
    """Why attention divides its scores by √d: for unit-variance q and k the unscaled score's variance
    is d, so as the head grows the softmax saturates (its rows' entropy falls toward one-hot) and the
    gradient through it dies; scaled, the entropy stays put. Fails when the unscaled entropy does not
    fall as d grows (to below half the scaled one at the largest d), when the scaled entropy moves by
    more than 30 % across d, or when the scaled scores do not pass more gradient at the largest d."""
    probes = sorted(
        (transformer_ablations.get("scaling") or {}).get("unit_variance") or [], key=lambda r: r["head_dim"]
    )
    if len(probes) < 2:
        return not_judged("the ablations measured no softmax entropy over head sizes")
    unscaled = [r["entropy_unscaled"] for r in probes]
    scaled = [r["entropy_scaled"] for r in probes]
    last = probes[-1]
    return verdict(
        {
            "unscaled_entropy_falls_with_d": all(b < a for a, b in zip(unscaled, unscaled[1:]))
            and unscaled[-1] < 0.5 * scaled[-1],
            "scaled_entropy_steady": max(scaled) <= 1.3 * min(scaled),
            "scaled_passes_more_gradient_at_largest_d": last["score_grad_rms_scaled"] > last["score_grad_rms_unscaled"],
        },
        {
            **{f"d{r['head_dim']}_entropy_scaled": r["entropy_scaled"] for r in probes},
            **{f"d{r['head_dim']}_entropy_unscaled": r["entropy_unscaled"] for r in probes},
            f"d{last['head_dim']}_score_grad_rms_scaled": last["score_grad_rms_scaled"],
            f"d{last['head_dim']}_score_grad_rms_unscaled": last["score_grad_rms_unscaled"],
        },
    )


DEPTH_LOSS_MARGIN = 0.02  # nats: "no worse" with depth, beyond run-to-run noise of a short training


def residuals_let_depth_train(transformer_ablations: dict) -> Verdict:
    """The residual stream lets depth train: fails when, at the deepest depth of the study, the model
    without residuals passes at least a tenth of the first-layer gradient (at init) that the model with
    them does, or is not worse than it; or when, with residuals, the deepest model's validation loss is
    worse than the shallowest's by more than DEPTH_LOSS_MARGIN (depth still hurting on this budget)."""
    rows = transformer_ablations.get("depth") or []
    by = {(r["n_layer"], r["residual"]): r for r in rows}
    depths = sorted({r["n_layer"] for r in rows})
    if len(depths) < 2 or any((d, f) not in by for d in depths for f in (True, False)):
        return not_judged("the ablations ran no depth study with and without residuals")
    lo, hi = depths[0], depths[-1]
    figures = {f"{'res' if f else 'nores'}_{d}_{k}": by[(d, f)][k] for d in depths for f in (True, False)
               for k in ("val_loss", "first_layer_grad_norm_init")}
    return verdict(
        {
            "without_residuals_gradient_fades_with_depth": by[(hi, False)]["first_layer_grad_norm_init"]
            < 0.1 * by[(hi, True)]["first_layer_grad_norm_init"],
            "without_residuals_deep_model_worse": by[(hi, False)]["val_loss"] > by[(hi, True)]["val_loss"],
            "with_residuals_depth_does_not_hurt": by[(hi, True)]["val_loss"]
            <= by[(lo, True)]["val_loss"] + DEPTH_LOSS_MARGIN,
        },
        {**figures, "margin": DEPTH_LOSS_MARGIN},
    )


def ffn_holds_two_thirds(model_comparison: dict) -> Verdict:
    accounting = model_comparison["accounting"]  # parameter_accounting per Transformer: it judges "about two thirds"
    figures = {}
    for n, a in accounting.items():
        figures[f"{n}_ffn_share"] = a["ffn_share"]
        if a.get("total"):  # the share of all parameters (embedding included): what the FFN weighs in the whole model
            figures[f"{n}_ffn_share_of_all_params"] = a["components"]["ffn"] / a["total"]
    return verdict(
        {f"{n}_ffn_share_two_thirds": bool(a["about_two_thirds"]) for n, a in accounting.items()}
        or {"some_transformer_measured": False},
        figures,
    )


# --------------------------------------------------------------------------------------------------
# Long context


def _attention_fits(attention_cost: dict) -> tuple[str, dict]:
    f = {(x["pass"], x["impl"]): x for x in attention_cost["fits"]}
    p = "forward_backward" if any(k[0] == "forward_backward" for k in f) else "forward"
    return p, {impl: x for (q, impl), x in f.items() if q == p}


def attention_scales_as_claimed(attention_cost: dict) -> Verdict:
    """Memory, which the score matrix fixes whatever the machine's load: the reference's ×4 per doubling."""
    p, f = _attention_fits(attention_cost)
    ref, fused = f.get("reference"), f.get("fused")
    checks = {}
    if ref:
        checks["reference_memory_quadratic"] = 1.8 <= ref["memory_exponent"] <= 2.2
        checks["reference_memory_x4_per_doubling"] = 3.6 <= ref["memory_ratio_last_doubling"] <= 4.4
    if fused:
        checks["fused_memory_linear"] = fused["memory_exponent"] <= 1.1
    figures = {f"{impl}_{k}": x[k] for impl, x in f.items() for k in ("memory_exponent", "memory_ratio_last_doubling")}
    return verdict(checks, {"pass": p, **figures})


def attention_time_scales_as_claimed(attention_cost: dict) -> Verdict:
    p, f = _attention_fits(attention_cost)
    ref, window = f.get("reference"), f.get("window")
    checks = {}
    if ref:
        checks["reference_time_quadratic"] = 1.5 <= ref["time_exponent"] <= 2.8
    if window:
        checks["window_time_linear"] = 0.6 <= window["time_exponent"] <= 1.5 and (
            ref is None or window["time_exponent"] <= ref["time_exponent"] - 0.3
        )
    figures = {
        f"{impl}_{k}": x[k] for impl, x in f.items() for k in ("time_exponent", "time_r2", "time_ratio_last_doubling")
    }
    return verdict(checks, {"pass": p, **figures})


def _generation_fits(generation_cost: dict) -> dict:
    return {x["model"]: x for x in generation_cost["fits"]}


def kv_cache_grows_recurrent_state_does_not(generation_cost: dict) -> Verdict:
    rows = generation_cost["rows"]

    def held(model: str) -> list[int]:
        return [r["bytes_per_sequence"] for r in rows if r["model"] == model and "skipped" not in r]

    kv = held("transformer_kv_cache")
    return verdict(
        {
            "cache_grows_with_context": len(kv) >= 2 and all(b > a for a, b in zip(kv, kv[1:])),
            "recurrent_state_constant": all(len(set(held(m))) == 1 for m in ("rnn", "lstm")),
        },
        {
            f"{m}_bytes_per_sequence_at_max": x["bytes_per_sequence_at_max"]
            for m, x in _generation_fits(generation_cost).items()
        },
    )


def kv_cache_pays(generation_cost: dict) -> Verdict:
    f = _generation_fits(generation_cost)
    kv, nc = f["transformer_kv_cache"], f["transformer_no_cache"]
    return verdict(
        {
            "cached_at_most_linear": kv["time_exponent"] <= 1.1,
            "uncached_grows_faster": nc["max_over_min"] > kv["max_over_min"]
            and nc["time_exponent"] > kv["time_exponent"],
        },
        {f"{m}_{k}": x[k] for m, x in f.items() for k in ("time_exponent", "max_over_min", "ms_per_token_at_max")},
    )


def arithmetic_matches_measurement(long_context_cost: dict) -> Verdict:
    s = long_context_cost["summary"]
    checks = {"kv_cache_equals_formula": bool(long_context_cost["kv_check"]) and all(
        abs(r["measured_over_predicted"] - 1) < 1e-9 for r in long_context_cost["kv_check"])}
    for p in ("forward", "forward_backward"):
        lo, hi = s.get(f"reference_{p}_peak_over_scores_min"), s.get(f"reference_{p}_peak_over_scores_max")
        if lo is not None:
            checks[f"reference_{p}_memory_tracks_n_squared"] = hi / lo <= 1.25
        r = s.get(f"reference_{p}_memory_ratio_last_doubling")
        if r is not None:
            checks[f"reference_{p}_memory_x4_per_doubling"] = 3.6 <= r <= 4.4
    return verdict(checks, {k: float(v) for k, v in s.items() if v is not None})


def recurrence_is_the_serial_bottleneck(long_context_cost: dict) -> Verdict:
    """Two measurements of the article's "the 100th word waits for the 99 before it". The critical
    path of a forward pass (dependent steps: T·n_layer for a recurrent model, 2·n_layer for the
    Transformer whatever T) must grow with T for the recurrent models only; and the wall time per
    token of a training step must be lower for the Transformer than for each recurrent model at the
    longest length measured. Fails when the Transformer costs more per token there (a machine with
    little parallel width, such as a 2-core CPU, cannot use the shorter critical path)."""
    rows = long_context_cost["train_rows"]
    steps: dict[str, dict[int, int]] = {}
    for r in rows:
        if "sequential_steps" in r:
            steps.setdefault(r["model"], {})[r["seq_len"]] = r["sequential_steps"]
    if "transformer" not in steps or len(steps) < 2:
        return not_judged("the training steps record no critical path (sequential_steps)")
    checks, figures = {}, {}
    tf = steps["transformer"]
    checks["transformer_depth_independent_of_length"] = len(set(tf.values())) == 1
    for c in long_context_cost["crossovers"]:
        n = c["recurrent"]
        rec = steps.get(n, {})
        lens = sorted(set(rec) & set(tf))
        checks[f"{n}_critical_path_grows_with_length"] = len(lens) >= 2 and all(
            rec[b] > rec[a] for a, b in zip(lens, lens[1:])
        )
        if lens:
            figures[f"{n}_sequential_steps_at_{lens[-1]}"] = rec[lens[-1]]
            figures[f"transformer_sequential_steps_at_{lens[-1]}"] = tf[lens[-1]]
        ratio = c.get("ratio_at_max_len")
        checks[f"transformer_cheaper_per_token_than_{n}_at_longest"] = ratio is not None and ratio < 1.0
        figures[f"transformer_over_{n}_time_per_token_at_longest"] = ratio
        figures[f"transformer_costlier_than_{n}_at_every_length"] = c["transformer_costlier_at_every_len"]
    return verdict(checks, figures)


def later_context_helps(context_usage: dict) -> Verdict:
    checks = {f"{s['model']}_gains_from_context": s["gain_from_context"] > 0 for s in context_usage["summaries"]}
    for s in context_usage["summaries"]:
        if s["receptive_field"]:
            checks[f"{s['model']}_saturates_within_receptive_field"] = s["saturation_position"] <= s["receptive_field"]
    for g in context_usage["window_gaps"]:
        if "gap_beyond_field_high" in g and math.isfinite(g["gap_beyond_field_high"]):
            # Beyond its receptive field the window cannot see what full attention sees: it must not be better there
            # beyond the bootstrap interval over validation blocks.
            checks[f"{g['model']}_not_better_beyond_field"] = not g["gap_beyond_field_high"] < 0
        else:
            checks[f"{g['model']}_not_better_after_window"] = not g["gap_after_window"] < 0
    return verdict(checks, {k.replace("/", "_"): v for k, v in context_usage["metrics"].items()})


# --------------------------------------------------------------------------------------------------
# Inside the Transformer


def attention_rows_sum_to_one(attention_heads: dict) -> Verdict:
    m = attention_heads["metrics"]
    err = m["heads/max_row_sum_error"]
    return verdict({"rows_sum_to_one": err <= ROW_SUM_TOLERANCE},
                   {"max_row_sum_error": err, "tolerance": ROW_SUM_TOLERANCE, "heads": len(attention_heads["heads"])})


def heads_differ(attention_heads: dict) -> Verdict:
    """Heads do different, named, necessary things, shown where it is structural: on the induction task
    (the `induction` section attention_heads carries from memory_induction) a previous-token head and an
    induction head are two different heads found by their scores, the induction head in a later
    layer, and zeroing it costs the copying at least INDUCTION_COLLAPSE accuracy, more than zeroing
    another head. The head classes on real text and the largest single-head ablation cost there are
    reported beside it (at this size every head is "broad" on text). Falsifier: no induction section,
    one head doing both jobs or none, or copying that survives the induction head's ablation."""
    m = attention_heads["metrics"]
    kinds = {h["kind"] for h in attention_heads["heads"]}
    text = {"text_classes": ", ".join(sorted(kinds)), **{k.replace("/", "_"): v for k, v in m.items()}}
    ind = attention_heads.get("induction")
    if not ind:
        return verdict({"induction_findings_present": False}, text, "attention_heads carries no induction findings")
    found, base = ind["found"], ind["base"]
    drop = {a["ablated"]: base["repeat_accuracy"] - a["repeat_accuracy"] for a in ind["ablations"]}
    prev = tuple(found["previous_token_head"])
    head = tuple(found["induction_head"]) if "induction_head" in found else None
    return verdict(
        {"previous_token_and_induction_heads_differ": head is not None and head != prev and head[0] > prev[0],
         "induction_head_necessary": drop.get("induction head", 0.0) >= INDUCTION_COLLAPSE,
         "another_head_less_necessary": drop.get("induction head", 0.0) > drop.get("another head", 0.0)},
        {"previous_token_head": "L{}H{}".format(*prev), "induction_head": "L{}H{}".format(*head) if head else "none",
         **{f"repeat_accuracy_drop_{k.replace(' ', '_')}_zeroed": v for k, v in drop.items()}, **text},
    )


def fact_neurons_matter(ffn_memories: dict) -> Verdict:
    """Neurons selected by their direct effect on the answer on one prompt lower the answer of the
    selecting prompt by construction, so the verdict is taken on held-out prompts of the same answers:
    fails when, there, zeroing them lowers the answer's probability no more than zeroing random
    neurons matched in activation (the 95 % bootstrap interval over facts of the extra drop reaches
    0), or when no fact has a held-out prompt (then not judged)."""
    m = ffn_memories["metrics"]
    figures = {k.replace("/", "_"): v for k, v in m.items()}
    if not ffn_memories["probe"]:
        return verdict({"fact_prompts_found": False}, figures)
    if "ffn/heldout_extra_drop_lo" not in m:
        return not_judged("no fact has a second, held-out prompt: the selecting prompt alone cannot judge it", figures)
    return verdict(
        {"fact_prompts_found": True, "heldout_drop_beyond_matched_random": m["ffn/heldout_extra_drop_lo"] > 0}, figures
    )


def soft_attention_beats_topk(attention_topk: dict) -> Verdict:
    """The full softmax beats every top-k restriction, and the loss rises as k falls (each by more than
    TOPK_MARGIN: k at least the block size is the full softmax, up to float rounding)."""
    rows = sorted((r for r in attention_topk["rows"] if r["k"] is not None), key=lambda r: r["k"])
    full = next(r for r in attention_topk["rows"] if r["k"] is None)["val_loss"]
    if not rows:
        return verdict({"some_k_measured": False}, {"full_val_loss": full})
    checks = {f"full_beats_top{rows[-1]['k']}": rows[-1]["val_loss"] - full > TOPK_MARGIN}
    for a, b in zip(rows, rows[1:]):
        checks[f"top{a['k']}_worse_than_top{b['k']}"] = a["val_loss"] - b["val_loss"] > TOPK_MARGIN
    figures = {"full_val_loss": full, "margin": TOPK_MARGIN}
    for r in rows:
        figures.update({f"top{r['k']}_val_loss": r["val_loss"], f"top{r['k']}_loss_increase": r["loss_increase"],
                        f"top{r['k']}_weight_share": r["weight_share"]})
    return verdict(checks, figures)


# --------------------------------------------------------------------------------------------------
# Quantization and export


def _size(quantized_models: dict, key: str, what: str) -> Verdict:
    c = quantized_models["checks"][key]
    if c["value"] is None:
        return not_measured(f"{what} was not among quantized_models' variants: nothing to check")
    return verdict({f"{what}_within_limit": c["value"] <= c["limit"]},
                   {"ratio_codes_and_scales": c["value"], "limit": c["limit"], "ratio_with_code_books": c["all_in"],
                    "model": quantized_models["main_model"]})


def _perplexity(quantized_models: dict, key: str, what: str) -> Verdict:
    c = quantized_models["checks"][key]
    if c["value"] is None:
        return not_measured(f"{what} was not measured")
    return verdict(
        {f"{what}_within_limit": c["value"] <= c["limit"]},
        {"perplexity_increase_pct": c["value"], "limit_pct": c["limit"], "model": quantized_models["main_model"]},
    )


def int8_weights_size(quantized_models: dict) -> Verdict:
    return _size(quantized_models, "int8_size", "int8")


def nf4_weights_size(quantized_models: dict) -> Verdict:
    return _size(quantized_models, "nf4_size", "nf4")


def int8_perplexity_cost(quantized_models: dict) -> Verdict:
    return _perplexity(quantized_models, "int8_ppl", "int8")


def nf4_perplexity_cost(quantized_models: dict) -> Verdict:
    return _perplexity(quantized_models, "nf4_ppl", "nf4")


def _model_size(quantized_models: dict, variant: str) -> Verdict:
    c = quantized_models["checks"].get(f"{variant}_model_size")
    if c is None or c["value"] is None:
        return not_judged(
            f"{variant} or fp16 was not among quantized_models' variants: the whole model was not compared"
        )
    return verdict(
        {f"{variant}_model_within_limit": c["value"] <= c["limit"]},
        {
            "model_ratio_vs_fp16": c["value"],
            "limit": c["limit"],
            "bytes": c["bytes"],
            "fp16_bytes": c["fp16_bytes"],
            "quantized_layers_ratio": c["layer_ratio"],
            "quantized_share_of_params": c["quantized_share"],
            "kept_float": c["kept_float"],
            "model": quantized_models["main_model"],
        },
    )


def int8_model_size(quantized_models: dict) -> Verdict:
    """Fails when the whole INT8 model (quantized layers, and every part kept unquantized) takes more
    than 0.60× the memory of the whole FP16 model."""
    return _model_size(quantized_models, "int8")


def nf4_model_size(quantized_models: dict) -> Verdict:
    """Fails when the whole NF4 model takes more than 0.35× the memory of the whole FP16 model."""
    return _model_size(quantized_models, "nf4")


def reload_reproduces_logits(model_export: dict) -> Verdict:
    rows = model_export["rows"]
    return verdict(
        {f"{r['variant']}_reloads": r["reload_ok"] for r in rows} or {"some_export": False},
        {
            r[
                "variant"
            ]: f"{'ok' if r['reload_ok'] else 'FAILED'} ({r['criterion']}): max abs Δlogit "
                f"{r['reload_logits_max_abs_diff']:.3g}, "
            f"val loss {r['exported_val_loss']:.6f} → {r['reloaded_val_loss']:.6f}"
            for r in rows
        },
    )


# --------------------------------------------------------------------------------------------------
# Memory tasks (delayed recall, associative recall): where the article's thesis is structural


MEMORY_SOLVED = 0.9  # accuracy a model "solves" a memory task at (its interval's lower bound at least this)
MEMORY_NEAR_CHANCE = 0.1  # "at chance": the interval's upper bound within this of chance
MEMORY_DISTANCE_DROP = (
    0.1  # attention "does not fall with distance": the farthest bucket no more than this below the nearest
)


def _rows(manifest: dict, by: str, model: str) -> list[dict]:
    return sorted(
        (r for r in manifest["rows"] if r["by"] == by and r["model"] == model and r["n"] > 0),
        key=lambda r: str(r["at"]) if by == "field" else r["at"],
    )


def rnn_forgets_where_lstm_remembers(memory_delay: dict) -> Verdict:
    """The RNN falls to chance at a delay where the LSTM still solves delayed recall.

    Falsifier: at no measured delay is the RNN's 95% interval within MEMORY_NEAR_CHANCE of chance while
    the LSTM's lower bound is at least MEMORY_SOLVED (the RNN bridges every delay, or the LSTM fails
    where the RNN fails)."""
    chance = float(memory_delay["chance"])
    rnn = {r["at"]: r for r in _rows(memory_delay, "delay", "rnn")}
    lstm = {r["at"]: r for r in _rows(memory_delay, "delay", "lstm")}
    parting = [
        d
        for d in sorted(rnn)
        if d in lstm and rnn[d]["high"] <= chance + MEMORY_NEAR_CHANCE and lstm[d]["low"] >= MEMORY_SOLVED
    ]
    figures = {"chance": chance, **{f"rnn_delay{d}_accuracy": r["accuracy"] for d, r in rnn.items()},
               **{f"lstm_delay{d}_accuracy": r["accuracy"] for d, r in lstm.items()},
               "delays_where_they_part": ", ".join(map(str, parting)) or "none"}
    for g in memory_delay.get("gradients", []):
        if g["model"] in ("rnn", "lstm") and g["delay"] == max(memory_delay["delays"]):
            figures[f"{g['model']}_grad_at_max_delay_over_last"] = g["relative_to_last"]
    return verdict(
        {"rnn_and_lstm_measured": bool(rnn and lstm), "some_delay_rnn_at_chance_lstm_solves": bool(parting)}, figures
    )


def attention_bridges_every_delay(memory_delay: dict, model: str = "transformer") -> Verdict:
    """Attention makes every two positions one step apart: the Transformer solves delayed recall at every
    measured delay. Falsifier: its 95% interval's lower bound below MEMORY_SOLVED at some delay."""
    rows = _rows(memory_delay, "delay", model)
    return verdict(
        {
            f"{model}_measured": bool(rows),
            **{f"{model}_solves_delay{r['at']}": r["low"] >= MEMORY_SOLVED for r in rows},
        },
        {f"{model}_delay{r['at']}_accuracy": r["accuracy"] for r in rows},
    )


def attention_recall_ignores_distance(memory_recall: dict, model: str = "transformer") -> Verdict:
    """Full attention's associative recall does not fall with the key-query distance. Falsifier: the
    farthest distance bucket's accuracy more than MEMORY_DISTANCE_DROP below the nearest bucket's,
    beyond both 95% intervals (its upper bound below the nearest's lower bound minus the drop), or the
    model not solving the nearest bucket (lower bound below MEMORY_SOLVED)."""
    rows = _rows(memory_recall, "distance", model)
    if len(rows) < 2:
        return verdict({f"{model}_two_distance_buckets_measured": False})
    near, far = rows[0], rows[-1]
    return verdict(
        {f"{model}_solves_nearest": near["low"] >= MEMORY_SOLVED,
         f"{model}_farthest_not_below_nearest": far["high"] >= near["low"] - MEMORY_DISTANCE_DROP},
        {**{f"{model}_distance_to{r['at']}_accuracy": r["accuracy"] for r in rows}, "chance": memory_recall["chance"]},
    )


def recurrent_state_runs_out(
    memory_recall: dict, models: tuple[str, ...] = ("rnn", "lstm"), reference: str = "transformer"
) -> Verdict:
    """A fixed recurrent state runs out as key-value pairs grow: each recurrent model's accuracy at the
    most pairs is below its accuracy at the fewest (beyond both 95% intervals) and below the
    Transformer's at the most pairs. Falsifier: a recurrent model as accurate with many pairs as with
    few, or as accurate as attention at the most pairs."""
    checks, figures = {}, {}
    ref = _rows(memory_recall, "pairs", reference)
    for m in models:
        rows = _rows(memory_recall, "pairs", m)
        if len(rows) < 2:
            checks[f"{m}_measured_at_two_pair_counts"] = False
            continue
        few, many = rows[0], rows[-1]
        checks[f"{m}_falls_as_pairs_grow"] = many["high"] < few["low"]
        if ref:
            checks[f"{m}_below_{reference}_at_most_pairs"] = many["high"] < ref[-1]["low"]
        figures.update({f"{m}_pairs{r['at']}_accuracy": r["accuracy"] for r in rows})
        figures[f"{m}_state_size"] = next((x["state_size"] for x in memory_recall["models"] if x["model"] == m), None)
    figures.update({f"{reference}_pairs{r['at']}_accuracy": r["accuracy"] for r in ref})
    return verdict(checks, figures)


def window_answers_within_field_only(memory_recall: dict, model: str = "window") -> Verdict:
    """A sliding-window model answers a key within its receptive field and fails beyond it: within, its
    95% lower bound is at least MEMORY_SOLVED; beyond, its upper bound is within MEMORY_NEAR_CHANCE of
    chance. Falsifier: it fails within its field, answers beyond it, or no query fell on one side."""
    chance = float(memory_recall["chance"])
    f = {r["at"]: r for r in _rows(memory_recall, "field", model)}
    within, beyond = f.get("within"), f.get("beyond")
    return verdict(
        {
            f"{model}_answers_within_field": within is not None and within["low"] >= MEMORY_SOLVED,
            f"{model}_at_chance_beyond_field": beyond is not None and beyond["high"] <= chance + MEMORY_NEAR_CHANCE,
        },
        {
            "receptive_field": memory_recall.get("receptive_fields", {}).get(model),
            "chance": chance,
            **{f"{model}_{k}_accuracy": r["accuracy"] for k, r in f.items()},
            **{f"{model}_{k}_queries": r["n"] for k, r in f.items()},
        },
    )



INDUCTION_COPIES = 0.9  # repeat accuracy of a model that copies
INDUCTION_COLLAPSE = 0.3  # accuracy the repeat must lose when the induction head is zeroed


def induction_head_copies(memory_induction: dict) -> Verdict:
    """Heads that do different, named, necessary things: trained on repeated random spans, the model
    predicts the repeat (accuracy ≥ INDUCTION_COPIES) and not the first part (within
    MEMORY_NEAR_CHANCE of chance); the head of highest prefix-matching score in a layer after the
    previous-token head's attends to the token after the earlier occurrence (score ≥ 0.5); zeroing it
    costs the repeat at least INDUCTION_COLLAPSE accuracy, more than zeroing another head does.
    Falsifier: no copying, no later layer to hold an induction head (a one-layer model), a prefix
    score below 0.5, or copying that survives the induction head's ablation."""
    base, found, chance = memory_induction["base"], memory_induction["found"], float(memory_induction["chance"])
    abl = {a["ablated"]: a for a in memory_induction["ablations"]}
    heads = {(h["layer"], h["head"]): h for h in memory_induction["heads"]}
    ind = tuple(found["induction_head"]) if "induction_head" in found else None
    drop = {k: base["repeat_accuracy"] - a["repeat_accuracy"] for k, a in abl.items()}
    return verdict(
        {
            "copies_the_repeat": base["repeat_accuracy"] >= INDUCTION_COPIES,
            "first_part_at_chance": base["first_accuracy"] <= chance + MEMORY_NEAR_CHANCE,
            "induction_head_in_a_later_layer": ind is not None,
            "induction_head_prefix_matching": ind is not None and heads[ind]["prefix_matching_score"] >= 0.5,
            "zeroing_it_collapses_copying": drop.get("induction head", 0.0) >= INDUCTION_COLLAPSE,
            "zeroing_another_head_costs_less": drop.get("induction head", 0.0) > drop.get("another head", 0.0),
        },
        {
            "n_layer": memory_induction["n_layer"],
            "repeat_accuracy": base["repeat_accuracy"],
            "first_accuracy": base["first_accuracy"],
            "repeat_loss": base["repeat_loss"],
            "first_loss": base["first_loss"],
            "previous_token_head": "L{}H{}".format(*found["previous_token_head"]),
            "previous_token_score": heads[tuple(found["previous_token_head"])]["previous_token_score"],
            "induction_head": "L{}H{}".format(*ind) if ind else "none",
            "prefix_matching_score": heads[ind]["prefix_matching_score"] if ind else None,
            **{f"repeat_accuracy_{k.replace(' ', '_')}_zeroed": a["repeat_accuracy"] for k, a in abl.items()},
        },
    )

# --------------------------------------------------------------------------------------------------
# The registry


CLAIMS: list[Claim] = [
    # --- 1 word vectors
    Claim(
        "onehot_equidistant_learned_not",
        "embedding_eval",
        "Distinct one-hot vectors are equidistant (every pair √2 apart, so they carry no similarity) while learned "
        "word vectors are "
        f"not: the spread (std/mean) of their pairwise distances is at least {SPREAD_OVER_RANDOM}× that of random "
        f"directions of the "
        "same dimension.",
        onehot_equidistant_learned_not,
        section="1.1",
        statement_zh="独热向量两两等距（都相距 "
            "√2），看不出词与词的远近；学到的词向量不是等距的：两两距离的离散度至少是同维随机方向的 1.5 倍。",
        falsifier="Learned vectors whose pairwise distances spread no wider than random directions' (std/mean below "
            "1.5× random), "
        "e.g. random or mutually orthogonal vectors.",
    ),
    Claim(
        "word_vectors_carry_similarity",
        "embedding_eval",
        "Learned vectors carry meaning: their cosine correlates with human similarity judgements (WordSim353 Spearman, "
        "95 % "
        "bootstrap interval above 0) and related pairs (human score ≥ 7) sit closer than unrelated ones (≤ 3).",
        word_vectors_carry_similarity,
        warn=True,
        section="1.2",
        statement_zh="学到的词向量带有语义：余弦相似度与人工打分（WordSim353）正相关（Spearman 的 95% 区间在 0 "
            "以上），相关词对比无关词对更近。",
        falsifier="A Spearman interval that reaches 0, or related pairs no closer than unrelated ones beyond their "
            "interval "
        "(e.g. random or shuffled vectors).",
    ),
    Claim(
        "king_man_woman_queen",
        "embedding_eval",
        "king − man + woman ≈ queen: for that query queen ranks above the 5th percentile of random words' ranks, and "
        "the analogy "
        "accuracy's 95 % interval lies above chance (the corpus size, not the method, keeps it low: see the note).",
        king_man_woman_queen,
        warn=True,
        section="1.2",
        statement_zh="国王 − 男人 + 女人 ≈ 女王：queen 的排名明显好于随机词，类比准确率的 95% "
            "区间高于随机猜测（语料规模限制了准确率）。",
        falsifier="queen ranking no better than the 5th percentile of random words, or an analogy accuracy interval "
            "reaching "
        "chance (e.g. vectors trained on a shuffled corpus).",
    ),
    # --- 2 recurrent networks
    Claim(
        "beats_ngram_baseline",
        LANGUAGE_MODELS,
        "The model learned more than counts: its validation loss is below the best interpolated Kneser–Ney n-gram's "
        "(bigram, "
        "trigram; counted over the same training tokens) on the same validation targets.",
        beats_ngram_baseline,
        warn=True,
        section="2.1",
        statement_zh="语言模型学到的不止是计数：在同一组验证目标上，它的验证损失低于最好的 Kneser–Ney n "
            "元模型（二元、三元，用同样的训练词元统计）。",
        falsifier="A validation loss at or above the best n-gram's on the same targets (e.g. an untrained or barely "
            "trained "
        "model), or a comparison on other targets, tokenizer or block size.",
    ),
    Claim(
        "gradients_vanish_and_explode",
        "gradient_study",
        "Vanishing and exploding both show: the contractive RNN decays (< 1), the expansive one grows (> 1), and the "
        "LSTM forgets "
        "more slowly than the RNN.",
        gradients_vanish_and_explode,
        section="2.2",
        statement_zh="梯度沿时间回传会消失也会爆炸：收缩的 RNN 每步衰减（< 1），扩张的 RNN 每步增长（> 1）；LSTM 比 "
            "RNN 忘得慢。",
        falsifier="A per-step gradient factor ≥ 1 for the contractive RNN, ≤ 1 for the expansive one, or an LSTM whose "
            "factor is "
        "not above the RNN's.",
    ),
    Claim(
        "clipping_tames_exploding_gradients",
        "gradient_study",
        "At a learning rate where plain SGD on an RNN diverges, the same run with its gradient norm clipped stays "
        "finite and trains: "
        "the clip engaged (the norm before clipping exceeded the threshold) and the clipped norm never exceeded it.",
        clipping_tames_exploding_gradients,
        section="2.2",
        statement_zh="在让普通 SGD 训练 RNN "
            "发散的学习率下，同一训练加上梯度裁剪就不发散且能学：裁剪确实起了作用（裁剪前的范数超过阈值）。",
        falsifier="The unclipped run does not diverge, the clipped one diverges or does not train, or the clip never "
            "engaged.",
    ),
    # --- 3 the Transformer
    Claim(
        "position_breaks_order_symmetry",
        "transformer_ablations",
        "Without positional encoding the model (bidirectional attention) is permutation-equivariant; with it, it is "
        "not.",
        position_breaks_order_symmetry,
        section="3.2",
        statement_zh="没有位置编码，注意力对词序是置换等变的（“我爱你”和“你爱我”只是同一组数换了行）；加上位置编码就不是了。",
        falsifier="The model with positional encoding permutes its outputs with its inputs (relative error no larger "
            "than float "
        "noise), or the model without it does not.",
    ),
    Claim(
        "sqrt_d_keeps_softmax_unsaturated",
        "transformer_ablations",
        "Dividing the scores by √d keeps the softmax from saturating: with unit-variance queries and keys, the "
        "unscaled "
        "attention rows' entropy falls as the head size d grows (below half the scaled entropy at the largest d) and "
        "passes "
        "less gradient, while the scaled entropy stays steady (within 30 % across d).",
        sqrt_d_keeps_softmax_unsaturated,
        section="3.1",
        statement_zh="除以 √d 防止 softmax 饱和：不缩放时，注意力行的熵随头维度 d "
            "增大而下降（趋向独热），梯度变小；缩放后熵基本不变。",
        falsifier="An unscaled entropy that does not fall with d, a scaled entropy that moves by more than 30 % across "
            "d, or "
        "scaled scores passing no more gradient than unscaled ones at the largest d.",
    ),
    Claim(
        "residuals_let_depth_train",
        "transformer_ablations",
        "Residual connections let depth train: on the same short budget, without residuals the first layer of the "
        "deepest "
        "model gets under a tenth of the gradient it gets with them and the deep model ends worse; with residuals the "
        "deepest "
        "model is no worse than the shallowest (within 0.02 nats).",
        residuals_let_depth_train,
        warn=True,
        section="3.3",
        statement_zh="残差连接让深层网络能训练：没有残差时，最深模型第一层收到的梯度不到有残差时的十分之一，且结果更差；有残差时加深不再变差。",
        falsifier="A model without residuals whose first layer keeps a tenth of the gradient or more at depth, or that "
            "trains "
        "no worse; or, with residuals, a deepest model worse than the shallowest by more than 0.02 nats.",
    ),
    Claim(
        "soft_attention_beats_topk",
        "attention_topk",
        "Soft attention beats picking only the top-scoring keys (blending the juice against ordering one dish): "
        "restricted to its "
        "top-k keys per query (renormalised) the trained Transformer's validation loss is higher than with the full "
        "softmax, and "
        "rises as k falls.",
        soft_attention_beats_topk,
        warn=True,
        section="3.1",
        statement_zh="软注意力（按权重混合所有词，像把果汁调在一起）胜过只挑得分最高的几个词：只保留前 k "
            "个键时验证损失更高，k 越小越高。",
        falsifier="A top-k restriction whose validation loss is no higher than the full softmax's (within 1e-4 nats), "
            "or a loss "
        "that does not rise as k falls.",
    ),
    Claim(
        "fact_neurons_matter",
        "ffn_memories",
        "The FFN's neurons carry facts: neurons selected on one prompt of an answer, zeroed on a held-out prompt of "
        "the same "
        "answer, lower its probability more than random neurons of the same layers matched in activation (95 % "
        "bootstrap "
        "interval over facts above 0).",
        fact_neurons_matter,
        warn=True,
        section="3.3",
        statement_zh="FFN 里存着“事实”：在一个提示上选出的神经元，在同一事实的另一个（留出的）提示上置零，答案概率比置"
            "零激活相当的随机神经元下降得更多。",
        falsifier="On held-out prompts the selected neurons lower the answer no more than activation-matched random "
            "ones "
        "(interval reaching 0), or no fact prompt is found.",
    ),
    # --- 4 long context
    Claim(
        "attention_scales_as_claimed",
        "attention_cost",
        "Double the length, four times the memory: the reference's peak memory grows as N² (exponent 1.8–2.2, ×3.6–4.4 "
        "at the last "
        "doubling), the fused kernel's as N (exponent ≤ 1.1), in the training pass.",
        attention_scales_as_claimed,
        section="4.1",
        statement_zh="长度翻倍，显存翻四倍：朴素注意力的峰值内存按 N² 增长；融合内核（FlashAttention 式）按 N 增长。",
        falsifier="A reference memory exponent outside 1.8–2.2 (or a last doubling outside ×3.6–4.4), or a fused "
            "kernel above N^1.1.",
    ),
    Claim(
        "attention_time_scales_as_claimed",
        "attention_cost",
        "Double the length, about four times the time: the reference's time grows as N² (exponent 1.5–2.8), the "
        "sliding window's "
        "about as N (0.6–1.5, and below the reference's by 0.3 or more), in the training pass. Wall time on a shared "
        "CPU: a warning "
        "when load or cache effects bend it.",
        attention_time_scales_as_claimed,
        warn=True,
        section="4.1",
        statement_zh="长度翻倍，时间约翻四倍：朴素注意力的时间按 N² 增长，滑动窗口注意力约按 N 增长。",
        falsifier="A reference time exponent outside 1.5–2.8, or a window exponent outside 0.6–1.5 or not 0.3 below "
            "the reference's.",
    ),
    Claim(
        "kv_cache_grows_recurrent_state_does_not",
        "generation_cost",
        "The KV cache carried between generated tokens grows with the context (2·n_layer·L·n_embd values) while the "
        "RNN's and "
        "LSTM's state stays one size.",
        kv_cache_grows_recurrent_state_does_not,
        section="4.2",
        statement_zh="生成时 Transformer 的 KV 缓存随上下文变长而增长，RNN/LSTM 的隐状态大小不变。",
        falsifier="A KV cache that does not grow at every longer context, or a recurrent state whose size changes.",
    ),
    Claim(
        "kv_cache_pays",
        "generation_cost",
        "With the KV cache a token's time grows at most linearly with the context (exponent ≤ 1.1) and grows less than "
        "without it "
        "(which reruns the context). Wall time on a shared CPU: a warning when load bends it.",
        kv_cache_pays,
        warn=True,
        section="4.2",
        statement_zh="有了 KV 缓存，每生成一个词的时间随上下文至多线性增长，并且比不用缓存（每次重算整个上下文）增长得"
            "慢。",
        falsifier="A cached per-token time exponent above 1.1, or an uncached time growing no faster than the cached "
            "one.",
    ),
    Claim(
        "arithmetic_matches_measurement",
        "long_context_cost",
        "The arithmetic holds on our own runs: the KV cache measured in generation_cost equals "
        "2·n_layer·n_head·head_dim·L·4 bytes "
        "at every L; the reference attention's peak memory is a constant multiple of its N×N score matrix (max/min of "
        "the ratio ≤ "
        "1.25 over the fitted N) and doubling N multiplies it by 3.6–4.4 (the article's ×4).",
        arithmetic_matches_measurement,
        section="4.1",
        statement_zh="文章的算术在我们自己的运行上成立：实测 KV 缓存等于 2·层数·头数·头维·L·4 "
            "字节；朴素注意力的峰值内存是 N×N 分数矩阵的固定倍数。",
        falsifier="A measured cache that differs from the formula, or a peak memory whose ratio to N² drifts by more "
            "than 1.25× "
        "over N.",
    ),
    Claim(
        "recurrence_is_the_serial_bottleneck",
        "long_context_cost",
        "Recurrence is the serial bottleneck: a recurrent forward pass has T·n_layer dependent steps (the 100th word "
        "waits for "
        "the 99 before it) while the Transformer's has 2·n_layer whatever T, and, measured, the Transformer's training "
        "step "
        "costs less per token than the RNN's and the LSTM's at the longest length (a timing: a warning when it does "
        "not).",
        recurrence_is_the_serial_bottleneck,
        warn=True,
        section="2.1",
        statement_zh="循环网络是串行的瓶颈：第 100 个词要等前 99 个算完（关键路径 T·层数步），Transformer "
            "的关键路径只有 2·层数步；实测在最长序列上 Transformer 每个词的训练时间更短。",
        falsifier="The Transformer costing more per token than a recurrent model at the longest length measured (as on "
            "a 2-core "
        "CPU, with no parallel width to use), or a critical path that does not grow with T for the recurrent models.",
    ),
    Claim(
        "later_context_helps",
        "context_usage",
        "Later context helps: every model's loss falls from the first positions to the last (gain > 0); the windowed "
        "Transformer "
        "saturates no later than its receptive field and, beyond that field, is no better than full attention (95% "
        "bootstrap "
        "interval over validation blocks); how far context helps each model is reported.",
        later_context_helps,
        warn=True,
        section="4.1",
        statement_zh="更长的上下文有用：每个模型在靠后位置的损失低于开头；滑动窗口模型在感受野内就饱和，窗口之后不比全注意力好。",
        falsifier="A model whose loss does not fall with position, or a window model that keeps improving beyond its "
            "receptive "
        "field or beats full attention after its window.",
    ),
    Claim(
        "heads_differ",
        "attention_heads",
        "The heads do not all do one thing: on repeated random spans a previous-token head and, in a later layer, an "
        "induction "
        f"head are found by measurement, and zeroing the induction head costs the copying ≥ {INDUCTION_COLLAPSE} "
        f"accuracy, more "
        "than zeroing another head (the head classes on real text reported beside it).",
        heads_differ,
        warn=True,
        section="3.3",
        statement_zh="多头注意力的各个头分工不同：在重复的随机片段上能测出前一词头和（后一层的）归纳头，置零归纳头让复制崩溃，比置零其他头代价大。",
        falsifier="No previous-token head or no induction head found, or zeroing the induction head costs the copying "
            "no more "
        "than zeroing another head (e.g. a one-layer model).",
    ),
    # --- 5 quantization
    Claim(
        "int8_model_size",
        "quantized_models",
        f"INT8 makes the whole model about half of FP16: every weight in memory (quantized layers, and what stays "
        f"unquantized) "
        f"≤ {0.60}× the whole FP16 model (the quantized layers' own ratio beside it).",
        int8_model_size,
        section="5.1",
        statement_zh="INT8 让整个模型的内存约为 FP16 的一半（整模型 ≤ 0.60×，含未量化的部分）。",
        falsifier="The whole INT8 model above 0.60× the FP16 model's bytes (e.g. when the embedding and head stay in "
            "float32).",
    ),
    Claim(
        "nf4_model_size",
        "quantized_models",
        f"4-bit (NF4) makes the whole model about a quarter of FP16: ≤ {0.35}× the whole FP16 model.",
        nf4_model_size,
        section="5.1",
        statement_zh="4 比特（NF4）让整个模型约为 FP16 的四分之一（整模型 ≤ 0.35×）。",
        falsifier="The whole NF4 model above 0.35× the FP16 model's bytes.",
    ),
    Claim(
        "int8_perplexity_cost",
        "quantized_models",
        "INT8 raises the Transformer's validation perplexity by at most 1 % (a warning: the figure is reported either "
        "way).",
        int8_perplexity_cost,
        warn=True,
        section="5.1",
        statement_zh="INT8 量化几乎不损失效果：验证困惑度最多上升 1%。",
        falsifier="A validation perplexity more than 1 % above FP32's.",
    ),
    Claim(
        "nf4_perplexity_cost",
        "quantized_models",
        "NF4 raises the Transformer's validation perplexity by at most 5 % (a warning: the figure is reported either "
        "way).",
        nf4_perplexity_cost,
        warn=True,
        section="5.1",
        statement_zh="NF4 量化的代价很小：验证困惑度最多上升 5%。",
        falsifier="A validation perplexity more than 5 % above FP32's.",
    ),
    # --- invariants: true by construction; a failure is a bug
    Claim(
        "pad_row_is_zero",
        "word_embeddings",
        "The [PAD] row is exactly the zero vector and no vector is NaN/inf.",
        pad_row_is_zero,
        blocking=True,
        kind="invariant",
        section="1.1",
        statement_zh="[PAD] 的向量恒为零，且没有 NaN/inf。",
        falsifier="A [PAD] row with any non-zero entry, or a non-finite vector.",
    ),
    Claim(
        "pad_excluded_from_similarity",
        "word_embeddings",
        "[PAD]'s vector is excluded from similarity: its row is zero (no direction), the similarity search leaves it "
        "out, and it "
        "is never among the nearest neighbours of the 200 most frequent words.",
        pad_excluded_from_similarity,
        blocking=True,
        kind="invariant",
        section="1.1",
        statement_zh="[PAD] 不参与相似度：它的行为零，检索跳过它，它从不出现在近邻里。",
        falsifier="[PAD] searchable, non-zero, or among a frequent word's neighbours.",
    ),
    Claim(
        "clipping_bounds_gradient",
        LANGUAGE_MODELS,
        "Clipping bounds the gradient norm: after clipping it is at most grad_clip at every log point (clip_grad_norm_ "
        "does this "
        "by construction; how often the norm before clipping exceeded grad_clip is reported beside it).",
        clipping_bounds_gradient,
        blocking=True,
        kind="invariant",
        section="2.2",
        statement_zh="裁剪后梯度范数不超过阈值（由 clip_grad_norm_ 的构造保证）。",
        falsifier="A clipped norm above grad_clip at a log point.",
    ),
    Claim(
        "ffn_holds_two_thirds",
        "model_comparison",
        "The FFN holds about two thirds of each Transformer's block parameters (attention + FFN + norms; 8d² of 12d² "
        "per layer for a "
        "4× FFN, measured from the module; its share of all parameters, embedding included, beside it).",
        ffn_holds_two_thirds,
        blocking=True,
        kind="invariant",
        section="3.3",
        statement_zh="4 倍宽的 FFN 占每层参数约三分之二（8d²/12d²，由结构决定）。",
        falsifier="An FFN share of the blocks' parameters more than 0.05 from 2/3.",
    ),
    Claim(
        "attention_rows_sum_to_one",
        "attention_heads",
        f"Attention weights are a distribution per query: on validation text every row of every head of the trained "
        f"Transformer "
        f"sums to 1 (within {ROW_SUM_TOLERANCE:g}).",
        attention_rows_sum_to_one,
        blocking=True,
        kind="invariant",
        section="3.1",
        statement_zh="每个查询的注意力权重是一个分布：每行之和为 1（softmax 的构造）。",
        falsifier="A row summing to more than 1e-5 away from 1.",
    ),
    Claim(
        "int8_weights_size",
        "quantized_models",
        "INT8 (codes + per-row scales) of the Transformer's quantized layers ≤ 0.55× their FP16 bytes (8 of 16 bits by "
        "the format).",
        int8_weights_size,
        blocking=True,
        kind="invariant",
        section="5.1",
        statement_zh="INT8 量化层（码 + 每行尺度）≤ 同层 FP16 字节的 0.55 倍（格式决定）。",
        falsifier="Quantized layers above 0.55× FP16.",
    ),
    Claim(
        "nf4_weights_size",
        "quantized_models",
        "NF4 (4-bit codes + absmax blocks) of the Transformer's quantized layers ≤ 0.30× their FP16 bytes (4 of 16 "
        "bits by the format).",
        nf4_weights_size,
        blocking=True,
        kind="invariant",
        section="5.1",
        statement_zh="NF4 量化层（4 比特码 + 分块尺度）≤ 同层 FP16 字节的 0.30 倍（格式决定）。",
        falsifier="Quantized layers above 0.30× FP16.",
    ),
    Claim(
        "reload_reproduces_logits",
        "model_export",
        "Every export folder, reloaded on its own, reproduces the exported model (float: bit-exact logits; quantized: "
        "the same "
        "evaluation).",
        reload_reproduces_logits,
        blocking=True,
        kind="invariant",
        section="5.2",
        statement_zh="每个导出文件夹单独重新加载后复现导出时的模型。",
        falsifier="A reloaded folder whose logits or evaluation differ.",
    ),
    # Memory tasks: where the article's thesis is structural
    Claim(
        "rnn_forgets_where_lstm_remembers",
        "memory_delay",
        "Gradients vanish across time in an RNN, the LSTM's gates carry information further: on delayed recall the "
        "RNN's "
        f"accuracy falls to chance (95% interval within {MEMORY_NEAR_CHANCE} of it) at a delay where the LSTM still "
        f"solves the "
        f"task (lower bound ≥ {MEMORY_SOLVED}).",
        rnn_forgets_where_lstm_remembers,
        warn=True,
        section="2.3",
        statement_zh="门控让 LSTM 记得更久：在延迟回忆任务上，RNN 在某个延迟处掉到随机水平，而 LSTM "
            "在同一延迟仍能答对。",
        falsifier='No delay where the RNN is at chance while the LSTM solves it (e.g. delays short enough for the RNN, '
            'or an LSTM at chance too).',
    ),
    Claim(
        "attention_bridges_every_delay",
        "memory_delay",
        f"Attention makes every two positions one step apart: the Transformer solves delayed recall at every delay "
        f"measured "
        f"(95% lower bound ≥ {MEMORY_SOLVED}).",
        attention_bridges_every_delay,
        warn=True,
        section="3.1",
        statement_zh="注意力让任意两个位置只隔一步：Transformer 在每个测到的延迟上都能答对。",
        falsifier="A delay at which the Transformer's accuracy lower bound falls below the solved threshold (e.g. an "
            "untrained model).",
    ),
    Claim(
        "attention_recall_ignores_distance",
        "memory_recall",
        f"Attention does not forget: on multi-query associative recall the Transformer solves the nearest keys (lower "
        f"bound ≥ "
        f"{MEMORY_SOLVED}) and its accuracy on the farthest is no more than {MEMORY_DISTANCE_DROP} lower, beyond the "
        f"intervals.",
        attention_recall_ignores_distance,
        warn=True,
        section="3.1",
        statement_zh="注意力不遗忘：在多查询联想回忆上，最近的键能答对，最远的键准确率不明显更低。",
        falsifier='The nearest keys not solved, or the farthest keys lower by more than the allowed drop beyond the '
            'intervals.',
    ),
    Claim(
        "recurrent_state_runs_out",
        "memory_recall",
        "A fixed recurrent state runs out: the RNN's and the LSTM's recall accuracy at the most key-value pairs is "
        "below their "
        "accuracy at the fewest and below the Transformer's (beyond the 95% intervals).",
        recurrent_state_runs_out,
        warn=True,
        section="2.3",
        statement_zh="固定大小的循环状态会被用完：键值对越多，RNN 和 LSTM 的回忆准确率越低，并低于 Transformer。",
        falsifier="A recurrent model whose accuracy at the most pairs is not below its accuracy at the fewest, or not "
            "below the Transformer's.",
    ),
    Claim(
        "window_answers_within_field_only",
        "memory_recall",
        f"A sliding-window Transformer recalls keys within its receptive field (lower bound ≥ {MEMORY_SOLVED}) and is "
        f"at chance "
        f"beyond it (upper bound within {MEMORY_NEAR_CHANCE} of chance).",
        window_answers_within_field_only,
        warn=True,
        section="4.1",
        statement_zh="滑动窗口模型只能回忆感受野内的键，超出感受野就是随机水平。",
        falsifier='A window model that fails within its field, or answers above chance beyond it.',
    ),
    Claim(
        "induction_head_copies",
        "memory_induction",
        f"Heads specialise into named, necessary roles: on repeated random spans a two-layer Transformer copies the "
        f"repeat "
        f"(accuracy ≥ {INDUCTION_COPIES}, the first part at chance) through an induction head found by its "
        f"prefix-matching score "
        f"(≥ 0.5) in a layer after the previous-token head; zeroing it costs the repeat ≥ {INDUCTION_COLLAPSE} "
        f"accuracy, more than "
        "zeroing another head.",
        induction_head_copies,
        warn=True,
        section="3.3",
        statement_zh="多头分工有名有实：两层 Transformer "
            "在重复的随机片段上靠归纳头复制，置零归纳头复制就崩溃，置零其他头则不会。",
        falsifier='No copying of the repeat, no induction head after a previous-token head, or zeroing it costs no '
            'more than zeroing another head (e.g. a one-layer model).',
    ),
]

BY_NAME = {c.name: c for c in CLAIMS}


def claim(name: str) -> Claim:
    return BY_NAME[name]


def article_claims(claims: list[Claim] | None = None) -> list[Claim]:
    return [c for c in (claims if claims is not None else CLAIMS) if c.kind == "claim"]


def invariants(claims: list[Claim] | None = None) -> list[Claim]:
    return [c for c in (claims if claims is not None else CLAIMS) if c.kind == "invariant"]


@dataclass(frozen=True)
class Judgement:
    claim: Claim
    asset: str
    verdict: Verdict | None  # None: the asset's manifest is not there to judge
    error: str = ""

    @property
    def status(self) -> str:
        """passed, failed (an error), warning (a failed finding), not judged."""
        if self.verdict is None or not self.verdict.judged:
            return "not judged"
        if self.verdict.passed:
            return "passed"
        return "warning" if self.claim.warn else "failed"


def judge_all(
    manifests: dict[str, dict], language_models: list[str], claims: list[Claim] | None = None
) -> list[Judgement]:
    """Every claim on the manifests at hand (asset name → manifest); LANGUAGE_MODELS claims once per
    language model. A claim whose asset is missing, or whose judge raises, is reported as not judged."""
    out = []
    for c in claims if claims is not None else CLAIMS:
        for asset in (language_models if c.asset == LANGUAGE_MODELS else [c.asset]):
            if asset not in manifests:
                out.append(Judgement(c, asset, None, f"`{asset}` is not among the report's inputs"))
                continue
            try:
                out.append(Judgement(c, asset, c.judge(manifests[asset])))
            except Exception as e:  # noqa: BLE001 - a report shows what it could not judge instead of failing
                out.append(Judgement(c, asset, None, f"{type(e).__name__}: {e}"))
    return out

