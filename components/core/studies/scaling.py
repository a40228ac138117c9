"""Where each neural family passes the count model, and whether the Transformer overtakes the LSTM as
compute grows: loss against training FLOPs and against training seconds, fitted as power laws.

Each family (a trained language model of the default run: RNN, LSTM, Transformer) is trained at every
budget of `budgets` (training FLOPs, increasing). The model grows with the budget by one stated rule,
the compute-optimal one of Hoffmann et al. (2022, "Chinchilla": parameters and tokens each ∝ C^0.5):

    param_budget(C) = P0 · (C / C0)^size_exponent        (P0: the input model's parameters, C0: budgets[0])

so at 8× the compute a family has √8 ≈ 2.8× the parameters and trains on 2.8× the tokens. Its depth,
shape ratios and context stay those of the input model; the sizer picks the width.

Learning rate and batch come from the tune machinery (`sweep.run_sweep` over `sweep.lm_trial`
trials, each with its own full schedule ending at its budget) at the smallest and the largest budget:
- at the smallest, the input model itself is the first point when it was trained at budgets[0]
  (the default run's models are: their learning rate and batch are the `tune` job's choice at that
  budget); otherwise its learning rate × `smallest_lr_factors` is swept there;
- at the largest, the smallest budget's learning rate × `largest_lr_factors` (and its batch ×
  `largest_batch_factors`) is swept;
- between them, the learning rate is interpolated geometrically in log C, the batch kept (or
  interpolated geometrically when the two ends chose different batches).
A sweep's trials train on the training split less its last `heldout_fraction` and are scored on that
tail; the chosen values are trained again on the whole training split and scored on the validation
split, which is the budget's point. The validation split, which the claims judge, never chooses.

The fit, per family and axis (x = FLOPs or training seconds, normalised by the first point's):

    L(x) = L∞ + a · x^(−α),     L∞ ∈ [0, min loss], a ≥ 0, α ∈ [0, 3]

Intervals come from a parametric bootstrap: each point's loss is redrawn with the family's seed noise
(σ: the spread of its final loss over seeds that `model_comparison` measured at the smallest budget)
and refitted. From every redraw follow the compute where the curve passes the count model, and where
the Transformer's passes the LSTM's; each is reported as a median with a 95 % interval, infinite where
a share of the redraws never crosses (within `horizon` × the largest budget for two curves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..data import TokenBlocks, context_length, split_tail
from ..errors import ConfigError
from ..manifests import Crossing, FamilyScaling, NgramRung, ScalingTrial, TransformerVsLstm
from .power_law import PowerLawFit, fit_power_law, overtake, pass_level
from .scaling_settings import ScalingSettings, check_settings

# --------------------------------------------------------------------------------------------------
# The study


@dataclass
class FamilyInput:
    """A trained language model the study starts from (its manifest's figures)."""

    name: str  # the asset, e.g. lstm_lm
    family: str  # recurrent | transformer
    model_config: dict[str, Any]
    train_settings: dict[str, Any]
    params: int
    val_loss: float
    train_seconds: float
    flops_per_token: float
    steps: int
    noise: float  # seed noise of its final loss (nats)
    noise_measured: bool


@dataclass
class ScalingResult:
    trials: list[ScalingTrial]  # every training: the budgets' points and the sweeps' other trials
    families: dict[str, FamilyScaling]  # the fits and where each passes the count model
    count_model: NgramRung
    versus: TransformerVsLstm | None  # the Transformer against the LSTM
    budgets: list[float]
    settings: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)

    def points(self, name: str) -> list[ScalingTrial]:
        return sorted((t for t in self.trials if t.model == name and t.role == "point"), key=lambda t: t.budget)


def _scaled_settings(inp: FamilyInput, budget: float, c0: float, exponent: float) -> dict[str, Any]:
    settings = dict(inp.model_config)
    settings["param_budget"] = int(round(inp.params * (budget / c0) ** exponent))
    return settings


def _interp_log(c: float, c0: float, c1: float, v0: float, v1: float) -> float:
    t = math.log(c / c0) / math.log(c1 / c0)
    return math.exp(math.log(v0) + t * (math.log(v1) - math.log(v0)))


def plan_steps(
    inputs: list[FamilyInput], settings: ScalingSettings, vocab_size: int, block_size: int
) -> dict[str, list[dict[str, Any]]]:
    """Per family and budget: the model's size and the steps the budget buys at the input batch
    (and at the largest budget's batches); a budget that buys no step past warmup is an error naming
    it, before anything trains."""
    import torch

    from ..lm import build_model, resolve_settings
    from ..models.recurrent import RecurrentLM
    from ..models.transformer import Transformer

    out: dict[str, list[dict[str, Any]]] = {}
    c0 = settings.budgets[0]
    for inp in inputs:
        rows = []
        for i, c in enumerate(settings.budgets):
            resolved = resolve_settings(inp.family, _scaled_settings(inp, c, c0, settings.size_exponent), vocab_size)
            with torch.device("meta"):
                model = build_model(inp.family, resolved, vocab_size)
            assert isinstance(model, (Transformer, RecurrentLM))  # the families build_model knows
            fpt = model.flops_per_token(block_size)
            batches = [int(inp.train_settings["batch_size"])]
            if i == len(settings.budgets) - 1:
                batches = [max(1, int(round(b * f))) for b in batches for f in settings.largest_batch_factors]
            steps = 0  # set below: batches is never empty (the factors are checked with the settings)
            for b in batches:
                steps = int(c // (fpt * b * block_size))
                warmup = int(inp.train_settings.get("warmup_steps", 0))
                if steps <= warmup:
                    raise ConfigError(
                        f"scaling_laws.budgets[{i}]={c:.3g} buys {steps} step(s) of {inp.name} at its size there "
                        f"({fpt:.3g} FLOPs a token × {b} × {block_size} tokens a step), not more than its "
                        f"warmup_steps={warmup}: raise the budget"
                    )
            rows.append({"budget": c, "fpt": fpt, "resolved": resolved.model_dump(), "steps": steps})
        out[inp.name] = rows
    return out


def run_scaling(
    inputs: list[FamilyInput],
    train_data,
    val_data,
    vocab_size: int,
    count_model: NgramRung,
    ladder: list[NgramRung],
    settings: ScalingSettings,
    out_dir: str | Path,
    *,
    model_meta: dict | None = None,
    log: Callable[[dict[str, Any]], None] | None = None,
) -> ScalingResult:
    """Every family at every budget (module doc), then the fits and the crossings."""
    check_settings(settings)
    block = context_length(inputs[0].model_config.get("block_size"), train_data.block_size)
    plan_steps(inputs, settings, vocab_size, block)
    # The sweeps choose on the training split's tail (data.split_tail), never on the validation split.
    tune_train, tune_heldout = split_tail(train_data, settings.heldout_fraction)
    run = _ScalingRun(
        train_data, val_data, tune_train, tune_heldout, vocab_size, block, settings, Path(out_dir), model_meta, log
    )
    for inp in inputs:
        run.family(inp)
    return analyse(inputs, run.trials, count_model, ladder, settings)


@dataclass
class _Recipe:
    """What every training of a family keeps from its input model: its train settings less the launch
    and the step count, and the shape of its schedule."""

    base_train: dict[str, Any]
    lr: float  # the input model's learning rate and batch
    batch_size: int
    min_lr_ratio: float  # min_lr as a share of lr
    warmup: int

    @classmethod
    def of(cls, inp: FamilyInput) -> _Recipe:
        base_train = {
            k: v
            for k, v in inp.train_settings.items()
            if k not in ("launcher", "nproc_per_node", "strategy", "max_steps")
        }
        lr_in, batch_in = float(inp.train_settings["lr"]), int(inp.train_settings["batch_size"])
        min_lr_ratio = float(inp.train_settings.get("min_lr", lr_in * 0.1)) / lr_in
        warmup = int(inp.train_settings.get("warmup_steps", 0))
        return cls(base_train, lr_in, batch_in, min_lr_ratio, warmup)

    def schedule(self, lr: float, batch_size: int) -> dict[str, Any]:
        """A point's trial parameters: this learning rate and batch on the family's schedule."""
        return {
            "lr": lr,
            "min_lr": lr * self.min_lr_ratio,
            "warmup_steps": self.warmup,
            "max_steps": 10**9,
            "batch_size": batch_size,
        }


@dataclass
class _ScalingRun:
    """One `run_scaling`: the data and settings every training shares, and the trials recorded so far."""

    train_data: TokenBlocks
    val_data: TokenBlocks
    tune_train: TokenBlocks  # the training split less its tail: what the sweeps' trials train on
    tune_heldout: TokenBlocks  # that tail: what they are scored on
    vocab_size: int
    block: int  # the context every model trains at
    settings: ScalingSettings
    out_dir: Path
    model_meta: dict | None
    log: Callable[[dict[str, Any]], None] | None
    trials: list[dict[str, Any]] = field(default_factory=list)

    def record(
        self, inp: FamilyInput, budget: float, role: str, row: dict[str, Any], scored_on: str = "validation"
    ) -> dict[str, Any]:
        """A training's row of `trials` (passed to `log`), from its trial's `row`."""
        tokens = row.get("steps", 0) * row["batch_size"] * self.block
        out = {
            "model": inp.name,
            "budget": budget,
            "role": role,
            "lr": row["lr"],
            "batch_size": row["batch_size"],
            "steps": int(row.get("steps", 0)),
            "params": int(row.get("params", 0)),
            "val_loss": row["val_loss"],
            "train_seconds": float(row.get("train_s", math.nan)),
            "flops": float(row.get("flops_per_token", math.nan)) * tokens,
            "tokens": tokens,
            # Over the data the trial trained on: a sweep trial's is the split less its tail.
            "epochs": tokens / max((self.tune_train if scored_on == "heldout" else self.train_data).n_targets, 1),
            "reused": bool(row.get("reused", False)),
            "scored_on": scored_on,
        }
        self.trials.append(out)
        if self.log:
            self.log(out)
        return out

    def family(self, inp: FamilyInput) -> None:
        """Every budget's point of one family: the smallest, the largest, then those between."""
        recipe = _Recipe.of(inp)
        first = self.smallest(inp, recipe)
        # The largest: a sweep around the smallest budget's choice.
        last = self.sweep(
            inp,
            recipe,
            self.settings.budgets[-1],
            [first["lr"] * f for f in self.settings.largest_lr_factors],
            sorted({max(1, int(round(first["batch_size"] * f))) for f in self.settings.largest_batch_factors}),
            "largest",
        )
        self.between(inp, recipe, first, last)

    def smallest(self, inp: FamilyInput, recipe: _Recipe) -> dict[str, Any]:
        """The smallest budget's point: the input model itself, or a sweep around its learning rate."""
        s, c0 = self.settings, self.settings.budgets[0]
        trained_at = inp.train_settings.get("flops_budget")
        if s.reuse_trained and trained_at and math.isclose(float(trained_at), c0, rel_tol=1e-9):
            return self.record(
                inp,
                c0,
                "point",
                {
                    "lr": recipe.lr,
                    "batch_size": recipe.batch_size,
                    "steps": inp.steps,
                    "params": inp.params,
                    "val_loss": inp.val_loss,
                    "train_s": inp.train_seconds,
                    "flops_per_token": inp.flops_per_token,
                    "reused": True,
                },
            )
        return self.sweep(
            inp, recipe, c0, [recipe.lr * f for f in s.smallest_lr_factors], [recipe.batch_size], "smallest"
        )

    def sweep(
        self, inp: FamilyInput, recipe: _Recipe, budget: float, lrs: list[float], batches: list[int], role_tag: str
    ) -> dict[str, Any]:
        """The budget's point from a sweep of `lrs` × `batches` on the training split's tail: the best
        trial's values trained again on the whole training split and scored on validation."""
        from .sweep import SweepSettings, lm_trial, run_sweep

        model_settings = _scaled_settings(inp, budget, self.settings.budgets[0], self.settings.size_exponent)
        train = {**recipe.base_train, "flops_budget": budget}
        out = self.out_dir / f"{inp.name}_{budget:.3g}"
        trial = lm_trial(
            inp.family,
            model_settings,
            train,
            self.tune_train,
            self.tune_heldout,
            self.vocab_size,
            out / "sweep",
            model_meta=self.model_meta,
            evals=1,
        )
        rows: list[dict[str, Any]] = []

        def keep(row: dict[str, Any]) -> None:
            rows.append(self.record(inp, budget, "sweep", row, scored_on="heldout"))

        result = run_sweep(
            SweepSettings(
                lrs=lrs,
                warmup_steps=[recipe.warmup],
                batch_sizes=batches,
                max_steps=10**9,
                min_lr_ratio=recipe.min_lr_ratio,
            ),
            trial,
            where=f"scaling_laws[{inp.name}] at {budget:.3g} FLOPs ({role_tag})",
            log=keep,
        )
        best = min((r for r in rows if math.isfinite(r["val_loss"])), key=lambda r: (r["val_loss"], r["lr"]))
        # The budget's point: the chosen values trained on the whole training split, scored on validation.
        params = recipe.schedule(best["lr"], best["batch_size"])
        point_trial = lm_trial(
            inp.family,
            model_settings,
            train,
            self.train_data,
            self.val_data,
            self.vocab_size,
            out,
            model_meta=self.model_meta,
            evals=1,
        )
        chosen = self.record(inp, budget, "point", {**params, **point_trial(params)})
        chosen["lr_at_edge"] = bool(result.at_edge)
        return chosen

    def between(self, inp: FamilyInput, recipe: _Recipe, first: dict[str, Any], last: dict[str, Any]) -> None:
        """The points between the smallest budget and the largest: learning rate and batch interpolated in log C."""
        from .sweep import lm_trial

        budgets = self.settings.budgets
        c0, c1 = budgets[0], budgets[-1]
        for c in budgets[1:-1]:
            lr = _interp_log(c, c0, c1, first["lr"], last["lr"])
            batch = int(round(_interp_log(c, c0, c1, first["batch_size"], last["batch_size"])))
            trial = lm_trial(
                inp.family,
                _scaled_settings(inp, c, c0, self.settings.size_exponent),
                {**recipe.base_train, "flops_budget": c},
                self.train_data,
                self.val_data,
                self.vocab_size,
                self.out_dir / f"{inp.name}_{c:.3g}",
                model_meta=self.model_meta,
                evals=1,
            )
            params = recipe.schedule(lr, batch)
            self.record(inp, c, "point", {**params, **trial(params)})


def analyse(
    inputs: list[FamilyInput],
    trials: list[dict[str, Any]] | list[ScalingTrial],
    count_model: NgramRung,
    ladder: list[NgramRung],
    settings: ScalingSettings,
) -> ScalingResult:
    """The fits and crossings of measured trials (every family's `point` rows)."""
    rows = [t if isinstance(t, ScalingTrial) else ScalingTrial(**t) for t in trials]
    fits: dict[str, dict[str, PowerLawFit]] = {}
    families: dict[str, FamilyScaling] = {}

    def points(name: str) -> list[ScalingTrial]:
        return sorted((t for t in rows if t.model == name and t.role == "point"), key=lambda t: t.budget)

    for k, inp in enumerate(inputs):
        pts = points(inp.name)
        losses = [t.val_loss for t in pts]
        by_axis = {
            axis: fit_power_law(
                [getattr(t, key) for t in pts], losses, inp.noise, bootstrap=settings.bootstrap, seed=settings.seed + k
            )
            for axis, key in (("flops", "flops"), ("seconds", "train_seconds"))
        }
        fits[inp.name] = by_axis
        families[inp.name] = FamilyScaling(
            noise=inp.noise,
            noise_measured=inp.noise_measured,
            fit_flops=by_axis["flops"].summary(),
            fit_seconds=by_axis["seconds"].summary(),
            passes_count_model_flops=pass_level(by_axis["flops"], count_model.val_loss, [t.flops for t in pts], losses),
            passes_count_model_seconds=pass_level(
                by_axis["seconds"], count_model.val_loss, [t.train_seconds for t in pts], losses
            ),
        )
    versus = None
    t_name = next((i.name for i in inputs if i.family == "transformer"), None)
    l_name = next((i.name for i in inputs if i.family == "recurrent" and i.model_config.get("cell") == "lstm"), None)
    if t_name and l_name:
        pt, pl = points(t_name), points(l_name)
        per_flop = overtake(
            fits[t_name]["flops"],
            fits[l_name]["flops"],
            settings.horizon,
            [t.budget for t in pt],
            [t.val_loss for t in pt],
            [t.val_loss for t in pl],
        )
        # Seconds differ between families: the Transformer's measured points against the LSTM's fitted curve.
        lstm_s = fits[l_name]["seconds"]
        xs = [t.train_seconds for t in pt]
        per_second = overtake(
            fits[t_name]["seconds"],
            lstm_s,
            settings.horizon,
            xs,
            [t.val_loss for t in pt],
            [float(lstm_s(x)) for x in xs],
        )
        noise = {i.name: i.noise for i in inputs}
        versus = TransformerVsLstm(
            transformer=t_name,
            lstm=l_name,
            largest_budget=pt[-1].budget,
            transformer_loss=pt[-1].val_loss,
            lstm_loss=pl[-1].val_loss,
            lstm_minus_transformer=pl[-1].val_loss - pt[-1].val_loss,
            noise=math.hypot(noise[t_name], noise[l_name]),
            transformer_drop=pt[0].val_loss - pt[-1].val_loss,
            lstm_drop=pl[0].val_loss - pl[-1].val_loss,
            per_flop=per_flop,
            per_second=per_second,
        )
    result = ScalingResult(
        trials=rows,
        families=families,
        count_model=count_model,
        versus=versus,
        budgets=list(settings.budgets),
        settings=settings.model_dump(),
    )
    result.figures["scaling"] = plot_scaling(result, fits, ladder)
    return result


def plot_scaling(result: ScalingResult, fits: dict[str, dict[str, PowerLawFit]], ladder: list[NgramRung]):
    from matplotlib.figure import Figure

    from ..plots import draw_count_ladder

    fig = Figure(figsize=(12, 4.6), layout="constrained")
    axes = fig.subplots(1, 2)
    rungs = [
        (r.model, r.val_loss, r.order == result.count_model.order)
        for r in ladder
        if r.val_loss < max(t.val_loss for t in result.trials) + 0.3
    ]
    for ax, (axis, key, label) in zip(
        axes, (("flops", "flops", "training FLOPs"), ("seconds", "train_seconds", "training seconds (this CPU)"))
    ):
        for i, (name, by) in enumerate(fits.items()):
            pts = result.points(name)  # the sweeps' trials are scored on the training tail: not on this axis
            xs = np.array([getattr(t, key) for t in pts])
            ax.plot(xs, [t.val_loss for t in pts], "o", color=f"C{i}", label=name)
            grid = np.geomspace(xs.min(), xs.max() * 30, 200)
            f = by[axis]
            ax.plot(grid, f(grid), "-", color=f"C{i}", lw=1, label=f"{name}: {f.l_inf:.2f} + a·x^−{f.alpha:.2f}")
        draw_count_ladder(ax, rungs)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss (nats per token)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title("Loss against compute (lines: fits, extended 30×)")
    axes[1].set_title("Loss against wall-clock training time")
    return fig


def markdown(result: ScalingResult) -> str:
    """The points, the fits and the crossings as a page."""
    cm = result.count_model
    lines = [
        "| model | budget (FLOPs) | params | batch | lr | steps | epochs | train s | loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in sorted(result.trials, key=lambda t: (t.model, t.budget, t.role != "point")):
        scored = "the training tail" if t.scored_on == "heldout" else "validation"
        mark = "" if t.role == "point" else f" (sweep, scored on {scored})"
        reused = " (the input model)" if t.reused else ""
        edge = " (lr at the sweep's edge)" if t.lr_at_edge else ""
        lines.append(
            f"| {t.model}{mark}{reused} | {t.budget:.3g} | {t.params:,} | {t.batch_size} | {t.lr:.3g}{edge} | "
            f"{t.steps:,} | {t.epochs:.2f} | {t.train_seconds:.0f} | {t.val_loss:.4f} |"
        )
    lines += [
        "",
        f"The count model: {cm.model}, {cm.val_loss:.4f} on the same validation targets.",
        "",
        "| model | axis | L∞ (95 %) | α (95 %) | passes the count model at: median (95 %) | seen passing at |",
        "|---|---|---|---|---|---|",
    ]
    for name, fam in result.families.items():
        for axis, f, c in (
            ("FLOPs", fam.fit_flops, fam.passes_count_model_flops),
            ("seconds", fam.fit_seconds, fam.passes_count_model_seconds),
        ):
            unit = "FLOPs" if axis == "FLOPs" else "s"
            seen = f"{c.measured:.3g} {unit}" if c.measured is not None else "not reached"
            lines.append(
                f"| {name} | {axis} | {f.l_inf:.3f} ({f.l_inf_lo:.3f}–{f.l_inf_hi:.3f}) | "
                f"{f.alpha:.2f} ({f.alpha_lo:.2f}–{f.alpha_hi:.2f}) | {crossing_text(c, unit)} | {seen} |"
            )
    v = result.versus
    if v:
        lines += [
            "",
            f"At the largest budget ({v.largest_budget:.3g} FLOPs) the LSTM's loss minus the Transformer's "
            f"is {v.lstm_minus_transformer:+.3f} nats (seed noise of the difference {v.noise:.3f}); from the "
            f"smallest budget to the largest the Transformer gained {v.transformer_drop:.3f} nats, the LSTM "
            f"{v.lstm_drop:.3f}.",
            f"The Transformer passes the LSTM per FLOP at {crossing_text(v.per_flop, 'FLOPs')}, per second "
            f"of training at {crossing_text(v.per_second, 's')}.",
        ]
    return "\n".join(lines)


def crossing_text(c: Crossing, unit: str) -> str:
    """ "1.2e+14 FLOPs (4.1e+13–∞; 12 % of redraws never)"."""

    def num(x: float) -> str:
        return "∞" if math.isinf(x) else f"{x:.2g}"

    never = f"; {c.never:.0%} of redraws never" if c.never and c.never > 0 else ""
    return f"{num(c.median)} {unit} ({num(c.lo)}–{num(c.hi)}{never})"
