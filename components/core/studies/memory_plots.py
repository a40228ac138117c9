"""The memory tasks' figures: accuracy by delay or by pairs, and the gradient reaching the symbol
(components/core/studies/memory.py runs the studies)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure


def plot_accuracy(
    rows: list[dict],
    x_key: str,
    xlabel: str,
    title: str,
    chance: float,
    log_x: bool = False,
    marks: dict[str, float] | None = None,
) -> Figure:
    """Accuracy against `x_key`, one line per model, with the 95% interval as a band."""
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for m in dict.fromkeys(r["model"] for r in rows):
        rs = sorted((r for r in rows if r["model"] == m and r["n"] > 0), key=lambda r: r[x_key])
        xs = [r[x_key] for r in rs]
        ax.plot(xs, [r["accuracy"] for r in rs], "o-", label=m)
        ax.fill_between(xs, [r["low"] for r in rs], [r["high"] for r in rs], alpha=0.2)
    ax.axhline(chance, color="grey", ls="--", lw=1, label="chance")
    for label, x in (marks or {}).items():
        ax.axvline(x, color="black", ls=":", lw=1)
        ax.annotate(label, (x, 0.5), rotation=90, fontsize=8, xytext=(3, 0), textcoords="offset points")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy (95% interval)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _log_log(fig: Figure, ax, xlabel: str, ylabel: str, title: str) -> Figure:
    """A gradient plot's axes: log2 x, log y, labels, grid and legend."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def plot_gradients(curves: dict[str, np.ndarray], delays: list[int]) -> Figure:
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for m, g in curves.items():
        d = np.arange(1, len(g))
        ax.plot(d, np.maximum(g[::-1][1:], 1e-30), label=m)
    return _log_log(
        fig,
        ax,
        "distance back from the query (positions)",
        "‖∂ loss at query / ∂ input embedding‖",
        "Gradient reaching t − d in the trained models",
    )


def plot_gradients_by_delay(grads: list[dict]) -> Figure:
    """Each model trained on one delay: the gradient reaching the symbol's position, relative to the
    gradient at the query itself, against the delay."""
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for m in dict.fromkeys(g["model"] for g in grads):
        gs = sorted((g for g in grads if g["model"] == m), key=lambda g: g["delay"])
        ax.plot([g["delay"] for g in gs], [max(g["relative_to_last"], 1e-30) for g in gs], "o-", label=m)
    return _log_log(
        fig,
        ax,
        "delay d the model was trained on",
        "‖∂ loss / ∂ x(t − d)‖ ÷ ‖∂ loss / ∂ x(t)‖",
        "Gradient reaching the symbol, each model trained on its delay",
    )
