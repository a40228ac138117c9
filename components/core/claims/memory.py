"""The claims of the memory tasks (delayed recall, associative recall, induction): where the
article's thesis is structural.
"""

from __future__ import annotations

from typing import TypeVar

from ..manifests import AccuracyRow, MemoryDelay, MemoryInduction, MemoryRecall
from .base import Verdict, not_judged, verdict

# --------------------------------------------------------------------------------------------------
# Memory tasks (delayed recall, associative recall): where the article's thesis is structural


MEMORY_SOLVED = 0.9  # accuracy a model "solves" a memory task at (its interval's lower bound at least this)
MEMORY_NEAR_CHANCE = 0.1  # "at chance": the interval's upper bound within this of chance
GRADIENT_RATIO = 10.0  # "carries the gradient further": at least this many times the RNN's, at the longest delay
MEMORY_DISTANCE_DROP = (
    0.1  # attention "does not fall with distance": the farthest bucket no more than this below the nearest
)


R = TypeVar("R", bound=AccuracyRow)


def _rows(rows: list[R], by: str, model: str) -> list[R]:
    """`model`'s measured rows grouped `by` one quantity, in order of its value."""
    return sorted(
        (r for r in rows if r.by == by and r.model == model and r.n > 0),
        key=lambda r: (str(r.at), 0) if isinstance(r.at, str) else ("", r.at),
    )


def rnn_forgets_where_lstm_remembers(memory_delay: MemoryDelay) -> Verdict:
    """The RNN falls to chance at a delay where the LSTM still solves delayed recall.

    Falsifier: at no measured delay is the RNN's 95% interval within MEMORY_NEAR_CHANCE of chance while
    the LSTM's lower bound is at least MEMORY_SOLVED (the RNN bridges every delay, or the LSTM fails
    where the RNN fails)."""
    chance = float(memory_delay.chance)
    rnn = {r.delay: r for r in _rows(memory_delay.rows, "delay", "rnn")}
    lstm = {r.delay: r for r in _rows(memory_delay.rows, "delay", "lstm")}
    parting = [
        d
        for d in sorted(rnn)
        if d in lstm and rnn[d].high <= chance + MEMORY_NEAR_CHANCE and lstm[d].low >= MEMORY_SOLVED
    ]
    figures = {
        "chance": chance,
        **{f"rnn_delay{d}_accuracy": r.accuracy for d, r in rnn.items()},
        **{f"lstm_delay{d}_accuracy": r.accuracy for d, r in lstm.items()},
        "delays_where_they_part": ", ".join(map(str, parting)) or "none",
        "training": memory_delay.training,
        **{
            f"{g.model}_grad_at_max_delay_over_last": g.relative_to_last
            for g in memory_delay.gradients
            if g.model in ("rnn", "lstm") and g.delay == max(memory_delay.delays)
        },
    }
    return verdict(
        {"rnn_and_lstm_measured": bool(rnn and lstm), "some_delay_rnn_at_chance_lstm_solves": bool(parting)}, figures
    )


def lstm_carries_gradient_further(memory_delay: MemoryDelay) -> Verdict:
    """The LSTM forgets more slowly, measured in the trained models: at the longest delay, the gradient the
    query's loss sends back to the symbol (relative to the gradient at the query itself) is at least
    GRADIENT_RATIO times larger in the LSTM than in the RNN.

    Falsifier: at the longest delay the trained RNN's relative gradient is above 1/GRADIENT_RATIO of the
    LSTM's (the gradient reaches the symbol about as well without gates), or either model unmeasured."""
    longest = max(memory_delay.delays) if memory_delay.delays else None
    g = {(r.model, r.delay): r.relative_to_last for r in memory_delay.gradients}
    measured = ("rnn", longest) in g and ("lstm", longest) in g
    figures = {
        "training": memory_delay.training,
        "longest_delay": longest,
        **{f"{m}_delay{d}_gradient_over_query": x for (m, d), x in sorted(g.items()) if m in ("rnn", "lstm")},
    }
    checks = {"rnn_and_lstm_measured": measured}
    if measured and longest is not None:
        rnn, lstm = g[("rnn", longest)], g[("lstm", longest)]
        figures.update(lstm_over_rnn_at_longest=lstm / max(rnn, 1e-300))
        checks.update({f"lstm_gradient_at_least_{GRADIENT_RATIO:g}x_rnns": lstm >= GRADIENT_RATIO * rnn})
    return verdict(checks, figures)


def attention_bridges_every_delay(memory_delay: MemoryDelay, model: str = "transformer") -> Verdict:
    """Attention makes every two positions one step apart: the Transformer solves delayed recall at every
    measured delay. Falsifier: its 95% interval's lower bound below MEMORY_SOLVED at some delay."""
    rows = _rows(memory_delay.rows, "delay", model)
    return verdict(
        {f"{model}_measured": bool(rows), **{f"{model}_solves_delay{r.at}": r.low >= MEMORY_SOLVED for r in rows}},
        {f"{model}_delay{r.at}_accuracy": r.accuracy for r in rows},
    )


def attention_recall_ignores_distance(memory_recall: MemoryRecall, model: str = "transformer") -> Verdict:
    """Full attention's associative recall does not fall with the key-query distance. Falsifier: the
    farthest distance bucket's accuracy more than MEMORY_DISTANCE_DROP below the nearest bucket's,
    beyond both 95% intervals (its upper bound below the nearest's lower bound minus the drop), or the
    model not solving the nearest bucket (lower bound below MEMORY_SOLVED)."""
    rows = _rows(memory_recall.rows, "distance", model)
    if len(rows) < 2:
        return verdict({f"{model}_two_distance_buckets_measured": False})
    near, far = rows[0], rows[-1]
    return verdict(
        {
            f"{model}_solves_nearest": near.low >= MEMORY_SOLVED,
            f"{model}_farthest_not_below_nearest": far.high >= near.low - MEMORY_DISTANCE_DROP,
        },
        {**{f"{model}_distance_to{r.at}_accuracy": r.accuracy for r in rows}, "chance": memory_recall.chance},
    )


def recurrent_state_runs_out(
    memory_recall: MemoryRecall, models: tuple[str, ...] = ("rnn", "lstm"), reference: str = "transformer"
) -> Verdict:
    """A fixed recurrent state runs out as key-value pairs grow: each recurrent model's accuracy at the
    most pairs is below its accuracy at the fewest (beyond both 95% intervals) and below the
    Transformer's at the most pairs. A recurrent model at chance even at the fewest pairs (its upper
    bound within MEMORY_NEAR_CHANCE of chance) learned nothing to run out of: it is named
    (`{model}_learned_the_task` False) and not judged; with no recurrent model that learned, the claim
    is not judged. Falsifier: a recurrent model that learned the task as accurate with many pairs as
    with few, or as accurate as attention at the most pairs. Why a model at chance at one pair is not
    judged: the claim is about capacity, and MQAR's capacity results (Arora et al., 2023, "Zoology")
    compare models that learned the task; one that fails at a single pair failed to optimise, which
    says nothing about its state running out."""
    checks: dict[str, bool] = {}
    figures: dict[str, object] = {}
    learned, skipped = [], []
    chance = float(memory_recall.chance)
    ref = _rows(memory_recall.rows, "pairs", reference)
    for m in models:
        rows = _rows(memory_recall.rows, "pairs", m)
        if len(rows) < 2:
            checks.update({f"{m}_measured_at_two_pair_counts": False})
            continue
        few, many = rows[0], rows[-1]
        learned_it = few.high > chance + MEMORY_NEAR_CHANCE
        figures.update(
            {
                **{f"{m}_pairs{r.at}_accuracy": r.accuracy for r in rows},
                f"{m}_state_size": next((x.state_size for x in memory_recall.models if x.model == m), None),
                f"{m}_learned_the_task": learned_it,
            }
        )
        if not learned_it:
            skipped.append((m, few.at))
            continue
        learned.append(m)
        checks.update({f"{m}_falls_as_pairs_grow": many.high < few.low})
        if ref:
            checks.update({f"{m}_below_{reference}_at_most_pairs": many.high < ref[-1].low})
    figures.update({f"{reference}_pairs{r.at}_accuracy": r.accuracy for r in ref})
    figures.update(chance=chance)
    note = (
        (
            f"{', '.join(m for m, _ in skipped)} at chance even with {skipped[0][1]} pair(s): "
            "learned nothing to run out of, not judged"
        )
        if skipped
        else ""
    )
    if not learned and not checks:
        return not_judged(note or "no recurrent model measured", figures)
    return verdict(checks, figures, note=note)


def window_answers_within_field_only(memory_recall: MemoryRecall, model: str = "window") -> Verdict:
    """A sliding-window model solves keys within its receptive field and fails beyond it: within (the
    value at most rf − 1 back), its 95% lower bound is at least MEMORY_SOLVED, the claim's first
    threshold, held; beyond, its upper bound is within MEMORY_NEAR_CHANCE of chance (the mask hides the
    answer). Whether it is at least above chance within (lower bound beyond chance + MEMORY_NEAR_CHANCE)
    is reported beside it. Falsifier: short of solving it within (half of its training queries lie beyond
    its reach, which may slow its learning: reported as a warning, not excused), above chance beyond (a
    key the window should hide is seen), or no query on one side."""
    chance = float(memory_recall.chance)
    f = {str(r.at): r for r in _rows(memory_recall.rows, "field", model)}
    within, beyond = f.get("within"), f.get("beyond")
    above_chance = within is not None and within.low > chance + MEMORY_NEAR_CHANCE
    return verdict(
        {
            f"{model}_solves_within_field": within is not None and within.low >= MEMORY_SOLVED,
            f"{model}_at_chance_beyond_field": beyond is not None and beyond.high <= chance + MEMORY_NEAR_CHANCE,
        },
        {
            "receptive_field": memory_recall.receptive_fields.get(model),
            "chance": chance,
            "solved_threshold": MEMORY_SOLVED,
            f"{model}_above_chance_within_field": above_chance,
            **{f"{model}_{k}_accuracy": r.accuracy for k, r in f.items()},
            **{f"{model}_{k}_low": r.low for k, r in f.items()},
            **{f"{model}_{k}_high": r.high for k, r in f.items()},
            **{f"{model}_{k}_queries": r.n for k, r in f.items()},
        },
    )


INDUCTION_COPIES = 0.9  # repeat accuracy of a model that copies
INDUCTION_COLLAPSE = 0.3  # accuracy the repeat must lose when the induction heads are zeroed


def induction_head_copies(memory_induction: MemoryInduction) -> Verdict:
    """Heads that do different, named, necessary things: trained on repeated random spans, the model
    predicts the repeat (accuracy ≥ INDUCTION_COPIES) and not the first part (within
    MEMORY_NEAR_CHANCE of chance); the head of highest prefix-matching score in a layer after the
    previous-token head's attends to the token after the earlier occurrence (score ≥ 0.5); zeroing
    the induction heads (every such head at ≥ 0.5: models grow several side by side, and one left
    copies alone) costs the repeat at least INDUCTION_COLLAPSE accuracy, more than zeroing the other
    heads of lowest prefix-matching score does (as many where as many exist besides the previous-token
    head: in a 2×2 model with two induction heads, one; the heads zeroed are figures). Falsifier: no
    copying, no later layer to hold an induction head (a one-layer model), a prefix score below 0.5,
    or copying that survives the induction heads' ablation."""
    base, found, chance = memory_induction.base, memory_induction.found, float(memory_induction.chance)
    if base is None or found is None:
        return not_judged("the induction study recorded no trained model")
    abl = {a.ablated: a for a in memory_induction.ablations}
    heads = {(h.layer, h.head): h for h in memory_induction.heads}
    ind = (found.induction_head[0], found.induction_head[1]) if found.induction_head else None
    prev = heads[(found.previous_token_head[0], found.previous_token_head[1])]
    drop = {k: base.repeat_accuracy - a.repeat_accuracy for k, a in abl.items()}
    return verdict(
        {
            "copies_the_repeat": base.repeat_accuracy >= INDUCTION_COPIES,
            "first_part_at_chance": base.first_accuracy <= chance + MEMORY_NEAR_CHANCE,
            "induction_head_in_a_later_layer": ind is not None,
            "induction_head_prefix_matching": ind is not None and heads[ind].prefix_matching_score >= 0.5,
            "zeroing_them_collapses_copying": drop.get("induction heads", 0.0) >= INDUCTION_COLLAPSE,
            "zeroing_other_heads_costs_less": drop.get("induction heads", 0.0) > drop.get("other heads", 0.0),
        },
        {
            "n_layer": memory_induction.n_layer,
            "repeat_accuracy": base.repeat_accuracy,
            "first_accuracy": base.first_accuracy,
            "repeat_loss": base.repeat_loss,
            "first_loss": base.first_loss,
            "previous_token_head": "L{}H{}".format(*found.previous_token_head),
            "previous_token_score": prev.previous_token_score,
            "induction_head": "L{}H{}".format(*ind) if ind else "none",
            "prefix_matching_score": heads[ind].prefix_matching_score if ind else None,
            **{f"repeat_accuracy_{k.replace(' ', '_')}_zeroed": a.repeat_accuracy for k, a in abl.items()},
            **{
                f"{k.replace(' ', '_')}_zeroed": ", ".join("L{}H{}".format(*h) for h in a.heads) for k, a in abl.items()
            },
        },
    )
