"""Soft attention against picking only the top-scoring keys.

Attention blends: each query's output is a weighted mean of every value it may see ("blending the
juice"). Its hard counterpart takes only the best-matching key's value ("ordering one dish"). Here
the trained Transformer is evaluated on validation blocks with each query restricted to its k
highest-scoring keys, the softmax renormalised over them (`models.attention.top_k_attention`), for
each k in `ks`, and with the full softmax. If attention really blends, the loss rises as k falls.
Also measured: the share of the full softmax's weight its top-k keys carry (over queries that see at
least max(ks) keys), i.e. how much of the blend top-k throws away.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..data import Blocks, TokenBlocks
from ..device import DeviceSetting, resolve_device
from ..models.attention import top_k_attention
from ..models.transformer import Transformer, require_transformer
from ..train_step import evaluate


class AttentionTopKSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ks: list[int] = Field(
        default=[1, 2, 4], min_length=1, description="Keys kept per query (each ≥ 1), against the full softmax."
    )
    eval_blocks: int = Field(default=64, ge=1, description="Validation blocks evaluated per setting.")
    batch_size: int = Field(default=16, ge=1, description="Blocks per forward pass.")
    device: DeviceSetting = Field(default="auto", description="Where to run: 'auto' = CUDA if present, else CPU.")

    @field_validator("ks")
    @classmethod
    def _positive_distinct(cls, v: list[int]) -> list[int]:
        if any(k < 1 for k in v):
            raise ValueError(f"ks must all be at least 1, got {v}")
        return sorted(set(v))


@dataclass
class TopKResult:
    rows: list[
        dict
    ]  # per k ascending, then the full softmax (k None): keys, k, val_loss, val_ppl, loss_increase, weight_share
    block_size: int
    blocks: int
    figures: dict[str, Figure] = field(default_factory=dict)

    @property
    def full_loss(self) -> float:
        return self.rows[-1]["val_loss"]

    def metrics(self) -> dict[str, float]:
        # On the first `blocks` validation blocks: a subset, not the model's val/loss (the whole split).
        out = {"topk/full_val_loss": self.full_loss, "topk/eval_blocks": float(self.blocks)}
        for r in self.rows[:-1]:
            out[f"topk/top{r['k']}_val_loss"] = r["val_loss"]
            out[f"topk/top{r['k']}_loss_increase"] = r["loss_increase"]
            out[f"topk/top{r['k']}_weight_share"] = r["weight_share"]
        return out


@torch.no_grad()
def top_weight_shares(
    model: Transformer, blocks: TokenBlocks, ks: list[int], batch_size: int, device
) -> dict[int, float]:
    """Mean share of the full softmax's weight on each query's top-k keys, over every layer, head and
    query that sees at least max(ks) keys (a k of the block size or more keeps every key: share 1)."""
    kmax = min(max(ks), blocks.block_size)
    first = kmax - 1  # query t sees t + 1 keys
    sums = {k: 0.0 for k in ks}
    count = 0
    for start in range(0, blocks.n_blocks, batch_size):
        x, _ = blocks.batch(np.arange(start, min(start + batch_size, blocks.n_blocks)), device)
        for w in model.attention_weights(x):  # (B, nh, T, T) per layer
            top = w[..., first:, :].double().topk(kmax, dim=-1).values.cumsum(-1)  # (B, nh, T', kmax)
            for k in ks:
                sums[k] += float(top[..., min(k, kmax) - 1].sum())
            count += top[..., 0].numel()
    return {k: sums[k] / count for k in ks}


def plot_topk(rows: list[dict], block_size: int, n_blocks: int | None = None) -> Figure:
    fig = Figure(figsize=(6.5, 4), tight_layout=True)
    ax = fig.add_subplot()
    labels = [r["keys"] for r in rows]
    ax.plot(range(len(rows)), [r["val_loss"] for r in rows], "o-")
    for i, r in enumerate(rows):
        ax.annotate(f"{r['val_loss']:.3f}", (i, r["val_loss"]), xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_xlabel(f"keys each query attends to (of up to {block_size})")
    ax.set_ylabel("validation loss (nats/token)" + (f", first {n_blocks} blocks (a subset)" if n_blocks else ""))
    ax.set_title("Top-k attention against the full softmax")
    ax.grid(True, alpha=0.3)
    return fig


def attention_topk(model: nn.Module, val: Blocks, settings: AttentionTopKSettings) -> TopKResult:
    """Validation loss of `model` (a Transformer) with attention restricted to the top-k keys per query,
    for each k in `settings.ks`, and with the full softmax."""
    device, _ = resolve_device(settings.device)
    model = require_transformer(model, "the top-k attention study").to(device).eval()
    blocks = val.crop(min(val.block_size, model.config.block_size))
    n = min(blocks.n_blocks, settings.eval_blocks)
    blocks = TokenBlocks(blocks.x[:n], blocks.y[:n])

    def loss() -> float:
        return evaluate(model, blocks, batch_size=settings.batch_size, max_batches=None, device=device)

    full = loss()
    shares = top_weight_shares(model, blocks, settings.ks, settings.batch_size, device)
    rows = []
    for k in settings.ks:
        with top_k_attention(model, k):
            lk = loss()
        rows.append(
            {
                "keys": f"top-{k}",
                "k": k,
                "val_loss": lk,
                "val_ppl": float(np.exp(lk)),
                "loss_increase": lk - full,
                "weight_share": shares[k],
            }
        )
    rows.append(
        {
            "keys": "all (softmax)",
            "k": None,
            "val_loss": full,
            "val_ppl": float(np.exp(full)),
            "loss_increase": 0.0,
            "weight_share": 1.0,
        }
    )
    return TopKResult(
        rows=rows,
        block_size=int(blocks.block_size),
        blocks=n,
        figures={"topk_attention": plot_topk(rows, int(blocks.block_size), n)},
    )
