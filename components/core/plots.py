"""Figures of a language-model run (matplotlib Figure objects, no pyplot state): the loss curve from the
training history, the Transformer's attention maps, and the explicit LSTM's mean gate activations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from .models.transformer import Transformer

LSTM_GATES = ("lstm/gate_input", "lstm/gate_forget", "lstm/gate_output")


def plot_history(history: list[dict], title: str = "training") -> Figure:
    """Train and validation loss against the step."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for key, style in (("train/loss", "-"), ("val/loss", "o-")):
        pts = [(h["step"], h[key]) for h in history if key in h]
        if pts:
            ax.plot(*zip(*pts), style, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def plot_lstm_gates(history: list[dict]) -> Figure:
    """Mean input, forget and output gate activations of the explicit LSTM at each log point."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for key in LSTM_GATES:
        pts = [(h["step"], h[key]) for h in history if key in h]
        if pts:
            ax.plot(*zip(*pts), ".-", label=key.removeprefix("lstm/gate_"))
    ax.set_xlabel("step")
    ax.set_ylabel("mean activation")
    ax.set_ylim(0, 1)
    ax.set_title("LSTM gates (mean over units, steps and batch)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def plot_head_maps(weights: list[torch.Tensor], labels: list[str], title: str) -> Figure:
    """Attention weights of every layer (rows) and head (columns) on one sequence: weights[layer] is
    (1, heads, t, t), labels the t tokens. Readable where it is shown at its pixel size (Dagster's
    metadata, at 100 dpi): 8 pt tick labels (11 px) on cells of at least 0.2 in (20 px) per token, so
    a panel grows with the tokens shown; keep t to about 16-24. Every panel is the same sequence, so the
    tokens label the grid's outer edges only: the queries the first column, the keys the bottom row
    (labels on every panel drew 16 × 2t texts and took twice as long to render)."""
    L, H, T = len(weights), weights[0].shape[1], weights[0].shape[-1]
    side = max(2.4, 0.2 * T + 0.6)
    fig = Figure(figsize=(side * H, side * L + 0.4), layout="constrained")
    axes = fig.subplots(L, H, squeeze=False)
    for layer, w in enumerate(weights):
        for h in range(H):
            ax = axes[layer][h]
            ax.imshow(w[0, h].float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer} head {h}", fontsize=10)
            ax.set_xticks(range(T), labels, fontsize=8, rotation=90)
            ax.set_yticks(range(T), labels, fontsize=8)
            ax.label_outer()
    fig.suptitle(title, fontsize=12)
    return fig


@torch.no_grad()
def plot_attention_maps(
    model: Transformer,
    idx: torch.Tensor,
    *,
    decode: Callable[[list[int]], str] | None = None,
    max_heads: int = 4,
    max_tokens: int = 16,
) -> Figure:
    """Attention weights of every layer (rows) and the first heads (columns) of a Transformer on the
    first `max_tokens` tokens of one sequence idx (1, t)."""
    idx = idx[:, :max_tokens]
    weights = [w[:, :max_heads] for w in model.attention_weights(idx)]  # n_layer × (1, heads, t, t)
    labels = [decode([int(t)]) if decode else str(int(t)) for t in idx[0]]
    return plot_head_maps(weights, labels, "attention weights (query rows → key columns)")


def draw_count_ladder(ax, rungs: list[tuple[str, float, bool]]) -> None:
    """The count ladder on a loss plot: one thin grey line per rung (model name, validation loss,
    whether it is the count model), named at the right edge, and the count model as a black line in
    the legend."""
    from matplotlib.transforms import blended_transform_factory

    edge = blended_transform_factory(ax.transAxes, ax.transData)
    for name, loss, chosen in rungs:
        if chosen:
            ax.axhline(loss, color="black", lw=1.4, label=f"count model ({name})")
        else:
            ax.axhline(loss, color="grey", ls=":", lw=0.8)
        ax.text(
            1.0,
            loss,
            f" {name.removeprefix('kn_')}",
            transform=edge,
            fontsize=6,
            va="center",
            color="black" if chosen else "grey",
            clip_on=False,
        )
