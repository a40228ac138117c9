"""The claims of the Transformer (the article's part 3) and of looking inside it: positional
encoding, the √d scaling, residuals and depth, the FFN's share, attention heads, fact neurons,
soft against top-k attention.
"""

from __future__ import annotations

import math

from ..manifests import AttentionHeads, FfnMemories, ModelComparison, TransformerAblations
from .base import Verdict, not_judged, verdict

ROW_SUM_TOLERANCE = 1e-5
HARD_MARGIN = 0.05  # nats: soft-trained beats hard-trained by more than this (5x the Transformers' seed spread)


# --------------------------------------------------------------------------------------------------
# Transformer


def position_breaks_order_symmetry(transformer_ablations: TransformerAblations) -> Verdict:
    p = transformer_ablations.permutation
    if p is None:
        return not_judged("the ablations ran no permutation check")
    no_pe, with_pe = p.no_pe.max_rel_err, p.with_pe.max_rel_err
    # Without PE the outputs permute with the inputs up to float32 rounding (~1e-7); with PE the
    # error must stand well clear of that noise (small models at init are only mildly position-aware).
    return verdict(
        {"no_pe_equivariant": no_pe < 1e-5, "with_pe_not_equivariant": with_pe > 100 * max(no_pe, 1e-7)},
        {"no_pe_rel_err": no_pe, "with_pe_rel_err": with_pe},
    )


def sqrt_d_keeps_softmax_unsaturated(transformer_ablations: TransformerAblations) -> Verdict:
    """Why attention divides its scores by √d: for unit-variance q and k the unscaled score's variance
    is d, so as the head grows the softmax saturates (its rows' entropy falls toward one-hot) and the
    gradient through it dies; scaled, the entropy stays put. Fails when the unscaled entropy does not
    fall as d grows (to below half the scaled one at the largest d), when the scaled entropy moves by
    more than 30 % across d, or when the scaled scores do not pass more gradient at the largest d."""
    scaling = transformer_ablations.scaling
    probes = sorted(scaling.unit_variance if scaling else [], key=lambda r: r.head_dim)
    if len(probes) < 2:
        return not_judged("the ablations measured no softmax entropy over head sizes")
    unscaled = [r.entropy_unscaled for r in probes]
    scaled = [r.entropy_scaled for r in probes]
    last = probes[-1]
    return verdict(
        {
            "unscaled_entropy_falls_with_d": all(b < a for a, b in zip(unscaled, unscaled[1:]))
            and unscaled[-1] < 0.5 * scaled[-1],
            "scaled_entropy_steady": max(scaled) <= 1.3 * min(scaled),
            "scaled_passes_more_gradient_at_largest_d": last.score_grad_rms_scaled > last.score_grad_rms_unscaled,
        },
        {
            **{f"d{r.head_dim}_entropy_scaled": r.entropy_scaled for r in probes},
            **{f"d{r.head_dim}_entropy_unscaled": r.entropy_unscaled for r in probes},
            f"d{last.head_dim}_score_grad_rms_scaled": last.score_grad_rms_scaled,
            f"d{last.head_dim}_score_grad_rms_unscaled": last.score_grad_rms_unscaled,
        },
    )


DEPTH_LOSS_MARGIN = 0.02  # nats: "no worse" with depth, beyond run-to-run noise of a short training


def residuals_let_depth_train(transformer_ablations: TransformerAblations) -> Verdict:
    """The residual stream lets depth train: fails when, at the deepest depth of the study, the model
    without residuals passes at least a tenth of the first-layer gradient (at init) that the model with
    them does, or is not worse than it; or when, with residuals, the deepest model's validation loss is
    worse than the shallowest's by more than DEPTH_LOSS_MARGIN (depth still hurting on this budget)."""
    rows = transformer_ablations.depth
    by = {(r.n_layer, r.residual): r for r in rows}
    depths = sorted({r.n_layer for r in rows})
    if len(depths) < 2 or any((d, f) not in by for d in depths for f in (True, False)):
        return not_judged("the ablations ran no depth study with and without residuals")
    lo, hi = depths[0], depths[-1]
    figures = {
        f"{'res' if f else 'nores'}_{d}_{k}": x
        for d in depths
        for f in (True, False)
        for k, x in (
            ("val_loss", by[(d, f)].val_loss),
            ("first_layer_grad_norm_init", by[(d, f)].first_layer_grad_norm_init),
        )
    }
    deep, deep_plain, shallow = by[(hi, True)], by[(hi, False)], by[(lo, True)]
    return verdict(
        {
            "without_residuals_gradient_fades_with_depth": deep_plain.first_layer_grad_norm_init
            < 0.1 * deep.first_layer_grad_norm_init,
            "without_residuals_deep_model_worse": deep_plain.val_loss > deep.val_loss,
            "with_residuals_depth_does_not_hurt": deep.val_loss <= shallow.val_loss + DEPTH_LOSS_MARGIN,
        },
        {**figures, "margin": DEPTH_LOSS_MARGIN},
    )


def ffn_holds_two_thirds(model_comparison: ModelComparison) -> Verdict:
    accounting = model_comparison.accounting  # parameter_accounting per Transformer: it judges "about two thirds"
    figures = {
        **{f"{n}_ffn_share": a.ffn_share for n, a in accounting.items()},
        # the share of all parameters (embedding included): what the FFN weighs in the whole model
        **{f"{n}_ffn_share_of_all_params": a.components.ffn / a.total for n, a in accounting.items() if a.total},
    }
    return verdict(
        {f"{n}_ffn_share_two_thirds": a.about_two_thirds for n, a in accounting.items()}
        or {"some_transformer_measured": False},
        figures,
    )


# --------------------------------------------------------------------------------------------------
# Inside the Transformer


def attention_rows_sum_to_one(attention_heads: AttentionHeads) -> Verdict:
    if not attention_heads.heads:
        return not_judged("attention_heads measured no head")
    err = max(h.max_row_sum_error for h in attention_heads.heads)
    return verdict(
        {"rows_sum_to_one": err <= ROW_SUM_TOLERANCE},
        {"max_row_sum_error": err, "tolerance": ROW_SUM_TOLERANCE, "heads": len(attention_heads.heads)},
    )


def heads_differ(attention_heads: AttentionHeads) -> Verdict:
    """The heads of the trained language model do not all do one thing, measured on real text: in some
    layer, zeroing the costliest head (chosen on half the validation blocks) costs more than zeroing the
    cheapest one on the other half, its 95 % bootstrap interval over those held-out blocks above 0. The
    induction task's heads are judged by `induction_head_copies`, not here. Beside it: the head classes
    on text and the one-head twin's loss. Falsifier: heads that are copies of one head (the one-head
    model split in n), whose zeroing costs the same on every block, or a text model on which no layer's
    heads part beyond the interval."""
    differ = attention_heads.differ
    figures: dict[str, object] = {"text_classes": ", ".join(sorted({h.kind for h in attention_heads.heads}))}
    if not differ:
        return not_judged("attention_heads measured no per-block head ablation", figures)
    figures.update(
        {
            **{f"layer{r.layer}_costliest_minus_cheapest": r.difference for r in differ},
            **{f"layer{r.layer}_low": r.low for r in differ},
            "heldout_blocks": differ[0].heldout_blocks,
        }
    )
    if math.isfinite(attention_heads.one_head_loss):
        figures.update(one_head_minus_multi_head=attention_heads.one_head_loss - attention_heads.base_loss)
    return verdict({"some_layer_heads_differ_beyond_interval": any(r.low > 0 for r in differ)}, figures)


def fact_neurons_matter(ffn_memories: FfnMemories) -> Verdict:
    """Facts live in FFN neurons, judged on each seed of the fact model (studies/facts.py) on held-out
    prompts. Fails when, on any seed, the model does not know the facts (the 95 % interval over facts
    of its knowledge, the answer after its own subject against after the relation's other subjects,
    reaches 0), or the neurons chosen on other prompts take no more of that knowledge, beyond
    activation-matched neurons, than the same selection takes in the untrained twin (paired interval
    reaching 0: the direct path from a neuron to an answer lowers that answer in any model). Not judged
    when the corpus names no fact often enough."""
    if not ffn_memories.seeds:
        return not_judged(
            f"the corpus names {ffn_memories.facts_found} facts of the analogy relations often enough: nothing to "
            "probe",
            {"facts_found": ffn_memories.facts_found},
        )
    checks: dict[str, bool] = {}
    figures: dict[str, object] = {"facts": ffn_memories.facts_found}
    for r in ffn_memories.seeds:
        checks |= {
            f"seed{r.seed}_knows_the_facts": r.knowledge_lo > 0,
            f"seed{r.seed}_neurons_carry_them_beyond_untrained": r.extra_drop_over_control_lo > 0,
        }
        figures |= {
            f"seed{r.seed}_val_loss": r.val_loss,
            f"seed{r.seed}_knowledge": r.knowledge_mean,
            f"seed{r.seed}_knowledge_lo": r.knowledge_lo,
            f"seed{r.seed}_known_share": r.known_share,
            f"seed{r.seed}_extra_drop": r.extra_drop_mean,
            f"seed{r.seed}_untrained_extra_drop": r.control_extra_drop_mean,
            f"seed{r.seed}_extra_drop_over_untrained_lo": r.extra_drop_over_control_lo,
        }
    return verdict(checks, figures)


def soft_attention_trains_better_than_hard(transformer_ablations: TransformerAblations) -> Verdict:
    """Blending beats picking one, both trained: the ablations' full model (soft attention) against the
    same model trained the same way with hard attention (each query takes its top key's value only,
    straight-through). Fails when the hard model's validation loss is not above the soft one's by more
    than HARD_MARGIN. Not judged when the ablations did not train the hard model."""
    rows = {r.run: r for r in transformer_ablations.table}
    soft, hard = rows.get("full"), rows.get("hard_attention")
    if soft is None or hard is None:
        return not_judged("the ablations trained no hard-attention model (ablations: add hard_attention)")
    gap = hard.val_loss - soft.val_loss
    return verdict(
        {"soft_beats_hard_by_margin": gap > HARD_MARGIN},
        {
            "soft_val_loss": soft.val_loss,
            "hard_val_loss": hard.val_loss,
            "hard_minus_soft": gap,
            "margin": HARD_MARGIN,
            "steps": soft.steps,
            "soft_attention_entropy": soft.attn_entropy,
            "hard_attention_entropy": hard.attn_entropy,
        },
    )
