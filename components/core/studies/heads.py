"""The heads of a trained Transformer: where each head attends (`head_statistics`, `classify_heads`
over `attention_over_blocks`), what zeroing it costs per validation block (`heads_zeroed`,
`head_ablation`), and whether a layer's heads differ on held-out blocks (`heads_differ_test`). The measures
and the study that reports them: `studies.inside`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import IGNORE_INDEX, Blocks, TokenBlocks
from ..errors import ConfigError
from ..models.transformer import Transformer
from .inside_settings import InsideSettings


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
            out.append(
                {
                    "layer": layer,
                    "head": h,
                    "prev_token_share": float(prev[:, h].mean()),
                    "first_token_share": float(first[:, h].mean()),
                    "self_share": float(same[:, h].mean()),
                    "mean_distance": float(mean_dist[:, h].mean()),
                    "entropy": float(ent[:, h].mean()),
                    "max_row_sum_error": float((row_sum[:, h] - 1).abs().max()),
                }
            )
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
def attention_over_blocks(model: Transformer, blocks: Blocks, n: int, batch_size: int, device) -> list[torch.Tensor]:
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
def heads_zeroed(model: Transformer, heads: list[tuple[int, int]]) -> Iterator[None]:
    """Zero the output of (layer, head) pairs before each layer's output projection."""
    handles = []
    by_layer: dict[int, list[int]] = {}
    for layer, h in heads:
        by_layer.setdefault(layer, []).append(h)
    for layer, hs in by_layer.items():
        attn = model.blocks[layer].attn

        def pre(mod, args, hs=hs, hd=attn.head_dim):
            (y,) = args  # (B, T, C): heads side by side
            y = y.clone()
            for h in hs:
                y[..., h * hd : (h + 1) * hd] = 0
            return (y,)

        handles.append(attn.c_proj.register_forward_pre_hook(pre))
    try:
        yield
    finally:
        for hnd in handles:
            hnd.remove()


@torch.no_grad()
def block_losses(model: nn.Module, blocks: TokenBlocks, batch_size: int, device) -> np.ndarray:
    """Mean next-token loss of each block (n_blocks,), over its non-ignored targets."""
    model.eval()
    out = []
    for start in range(0, blocks.n_blocks, batch_size):
        x, y = blocks.batch(np.arange(start, min(start + batch_size, blocks.n_blocks)), device)
        logits, _ = model(x)
        nll = F.cross_entropy(logits.float().transpose(1, 2), y, ignore_index=IGNORE_INDEX, reduction="none")
        mask = (y != IGNORE_INDEX).to(nll.dtype)
        out.append((nll * mask).sum(1).div(mask.sum(1).clamp(min=1)).double().cpu().numpy())
    return np.concatenate(out)


def head_ablation(
    model: Transformer, blocks: Blocks, n: int, batch_size: int, device
) -> tuple[float, np.ndarray, np.ndarray]:
    """Validation loss of the model; its increase with each head zeroed in turn (n_layer, n_head); and
    that increase per validation block (n_layer, n_head, n) for intervals and held-out comparisons."""
    sub = TokenBlocks(blocks.x[:n], blocks.y[:n])
    base_blocks = block_losses(model, sub, batch_size, device)
    L, H = model.config.n_layer, model.config.n_head
    per_block = np.zeros((L, H, sub.n_blocks))
    for layer in range(L):
        for h in range(H):
            with heads_zeroed(model, [(layer, h)]):
                per_block[layer, h] = block_losses(model, sub, batch_size, device) - base_blocks
    return float(base_blocks.mean()), per_block.mean(-1), per_block


def heads_differ_test(per_block: np.ndarray, draws: int = 2000, seed: int = 0) -> list[dict]:
    """Are a layer's heads interchangeable on real text? Per layer, the head whose zeroing costs most and
    the one that costs least are chosen on the even validation blocks; on the odd blocks (held out from
    that choice) the paired difference of their costs gets a 95 % bootstrap interval over blocks. Heads
    that do one and the same thing (copies of one head) give a difference of 0 on every block."""
    L, H, n = per_block.shape
    pick, test = np.arange(0, n, 2), np.arange(1, n, 2)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(test), size=(draws, len(test)))
    rows = []
    for layer in range(L):
        cost = per_block[layer][:, pick].mean(1)
        hi, lo = int(np.argmax(cost)), int(np.argmin(cost))
        d = per_block[layer, hi, test] - per_block[layer, lo, test]
        boot = d[idx].mean(1)
        rows.append(
            {
                "layer": layer,
                "costliest_head": hi,
                "cheapest_head": lo,
                "difference": float(d.mean()),
                "low": float(np.quantile(boot, 0.025)),
                "high": float(np.quantile(boot, 0.975)),
                "heldout_blocks": int(len(test)),
            }
        )
    return rows
