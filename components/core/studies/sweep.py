"""A learning-rate (and batch-size) sweep at a fixed budget: every trial trains the same model on the
same budget (equal FLOPs, or equal tokens: fewer steps at a larger batch), each with its own full
schedule (warmup, then cosine to min_lr = lr × min_lr_ratio ending at the budget, never a snapshot
taken mid-schedule), and is scored on the whole validation split. The chosen values are those with
the lowest validation loss; ties go to the smaller learning rate.

`run_sweep` is generic (a trial is a callable from settings to a loss), so the selection is tested
on a problem whose best learning rate is known; `lm_trial` makes a trial of a language model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError


class SweepBudget(BaseModel):
    """What every trial of a sweep shares: the warmups tried, the budget and the schedule's floor.
    `SweepSettings` adds the learning rates and batch sizes tried (the tune job's config has its own,
    optional, way of giving those)."""

    model_config = ConfigDict(extra="forbid")

    warmup_steps: list[int] = Field(
        default=[30], description="Warmup lengths to try with every learning rate (each >= 0, below max_steps)."
    )
    max_steps: int = Field(
        default=500,
        description="The budget: optimizer steps of every trial (its schedule ends there). A model trained with a "
        "flops_budget (the default run's) is swept at that budget instead: the best learning rate depends on it.",
    )
    min_lr_ratio: float = Field(
        default=0.1, gt=0, le=1, description="min_lr = lr × this at the end of each trial's cosine."
    )


class SweepSettings(SweepBudget):
    lrs: list[float] = Field(
        default=[1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2],
        description="Peak learning rates to try (each > 0), doubling: 1e-3 … 6.4e-2 (over bytes the RNN's and the "
        "Transformer's best were 4e-3, the LSTM's 3.2e-2).",
    )
    batch_sizes: list[int] = Field(
        default=[16],
        description="Blocks per step to try with every (lr, warmup) (with block_size, the tokens one step costs). "
        "At a model's flops_budget each size trains the steps the budget buys; at max_steps each trains the "
        "tokens max_steps steps of the first size hold (steps = max_steps × first size / size): equal cost.",
    )

    def steps_at(self, batch_size: int) -> int:
        """Optimizer steps of a trial at this batch size when the budget is max_steps (equal tokens)."""
        return max(1, round(self.max_steps * self.batch_sizes[0] / batch_size))


def check_grid(
    s: SweepSettings, *, where: str = "sweep", tokens_per_step: int | None = None, budget_tokens: int | None = None
) -> None:
    """Bad grids and budgets fail before any trial trains, naming the setting."""
    if not s.lrs:
        raise ConfigError(f"{where}.lrs is empty: give at least one learning rate")
    bad = [x for x in s.lrs if not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0)]
    if bad:
        raise ConfigError(f"{where}.lrs holds non-positive or non-finite values {bad}: every learning rate must be > 0")
    if not s.warmup_steps:
        raise ConfigError(f"{where}.warmup_steps is empty: give at least one warmup length (0 for none)")
    if any(w < 0 for w in s.warmup_steps):
        raise ConfigError(f"{where}.warmup_steps holds negative values {[w for w in s.warmup_steps if w < 0]}")
    if not s.batch_sizes:
        raise ConfigError(f"{where}.batch_sizes is empty: give at least one batch size")
    if any(b < 1 for b in s.batch_sizes):
        raise ConfigError(f"{where}.batch_sizes holds values below 1 {[b for b in s.batch_sizes if b < 1]}")
    if s.max_steps < 1:
        raise ConfigError(
            f"{where}.max_steps={s.max_steps} is smaller than one step: the budget must allow at least one step"
        )
    if budget_tokens is not None and tokens_per_step is not None and budget_tokens < tokens_per_step:
        raise ConfigError(
            f"{where}: a budget of {budget_tokens} tokens is smaller than one step ({tokens_per_step} tokens)"
        )
    fewest = min(s.steps_at(b) for b in s.batch_sizes)
    if max(s.warmup_steps) >= fewest:
        raise ConfigError(
            f"{where}.warmup_steps={max(s.warmup_steps)} does not fit in max_steps={fewest}"
            f"{'' if fewest == s.max_steps else f' (at batch size {max(s.batch_sizes)})'}: the schedule would never "
            "decay"
        )


@dataclass
class SweepResult:
    trials: list[dict[str, Any]]  # per trial: lr, warmup_steps, val_loss, and what the trial returned
    best: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def at_edge(self) -> bool:
        """Whether the chosen learning rate is the grid's smallest or largest: the optimum may lie
        beyond it, so the grid should be widened on that side."""
        lrs = [t["lr"] for t in self.trials]
        return len(set(lrs)) > 1 and self.best["lr"] in (min(lrs), max(lrs))

    @property
    def batch_at_edge(self) -> bool:
        """Whether the chosen batch size is the grid's smallest or largest of several."""
        sizes = [t["batch_size"] for t in self.trials]
        return len(set(sizes)) > 1 and self.best["batch_size"] in (min(sizes), max(sizes))

    def markdown(self) -> str:
        lines = ["| batch | steps | lr | warmup | val loss |", "|---|---|---|---|---|"]
        for t in sorted(self.trials, key=lambda t: (t["batch_size"], t["warmup_steps"], t["lr"])):
            mark = " **(chosen)**" if t is self.best else ""
            steps = t.get("steps", t["max_steps"])
            row = f"| {t['batch_size']} | {steps} | {t['lr']:g} | {t['warmup_steps']} | {t['val_loss']:.4f}{mark} |"
            lines.append(row)
        if self.at_edge:
            lines.append(f"\nThe chosen lr {self.best['lr']:g} is at the grid's edge: widen the grid beyond it.")
        if self.batch_at_edge:
            lines.append(f"\nThe chosen batch size {self.best['batch_size']} is at the edge of the sizes tried.")
        return "\n".join(lines)


def run_sweep(
    s: SweepSettings,
    trial: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    where: str = "sweep",
    log: Callable[[dict[str, Any]], None] | None = None,
) -> SweepResult:
    """Every (batch size, warmup, lr) of the grid through `trial(params) -> {"val_loss": ..., ...}`,
    where params holds lr, min_lr, warmup_steps, max_steps (equal tokens at every batch size) and
    batch_size. A trial that diverges returns a non-finite loss and is never chosen. `log(trial_row)`
    after each trial."""
    check_grid(s, where=where)
    trials = []
    for batch in s.batch_sizes:
        for warmup in s.warmup_steps:
            for lr in s.lrs:
                params = {
                    "lr": float(lr),
                    "min_lr": float(lr) * s.min_lr_ratio,
                    "warmup_steps": int(warmup),
                    "max_steps": s.steps_at(batch),
                    "batch_size": int(batch),
                }
                out = trial(params)
                row = {**params, **out, "val_loss": float(out["val_loss"])}
                trials.append(row)
                if log:
                    log(row)
    finite = [t for t in trials if math.isfinite(t["val_loss"])]
    if not finite:
        raise RuntimeError(f"{where}: every trial diverged (lrs {s.lrs}); try smaller learning rates")
    best = min(finite, key=lambda t: (t["val_loss"], t["lr"]))
    result = SweepResult(trials=trials, best=best)
    result.figures["sweep"] = plot_sweep(trials, best)
    return result


def plot_sweep(trials: list[dict], best: dict):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.5), layout="constrained")
    ax = fig.subplots()
    for b, w in sorted({(t["batch_size"], t["warmup_steps"]) for t in trials}):
        pts = sorted(
            (t["lr"], t["val_loss"])
            for t in trials
            if (t["batch_size"], t["warmup_steps"]) == (b, w) and math.isfinite(t["val_loss"])
        )
        if pts:
            ax.plot(*zip(*pts), "o-", label=f"batch {b}, warmup {w}")
    ax.plot([best["lr"]], [best["val_loss"]], "k*", ms=12, label="chosen")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("validation loss (all targets)")
    ax.set_title(f"lr sweep, chosen: batch {best['batch_size']}, {best.get('steps', best['max_steps'])} steps")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def lm_trial(
    family: str,
    model_settings: dict,
    base_train: dict,
    train_data,
    val_data,
    vocab_size: int,
    out_dir: str | Path,
    *,
    model_meta: dict | None = None,
    evals: int = 2,
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A trial that trains the language model `family` with `base_train` updated by the trial's
    params and returns its validation loss on the whole validation split (diverged: inf), scored
    `evals` times (2: halfway and at the end; 1: at the end only), and what the training cost."""
    from ..lm import SamplingSettings, train_lm
    from ..train_settings import TrainSettings
    from ..training import TrainingDivergedError

    def trial(params: dict[str, Any]) -> dict[str, Any]:
        # Scored on the whole split each time (halfway and at the end, or at the end only): only the end chooses.
        ts = TrainSettings(
            **{
                **base_train,
                **params,
                "eval_batches": None,
                "eval_interval": max(params["max_steps"] // 2, 1) if evals > 1 else 0,
            }
        )
        tag = f"lr{params['lr']:g}_w{params['warmup_steps']}"
        try:
            res = train_lm(
                family,
                model_settings,
                ts,
                train_data,
                val_data,
                vocab_size,
                Path(out_dir) / tag,
                sampling=SamplingSettings(num_samples=0),
                resume=False,
                model_meta=model_meta,
            )
        except TrainingDivergedError:
            return {"val_loss": float("inf"), "diverged": True}
        m = res.metrics
        return {
            "val_loss": float(m["val/loss"]),
            "steps": int(m["steps"]),  # the steps trained: max_steps, or what base_train's flops_budget buys
            "train_loss": float(m["train/loss"]),
            "tokens_per_s": float(m["train/tokens_per_s_mean"]),
            "wall_s": float(m["wall_s"]),
            "train_s": float(m["train/seconds"]),
            "params": int(m["params"]),
            "flops_per_token": float(m["flops_per_token"]),
            "history": [(h["step"], h["val/loss"]) for h in res.history if "val/loss" in h],
        }

    return trial
