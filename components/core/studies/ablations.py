"""What each part of the Transformer is for: ablations, the permutation-equivariance check, the
√d-scaling check at init, and the parameter accounting per component.

- `run_ablations`: short trainings (through the shared loop) of the full model and of each switch —
  no positional encoding, no √d score scaling, a deep stack with vs without residual connections,
  and hard (top-1, straight-through) attention against soft — on the same labels, as one table.
- `permutation_equivariance`: without positional encoding self-attention sees a *set*: permuting the
  input tokens just permutes the outputs ("我爱你" and "你爱我" get the same per-token vectors). This
  holds exactly for unmasked (bidirectional) attention. The causal mask itself leaks order (position
  t sees t+1 tokens), which is why a causal LM without positional encoding is still not quite
  order-blind; both numbers are reported.
- `score_scaling_at_init`: the dot product of two d-dimensional vectors with unit-variance entries has
  variance d, so unscaled scores grow with the head size and push the softmax toward one-hot, where
  its gradient vanishes. Measured on the model at init (entropy, gradient norms) and on unit-variance
  q, k across head sizes.
- `parameter_accounting`: parameters per component of an actual model (token embedding, positional,
  attention, FFN, norms, untied head) and the FFN share of the non-embedding parameters — with a 4×
  FFN 8d² of every layer's 12d², "about two thirds".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Optional, get_args

import numpy as np
import torch
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..artifacts import write_json
from ..data import Blocks
from ..device import seed_everything
from ..lm import resolve_settings
from ..models.transformer import Transformer, TransformerSettings
from ..train_settings import TrainSettings
from ..training import TrainResult, train
from ..workers import cpu_workers, one_thread_each, run_jobs, weights_in, weights_out
from .ablation_tables import (
    ablation_markdown,
    accounting_markdown,
    depth_markdown,
    permutation_markdown,
    scaling_markdown,
)
from .transformer_probes import attention_entropy, parameter_accounting, permutation_equivariance, score_scaling_at_init

__all__ = [
    "ABLATIONS",
    "Ablation",
    "AblationResult",
    "AblationSettings",
    "first_layer_grad_norm",
    "plot_ablation_curves",
    "plot_ablation_losses",
    "plot_score_scaling",
    "residual_depth_study",
    "run_ablations",
]

Ablation = Literal["no_pos", "no_scale", "no_residual", "hard_attention"]
# Each ablation: the setting it flips and the run it is compared against.
ABLATIONS: dict[str, dict] = {  # keyed by Ablation
    "no_pos": {"update": {"pos_encoding": "none"}, "baseline": "full"},
    "no_scale": {"update": {"scale_scores": False}, "baseline": "full"},
    "no_residual": {"update": {"residual": False}, "baseline": "deep_residual"},  # at deep_n_layer
    # top-1 attention trained straight-through: picking one key against blending all of them
    "hard_attention": {"update": {"hard_attention": True}, "baseline": "full"},
}


class AblationSettings(BaseModel):
    """Which ablations to run and how long."""

    model_config = ConfigDict(extra="forbid")

    ablations: list[str] = Field(
        default_factory=lambda: ["no_pos", "no_scale", "no_residual", "hard_attention"],
        description="Ablations to run against the full model: no_pos, no_scale, no_residual, hard_attention (each "
        "query takes its top key's value only, trained straight-through).",
    )
    ablation_steps: Optional[int] = Field(
        default=None, ge=1, description="Optimizer steps per run (None = the train settings' max_steps)."
    )
    deep_n_layer: int = Field(
        default=8, ge=2, description="Depth of the with/without-residual pair (residuals matter in deep stacks)."
    )
    permutation_len: int = Field(default=16, ge=3, description="Tokens in the permutation-equivariance check.")
    permutation_trials: int = Field(
        default=3, ge=1, description="Permutations tried (the first is the reversal, 我爱你 → 你爱我)."
    )
    probe_blocks: int = Field(
        default=8, ge=1, description="Validation blocks for the at-init and attention-entropy probes."
    )
    depths: list[int] = Field(
        default=[2, 4, 8, 12],
        description="Depths of the residual study (with and without residuals, same budget); [] = skip.",
    )
    depth_steps: int = Field(default=30, ge=1, description="Optimizer steps per model of the residual study.")
    depth_n_embd: int = Field(
        default=32, ge=8, description="Width of the residual study's models (small: 2 × len(depths) trainings)."
    )
    depth_block_size: int = Field(default=32, ge=8, description="Context of the residual study's models.")
    workers: int = Field(
        default=2,
        ge=1,
        description="Processes the ablation and depth runs train in side by side on a CPU, one torch thread each "
        "(components/core/workers.py; these small models gain little from a second thread, so two at once take "
        "about 0.6× the time of one after the other); 1: one after the other here. The losses are the same; the "
        "tokens/s in the table are then those of one thread beside another run.",
    )

    @field_validator("ablations")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        # A list of Literal is no Dagster config type, so the names are checked here, against the Literal.
        unknown = [a for a in v if a not in get_args(Ablation)]
        if unknown:
            raise ValueError(f"ablations: unknown {unknown}; use any of {list(get_args(Ablation))}")
        if len(set(v)) != len(v):
            raise ValueError(f"ablations: duplicates in {v}")
        return v


@dataclass
class AblationResult:
    table: list[dict]  # one row per run: run, change, baseline, params, train/val loss, delta, ...
    markdown: str  # the table, plus the permutation and scaling checks, as markdown
    metrics: dict[str, float]  # flat headline numbers
    permutation: dict
    scaling: dict
    accounting: dict
    run_dirs: dict[str, Path]
    warnings: list[str]
    table_path: Path
    figures: dict[str, Figure] = field(default_factory=dict)
    depth: list[dict] = field(default_factory=list)  # `residual_depth_study`


def _runs(
    model_settings: TransformerSettings, s: AblationSettings
) -> dict[str, tuple[TransformerSettings, str, str | None]]:
    """name -> (settings, the change in words, baseline run name)."""
    base = model_settings.model_dump()
    runs: dict[str, tuple[TransformerSettings, str, str | None]] = {"full": (model_settings, "—", None)}
    deep = {"n_layer": s.deep_n_layer}
    if "no_residual" in s.ablations:
        runs["deep_residual"] = (TransformerSettings(**{**base, **deep}), f"n_layer={s.deep_n_layer}", None)
    for name in s.ablations:
        spec = ABLATIONS[name]
        update = {**spec["update"], **(deep if name == "no_residual" else {})}
        change = ", ".join(f"{k}={v}" for k, v in update.items())
        runs[name] = (TransformerSettings(**{**base, **update}), change, spec["baseline"])
    return runs


def run_ablations(
    model_settings: TransformerSettings,
    train_settings: TrainSettings,
    settings: AblationSettings,
    train_data: Blocks,
    val_data: Blocks,
    vocab_size: int,
    out_dir: str | Path,
    *,
    log_metrics: Callable[[dict[str, float], int], None] | None = None,
    resume: bool = True,
    model_meta: dict | None = None,
) -> AblationResult:
    """Train the full model and each ablation with the same data, steps and seed; compare."""
    out_dir = Path(out_dir)
    ts = (
        train_settings
        if settings.ablation_steps is None
        else train_settings.model_copy(update={"max_steps": settings.ablation_steps, "lr_decay_steps": None})
    )
    probe = _probe_batch(val_data, settings.probe_blocks, model_settings.block_size)
    rows, models, run_dirs, notes, histories = [], {}, {}, [], {}
    runs = _runs(model_settings, settings)
    trained = _train_runs(runs, vocab_size, ts, settings.workers, train_data, val_data, out_dir, resume, model_meta)
    for name, (cfg, change, baseline) in runs.items():
        weights, res = trained[name]
        seed_everything(ts.seed)
        model = _build(cfg, vocab_size)
        weights_in(model, weights)
        if log_metrics is not None:  # the run's log/eval points, as train() would have logged them
            for point in res.history:
                log_metrics({f"{name}/{k}": v for k, v in point.items() if k != "step"}, point["step"])
        run_dirs[name] = out_dir / name
        notes += [f"{name}: {w}" for w in res.warnings if "no CUDA GPU" not in w]
        models[name], histories[name] = model.cpu().eval(), res.history
        rows.append(_ablation_row(name, change, baseline, cfg, res, model, probe[0]))
    by_name = {r["run"]: r for r in rows}
    for r in rows:
        r["delta_val_loss"] = r["val_loss"] - by_name[r["baseline"]]["val_loss"] if r["baseline"] else 0.0

    tokens = probe[0][:1, : settings.permutation_len]  # (1, n) real text
    permutation = _permutation_checks(models, model_settings, tokens, settings.permutation_trials, vocab_size, ts.seed)
    scaling = score_scaling_at_init(model_settings, vocab_size, *probe, seed=ts.seed)
    seed_everything(ts.seed)
    accounting = parameter_accounting(_build(model_settings, vocab_size))
    depth = (
        residual_depth_study(
            model_settings, train_settings, settings, train_data, val_data, vocab_size, out_dir / "depth"
        )
        if settings.depths
        else []
    )

    metrics = _ablation_metrics(rows, permutation, scaling, accounting, depth)
    table_path, markdown = _write_tables(out_dir, rows, permutation, scaling, accounting, notes, depth)
    figures = {
        "ablation_val_loss": plot_ablation_losses(rows),
        "ablation_curves": plot_ablation_curves(histories),
        "score_scaling": plot_score_scaling(scaling),
    }
    return AblationResult(
        rows, markdown, metrics, permutation, scaling, accounting, run_dirs, notes, table_path, figures, depth
    )


def _train_runs(
    runs: dict[str, tuple[TransformerSettings, str, str | None]],
    vocab_size: int,
    ts: TrainSettings,
    workers: int,
    train_data: Blocks,
    val_data: Blocks,
    out_dir: Path,
    resume: bool,
    model_meta: dict | None,
) -> dict[str, tuple[dict, TrainResult]]:
    """Every run trained (`_train_run`) into out_dir/<name>, side by side in `workers` processes on a CPU:
    name -> (its weights, its TrainResult)."""
    workers = cpu_workers(workers, ts.device)
    run_ts = one_thread_each(ts, workers)
    names = sorted(runs, key=lambda n: -runs[n][0].n_layer)  # the deep runs first: the last to start is a short one
    jobs = [(runs[n][0], vocab_size, run_ts, train_data, val_data, out_dir / n, resume, model_meta) for n in names]
    return dict(zip(names, run_jobs(_train_run, jobs, workers)))


def _ablation_row(
    name: str,
    change: str,
    baseline: str | None,
    cfg: TransformerSettings,
    res: TrainResult,
    model: Transformer,
    x: torch.Tensor,
) -> dict:
    """A run's row of the table (all but `delta_val_loss`): its change, size, losses and speed, and the
    attention entropy of its trained `model` on the probe tokens `x`."""
    return {
        "run": name,
        "change": change,
        "baseline": baseline or "",
        "n_layer": cfg.n_layer,
        "params": res.params,
        "steps": res.steps,
        "train_loss": res.train_loss,
        "val_loss": res.val_loss,
        "val_ppl": res.val_ppl,
        "tokens_per_s": res.tokens_per_s,
        "attn_entropy": attention_entropy(model, x)["normalized_entropy"],
    }


def _permutation_checks(
    models: dict[str, Transformer],
    cfg: TransformerSettings,
    tokens: torch.Tensor,
    trials: int,
    vocab_size: int,
    seed: int,
) -> dict:
    """Permutation equivariance of `tokens` without positional encoding (the no_pos run, else a fresh
    model), then with it (the full run, else a fresh model with learned positions)."""
    return {
        "no_pe": permutation_equivariance(
            models.get("no_pos") or _fresh(cfg, "none", vocab_size, seed), tokens, trials, seed
        ),
        "with_pe": permutation_equivariance(
            models["full"] if cfg.pos_encoding != "none" else _fresh(cfg, "learned", vocab_size, seed),
            tokens,
            trials,
            seed,
        ),
    }


def _ablation_metrics(
    rows: list[dict], permutation: dict, scaling: dict, accounting: dict, depth: list[dict]
) -> dict[str, float]:
    """The study's flat headline numbers: each run's losses and entropy, the checks and the depth study."""
    metrics = {
        f"{r['run']}/{k}": float(r[k]) for r in rows for k in ("val_loss", "val_ppl", "delta_val_loss", "attn_entropy")
    }
    metrics.update(
        {
            "permutation/no_pe_rel_err": permutation["no_pe"]["max_rel_err"],
            "permutation/with_pe_rel_err": permutation["with_pe"]["max_rel_err"],
            "permutation/no_pe_causal_rel_err": permutation["no_pe"]["causal_max_rel_err"],
            "scaling/entropy_scaled": scaling["scaled"]["normalized_entropy"],
            "scaling/entropy_unscaled": scaling["unscaled"]["normalized_entropy"],
            "scaling/grad_norm_scaled": scaling["scaled"]["grad_norm"],
            "scaling/grad_norm_unscaled": scaling["unscaled"]["grad_norm"],
            "params/ffn_share": accounting["ffn_share"],
            **{
                f"depth/{r['n_layer']}_{'res' if r['residual'] else 'nores'}/{k}": float(r[k])
                for r in depth
                for k in ("val_loss", "first_layer_grad_norm_init")
            },
        }
    )
    return metrics


def _write_tables(
    out_dir: Path, rows: list[dict], permutation: dict, scaling: dict, accounting: dict, notes: list[str], depth: list
) -> tuple[Path, str]:
    """ablations.json (every table and the warnings) and ablations.md in `out_dir`: the JSON's path and
    the markdown."""
    table_path = write_json(
        out_dir / "ablations.json",
        {
            "table": rows,
            "permutation": permutation,
            "scaling": scaling,
            "accounting": accounting,
            "warnings": notes,
            "depth": depth,
        },
    )
    markdown = "\n\n".join(
        [
            ablation_markdown(rows),
            permutation_markdown(permutation),
            scaling_markdown(scaling),
            accounting_markdown(accounting),
            depth_markdown(depth),
        ]
    )
    (out_dir / "ablations.md").write_text(markdown + "\n", encoding="utf-8")
    return table_path, markdown


def first_layer_grad_norm(model: Transformer, x: torch.Tensor, y: torch.Tensor) -> float:
    """The gradient norm reaching the first block's parameters on one batch (what depth lets through)."""
    model.zero_grad(set_to_none=True)
    model.train()
    model(x, y)[1].backward()
    norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.h[0].parameters() if p.grad is not None]))
    model.zero_grad(set_to_none=True)
    return norm


def residual_depth_study(
    model_settings: TransformerSettings,
    train_settings: TrainSettings,
    s: AblationSettings,
    train_data: Blocks,
    val_data: Blocks,
    vocab_size: int,
    out_dir: Path,
) -> list[dict]:
    """Small Transformers at each of `s.depths`, with and without residual connections, trained on the
    same budget (`depth_steps`, same seed and batches): validation loss, and the gradient norm that
    reaches the first layer at init and after training."""
    T = min(s.depth_block_size, model_settings.block_size, train_data.block_size)
    ts = train_settings.model_copy(
        update={
            "max_steps": s.depth_steps,
            "lr_decay_steps": None,
            "warmup_steps": min(train_settings.warmup_steps, s.depth_steps // 5),
            "block_size": T,
            "eval_interval": 0,
            "eval_batches": 4,
            "log_interval": s.depth_steps,
            "checkpoint_interval": s.depth_steps,
        }
    )
    x, y = _probe_batch(val_data, min(8, val_data.n_blocks), T)
    workers = cpu_workers(s.workers, ts.device)
    ts = one_thread_each(ts, workers)
    grid = [(depth, residual) for depth in sorted(s.depths, reverse=True) for residual in (True, False)]
    jobs = [
        (
            TransformerSettings(
                **{
                    **model_settings.model_dump(),
                    "n_layer": depth,
                    "n_embd": s.depth_n_embd,
                    "n_head": max(1, s.depth_n_embd // 16),
                    "block_size": T,
                    "residual": residual,
                    "param_budget": None,
                    "dropout": 0.0,
                }
            ),
            vocab_size,
            ts,
            train_data,
            val_data,
            out_dir / f"depth{depth}_{'res' if residual else 'nores'}",
            x.numpy(),
            y.numpy(),
        )
        for depth, residual in grid
    ]
    done = dict(zip(grid, run_jobs(_train_depth, jobs, workers)))
    return [
        {"n_layer": depth, "residual": residual, **done[(depth, residual)]}
        for depth in s.depths
        for residual in (True, False)
    ]


def _train_run(cfg, vocab_size, ts, train_data, val_data, run_dir, resume, model_meta):
    """One ablation run (in a worker or here): its weights and its TrainResult."""
    seed_everything(ts.seed)  # every run starts from the same seed
    model = _build(cfg, vocab_size)
    # A no-residual deep stack may blow up; that is a finding, not a crash.
    res = train(
        model, train_data, val_data, ts, run_dir, resume=resume, model_meta=model_meta, raise_on_divergence=False
    )
    return weights_out(model), res


def _train_depth(cfg, vocab_size, ts, train_data, val_data, run_dir, x, y) -> dict:
    """One model of the residual depth study (in a worker or here): its row. x, y: numpy (B, T)."""
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    seed_everything(ts.seed)
    model = Transformer(cfg, vocab_size)
    g0 = first_layer_grad_norm(model, x, y)
    res = train(model, train_data, val_data, ts, run_dir, resume=False, raise_on_divergence=False)
    return {
        "val_loss": res.val_loss,
        "first_layer_grad_norm_init": g0,
        "first_layer_grad_norm_trained": first_layer_grad_norm(model.cpu(), x, y),
        "params": res.params,
    }


def _build(cfg: TransformerSettings, vocab_size: int) -> Transformer:
    """The model of `cfg`, a param_budget resolved for this very shape (each run meets the budget)."""
    resolved = resolve_settings("transformer", cfg, vocab_size)
    assert isinstance(resolved, TransformerSettings)  # the transformer family's settings
    return Transformer(resolved, vocab_size)


def _fresh(cfg: TransformerSettings, pos: str, vocab_size: int, seed: int) -> Transformer:
    seed_everything(seed)
    return _build(cfg.model_copy(update={"pos_encoding": pos}), vocab_size).eval()


def _probe_batch(data: Blocks, n_blocks: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first validation blocks as (x, y) int64 tensors, cropped to the model's context."""
    data = data.crop(min(block_size, data.block_size))
    x, y = data.batch(np.arange(min(n_blocks, data.n_blocks)))
    return x, y  # (B, T) each


# --------------------------------------------------------------------------------------------------
# Figures


def plot_ablation_losses(rows: list[dict]) -> Figure:
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    names = [r["run"] for r in rows]
    colors = ["tab:blue" if not r["baseline"] else "tab:orange" for r in rows]
    ax.bar(names, [r["val_loss"] for r in rows], color=colors)
    for i, r in enumerate(rows):
        ax.annotate(f"{r['val_loss']:.3f}", (i, r["val_loss"]), ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="validation loss (nats/token)", title="Transformer ablations (orange: switched off)")
    ax.tick_params(axis="x", labelrotation=20)
    return fig


def plot_ablation_curves(histories: dict[str, list[dict]]) -> Figure:
    """Each run's training loss at its log points (lines) and its validation loss where it was evaluated
    (markers of the same colour)."""
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    later = []  # the losses after the first sixth of each run: the axis shows them, not the first descent
    for name, hist in histories.items():
        train = [(h["step"], h["train/loss"]) for h in hist if "train/loss" in h]
        last = max((st for st, _ in train), default=0)
        later += [v for st, v in train if st > last / 6 and math.isfinite(v)]
        val = [(h["step"], h["val/loss"]) for h in hist if "val/loss" in h]
        (line,) = ax.plot(*zip(*train), lw=1, label=name) if train else ax.plot([], [], label=name)
        if val:
            ax.plot(*zip(*val), ls="none", marker="o", color=line.get_color())
    if later:
        lo, hi = min(later), max(later)
        ax.set_ylim(lo - 0.05 * (hi - lo + 0.1), hi + 0.1 * (hi - lo + 0.1))
    ax.set(xlabel="step", ylabel="loss (nats/token)", title="Ablation runs: training loss (lines), validation (dots)")
    ax.legend(fontsize=8)
    return fig


def plot_score_scaling(s: dict) -> Figure:
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    d = [u["head_dim"] for u in s["unit_variance"]]
    ax.plot(d, [u["entropy_scaled"] for u in s["unit_variance"]], marker="o", label="scaled by 1/√d")
    ax.plot(d, [u["entropy_unscaled"] for u in s["unit_variance"]], marker="o", label="unscaled")
    ax.set(
        xscale="log",
        xlabel="head size d",
        ylabel="normalised softmax entropy",
        ylim=(0, 1.05),
        title="Unit-variance q, k: unscaled scores saturate the softmax",
    )
    ax.legend()
    return fig
