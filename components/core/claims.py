"""The article's claims, each judged on a run's own artifacts.

One function per claim. It takes the manifest (the plain JSON dict an asset hands downstream) of the
asset whose output it judges, reads the files that manifest names when it needs them, and returns a
`Verdict`: whether the claim held, its sub-checks and the measured figures. The asset checks call
these functions and so does the run's report, so a check and the report never disagree.

`CLAIMS` lists every claim with the asset it judges (`LANGUAGE_MODELS`: each language-model asset),
its statement (the check's description), whether a failure blocks downstream steps, and whether it is
a finding that needs a trained model of some size or a quiet machine (a warning when it fails) rather
than a property that must hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

LANGUAGE_MODELS = "*language models*"  # a claim judged on every language-model asset
SQRT2 = math.sqrt(2.0)
ONEHOT_TOLERANCE = 1e-9  # one-hot distances are √2 up to float rounding
SPREAD_OVER_RANDOM = 1.5  # learned distances' std/mean at least this × that of random directions
ROW_SUM_TOLERANCE = 1e-5
CLIP_TOLERANCE = 1e-4  # relative: clipping scales by clip / (norm + 1e-6), then float32 rounding
TOPK_MARGIN = 1e-4  # nats: a loss "rises" by more than float rounding between attention paths


@dataclass(frozen=True)
class Verdict:
    passed: bool
    checks: dict[str, bool]
    figures: dict[str, Any]  # numbers, short strings
    note: str = ""


def verdict(checks: dict[str, bool], figures: dict[str, Any] | None = None, note: str = "") -> Verdict:
    checks = {k: bool(v) for k, v in checks.items()}
    return Verdict(passed=bool(checks) and all(checks.values()), checks=checks, figures=dict(figures or {}), note=note)


def not_measured(note: str, figures: dict[str, Any] | None = None) -> Verdict:
    """Nothing to judge (the stage did not measure it in this configuration): passes, and says so."""
    return Verdict(passed=True, checks={}, figures=dict(figures or {}), note=note)


@dataclass(frozen=True)
class Claim:
    name: str  # the asset check's name
    asset: str  # the asset whose manifest is judged, or LANGUAGE_MODELS
    statement: str
    judge: Callable[[dict], Verdict] = field(repr=False)
    blocking: bool = False
    warn: bool = False  # a finding of a trained model or a timing: a warning, not an error, when it fails


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
        {"pad_token": words[PAD_ID], "pad_row_norm": float(np.linalg.norm(emb.vectors[PAD_ID])), "words_probed": len(neighbours),
         "neighbours_listed": sum(len(nb) for nb in neighbours.values()), "pad_in_neighbours": hits},
    )


def onehot_equidistant_learned_not(embedding_eval: dict) -> Verdict:
    m = embedding_eval["metrics"]
    if "distance/learned_cv" not in m:
        return not_measured("embedding_eval measured no pairwise distances (fewer than 3 searchable words)")
    figures = {k.removeprefix("distance/"): m[k] for k in sorted(m) if k.startswith("distance/")}
    return verdict(
        {
            "onehot_all_sqrt2": max(abs(m["distance/onehot_min"] - SQRT2), abs(m["distance/onehot_max"] - SQRT2)) <= ONEHOT_TOLERANCE,
            "learned_spread_beyond_random": m["distance/learned_cv"] >= SPREAD_OVER_RANDOM * m["distance/random_cv"],
        },
        {**figures, "sqrt2": SQRT2, "spread_over_random_needed": SPREAD_OVER_RANDOM},
    )


# --------------------------------------------------------------------------------------------------
# Language models


def better_than_uniform(lm: dict) -> Verdict:
    """A model worse than uniform guessing learned nothing (or diverged)."""
    uniform = math.log(int(lm["vocab_size"]))
    val = float(lm["metrics"]["val/loss"])
    return verdict({"below_uniform": val < uniform}, {"val_loss": val, "uniform_loss": uniform, "margin": uniform - val})


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
        {"grad_clip": clip, "log_points": len(points), "max_grad_norm": max(before), "max_grad_norm_clipped": max(after),
         "points_over_clip": over},
        "" if over else "the gradient norm never exceeded grad_clip at a log point: the bound held without being needed",
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


def ffn_holds_two_thirds(model_comparison: dict) -> Verdict:
    accounting = model_comparison["accounting"]  # parameter_accounting per Transformer: it judges "about two thirds"
    return verdict(
        {f"{n}_ffn_share_two_thirds": bool(a["about_two_thirds"]) for n, a in accounting.items()} or {"some_transformer_measured": False},
        {f"{n}_ffn_share": a["ffn_share"] for n, a in accounting.items()},
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
        checks["window_time_linear"] = 0.6 <= window["time_exponent"] <= 1.5 and (ref is None or window["time_exponent"] <= ref["time_exponent"] - 0.3)
    figures = {f"{impl}_{k}": x[k] for impl, x in f.items() for k in ("time_exponent", "time_r2", "time_ratio_last_doubling")}
    return verdict(checks, {"pass": p, **figures})


def _generation_fits(generation_cost: dict) -> dict:
    return {x["model"]: x for x in generation_cost["fits"]}


def kv_cache_grows_recurrent_state_does_not(generation_cost: dict) -> Verdict:
    rows = generation_cost["rows"]

    def held(model: str) -> list[int]:
        return [r["bytes_per_sequence"] for r in rows if r["model"] == model and "skipped" not in r]

    kv = held("transformer_kv_cache")
    return verdict(
        {"cache_grows_with_context": len(kv) >= 2 and all(b > a for a, b in zip(kv, kv[1:])),
         "recurrent_state_constant": all(len(set(held(m))) == 1 for m in ("rnn", "lstm"))},
        {f"{m}_bytes_per_sequence_at_max": x["bytes_per_sequence_at_max"] for m, x in _generation_fits(generation_cost).items()},
    )


def kv_cache_pays(generation_cost: dict) -> Verdict:
    f = _generation_fits(generation_cost)
    kv, nc = f["transformer_kv_cache"], f["transformer_no_cache"]
    return verdict(
        {"cached_at_most_linear": kv["time_exponent"] <= 1.1,
         "uncached_grows_faster": nc["max_over_min"] > kv["max_over_min"] and nc["time_exponent"] > kv["time_exponent"]},
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
    m = ffn_memories["metrics"]
    return verdict(
        {"fact_prompts_found": bool(ffn_memories["probe"]),
         "top_k_zeroed_hurts_more_than_random": bool(ffn_memories["probe"]) and m["ffn/p_top_k_zeroed_mean"] < m["ffn/p_random_k_zeroed_mean"]},
        {k.replace("/", "_"): v for k, v in m.items()},
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
    return verdict({f"{what}_within_limit": c["value"] <= c["limit"]},
                   {"perplexity_increase_pct": c["value"], "limit_pct": c["limit"], "model": quantized_models["main_model"]})


def int8_weights_size(quantized_models: dict) -> Verdict:
    return _size(quantized_models, "int8_size", "int8")


def nf4_weights_size(quantized_models: dict) -> Verdict:
    return _size(quantized_models, "nf4_size", "nf4")


def int8_perplexity_cost(quantized_models: dict) -> Verdict:
    return _perplexity(quantized_models, "int8_ppl", "int8")


def nf4_perplexity_cost(quantized_models: dict) -> Verdict:
    return _perplexity(quantized_models, "nf4_ppl", "nf4")


def reload_reproduces_logits(model_export: dict) -> Verdict:
    rows = model_export["rows"]
    return verdict(
        {f"{r['variant']}_reloads": r["reload_ok"] for r in rows} or {"some_export": False},
        {
            r["variant"]: f"{'ok' if r['reload_ok'] else 'FAILED'} ({r['criterion']}): max abs Δlogit {r['reload_logits_max_abs_diff']:.3g}, "
            f"val loss {r['exported_val_loss']:.6f} → {r['reloaded_val_loss']:.6f}"
            for r in rows
        },
    )


# --------------------------------------------------------------------------------------------------
# Memory tasks (delayed recall, associative recall): where the article's thesis is structural


MEMORY_SOLVED = 0.9  # accuracy a model "solves" a memory task at (its interval's lower bound at least this)
MEMORY_NEAR_CHANCE = 0.1  # "at chance": the interval's upper bound within this of chance
MEMORY_DISTANCE_DROP = 0.1  # attention "does not fall with distance": the farthest bucket no more than this below the nearest


def _rows(manifest: dict, by: str, model: str) -> list[dict]:
    return sorted((r for r in manifest["rows"] if r["by"] == by and r["model"] == model and r["n"] > 0), key=lambda r: str(r["at"]) if by == "field" else r["at"])


def rnn_forgets_where_lstm_remembers(memory_delay: dict) -> Verdict:
    """The RNN falls to chance at a delay where the LSTM still solves delayed recall.

    Falsifier: at no measured delay is the RNN's 95% interval within MEMORY_NEAR_CHANCE of chance while
    the LSTM's lower bound is at least MEMORY_SOLVED (the RNN bridges every delay, or the LSTM fails
    where the RNN fails)."""
    chance = float(memory_delay["chance"])
    rnn = {r["at"]: r for r in _rows(memory_delay, "delay", "rnn")}
    lstm = {r["at"]: r for r in _rows(memory_delay, "delay", "lstm")}
    parting = [d for d in sorted(rnn) if d in lstm and rnn[d]["high"] <= chance + MEMORY_NEAR_CHANCE and lstm[d]["low"] >= MEMORY_SOLVED]
    figures = {"chance": chance, **{f"rnn_delay{d}_accuracy": r["accuracy"] for d, r in rnn.items()},
               **{f"lstm_delay{d}_accuracy": r["accuracy"] for d, r in lstm.items()},
               "delays_where_they_part": ", ".join(map(str, parting)) or "none"}
    for g in memory_delay.get("gradients", []):
        if g["model"] in ("rnn", "lstm") and g["delay"] == max(memory_delay["delays"]):
            figures[f"{g['model']}_grad_at_max_delay_over_last"] = g["relative_to_last"]
    return verdict({"rnn_and_lstm_measured": bool(rnn and lstm), "some_delay_rnn_at_chance_lstm_solves": bool(parting)}, figures)


def attention_bridges_every_delay(memory_delay: dict, model: str = "transformer") -> Verdict:
    """Attention makes every two positions one step apart: the Transformer solves delayed recall at every
    measured delay. Falsifier: its 95% interval's lower bound below MEMORY_SOLVED at some delay."""
    rows = _rows(memory_delay, "delay", model)
    return verdict({f"{model}_measured": bool(rows), **{f"{model}_solves_delay{r['at']}": r["low"] >= MEMORY_SOLVED for r in rows}},
                   {f"{model}_delay{r['at']}_accuracy": r["accuracy"] for r in rows})


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


def recurrent_state_runs_out(memory_recall: dict, models: tuple[str, ...] = ("rnn", "lstm"), reference: str = "transformer") -> Verdict:
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
        {f"{model}_answers_within_field": within is not None and within["low"] >= MEMORY_SOLVED,
         f"{model}_at_chance_beyond_field": beyond is not None and beyond["high"] <= chance + MEMORY_NEAR_CHANCE},
        {"receptive_field": memory_recall.get("receptive_fields", {}).get(model), "chance": chance,
         **{f"{model}_{k}_accuracy": r["accuracy"] for k, r in f.items()}, **{f"{model}_{k}_queries": r["n"] for k, r in f.items()}},
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
        {"copies_the_repeat": base["repeat_accuracy"] >= INDUCTION_COPIES,
         "first_part_at_chance": base["first_accuracy"] <= chance + MEMORY_NEAR_CHANCE,
         "induction_head_in_a_later_layer": ind is not None,
         "induction_head_prefix_matching": ind is not None and heads[ind]["prefix_matching_score"] >= 0.5,
         "zeroing_it_collapses_copying": drop.get("induction head", 0.0) >= INDUCTION_COLLAPSE,
         "zeroing_another_head_costs_less": drop.get("induction head", 0.0) > drop.get("another head", 0.0)},
        {"n_layer": memory_induction["n_layer"], "repeat_accuracy": base["repeat_accuracy"], "first_accuracy": base["first_accuracy"],
         "repeat_loss": base["repeat_loss"], "first_loss": base["first_loss"],
         "previous_token_head": "L{}H{}".format(*found["previous_token_head"]),
         "previous_token_score": heads[tuple(found["previous_token_head"])]["previous_token_score"],
         "induction_head": "L{}H{}".format(*ind) if ind else "none",
         "prefix_matching_score": heads[ind]["prefix_matching_score"] if ind else None,
         **{f"repeat_accuracy_{k.replace(' ', '_')}_zeroed": a["repeat_accuracy"] for k, a in abl.items()}},
    )

# --------------------------------------------------------------------------------------------------
# The registry


CLAIMS: list[Claim] = [
    Claim("pad_row_is_zero", "word_embeddings", "The [PAD] row is exactly the zero vector and no vector is NaN/inf.",
          pad_row_is_zero, blocking=True),
    Claim("pad_excluded_from_similarity", "word_embeddings",
          "[PAD]'s vector is excluded from similarity: its row is zero (no direction), the similarity search leaves it out, and it "
          "is never among the nearest neighbours of the 200 most frequent words.", pad_excluded_from_similarity, blocking=True),
    Claim("onehot_equidistant_learned_not", "embedding_eval",
          "Distinct one-hot vectors are equidistant (every pair √2 apart, so they carry no similarity) while learned word vectors are "
          f"not: the spread (std/mean) of their pairwise distances is at least {SPREAD_OVER_RANDOM}× that of random directions of the "
          "same dimension.", onehot_equidistant_learned_not),
    Claim("better_than_uniform", LANGUAGE_MODELS, "Validation loss below ln(vocabulary size), the loss of guessing uniformly.",
          better_than_uniform, warn=True),
    Claim("clipping_bounds_gradient", LANGUAGE_MODELS,
          "Clipping bounds the gradient norm: after clipping it is at most grad_clip at every log point (the norm before clipping, and "
          "how often it exceeded grad_clip, reported beside it).", clipping_bounds_gradient),
    Claim("gradients_vanish_and_explode", "gradient_study",
          "Vanishing and exploding both show: the contractive RNN decays (< 1), the expansive one grows (> 1), and the LSTM forgets "
          "more slowly than the RNN.", gradients_vanish_and_explode),
    Claim("clipping_tames_exploding_gradients", "gradient_study",
          "At a learning rate where plain SGD on an RNN diverges, the same run with its gradient norm clipped stays finite, trains, and "
          "its clipped norm never exceeds the threshold.", clipping_tames_exploding_gradients),
    Claim("position_breaks_order_symmetry", "transformer_ablations",
          "Without positional encoding the model (bidirectional attention) is permutation-equivariant; with it, it is not.",
          position_breaks_order_symmetry),
    Claim("ffn_holds_two_thirds", "model_comparison",
          "The FFN holds about two thirds of each Transformer's block parameters (attention + FFN + norms; measured from the module).", ffn_holds_two_thirds),
    Claim("attention_scales_as_claimed", "attention_cost",
          "Double the length, four times the memory: the reference's peak memory grows as N² (exponent 1.8–2.2, ×3.6–4.4 at the last "
          "doubling), the fused kernel's as N (exponent ≤ 1.1), in the training pass.", attention_scales_as_claimed),
    Claim("attention_time_scales_as_claimed", "attention_cost",
          "Double the length, about four times the time: the reference's time grows as N² (exponent 1.5–2.8), the sliding window's "
          "about as N (0.6–1.5, and below the reference's by 0.3 or more), in the training pass. Wall time on a shared CPU: a warning "
          "when load or cache effects bend it.", attention_time_scales_as_claimed, warn=True),
    Claim("kv_cache_grows_recurrent_state_does_not", "generation_cost",
          "The KV cache carried between generated tokens grows with the context (2·n_layer·L·n_embd values) while the RNN's and "
          "LSTM's state stays one size.", kv_cache_grows_recurrent_state_does_not),
    Claim("kv_cache_pays", "generation_cost",
          "With the KV cache a token's time grows at most linearly with the context (exponent ≤ 1.1) and grows less than without it "
          "(which reruns the context). Wall time on a shared CPU: a warning when load bends it.", kv_cache_pays, warn=True),
    Claim("arithmetic_matches_measurement", "long_context_cost",
          "The arithmetic holds on our own runs: the KV cache measured in generation_cost equals 2·n_layer·n_head·head_dim·L·4 bytes "
          "at every L; the reference attention's peak memory is a constant multiple of its N×N score matrix (max/min of the ratio ≤ "
          "1.25 over the fitted N) and doubling N multiplies it by 3.6–4.4 (the article's ×4).", arithmetic_matches_measurement),
    Claim("later_context_helps", "context_usage",
          "Later context helps: every model's loss falls from the first positions to the last (gain > 0); the windowed Transformer "
          "saturates no later than its receptive field and, beyond that field, is no better than full attention (95% bootstrap "
          "interval over validation blocks); how far context helps each model is reported.",
          later_context_helps, warn=True),
    Claim("attention_rows_sum_to_one", "attention_heads",
          f"Attention weights are a distribution per query: on validation text every row of every head of the trained Transformer "
          f"sums to 1 (within {ROW_SUM_TOLERANCE:g}).", attention_rows_sum_to_one),
    Claim("heads_differ", "attention_heads",
          "The heads do not all do one thing: on repeated random spans a previous-token head and, in a later layer, an induction "
          f"head are found by measurement, and zeroing the induction head costs the copying ≥ {INDUCTION_COLLAPSE} accuracy, more "
          "than zeroing another head (the head classes on real text reported beside it).", heads_differ, warn=True),
    Claim("fact_neurons_matter", "ffn_memories",
          "The attributed neurons carry the facts: zeroing the top-k lowers the answers' mean probability more than zeroing k random "
          "neurons of the same layers (figures reported whatever they are).", fact_neurons_matter, warn=True),
    Claim("soft_attention_beats_topk", "attention_topk",
          "Soft attention beats picking only the top-scoring keys (blending the juice against ordering one dish): restricted to its "
          "top-k keys per query (renormalised) the trained Transformer's validation loss is higher than with the full softmax, and "
          "rises as k falls.", soft_attention_beats_topk, warn=True),
    Claim("int8_weights_size", "quantized_models",
          "INT8 (codes + per-row scales) of the Transformer's quantized layers ≤ 0.55× their FP16 bytes.", int8_weights_size),
    Claim("nf4_weights_size", "quantized_models",
          "NF4 (4-bit codes + absmax blocks) of the Transformer's quantized layers ≤ 0.30× their FP16 bytes.", nf4_weights_size),
    Claim("int8_perplexity_cost", "quantized_models",
          "INT8 raises the Transformer's validation perplexity by at most 1 % (a warning: the figure is reported either way).",
          int8_perplexity_cost, warn=True),
    Claim("nf4_perplexity_cost", "quantized_models",
          "NF4 raises the Transformer's validation perplexity by at most 5 % (a warning: the figure is reported either way).",
          nf4_perplexity_cost, warn=True),
    Claim("reload_reproduces_logits", "model_export",
          "Every export folder, reloaded on its own, reproduces the exported model (float: bit-exact logits; quantized: the same "
          "evaluation).", reload_reproduces_logits),
    # Memory tasks: where the article's thesis is structural
    Claim("rnn_forgets_where_lstm_remembers", "memory_delay",
          "Gradients vanish across time in an RNN, the LSTM's gates carry information further: on delayed recall the RNN's "
          f"accuracy falls to chance (95% interval within {MEMORY_NEAR_CHANCE} of it) at a delay where the LSTM still solves the "
          f"task (lower bound ≥ {MEMORY_SOLVED}).", rnn_forgets_where_lstm_remembers, warn=True),
    Claim("attention_bridges_every_delay", "memory_delay",
          f"Attention makes every two positions one step apart: the Transformer solves delayed recall at every delay measured "
          f"(95% lower bound ≥ {MEMORY_SOLVED}).", attention_bridges_every_delay, warn=True),
    Claim("attention_recall_ignores_distance", "memory_recall",
          f"Attention does not forget: on multi-query associative recall the Transformer solves the nearest keys (lower bound ≥ "
          f"{MEMORY_SOLVED}) and its accuracy on the farthest is no more than {MEMORY_DISTANCE_DROP} lower, beyond the intervals.",
          attention_recall_ignores_distance, warn=True),
    Claim("recurrent_state_runs_out", "memory_recall",
          "A fixed recurrent state runs out: the RNN's and the LSTM's recall accuracy at the most key-value pairs is below their "
          "accuracy at the fewest and below the Transformer's (beyond the 95% intervals).", recurrent_state_runs_out, warn=True),
    Claim("window_answers_within_field_only", "memory_recall",
          f"A sliding-window Transformer recalls keys within its receptive field (lower bound ≥ {MEMORY_SOLVED}) and is at chance "
          f"beyond it (upper bound within {MEMORY_NEAR_CHANCE} of chance).", window_answers_within_field_only, warn=True),
    Claim("induction_head_copies", "memory_induction",
          f"Heads specialise into named, necessary roles: on repeated random spans a two-layer Transformer copies the repeat "
          f"(accuracy ≥ {INDUCTION_COPIES}, the first part at chance) through an induction head found by its prefix-matching score "
          f"(≥ 0.5) in a layer after the previous-token head; zeroing it costs the repeat ≥ {INDUCTION_COLLAPSE} accuracy, more than "
          "zeroing another head.", induction_head_copies, warn=True),
]

BY_NAME = {c.name: c for c in CLAIMS}


def claim(name: str) -> Claim:
    return BY_NAME[name]


@dataclass(frozen=True)
class Judgement:
    claim: Claim
    asset: str
    verdict: Verdict | None  # None: the asset's manifest is not there to judge
    error: str = ""

    @property
    def status(self) -> str:
        """passed, failed (an error), warning (a failed finding), not judged."""
        if self.verdict is None:
            return "not judged"
        if self.verdict.passed:
            return "passed"
        return "warning" if self.claim.warn else "failed"


def judge_all(manifests: dict[str, dict], language_models: list[str], claims: list[Claim] | None = None) -> list[Judgement]:
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

