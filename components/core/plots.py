"""Figures of a language-model run (matplotlib Figure objects, no pyplot state): the loss curve from the
training history, the Transformer's attention maps, and the explicit LSTM's mean gate activations."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from matplotlib.figure import Figure

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


@torch.no_grad()
def plot_attention_maps(
    model: nn.Module, idx: torch.Tensor, *, decode: Callable[[list[int]], str] | None = None, max_heads: int = 4
) -> Figure:
    """Attention weights of every layer (rows) and the first heads (columns) of a Transformer on one
    sequence idx (1, t)."""
    weights = model.attention_weights(idx)  # n_layer × (1, nh, t, t)
    L, H = len(weights), min(max_heads, model.config.n_head)
    labels = [decode([int(t)]) if decode else str(int(t)) for t in idx[0]]
    fig = Figure(figsize=(2.6 * H, 2.6 * L), layout="constrained")
    axes = fig.subplots(L, H, squeeze=False)
    for layer, w in enumerate(weights):
        for head in range(H):
            ax = axes[layer][head]
            ax.imshow(w[0, head].float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            ticks = range(len(labels))
            ax.set_xticks(ticks, labels, fontsize=5, rotation=90)
            ax.set_yticks(ticks, labels, fontsize=5)
    fig.suptitle("attention weights (query rows → key columns)")
    return fig
