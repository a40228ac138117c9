"""The heads of a trained Transformer: where each head attends (`head_statistics`, `classify_heads`
over `attention_over_blocks`) and what zeroing it costs (`heads_zeroed`, `head_ablation`). The measures
and the study that reports them: `studies.inside`, which re-exports all of it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch
import torch.nn as nn

from ..data import TokenBlocks
from ..errors import ConfigError
from ..training import evaluate

if TYPE_CHECKING:  # the thresholds only (settings live with the study)
    from .inside import InsideSettings


def head_statistics(weights: list[torch.Tensor]) -> list[dict]:
    """Per layer and head, from attention weights n_layer × (B, nh, T, T) (rows: queries)."""
    out = []
    for layer, w in enumerate(weights):
        w = w.double()
        B, H, T, _ = w.shape
        if T < 3:
            raise ConfigError(f"head statistics need blocks of at least 3 tokens, got {T}")
        t = torch.arange(T)
        q = t[2:]  # queries t >= 2
        prev = w[:, :, q, q - 1]  # (B, H, T-2)
        first = w[:, :, q, 0]
        same = w[:, :, q, q]
        dist = (t[:, None] - t[None, :]).clamp(min=0).double()  # (T, T) query − key
        mean_dist = (w * dist).sum(-1)[:, :, q]  # (B, H, T-2)
        ent = -(w * w.clamp(min=1e-30).log()).sum(-1)[:, :, q]
        row_sum = w.sum(-1)  # (B, H, T) each 1 for softmax weights
        for h in range(H):
            out.append({
                "layer": layer, "head": h,
                "prev_token_share": float(prev[:, h].mean()), "first_token_share": float(first[:, h].mean()),
                "self_share": float(same[:, h].mean()), "mean_distance": float(mean_dist[:, h].mean()),
                "entropy": float(ent[:, h].mean()), "max_row_sum_error": float((row_sum[:, h] - 1).abs().max()),
            })
    return out


def classify_heads(stats: list[dict], s: InsideSettings) -> list[dict]:
    def kind(r: dict) -> str:
        if r["prev_token_share"] >= s.prev_threshold:
            return "previous-token"
        if r["first_token_share"] >= s.first_threshold:
            return "first-token sink"
        if r["self_share"] >= s.self_threshold:
            return "self"
        if r["mean_distance"] <= s.local_distance:
            return "local"
        return "broad"

    return [{**r, "kind": kind(r)} for r in stats]


@torch.no_grad()
def attention_over_blocks(model: nn.Module, blocks: TokenBlocks, n: int, batch_size: int, device) -> list[torch.Tensor]:
    """Per layer, the attention weights (n, nh, T, T) of the first n blocks (reference math)."""
    per_layer: list[list[torch.Tensor]] = []
    for start in range(0, n, batch_size):
        x, _ = blocks.batch(np.arange(start, min(start + batch_size, n)), device)
        ws = model.attention_weights(x)
        if not per_layer:
            per_layer = [[] for _ in ws]
        for acc, w in zip(per_layer, ws):
            acc.append(w.float().cpu())
    return [torch.cat(acc) for acc in per_layer]


@contextmanager
def heads_zeroed(model: nn.Module, heads: list[tuple[int, int]]) -> Iterator[None]:
    """Zero the output of (layer, head) pairs before each layer's output projection."""
    handles = []
    by_layer: dict[int, list[int]] = {}
    for layer, h in heads:
        by_layer.setdefault(layer, []).append(h)
    for layer, hs in by_layer.items():
        attn = model.h[layer].attn

        def pre(mod, args, hs=hs, hd=attn.head_dim):
            (y,) = args  # (B, T, C): heads side by side
            y = y.clone()
            for h in hs:
                y[..., h * hd:(h + 1) * hd] = 0
            return (y,)

        handles.append(attn.c_proj.register_forward_pre_hook(pre))
    try:
        yield
    finally:
        for hnd in handles:
            hnd.remove()


def head_ablation(model: nn.Module, blocks: TokenBlocks, n: int, batch_size: int, device) -> tuple[float, np.ndarray]:
    """Validation loss of the model, and its increase with each head zeroed in turn (n_layer, n_head)."""
    sub = TokenBlocks(blocks.x[:n], blocks.y[:n])
    base = evaluate(model, sub, batch_size=batch_size, max_batches=None, device=device)
    L, H = model.config.n_layer, model.config.n_head
    inc = np.zeros((L, H))
    for layer in range(L):
        for h in range(H):
            with heads_zeroed(model, [(layer, h)]):
                inc[layer, h] = evaluate(model, sub, batch_size=batch_size, max_batches=None, device=device) - base
    return base, inc
