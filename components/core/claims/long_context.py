"""The claims of long context and generation (the article's part 4): the N² score matrix and its
time, the KV cache against a recurrent state, the serial bottleneck of recurrence, later context.
"""

from __future__ import annotations

import math

from ..manifests import AttentionCost, AttentionFit, ContextUsage, GenerationCost, GenerationFit, LongContextCost
from .base import Verdict, not_judged, verdict

# --------------------------------------------------------------------------------------------------
# Long context


def _attention_fits(attention_cost: AttentionCost) -> tuple[str, dict[str, AttentionFit]]:
    """The pass the claims judge (forward+backward where measured, else forward) and its fit per implementation."""
    passes = {x.pass_ for x in attention_cost.fits}
    p = "forward_backward" if "forward_backward" in passes else "forward"
    return p, {x.impl: x for x in attention_cost.fits if x.pass_ == p}


def attention_scales_as_claimed(attention_cost: AttentionCost) -> Verdict:
    """Memory, which the score matrix fixes whatever the machine's load: the reference's ×4 per doubling."""
    p, f = _attention_fits(attention_cost)
    ref, fused = f.get("reference"), f.get("fused")
    checks: dict[str, bool] = {}
    if ref:
        checks.update(
            {
                "reference_memory_quadratic": 1.8 <= ref.memory_exponent <= 2.2,
                "reference_memory_x4_per_doubling": 3.6 <= ref.memory_ratio_last_doubling <= 4.4,
            }
        )
    if fused:
        checks.update({"fused_memory_linear": fused.memory_exponent <= 1.1})
    figures: dict[str, object] = {"pass": p}
    for impl, x in f.items():
        figures.update(
            {
                f"{impl}_memory_exponent": x.memory_exponent,
                f"{impl}_memory_ratio_last_doubling": x.memory_ratio_last_doubling,
            }
        )
    return verdict(checks, figures)


def attention_time_scales_as_claimed(attention_cost: AttentionCost) -> Verdict:
    p, f = _attention_fits(attention_cost)
    ref, window = f.get("reference"), f.get("window")
    checks: dict[str, bool] = {}
    if ref:
        checks.update({"reference_time_quadratic": 1.5 <= ref.time_exponent <= 2.8})
    if window:
        checks.update(
            {
                "window_time_linear": 0.6 <= window.time_exponent <= 1.5
                and (ref is None or window.time_exponent <= ref.time_exponent - 0.3)
            }
        )
    figures: dict[str, object] = {"pass": p}
    for impl, x in f.items():
        figures.update(
            {
                f"{impl}_time_exponent": x.time_exponent,
                f"{impl}_time_r2": x.time_r2,
                f"{impl}_time_ratio_last_doubling": x.time_ratio_last_doubling,
            }
        )
    return verdict(checks, figures)


def _generation_fits(generation_cost: GenerationCost) -> dict[str, GenerationFit]:
    return {x.model: x for x in generation_cost.fits}


def kv_cache_grows_recurrent_state_does_not(generation_cost: GenerationCost) -> Verdict:
    rows = generation_cost.rows

    def held(model: str) -> list[int]:
        return [r.bytes_per_sequence for r in rows if r.model == model and r.bytes_per_sequence is not None]

    kv = held("transformer_kv_cache")
    return verdict(
        {
            "cache_grows_with_context": len(kv) >= 2 and all(b > a for a, b in zip(kv, kv[1:])),
            "recurrent_state_constant": all(len(set(held(m))) == 1 for m in ("rnn", "lstm")),
        },
        {
            f"{m}_bytes_per_sequence_at_max": x.bytes_per_sequence_at_max
            for m, x in _generation_fits(generation_cost).items()
        },
    )


def kv_cache_pays(generation_cost: GenerationCost) -> Verdict:
    f = _generation_fits(generation_cost)
    kv, nc = (f[m] for m in ("transformer_kv_cache", "transformer_no_cache"))  # KeyError: not measured
    figures: dict[str, object] = {}
    for m, x in f.items():
        figures.update(
            {
                f"{m}_time_exponent": x.time_exponent,
                f"{m}_max_over_min": x.max_over_min,
                f"{m}_ms_per_token_at_max": x.ms_per_token_at_max,
            }
        )
    return verdict(
        {
            "cached_at_most_linear": kv.time_exponent <= 1.1,
            "uncached_grows_faster": nc.max_over_min > kv.max_over_min and nc.time_exponent > kv.time_exponent,
            # What the cache is for, at the longest context: a token costs at most half of rerunning the context.
            "cached_at_most_half_at_longest": kv.ms_per_token_at_max <= 0.5 * nc.ms_per_token_at_max,
        },
        figures,
    )


def arithmetic_matches_measurement(long_context_cost: LongContextCost) -> Verdict:
    s = long_context_cost.summary
    kv = long_context_cost.kv_check
    checks = {"kv_cache_equals_formula": bool(kv) and all(abs(r.measured_over_predicted - 1) < 1e-9 for r in kv)}
    for p in ("forward", "forward_backward"):
        lo, hi = s.get(f"reference_{p}_peak_over_scores_min"), s.get(f"reference_{p}_peak_over_scores_max")
        if lo is not None and hi is not None:
            checks.update({f"reference_{p}_memory_tracks_n_squared": hi / lo <= 1.25})
        r = s.get(f"reference_{p}_memory_ratio_last_doubling")
        if r is not None:
            checks.update({f"reference_{p}_memory_x4_per_doubling": 3.6 <= r <= 4.4})
    return verdict(checks, {k: float(v) for k, v in s.items() if v is not None})


def recurrence_is_the_serial_bottleneck(long_context_cost: LongContextCost) -> Verdict:
    """Two measurements of the article's "the 100th word waits for the 99 before it". The critical
    path of a forward pass (dependent steps: T·n_layer for a recurrent model, 2·n_layer for the
    Transformer whatever T) must grow with T for the recurrent models only; and the wall time per
    token of a training step must be lower for the Transformer than for each recurrent model at the
    longest length measured. Fails when the Transformer costs more per token there (a machine with
    little parallel width, such as a 2-core CPU, cannot use the shorter critical path)."""
    steps: dict[str, dict[int, int]] = {}
    for r in long_context_cost.train_rows:
        if r.sequential_steps is not None:
            steps.setdefault(r.model, {}).update({r.seq_len: r.sequential_steps})
    tf = steps.get("transformer")
    if tf is None or len(steps) < 2:
        return not_judged("the training steps record no critical path (sequential_steps)")
    checks: dict[str, bool] = {"transformer_depth_independent_of_length": len(set(tf.values())) == 1}
    figures: dict[str, object] = {}
    for c in long_context_cost.crossovers:
        n = c.recurrent
        rec = steps.get(n, {})
        lens = sorted(set(rec) & set(tf))
        ratio = c.ratio_at_max_len
        checks.update(
            {
                f"{n}_critical_path_grows_with_length": len(lens) >= 2
                and all(rec[b] > rec[a] for a, b in zip(lens, lens[1:])),
                f"transformer_cheaper_per_token_than_{n}_at_longest": ratio is not None and ratio < 1.0,
            }
        )
        if lens:
            figures.update(
                {
                    f"{n}_sequential_steps_at_{lens[-1]}": rec[lens[-1]],
                    f"transformer_sequential_steps_at_{lens[-1]}": tf[lens[-1]],
                }
            )
        figures.update(
            {
                f"transformer_over_{n}_time_per_token_at_longest": ratio,
                f"transformer_costlier_than_{n}_at_every_length": c.transformer_costlier_at_every_len,
            }
        )
    return verdict(checks, figures)


def later_context_helps(context_usage: ContextUsage) -> Verdict:
    checks = {f"{s.model}_gains_from_context": s.gain_from_context > 0 for s in context_usage.summaries}
    checks.update(
        {
            f"{s.model}_saturates_within_receptive_field": s.saturation_position <= s.receptive_field
            for s in context_usage.summaries
            if s.receptive_field
        }
    )
    for g in context_usage.window_gaps:
        if math.isfinite(g.gap_beyond_field_high):
            # Beyond its receptive field the window cannot see what full attention sees: it must not be better there
            # beyond the bootstrap interval over validation blocks.
            checks.update({f"{g.model}_not_better_beyond_field": not g.gap_beyond_field_high < 0})
        else:
            checks.update({f"{g.model}_not_better_after_window": not g.gap_after_window < 0})
    return verdict(checks, {k.replace("/", "_"): v for k, v in context_usage.metrics.items()})
