"""RNN vs LSTM vs Transformer on the same labels: at matched parameter budgets (the configs size
every model to one budget) and at matched wall-clock (each model's validation loss at the same
amount of training time, read off its own evaluation history)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.figure import Figure


def training_time_axis(history: list[dict]) -> list[tuple[float, float]]:
    """(cumulative training seconds, val loss) at each evaluation point of a training history.

    Training time is summed from the logged step times (step_ms × steps since the previous log
    point), so evaluation, logging and checkpointing are excluded, as in tokens/s.
    """
    points, elapsed, last_step = [], 0.0, 0
    for h in history:
        if "step_ms" in h:
            elapsed += h["step_ms"] / 1000 * (h["step"] - last_step)
            last_step = h["step"]
        if "val/loss" in h:
            points.append((elapsed, float(h["val/loss"])))
    return points


def tokens_axis(history: list[dict]) -> list[tuple[float, float]]:
    """(tokens seen, val loss) at each evaluation point; tokens per step read off the log points
    (tokens_per_s × step_ms), so the axis needs no settings."""
    per_step = next((h["tokens_per_s"] * h["step_ms"] / 1000 for h in history if "tokens_per_s" in h and "step_ms" in h), None)
    if per_step is None:
        return []
    return [(h["step"] * per_step, float(h["val/loss"])) for h in history if "val/loss" in h]


def ranking_settledness(curves: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
    """The models ranked by validation loss at their last and at their second-to-last evaluation:
    a ranking that still changes between the two is not settled by this budget."""
    ok = {n: c for n, c in curves.items() if len(c) >= 2}
    last = sorted(ok, key=lambda n: ok[n][-1][1])
    previous = sorted(ok, key=lambda n: ok[n][-2][1])
    return {"ranking_last_eval": last, "ranking_previous_eval": previous, "ranking_settled": bool(ok) and last == previous}


def loss_at_time(points: list[tuple[float, float]], t: float) -> float:
    """Validation loss at training time t: linear interpolation between evaluation points
    (before the first evaluation there is no measurement: NaN)."""
    if not points or t < points[0][0]:
        return float("nan")
    times, losses = zip(*points)
    return float(np.interp(t, times, losses))


@dataclass
class ComparisonResult:
    rows: list[dict[str, Any]]
    matched_time_s: float
    settledness: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)

    def markdown(self) -> str:
        cols = ["model", "params", "val_loss", "val_ppl", "tokens_per_s_mean", "train_time_s", "val_loss_at_matched_time"]
        head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"

        def fmt(v: Any) -> str:
            return f"{v:,.0f}" if isinstance(v, (int, float)) and abs(v) >= 1000 else (f"{v:.4g}" if isinstance(v, float) else str(v))

        body = "\n".join("| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in self.rows)
        st = self.settledness
        settled = (f"\n\nRanking by validation loss at the last evaluation: {' < '.join(st.get('ranking_last_eval', []))}; at the one "
                   f"before: {' < '.join(st.get('ranking_previous_eval', []))} — "
                   + ("settled." if st.get("ranking_settled") else "**still changing: train longer before trusting the order**."))
        return head + body + f"\n\nMatched wall-clock: validation loss after {self.matched_time_s:.1f} s of training each." + settled

    def metrics(self) -> dict[str, float]:
        out = {"matched_time_s": self.matched_time_s, "ranking_settled": float(bool(self.settledness.get("ranking_settled")))}
        for r in self.rows:
            for k in ("val_loss", "val_ppl", "tokens_per_s_mean", "params", "val_loss_at_matched_time"):
                out[f"{r['model']}/{k}"] = float(r[k])
        return out


def compare_models(models: dict[str, dict[str, Any]]) -> ComparisonResult:
    """`models`: name -> {"metrics": the shared training metrics, "history": the eval history}."""
    curves = {name: training_time_axis(m["history"]) for name, m in models.items()}
    # The longest time every model reached: the fair budget for "who is better per second".
    matched = min((c[-1][0] for c in curves.values() if c), default=0.0)
    rows = []
    for name, m in models.items():
        met = m["metrics"]
        rows.append(
            {
                "model": name,
                "params": int(met["params"]),
                "val_loss": float(met["val/loss"]),
                "val_ppl": float(met["val/ppl"]),
                "tokens_per_s_mean": float(met["train/tokens_per_s_mean"]),
                "train_time_s": curves[name][-1][0] if curves[name] else float("nan"),
                "val_loss_at_matched_time": loss_at_time(curves[name], matched),
            }
        )
    result = ComparisonResult(rows=rows, matched_time_s=matched, settledness=ranking_settledness(curves))
    tokens = {name: tokens_axis(m["history"]) for name, m in models.items()}
    result.figures["comparison"] = plot_comparison(curves, rows, matched, tokens)
    return result


def plot_comparison(curves: dict[str, list[tuple[float, float]]], rows: list[dict], matched: float,
                    tokens: dict[str, list[tuple[float, float]]] | None = None) -> Figure:
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    ax1, ax_tok, ax2 = fig.subplots(1, 3)
    for i, (name, pts) in enumerate(curves.items()):
        if pts:
            t, loss = zip(*pts)
            ax1.plot(t, loss, marker="o", ms=3, label=name, color=f"C{i}")
        if tokens and tokens.get(name):
            n, loss = zip(*tokens[name])
            ax_tok.plot(n, loss, marker="o", ms=3, label=name, color=f"C{i}")
    ax1.axvline(matched, color="grey", ls="--", lw=1)
    ax1.set_xlabel("training time (s)")
    ax1.set_ylabel("validation loss")
    ax1.set_title("Loss vs wall-clock")
    ax1.legend()
    ax_tok.set_xlabel("training tokens seen")
    ax_tok.set_ylabel("validation loss")
    ax_tok.set_title("Loss vs tokens")
    if ax_tok.get_legend_handles_labels()[0]:
        ax_tok.legend()
    for a in (ax1, ax_tok):
        a.grid(True, alpha=0.3)
    names = [r["model"] for r in rows]
    ax2.bar(names, [r["tokens_per_s_mean"] for r in rows], color=[f"C{i}" for i in range(len(rows))])
    ax2.tick_params(axis="x", labelrotation=30)
    ax2.set_ylabel("training tokens / s")
    ax2.set_title("Throughput (params: " + ", ".join(f"{r['model']} {r['params'] / 1e6:.2f}M" for r in rows) + ")", fontsize=8)
    return fig
