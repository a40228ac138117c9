"""Counting parameters, and sizing a model family to a parameter budget.

`size_for_budget` is shared by the recurrent and Transformer families: each passes its builder and
how one integer width turns into settings; the count of every candidate comes from the model itself,
built on the meta device (shapes only, no memory), so it cannot drift from the real module.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch
import torch.nn as nn
from pydantic import BaseModel

from ..errors import ConfigError

S = TypeVar("S", bound=BaseModel)


def embedding_parameters(model: nn.Module) -> int:
    """Parameters of the model's lookup tables (every `nn.Embedding`: the token embedding, which is
    also the output matrix when tied, and a learned position table), each distinct tensor once."""
    tables = {id(p): p.numel() for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    return sum(tables.values())


def count_parameters(model: nn.Module, *, non_embedding: bool = False) -> int:
    """Distinct parameters (a tied matrix counts once). non_embedding: minus the embedding tables
    (`embedding_parameters`: tokens and learned positions), the one definition for every family and
    for `model_comparison`'s accounting. An untied output head is a matmul on every token and counts."""
    n = sum(p.numel() for p in model.parameters())
    return n - embedding_parameters(model) if non_embedding else n


def meta_parameter_count(build: Callable[[S, int], nn.Module], settings: S, vocab_size: int) -> int:
    """The exact parameter count of `build(settings, vocab_size)`, built on the meta device."""
    with torch.device("meta"):
        return count_parameters(build(settings, vocab_size))


def size_for_budget(
    settings: S,
    vocab_size: int,
    build: Callable[[S, int], nn.Module],
    widths: Callable[[int], dict],
    *,
    budget: int,
    what: str = "model",
) -> S:
    """The settings whose parameter count is closest to `budget`, over the shapes `widths(m)`, m = 1, 2, ...

    `widths(m)` is the settings update for width index m (e.g. {"n_embd": 8 * m}); the count must grow
    with m. `what` names the model in the error when even m = 1 is over the budget. Brackets the budget by doubling
    m, then bisects; of the two neighbours the nearer wins.
    Returns validated settings with `param_budget=None`: the width is resolved, and a model built from
    them (or from a checkpoint of them) needs no sizing again.
    """

    def count(m: int) -> int:
        return meta_parameter_count(build, settings.model_copy(update={**widths(m), "param_budget": None}), vocab_size)

    if count(1) > budget:
        raise ConfigError(
            f"param_budget={budget} is below the smallest {what} for vocab_size={vocab_size} "
            f"({count(1)} parameters at {widths(1)}); raise param_budget, make the model shallower or shrink the "
            f"vocabulary"
        )
    # Invariant: count(lo) <= budget < count(hi).
    lo, hi = 1, 2
    while count(hi) <= budget:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(mid) <= budget else (lo, mid)
    best = min((lo, hi), key=lambda m: abs(count(m) - budget))
    # Through the constructor, so the model validators check the chosen shape.
    return type(settings)(**{**settings.model_dump(), **widths(best), "param_budget": None})
