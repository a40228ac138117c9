"""Does later context help? Validation loss by position within the context window.

Each validation block is read from its first token, so the target at position t is predicted from
t + 1 tokens of context (a recurrent model starts from a zero state at every block, as it trains).
The loss at each position, averaged over the same validation blocks for every model, shows how
much a model gains from seeing more of the past:

- a full-attention Transformer sees every earlier position of the block: its curve keeps falling
  as long as more context is informative;
- a sliding-window Transformer (trained on the same data for the same steps) sees only the last
  `window` keys per layer; with n_layer layers its receptive field is n_layer · (window − 1) + 1
  positions, so beyond that its curve can no longer fall, and beyond `window` it falls only through
  stacking: where its curve parts from the full model's is where the window's limit shows;
- an LSTM carries everything in a fixed-size state: its curve flattens where the state stops
  keeping more of the past.

Per model: the loss curve (and in buckets of `bucket` positions), the gain from context (the first
bucket's loss minus the last's), and the position where the curve saturates (the first bucket whose
loss is within `saturation` of the total gain from the last bucket's). For each windowed model, the
gap to a full-attention model after the window, and beyond its receptive field (where it cannot see
what full attention sees) with a 95% bootstrap interval over validation blocks; per model, how far
context helps: the last bucket still above the final bucket's loss beyond that interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field

from ..data import IGNORE_INDEX, Blocks
from ..device import DeviceSetting, resolve_device


class ContextUsageSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_blocks: int = Field(
        default=256, ge=1, description="Validation blocks evaluated (the first ones; the same for every model)."
    )
    batch_size: int = Field(default=32, ge=1, description="Blocks per forward pass.")
    bucket: int = Field(default=8, ge=1, description="Positions per bucket in the table and the saturation test.")
    saturation: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description="A curve has saturated once its loss is within this share of its total gain of the last bucket's.",
    )
    device: DeviceSetting = Field(default="auto", description="Where to evaluate: 'auto' = CUDA if present, else CPU.")


def block_losses(
    model: nn.Module, blocks: Blocks, *, max_blocks: int, batch_size: int, device: torch.device
) -> np.ndarray:
    """Cross-entropy (nats) of every target, (blocks, T), NaN where there is no target."""
    was = model.training
    model.eval()
    n = min(blocks.n_blocks, max_blocks)
    out = []
    with torch.no_grad():
        for start in range(0, n, batch_size):
            x, y = blocks.batch(np.arange(start, min(start + batch_size, n)), device)  # (B, T) each
            logits, _ = model(x)  # (B, T, V)
            ce = F.cross_entropy(
                logits.float().transpose(1, 2), y, ignore_index=IGNORE_INDEX, reduction="none"
            )  # (B, T)
            out.append(torch.where(y != IGNORE_INDEX, ce.double(), torch.nan).cpu().numpy())
    model.train(was)
    return np.concatenate(out)


def loss_by_position(
    model: nn.Module, blocks: Blocks, *, max_blocks: int, batch_size: int, device: torch.device
) -> tuple[np.ndarray, np.ndarray]:
    """Mean cross-entropy (nats) of the targets at each position of the block, and their counts (T,)."""
    ce = block_losses(model, blocks, max_blocks=max_blocks, batch_size=batch_size, device=device)
    count = np.isfinite(ce).sum(0)
    return np.nansum(ce, 0) / np.maximum(count, 1), count.astype(np.float64)


def bootstrap_mean(per_block: np.ndarray, draws: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Mean over blocks and its 95% bootstrap interval (blocks resampled with replacement; NaN rows dropped)."""
    v = per_block[np.isfinite(per_block)]
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(draws, len(v)))].mean(1)
    return float(v.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _span_mean(ce: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Per block, the mean loss over positions lo..hi-1 (NaN when none)."""
    part = ce[:, lo:hi]
    with np.errstate(invalid="ignore"):
        return np.nanmean(part, 1) if part.shape[1] else np.full(len(ce), np.nan)


def context_helps_until(ce: np.ndarray, bucket: int) -> int:
    """The last position up to which more context still lowers the loss beyond noise: the end of the
    last bucket whose per-block loss is above the final bucket's with a 95% bootstrap interval clear of 0
    (0 when even the first is not)."""
    T = ce.shape[1]
    starts = list(range(0, T, bucket))
    last = _span_mean(ce, starts[-1], T)
    until = 0
    for b in starts[:-1]:
        _, low, _ = bootstrap_mean(_span_mean(ce, b, b + bucket) - last)
        if low > 0:
            until = min(b + bucket, T)
    return until


def receptive_field(model: nn.Module) -> int | None:
    """Positions a sliding-window Transformer's last query can reach through its stack (None: unbounded)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "attention", None) != "sliding_window":
        return None
    return cfg.n_layer * (cfg.window - 1) + 1


def _config(model: nn.Module) -> Any:
    """The model's settings (`config`, of whichever family; nn.Module's typing cannot know it)."""
    return cast(Any, model).config


def summarize_curve(loss: np.ndarray, bucket: int, saturation: float) -> dict:
    T = len(loss)
    buckets = [float(loss[s : s + bucket].mean()) for s in range(0, T, bucket)]
    gain = buckets[0] - buckets[-1]
    sat = next((i * bucket for i, b in enumerate(buckets) if b - buckets[-1] <= saturation * max(gain, 0.0)), 0)
    return {
        "loss_first_position": float(loss[0]),
        "loss_first_bucket": buckets[0],
        "loss_last_bucket": buckets[-1],
        "gain_from_context": gain,
        "saturation_position": sat,
        "mean_loss": float(loss.mean()),
    }


def plot_context_usage(curves: dict[str, np.ndarray], windows: dict[str, int], n_blocks: int | None = None) -> Figure:
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    ax, ax_gap = fig.subplots(1, 2)
    for name, c in curves.items():
        ax.plot(np.arange(1, len(c) + 1), c, label=name, lw=1.2)
    for name, w in windows.items():
        ax.axvline(w, ls=":", color="grey")
        ax.text(w, ax.get_ylim()[1], f" {name} window", fontsize=8, va="top")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens of context (position + 1)")
    ax.set_ylabel("validation loss (nats)" + (f", first {n_blocks} blocks (a subset)" if n_blocks else ""))
    ax.set_title("loss by position in the context window")
    full = [n for n, c in curves.items() if n not in windows and n.startswith("transformer")]
    if full:
        ref = curves[full[0]]
        for name, c in curves.items():
            if name != full[0]:
                ax_gap.plot(np.arange(1, len(c) + 1), c - ref, label=f"{name} − {full[0]}", lw=1.2)
        for w in windows.values():
            ax_gap.axvline(w, ls=":", color="grey")
        ax_gap.axhline(0, color="black", lw=0.6)
        ax_gap.set_xscale("log", base=2)
    ax_gap.set_xlabel("tokens of context (position + 1)")
    ax_gap.set_ylabel("loss difference (nats)")
    ax_gap.set_title("against the full-attention Transformer")
    for a in (ax, ax_gap):
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    return fig


@dataclass
class ContextUsageResult:
    curves: dict[str, list[float]]
    summaries: list[dict]
    buckets: list[dict]
    window_gaps: list[dict]
    figures: dict[str, Figure] = field(default_factory=dict)

    def plainly(self) -> str:
        """How far context helps each model, and what the window loses beyond its field, in words."""
        lines = [
            f"- {s['model']}: more context lowers the loss beyond block-to-block noise up to position "
            f"{s['context_helps_until']} of {s['positions']} (first bucket {s['loss_first_bucket']:.3f} → last "
            f"{s['loss_last_bucket']:.3f} nats)."
            for s in self.summaries
        ]
        for g in self.window_gaps:
            if np.isfinite(g["gap_beyond_field"]):
                lines.append(
                    f"- {g['model']} against {g['versus']} beyond its receptive field ({g['receptive_field']} "
                    f"positions): "
                    f"{g['gap_beyond_field']:+.4f} nats [{g['gap_beyond_field_low']:+.4f}, "
                    f"{g['gap_beyond_field_high']:+.4f}] "
                    f"(95% bootstrap over blocks); within its window {g['gap_within_window']:+.4f}."
                )
            else:
                lines.append(
                    f"- {g['model']}: its receptive field ({g['receptive_field']}) covers the whole block; nothing "
                    f"lies beyond it."
                )
        return "\n".join(lines)

    def metrics(self) -> dict[str, float]:
        out = {}
        for s in self.summaries:
            for k in (
                "gain_from_context",
                "saturation_position",
                "loss_first_bucket",
                "loss_last_bucket",
                "mean_loss",
                "context_helps_until",
            ):
                out[f"context/{s['model']}/{k}"] = float(s[k])
        for g in self.window_gaps:
            out[f"context/{g['model']}/gap_after_window"] = g["gap_after_window"]
            out[f"context/{g['model']}/gap_within_window"] = g["gap_within_window"]
            out[f"context/{g['model']}/gap_beyond_field"] = g["gap_beyond_field"]
        return out


def context_usage(models: dict[str, nn.Module], val: Blocks, settings: ContextUsageSettings) -> ContextUsageResult:
    """Loss by position for each model on the same validation blocks (cropped to the shortest context
    any model was built for)."""
    s = settings
    device, _ = resolve_device(s.device)
    T = min([val.block_size] + [_config(m).block_size for m in models.values() if hasattr(_config(m), "block_size")])
    blocks = val.crop(T)
    curves, windows, per_block = {}, {}, {}
    for name, m in models.items():
        ce = block_losses(m.to(device), blocks, max_blocks=s.max_blocks, batch_size=s.batch_size, device=device)
        m.to("cpu")
        per_block[name] = ce
        curves[name] = np.nansum(ce, 0) / np.maximum(np.isfinite(ce).sum(0), 1)
        if receptive_field(m) is not None:
            windows[name] = _config(m).window
    summaries = []
    for name, c in curves.items():
        rf = receptive_field(models[name])
        summaries.append(
            {
                "model": name,
                "positions": len(c),
                "window": windows.get(name),
                "receptive_field": rf,
                **summarize_curve(c, s.bucket, s.saturation),
                "context_helps_until": context_helps_until(per_block[name], s.bucket),
            }
        )
    buckets = [
        {"from": b, "to": min(b + s.bucket, T) - 1, **{n: float(c[b : b + s.bucket].mean()) for n, c in curves.items()}}
        for b in range(0, T, s.bucket)
    ]
    gaps = []
    full = next(
        (
            n
            for n, m in models.items()
            if n not in windows and getattr(_config(m), "attention", None) in ("fused", "reference")
        ),
        None,
    )
    if full is not None:
        for name, w in windows.items():
            d = curves[name] - curves[full]
            rf = receptive_field(models[name])
            assert rf is not None  # a windowed model
            per = per_block[name] - per_block[full]  # (blocks, T): the window's loss minus full attention's, per target
            within = bootstrap_mean(_span_mean(per, 0, min(w, T)))
            beyond = bootstrap_mean(_span_mean(per, rf, T)) if rf < T else (float("nan"),) * 3
            gaps.append(
                {
                    "model": name,
                    "versus": full,
                    "window": w,
                    "receptive_field": rf,
                    "gap_within_window": float(d[:w].mean()),
                    "gap_after_window": float(d[w:].mean()) if w < T else float("nan"),
                    "gap_within_window_low": within[1],
                    "gap_within_window_high": within[2],
                    "gap_beyond_field": beyond[0],
                    "gap_beyond_field_low": beyond[1],
                    "gap_beyond_field_high": beyond[2],
                    "positions_beyond_field": max(0, T - rf),
                }
            )
    return ContextUsageResult(
        curves={n: c.tolist() for n, c in curves.items()},
        summaries=summaries,
        buckets=buckets,
        window_gaps=gaps,
        figures={"context_usage": plot_context_usage(curves, windows, min(blocks.n_blocks, s.max_blocks))},
    )
