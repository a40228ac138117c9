"""Induction on repeated random spans: the previous-token head and the induction head, found by
their attention scores and shown necessary by ablation.

Each sequence is random tokens, then a random span of length L, then the same span again; L is drawn
per sequence (min_span..span), so the distance from a token to its copy varies and only a head that
matches content (the token after the current token's earlier occurrence) can copy it. On the
fixed-offset task (every L = span) a head that attends a fixed distance back copies as well, which is
why validation always draws L from span // 2..span. Trained by the memory tasks' loop (`memory`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from matplotlib.figure import Figure
from pydantic import Field, model_validator

from ..data import IGNORE_INDEX
from ..models.sizing import count_parameters
from ..models.transformer import Transformer, require_transformer
from ..workers import weights_in
from .memory import MemoryResult, build_model, state_size, train_one
from .memory_pool import StudyPlan, run_studies, training_cost
from .memory_tasks import MemoryTrainSettings, TaskData, disjoint_validation

# A later-layer head attending at least this share to the token after the current token's earlier
# occurrence (prefix matching) is counted among the induction heads.
PREFIX_MATCHING_MIN = 0.5


class InductionSettings(MemoryTrainSettings):
    span: int = Field(
        default=16,
        ge=2,
        description="The longest span (each sequence draws its own length, see min_span); every sequence "
        "is 2 · span tokens: random tokens, the span, the span again.",
    )
    n_tokens: int = Field(
        default=32, ge=2, description="Vocabulary the spans are drawn from (first-part accuracy at chance: 1/n_tokens)."
    )
    train_sequences: int = Field(default=4096, ge=1, description="Training sequences.")
    val_sequences: int = Field(default=256, ge=1, description="Validation sequences.")
    n_layer: int = Field(
        default=2,
        ge=1,
        description="Transformer blocks: an induction head needs a previous-token head in an earlier layer.",
    )
    steps: int = Field(
        default=2000,
        ge=1,
        description="Optimizer steps (with offsets that vary, induction heads form between ~800 and "
        "~1,500 steps depending on the seed and the CPU's rounding: on an AVX2 CPU 1,000 left seeds 0, 2 and 3 "
        "copying 80-88 % of the repeat, 1,500 left seed 1 at 86 %, 2,000 copied 92-98 % on seeds 0-4; 300 leave "
        "the repeat near chance).",
    )
    min_span: Optional[int] = Field(
        default=None,
        ge=2,
        description="Shortest span trained on (default span // 2): each sequence's span length, and so "
        "the distance from a token to its copy, is drawn from min_span..span, so no head that attends a fixed "
        "distance back can copy. min_span = span trains the fixed-offset task, which a positional head solves. "
        "Validation always draws from span // 2..span.",
    )

    @property
    def vocab_size(self) -> int:
        return 1 + self.n_tokens

    @property
    def train_min_span(self) -> int:
        return self.min_span if self.min_span is not None else max(2, self.span // 2)

    @model_validator(mode="after")
    def _span_fits(self) -> "InductionSettings":
        if self.min_span is not None and self.min_span > self.span:
            raise ValueError(f"min_span={self.min_span} is longer than span={self.span}; give min_span <= span")
        return self

    @property
    def train(self) -> MemoryTrainSettings:
        return MemoryTrainSettings(**{k: getattr(self, k) for k in MemoryTrainSettings.model_fields})


def induction_task(s: InductionSettings, n: int, seed: int, min_span: int | None = None) -> TaskData:
    """`n` sequences of 2 · span tokens: random tokens, then a random span of length L (drawn from
    min_span..span, default s.train_min_span), then the same span again, ending the sequence. Every
    next token is a target; those inside the repeat are predictable by copying from L positions back
    (`distance` L, `condition` L); the rest are not (`distance` 0)."""
    rng = np.random.default_rng(seed)
    T, lo = 2 * s.span, min_span if min_span is not None else s.train_min_span
    lengths = rng.integers(lo, s.span + 1, size=n)
    x = rng.integers(1, 1 + s.n_tokens, size=(n, T))
    dist = np.zeros_like(x)
    for i, L in enumerate(lengths):
        x[i, T - L :] = x[i, T - 2 * L : T - L]
        dist[i, T - L : T - 1] = L  # targets at T-L..T-2 predict the repeat's 2nd..last token
    y = np.full_like(x, IGNORE_INDEX)
    y[:, :-1] = x[:, 1:]
    return TaskData(x.astype(np.int64), y.astype(np.int64), lengths.astype(np.int64), dist.astype(np.int64))


def repeat_targets_only(data: TaskData) -> TaskData:
    """`data` with only the repeat's targets kept (the rest IGNORE_INDEX): what the model trains on.
    The unpredictable targets carry no signal, only noise: trained on every next token, the copy
    did not form in 1,500 steps (repeat at 0.09, chance 0.03); on the repeat alone it does by ~800."""
    y = data.y.copy()
    y[data.distance == 0] = IGNORE_INDEX
    return TaskData(data.x, y, data.condition, data.distance)


def _halves(data: TaskData, ok: np.ndarray, ce: np.ndarray) -> dict:
    asked = data.y != IGNORE_INDEX
    first, rep = asked & (data.distance == 0), asked & (data.distance > 0)  # unpredictable; copied from the first
    return {
        "first_accuracy": float(ok[first].mean()),
        "repeat_accuracy": float(ok[rep].mean()),
        "first_loss": float(ce[first].mean()),
        "repeat_loss": float(ce[rep].mean()),
    }


@torch.no_grad()
def induction_eval(
    model: nn.Module, data: TaskData, s: InductionSettings, zero: list[tuple[int, int]] | None = None
) -> dict:
    """Accuracy and loss on the first part and on the repeat, optionally with heads zeroed."""
    from .heads import heads_zeroed

    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    with heads_zeroed(require_transformer(model, "zeroing heads"), zero) if zero else nullcontext():
        logits, _ = model(x)
    ce = F.cross_entropy(logits.float().transpose(1, 2), y.clamp(min=0), reduction="none").numpy()
    return _halves(data, (logits.argmax(-1) == y).numpy(), ce)


@torch.no_grad()
def head_scores(model: Transformer, data: TaskData, s: InductionSettings) -> list[dict]:
    """Per (layer, head): previous-token score (mean attention from t to t − 1), prefix-matching score
    (mean attention, from a query in the repeat, to the token after its earlier occurrence: t − L + 1,
    L the sequence's own span length, so a head attending a fixed distance back scores only where L
    happens to be that distance)."""
    weights = model.attention_weights(torch.from_numpy(data.x))  # n_layer × (B, nh, T, T)
    T = data.x.shape[1]
    t = torch.arange(1, T)
    seq, tq = (torch.from_numpy(a) for a in np.nonzero(data.distance > 0))
    src = tq - torch.from_numpy(data.distance)[seq, tq] + 1
    rows = []
    for layer, w in enumerate(weights):
        w = w.float()
        prev = w[:, :, t, t - 1].mean(dim=(0, 2))  # (nh,)
        prefix = w[seq, :, tq, src].mean(dim=0)  # (nh,)
        for h in range(w.shape[1]):
            rows.append(
                {
                    "layer": layer,
                    "head": h,
                    "previous_token_score": float(prev[h]),
                    "prefix_matching_score": float(prefix[h]),
                }
            )
    return rows


def aligned_accuracy(data: TaskData, ok: np.ndarray, span: int) -> list[float]:
    """Accuracy by position relative to the repeat's start (each sequence aligned on its own): the
    span − 1 targets before it, then the repeat's; NaN where no sequence has a target."""
    starts = data.x.shape[1] - data.condition  # the repeat begins at T − L
    rel = np.arange(data.x.shape[1])[None, :] - starts[:, None]
    asked = data.y != IGNORE_INDEX
    out = []
    for k in range(-(span - 1), span - 1):
        sel = asked & (rel == k)
        out.append(float(ok[sel].mean()) if sel.any() else float("nan"))
    return out


def plot_induction(heads: list[dict], curve: dict[str, list[float]]) -> Figure:
    fig = Figure(figsize=(10, 4), layout="constrained")
    a, b = fig.subplots(1, 2)
    for m, acc in curve.items():
        a.plot(range(1, len(acc) + 1), acc, ".-", label=m)
    a.axvline(len(next(iter(curve.values()))) / 2 + 0.5, color="black", ls=":", lw=1)
    a.set_xlabel("position, each sequence aligned on its repeat (after the dotted line)")
    a.set_ylabel("next-token accuracy")
    a.set_ylim(-0.02, 1.02)
    a.set_title("Repeated random spans")
    a.grid(True, alpha=0.3)
    a.legend(fontsize=8)
    names = [f"L{r['layer']}H{r['head']}" for r in heads]
    i = np.arange(len(heads))
    b.bar(i - 0.2, [r["previous_token_score"] for r in heads], 0.4, label="previous-token")
    b.bar(i + 0.2, [r["prefix_matching_score"] for r in heads], 0.4, label="prefix-matching")
    b.set_xticks(i, names)
    b.set_ylim(0, 1)
    b.set_title("Head scores")
    b.legend(fontsize=8)
    return fig


def induction_study(s: InductionSettings) -> MemoryResult:
    """Train the Transformer on repeated spans; find the previous-token head (highest previous-token
    score) and the induction head (highest prefix-matching score in a later layer); ablate the
    induction heads together (every later-layer head whose prefix-matching score reaches
    PREFIX_MATCHING_MIN, at least the one found), and, for comparison, as many of the other heads
    (not the previous-token head), those of lowest prefix-matching score (fewer where fewer exist)."""
    return run_studies({"induction": plan_induction(s)})["induction"]


def plan_induction(s: InductionSettings) -> StudyPlan[MemoryResult]:
    """`induction_study` as its one training and what makes its result of it (memory_pool.run_studies)."""
    train = repeat_targets_only(induction_task(s, s.train_sequences, s.seed))
    # validated on offsets that vary whatever the training drew: a positional copy head fails here
    val = disjoint_validation(train, induction_task(s, s.val_sequences, s.seed + 1, min_span=max(2, s.span // 2)))
    seq_len = 2 * s.span

    def finish(results: list) -> MemoryResult:
        weights, info = results[0]
        torch.manual_seed(s.seed)  # the module the job trained, its trained weights put back
        model = require_transformer(build_model("transformer", s.vocab_size, seq_len, s.train), "induction")
        weights_in(model, weights)
        model.eval()
        return _induction_result(s, model, info, val)

    job = (train_one, ("transformer", s.vocab_size, seq_len, train, s.train, None))
    cost = training_cost("transformer", s.steps, s.batch_size, seq_len)
    return StudyPlan([job], [cost], finish, s.workers, s.threads)


def _induction_result(s: InductionSettings, model: Transformer, info: dict, val: TaskData) -> MemoryResult:
    base = induction_eval(model, val, s)
    heads = head_scores(model, val, s)
    prev = max(heads, key=lambda r: r["previous_token_score"])
    later = [r for r in heads if r["layer"] > prev["layer"]]
    found: dict = {"previous_token_head": [prev["layer"], prev["head"]]}
    ablations = []
    if later:
        ind = max(later, key=lambda r: r["prefix_matching_score"])
        found["induction_head"] = [ind["layer"], ind["head"]]
        # Two-layer models often grow several induction heads side by side, and zeroing one of
        # them leaves the others copying: the circuit's necessity is tested on all of them.
        induction = [r for r in later if r["prefix_matching_score"] >= PREFIX_MATCHING_MIN] or [ind]
        named = {(r["layer"], r["head"]) for r in induction} | {(prev["layer"], prev["head"])}
        others = sorted(
            (r for r in heads if (r["layer"], r["head"]) not in named), key=lambda r: r["prefix_matching_score"]
        )[: len(induction)]
        for what, rs in (("induction heads", induction), ("other heads", others)):
            if rs:
                zero = [(r["layer"], r["head"]) for r in rs]
                e = induction_eval(model, val, s, zero=zero)
                ablations.append(
                    {
                        "ablated": what,
                        "heads": [list(z) for z in zero],
                        "layer": rs[0]["layer"],
                        "head": rs[0]["head"],
                        **e,
                    }
                )
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(val.x))
        per_pos = aligned_accuracy(val, logits.argmax(-1).numpy() == val.y, s.span)
    for r in heads:
        r["role"] = (
            "previous-token"
            if [r["layer"], r["head"]] == found["previous_token_head"]
            else "induction"
            if ablations and [r["layer"], r["head"]] in ablations[0]["heads"]
            else ""
        )
    model_row = {
        "model": f"transformer ({s.n_layer} layer{'s' if s.n_layer > 1 else ''})",
        "parameters": count_parameters(model),
        "state_size": state_size(model, 2 * s.span),
        "train_seconds": info["seconds"],
        "first_loss": info["first_loss"],
        "final_loss": info["final_loss"],
    }
    rows = [
        {
            "model": "transformer",
            "by": "part",
            "at": "first",
            "n": int(val.x.shape[0]),
            "accuracy": base["first_accuracy"],
            "loss": base["first_loss"],
        },
        {
            "model": "transformer",
            "by": "part",
            "at": "repeat",
            "n": int(val.x.shape[0]),
            "accuracy": base["repeat_accuracy"],
            "loss": base["repeat_loss"],
        },
    ]
    rows += [
        {
            "model": f"transformer, {a['ablated']} {', '.join('L{}H{}'.format(*h) for h in a['heads'])} zeroed",
            "by": "part",
            "at": "repeat",
            "n": int(val.x.shape[0]),
            "accuracy": a["repeat_accuracy"],
            "loss": a["repeat_loss"],
        }
        for a in ablations
    ]
    curve = {"trained": per_pos}
    return MemoryResult(
        rows,
        [model_row],
        1.0 / s.n_tokens,
        {"heads": heads, "found": found, "ablations": ablations, "base": base, "n_layer": s.n_layer, "span": s.span},
        {"induction": plot_induction(heads, curve)},
    )
