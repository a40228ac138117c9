"""The count baseline every language model must beat: interpolated Kneser–Ney n-grams.

Counts come from the training labels' token stream (the blocks laid end to end, as they were cut
from it); the models are scored on the validation targets the language models are scored on: every
non-ignored target of the validation blocks at the models' training context length, each predicted
from the tokens before it *in its block* (a model sees nothing before its block's first token, so at
position 0 a trigram has only one token of context and uses its lower order).

Interpolated Kneser–Ney (Chen & Goodman 1998, with one discount per order, D = n1 / (n1 + 2 n2) from
the count-of-counts of that order's table):

    p_k(w | h) = (max(a_k(h w) − D_k, 0) + D_k · T_k(h) · p_{k−1}(w | h')) / A_k(h)     if A_k(h) > 0
               = p_{k−1}(w | h')                                                          otherwise

where h' drops h's oldest token; a_k is the raw count at the highest order and the continuation count
(how many distinct tokens precede h w) below it; A_k(h) = Σ_w a_k(h w) and T_k(h) = #{w: a_k(h w) > 0}.
The lowest order interpolates with the uniform distribution over the vocabulary, so every token has
a probability above zero and every p_k sums to one over the vocabulary.

Everything is vectorised: an n-gram is one int64 key (token ids in base V), tables are sorted key
arrays with their values, and a lookup is a `searchsorted`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..data import IGNORE_INDEX, PAD_ID
from ..errors import ConfigError, PipelineInputError


class NgramSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    orders: list[int] = Field(
        [2, 3], description="The n-gram orders to build (2 = bigram, 3 = trigram); each scored on its own."
    )
    block_size: int = Field(
        128,
        ge=1,
        description="Context length the language models train and are scored at: the validation blocks are cropped "
        "to it, and a target sees only the tokens before it in its block, as the models do.",
    )


@dataclass
class _Table:
    """One order's counts: sorted n-gram keys and their (raw or continuation) counts, and per
    context (the key without its last token) the total A and the number of distinct successors T."""

    keys: np.ndarray
    counts: np.ndarray
    ctx_keys: np.ndarray
    ctx_total: np.ndarray
    ctx_types: np.ndarray
    discount: float


def _grams(tokens: np.ndarray, n: int, V: int) -> np.ndarray:
    """Keys of every n-gram of a 1-D token array (base-V digits, oldest token most significant)."""
    if len(tokens) < n:
        return np.zeros(0, dtype=np.int64)
    key = np.zeros(len(tokens) - n + 1, dtype=np.int64)
    for i in range(n):
        key = key * V + tokens[i: len(tokens) - n + 1 + i]
    return key


def _discount(counts: np.ndarray) -> float:
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    return n1 / (n1 + 2 * n2) if n1 + 2 * n2 > 0 else 0.5


def _table(keys: np.ndarray, counts: np.ndarray, V: int) -> _Table:
    ctx = keys // V
    ctx_keys, start = np.unique(ctx, return_index=True)  # keys are sorted, so each context is a run
    ctx_total = np.add.reduceat(counts, start) if len(keys) else np.zeros(0, dtype=np.int64)
    ctx_types = np.diff(np.append(start, len(keys)))
    return _Table(keys, counts, ctx_keys, ctx_total.astype(np.float64), ctx_types.astype(np.float64), _discount(counts))


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values[key] for each query key, 0 where the key is absent."""
    if len(sorted_keys) == 0:
        return np.zeros(len(query), dtype=np.float64)
    i = np.minimum(np.searchsorted(sorted_keys, query), len(sorted_keys) - 1)
    return np.where(sorted_keys[i] == query, values[i], 0).astype(np.float64)


class KneserNey:
    """An interpolated Kneser–Ney model of one order over a vocabulary of V ids (module doc)."""

    def __init__(self, order: int, vocab_size: int, tables: list[_Table]) -> None:
        self.order, self.V, self.tables = order, vocab_size, tables  # tables[k - 1]: order k

    @classmethod
    def fit(cls, stream: np.ndarray, order: int, vocab_size: int) -> "KneserNey":
        """Count over a 1-D token stream. The highest order keeps raw counts; each lower order the
        continuation counts read off the order above."""
        if order < 1:
            raise ConfigError(f"n-gram order must be >= 1, got {order}")
        V = int(vocab_size)
        if V ** order >= 2 ** 63:
            raise ConfigError(f"order {order} over a vocabulary of {V} does not fit an int64 key; lower the order")
        stream = np.asarray(stream, dtype=np.int64)
        if len(stream) and (stream.min() < 0 or stream.max() >= V):
            raise PipelineInputError(f"training tokens outside [0, {V}): the labels do not match vocab_size={V}")
        tables: list[_Table] = [None] * order  # type: ignore[list-item]
        keys, counts = np.unique(_grams(stream, order, V), return_counts=True)
        tables[order - 1] = _table(keys, counts.astype(np.int64), V)
        for k in range(order - 1, 0, -1):
            # Continuation count of a k-gram: the distinct tokens seen before it (the (k+1)-grams it ends).
            above = tables[k].keys % (V ** k)
            keys, counts = np.unique(above, return_counts=True)
            tables[k - 1] = _table(keys, counts.astype(np.int64), V)
        return cls(order, V, tables)

    def prob(self, context: np.ndarray, target: np.ndarray) -> np.ndarray:
        """p(target | context) for N queries. `context`: (N, order − 1) token ids, oldest first, −1
        where a position has no token (before the block's start): the model then uses the highest
        order whose context is complete."""
        V = self.V
        target = np.asarray(target, dtype=np.int64)
        context = np.asarray(context, dtype=np.int64).reshape(len(target), self.order - 1)
        t1 = self.tables[0]
        p = (np.maximum(_lookup(t1.keys, t1.counts, target) - t1.discount, 0.0) + t1.discount * len(t1.keys) / V) / max(
            t1.counts.sum(), 1
        )
        if t1.counts.sum() == 0:
            p = np.full(len(target), 1.0 / V)
        for k in range(2, self.order + 1):
            t = self.tables[k - 1]
            h = context[:, self.order - k:]  # the last k − 1 tokens of context
            have = (h >= 0).all(axis=1)
            hkey = np.zeros(len(target), dtype=np.int64)
            for j in range(k - 1):
                hkey = hkey * V + np.maximum(h[:, j], 0)
            a = _lookup(t.keys, t.counts, hkey * V + target)
            A = _lookup(t.ctx_keys, t.ctx_total, hkey)
            T = _lookup(t.ctx_keys, t.ctx_types, hkey)
            seen = have & (A > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                pk = (np.maximum(a - t.discount, 0.0) + t.discount * T * p) / A
            p = np.where(seen, pk, p)
        return p


def train_stream(train_x: np.ndarray, train_y: np.ndarray) -> np.ndarray:
    """The training token stream the labels were cut from: every block's inputs, then the last
    real target (blocks overlap by one token, so x laid end to end is the stream up to its last
    token). Positions whose target is padding are dropped."""
    x = np.asarray(train_x).reshape(-1).astype(np.int64)
    y = np.asarray(train_y).reshape(-1).astype(np.int64)
    real = np.flatnonzero(y != IGNORE_INDEX)
    if len(real) == 0:
        raise PipelineInputError("the training labels hold no targets: nothing to count")
    end = real[-1]
    return np.append(x[: end + 1], y[end])


def block_contexts(x: np.ndarray, n_context: int) -> np.ndarray:
    """For each position of each block, the n_context tokens before the target (the input at that
    position and the ones before it in the block), oldest first; −1 before the block's start.
    x: (B, T) -> (B, T, n_context)."""
    B, T = x.shape
    out = np.full((B, T, n_context), -1, dtype=np.int64)
    for j in range(n_context):
        lag = n_context - 1 - j  # column j holds x[t − lag]
        out[:, lag:, j] = x[:, : T - lag]
    return out


@dataclass
class NgramResult:
    rows: list[dict[str, Any]]  # per order: model, order, val_loss, val_ppl, discounts, n-gram types
    n_targets: int
    n_train_tokens: int
    block_size: int
    vocab_size: int
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> dict[str, Any]:
        return min(self.rows, key=lambda r: r["val_loss"])

    def metrics(self) -> dict[str, float]:
        out = {"val/loss": self.best["val_loss"], "val/ppl": self.best["val_ppl"], "val/targets": float(self.n_targets),
               "train/tokens": float(self.n_train_tokens)}
        for r in self.rows:
            out[f"{r['model']}/val_loss"] = r["val_loss"]
        return out

    def markdown(self) -> str:
        lines = ["| model | val loss (nats) | val ppl | discounts | n-gram types |", "|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(f"| {r['model']} | {r['val_loss']:.4f} | {r['val_ppl']:.1f} | "
                         f"{', '.join(f'{d:.3f}' for d in r['discounts'])} | {r['types']:,} |")
        return "\n".join(lines) + (
            f"\n\nCounted over {self.n_train_tokens:,} training tokens; scored on all {self.n_targets:,} "
            f"validation targets in blocks of {self.block_size} (each sees only its own block)."
        )


def ngram_baseline(train, val, vocab_size: int, settings: NgramSettings) -> NgramResult:
    """Interpolated Kneser–Ney models of `settings.orders`, counted over the training labels' stream
    and scored on every validation target of the blocks cropped to `settings.block_size`."""
    if not settings.orders or any(o < 1 for o in settings.orders):
        raise ConfigError(f"ngram_baseline.orders={settings.orders}: give at least one order >= 1")
    if settings.block_size > val.block_size:
        raise ConfigError(
            f"ngram_baseline.block_size={settings.block_size} exceeds the labels' block_size={val.block_size}"
        )
    stream = train_stream(np.asarray(train.x), np.asarray(train.y))
    v = val.crop(settings.block_size)
    vx, vy = np.asarray(v.x).astype(np.int64), np.asarray(v.y).astype(np.int64)
    keep = vy != IGNORE_INDEX
    targets = vy[keep]
    if len(targets) == 0:
        raise PipelineInputError("the validation labels hold no targets to score")
    if (vx[keep] == PAD_ID).any():
        raise PipelineInputError("a validation target follows a [PAD] input: the labels are malformed")
    rows = []
    for order in sorted(set(settings.orders)):
        model = KneserNey.fit(stream, order, vocab_size)
        ctx = block_contexts(vx, order - 1)[keep] if order > 1 else np.zeros((len(targets), 0), dtype=np.int64)
        p = model.prob(ctx, targets)
        loss = float(-np.log(p).mean())
        rows.append({"model": f"kn_{order}gram", "order": order, "val_loss": loss, "val_ppl": math.exp(loss),
                     "discounts": [t.discount for t in model.tables], "types": int(len(model.tables[-1].keys))})
    return NgramResult(rows=rows, n_targets=int(len(targets)), n_train_tokens=int(len(stream)),
                       block_size=settings.block_size, vocab_size=int(vocab_size))
