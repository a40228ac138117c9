"""Exploding and vanishing gradients in recurrent nets, measured.

Backpropagation through time multiplies one Jacobian per step: dL_T/dh_t = dL_T/dh_T * prod_{k=t+1..T} dh_k/dh_{k-1}.
For the Elman RNN dh_k/dh_{k-1} = diag(tanh'(.)) W_hh, so the gradient reaching a step at distance
d = T - t shrinks or grows roughly like rho^d, with rho set by W_hh's spectral radius (and shrunk by
tanh saturation): below 1 the signal from far steps vanishes, above 1 it can explode. The LSTM's
cell path c_t = f * c_{t-1} + i * g multiplies by the forget gate instead, which it can learn to
hold near 1, so its gradients decay more slowly.

What this module measures:
- `hidden_grad_norms`: ||dL_T/dh_t|| for t = 1..T, the loss taken at the last step only, h_t the
  full hidden state (all layers; for the LSTM h, not c) — in float64 on a copy of the model, so
  norms of 1e-100 are still resolved.
- `fit_step_factor`: the per-step factor, exp of the slope of a least-squares line through
  log(norm) against distance (distance 0, the step read by the head, excluded).
- `scale_spectral_radius`: a copy of a model with every recurrent matrix (each gate's block for
  the LSTM) rescaled to a given spectral radius: 0.5 contracts, 1.5 and up expands.
- `clipping_experiment`: the same small RNN trained at a high learning rate with and without
  gradient-norm clipping, through the shared training loop.
- `gradient_study`: all of it for a set of models, with the figures.
"""

from __future__ import annotations

import copy
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field

from ..data import IGNORE_INDEX, Blocks
from ..device import seed_everything
from ..errors import ConfigError, PipelineInputError
from ..models.recurrent import RecurrentLM, RecurrentSettings
from ..train_settings import TrainSettings
from ..training import train


class GradientStudySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq_len: int = Field(
        default=256, ge=1, description="T: steps back-propagated through (the labels' block_size must hold it)."
    )
    n_sequences: int = Field(
        default=8, ge=1, description="Sequences (validation blocks) the norms are averaged over (geometric mean)."
    )
    contractive_radius: float = Field(
        default=0.5,
        gt=0,
        allow_inf_nan=False,
        description="Spectral radius of the contractive synthetic recurrent weights.",
    )
    expansive_radius: float = Field(
        default=3.0,
        gt=0,
        allow_inf_nan=False,
        description="Spectral radius of the expansive synthetic recurrent weights (> 1).",
    )
    seed: int = Field(default=0, description="Seed of the fresh (untrained) models and of the clipping runs.")
    clip_steps: int = Field(default=60, ge=1, description="Training steps of each clipping-experiment run.")
    clip_lr: float = Field(
        default=8.0,
        gt=0,
        allow_inf_nan=False,
        description="The (too) high learning rate of the clipping experiment (plain SGD).",
    )
    clip_grad: float = Field(
        default=0.25,
        gt=0,
        allow_inf_nan=False,
        description="Max gradient norm of the clipped run (about the typical norm, so only the spikes are cut).",
    )
    clip_batch_size: int = Field(default=16, ge=1, description="Batch size of the clipping experiment.")
    clip_block_size: int = Field(default=64, ge=1, description="Context length of the clipping experiment.")
    clip_blowup: float = Field(
        default=2.0,
        gt=0,
        allow_inf_nan=False,
        description="A run counts as diverged when its loss is NaN/inf or ever exceeds clip_blowup x its first loss.",
    )


# ----------------------------------------------------------------------------------------------
# Norms of dL_T / dh_t


def hidden_grad_norms(model: RecurrentLM, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """||dL_T/dh_t|| for t = 1..T, as an array of shape (T,) indexed by t - 1.

    x, y: (B, T) inputs and targets; the loss is the cross-entropy of the last step only. The
    recurrence runs one step at a time so each h_t is its own graph node whose gradient can be
    kept. Norms are per sequence (over layers and units), then a geometric mean over sequences.
    """
    m = copy.deepcopy(model).to(device="cpu", dtype=torch.float64).eval()  # eval: no dropout noise
    x, y = x.cpu(), y.cpu()
    keep = y[:, -1] != IGNORE_INDEX
    if not keep.any():
        raise PipelineInputError(
            "every sequence's last target is padding; pass blocks whose last target is a real token"
        )
    x, y = x[keep], y[keep]
    B, T = x.shape
    emb = m.embed(x)  # (B, T, E)
    state = m.init_state(B)
    hs = []
    for t in range(T):
        _, state = m.recur(emb[:, t : t + 1], state)  # one step: state (L, B, H) or (h, c)
        h = state[0] if isinstance(state, tuple) else state
        h.retain_grad()
        hs.append(h)
    logits = m.head(hs[-1][-1])  # (B, V) from the top layer's h_T
    loss = F.cross_entropy(logits, y[:, -1], reduction="sum")  # sum: each sequence keeps its own gradient scale
    loss.backward()
    norms = torch.stack([h.grad.pow(2).sum(dim=(0, 2)).sqrt() for h in hs], dim=1)  # (B, T)
    log_norms = norms.clamp_min(1e-300).log()
    return log_norms.mean(dim=0).exp().numpy()  # (T,) geometric mean over sequences


def fit_step_factor(norms: np.ndarray) -> tuple[float, float]:
    """Per-step growth (> 1) or decay (< 1) factor and the R^2 of the log-linear fit.

    Fits log ||dL_T/dh_{T-d}|| = a + d * log(factor) over distances d >= 1 (d = 0 is the step the
    head reads directly, a different path).
    """
    norms = np.asarray(norms, dtype=np.float64)
    d = np.arange(len(norms))[::-1]  # distance T - t for t = 1..T
    ok = (d >= 1) & np.isfinite(norms) & (norms > 0)
    if ok.sum() < 2:
        return float("nan"), float("nan")
    logn = np.log(norms[ok])
    slope, intercept = np.polyfit(d[ok], logn, 1)
    resid = logn - (intercept + slope * d[ok])
    ss_tot = float(((logn - logn.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return float(math.exp(slope)), r2


def recurrent_matrices(model: RecurrentLM) -> list[torch.Tensor]:
    """The recurrent weight matrices W_hh, as (H, H) views: one per layer (RNN) or per gate and layer (LSTM)."""
    H = model.config.hidden_size
    mats = []
    for k in range(model.config.n_layer):
        w = getattr(model.rnn, f"weight_hh_l{k}")  # (G*H, H)
        mats.extend(w.data[g * H : (g + 1) * H] for g in range(w.shape[0] // H))
    return mats


def spectral_radius(w: torch.Tensor) -> float:
    return float(torch.linalg.eigvals(w.double()).abs().max())


@torch.no_grad()
def scale_spectral_radius(model: RecurrentLM, radius: float) -> RecurrentLM:
    """A copy of `model` with every recurrent matrix rescaled to spectral radius `radius`."""
    out = copy.deepcopy(model)
    for w in recurrent_matrices(out):
        w.mul_(radius / max(spectral_radius(w), 1e-12))  # in place on the view: updates the parameter
    return out


# ----------------------------------------------------------------------------------------------
# Clipping experiment


@dataclass
class ClippingResult:
    steps: list[int]
    loss_unclipped: list[float]  # ends early (with NaN appended) when the run diverged
    loss_clipped: list[float]
    unclipped_diverged: bool
    clipped_diverged: bool
    clipped_trained: bool  # finite throughout and its last losses below its first
    max_grad_norm_unclipped: float
    max_grad_norm_clipped_after_clip: float
    notes: list[str]
    max_grad_norm_clipped_before_clip: float = float("nan")  # the clipped run's norm before its clip
    steps_clip_engaged: int = 0  # steps of the clipped run whose norm exceeded the threshold (the clip acted)

    @property
    def shows_clipping_helps(self) -> bool:
        return self.unclipped_diverged and not self.clipped_diverged and self.clipped_trained


def _trained(losses: list[float]) -> bool:
    tail = losses[-5:]
    return bool(losses) and all(math.isfinite(v) for v in losses) and float(np.mean(tail)) < losses[0]


def _diverged(losses: list[float], blowup: float) -> bool:
    if not losses:
        return True
    if any(not math.isfinite(v) for v in losses):
        return True
    return max(losses) > blowup * losses[0]


def clipping_experiment(
    model_config: RecurrentSettings,
    vocab_size: int,
    train_data: Blocks,
    val_data: Blocks,
    settings: GradientStudySettings,
    out_dir: str | Path | None = None,
) -> ClippingResult:
    """Train the same freshly initialised RNN at a high learning rate with clipping off and on.

    Plain SGD: its update is lr * gradient, so one exploding gradient throws the weights off a
    cliff unless its norm is clipped (Adam's per-coordinate normalisation would hide the effect).
    """
    s = settings
    runs, notes = {}, []
    workdir = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="clipping-"))
    for name, clip in (("unclipped", 0.0), ("clipped", s.clip_grad)):
        seed_everything(s.seed)
        # same init for both runs, trained at the experiment's context
        model = RecurrentLM(
            model_config.model_copy(update={"block_size": min(s.clip_block_size, train_data.block_size)}), vocab_size
        )
        ts = TrainSettings(
            max_steps=s.clip_steps,
            batch_size=s.clip_batch_size,
            lr=s.clip_lr,
            min_lr=s.clip_lr,
            warmup_steps=0,
            weight_decay=0.0,
            beta1=0.0,
            grad_clip=clip,
            eval_interval=0,
            eval_batches=1,
            log_interval=1,
            checkpoint_interval=s.clip_steps,
            seed=s.seed,
            device="cpu",
            dtype="float32",
            optimizer="sgd",
        )
        res = train(model, train_data, val_data, ts, workdir / name, resume=False, raise_on_divergence=False)
        curve = [h["train/loss"] for h in res.history if "train/loss" in h]
        if res.steps < s.clip_steps:  # stopped on a non-finite loss
            curve.append(float("nan"))
            notes.extend(f"{name}: {w}" for w in res.warnings if "diverged" in w)
        runs[name] = (curve, res.history)
    (lu, hu), (lc, hc) = runs["unclipped"], runs["clipped"]
    return ClippingResult(
        steps=list(range(1, max(len(lu), len(lc)) + 1)),
        loss_unclipped=lu,
        loss_clipped=lc,
        unclipped_diverged=_diverged(lu, s.clip_blowup),
        clipped_diverged=_diverged(lc, s.clip_blowup),
        clipped_trained=_trained(lc),
        max_grad_norm_unclipped=max((h["grad_norm"] for h in hu if "grad_norm" in h), default=float("nan")),
        max_grad_norm_clipped_after_clip=max(
            (h["grad_norm_clipped"] for h in hc if "grad_norm_clipped" in h), default=float("nan")
        ),
        notes=notes,
        max_grad_norm_clipped_before_clip=max((h["grad_norm"] for h in hc if "grad_norm" in h), default=float("nan")),
        steps_clip_engaged=sum(h["grad_norm"] > s.clip_grad for h in hc if "grad_norm" in h),
    )


# ----------------------------------------------------------------------------------------------
# The study


@dataclass
class GradientStudyResult:
    rows: list[dict]  # one per (model, variant): spectral radius, factor, R^2, norms at d = 1 and d = T-1
    norms: dict[str, dict[str, list[float]]]  # model -> variant -> ||dL_T/dh_t|| by distance d = 0..T-1
    clipping: Optional[ClippingResult]
    figures: dict[str, Figure] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        out = {f"grad/{r['model']}/{r['variant']}/step_factor": r["step_factor"] for r in self.rows}
        if self.clipping is not None:
            out["clip/unclipped_diverged"] = float(self.clipping.unclipped_diverged)
            out["clip/clipped_diverged"] = float(self.clipping.clipped_diverged)
            out["clip/clipped_trained"] = float(self.clipping.clipped_trained)
            out["clip/max_grad_norm_unclipped"] = self.clipping.max_grad_norm_unclipped
            out["clip/max_grad_norm_clipped"] = self.clipping.max_grad_norm_clipped_after_clip
            out["clip/max_grad_norm_before_clip"] = self.clipping.max_grad_norm_clipped_before_clip
            out["clip/steps_clip_engaged"] = float(self.clipping.steps_clip_engaged)
        return out


def gradient_study(
    models: dict[str, RecurrentLM],
    data: Blocks,
    settings: GradientStudySettings,
    *,
    train_data: Blocks | None = None,
    clip_model_config: RecurrentSettings | None = None,
    out_dir: str | Path | None = None,
) -> GradientStudyResult:
    """Gradient norms vs distance for each model (e.g. {"rnn": trained_rnn, "lstm": trained_lstm}).

    Per model, four variants: trained (as given), fresh (same config, new init), contractive and
    expansive (fresh with the recurrent weights rescaled to the settings' radii). `data` supplies
    the sequences (its first n_sequences blocks, cropped to seq_len). With `train_data` and
    `clip_model_config` (an RNN config) given, the clipping experiment runs too.
    """
    s = settings
    if s.seq_len > data.block_size:
        raise ConfigError(
            f"gradient_study.seq_len={s.seq_len} is beyond what the labels hold (block_size {data.block_size}); "
            "lower seq_len or rebuild the labels with a larger block_size"
        )
    blocks = data.crop(s.seq_len)
    usable = np.flatnonzero(blocks.y[:, -1] != IGNORE_INDEX)[: s.n_sequences]
    if len(usable) == 0:
        raise PipelineInputError("no block has a real last target to take the loss at; rebuild the labels")
    x, y = blocks.batch(usable)

    rows, norms = [], {}
    for name, trained in models.items():
        seed_everything(s.seed)
        fresh = RecurrentLM(trained.config, trained.vocab_size)
        variants = {
            "trained": trained,
            "fresh": fresh,
            "contractive": scale_spectral_radius(fresh, s.contractive_radius),
            "expansive": scale_spectral_radius(fresh, s.expansive_radius),
        }
        norms[name] = {}
        for variant, m in variants.items():
            n = hidden_grad_norms(m, x, y)
            factor, r2 = fit_step_factor(n)
            norms[name][variant] = n[::-1].tolist()  # by distance d = 0..T-1
            rows.append(
                {
                    "model": name,
                    "variant": variant,
                    "spectral_radius": max(spectral_radius(w) for w in recurrent_matrices(m)),
                    "step_factor": factor,
                    "fit_r2": r2,
                    "norm_d1": float(n[-2]) if len(n) > 1 else float("nan"),
                    "norm_dmax": float(n[0]),
                    "seq_len": s.seq_len,
                }
            )

    clipping = None
    if train_data is not None and clip_model_config is not None:
        vocab_size = (
            next(iter(models.values())).vocab_size
            if models
            else int(max(np.asarray(data.x).max(), np.asarray(train_data.x).max())) + 1
        )
        clipping = clipping_experiment(clip_model_config, vocab_size, train_data, data, s, out_dir)

    result = GradientStudyResult(rows=rows, norms=norms, clipping=clipping)
    result.figures["grad_norms"] = plot_grad_norms(result)
    if clipping is not None:
        result.figures["clipping"] = plot_clipping(clipping, s)
    return result


# ----------------------------------------------------------------------------------------------
# Figures


def plot_grad_norms(result: GradientStudyResult) -> Figure:
    names = list(result.norms)
    fig = Figure(figsize=(5.5 * max(1, len(names)), 4.2), layout="constrained")
    axes = fig.subplots(1, max(1, len(names)), squeeze=False)[0]
    factor = {(r["model"], r["variant"]): r["step_factor"] for r in result.rows}
    for ax, name in zip(axes, names):
        for variant, curve in result.norms[name].items():
            d = np.arange(len(curve))
            ax.semilogy(d, curve, label=f"{variant} (x{factor[(name, variant)]:.3g}/step)")
        ax.set_title(f"{name}: ||dL_T/dh_(T-d)||")
        ax.set_xlabel("distance d = T - t (steps)")
        ax.set_ylabel("gradient norm (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def plot_clipping(c: ClippingResult, s: GradientStudySettings) -> Figure:
    fig = Figure(figsize=(6, 4.2), layout="constrained")
    ax = fig.subplots()
    for label, curve in (
        (f"no clipping{' (diverged)' if c.unclipped_diverged else ''}", c.loss_unclipped),
        (f"clip at {s.clip_grad}{' (diverged)' if c.clipped_diverged else ''}", c.loss_clipped),
    ):
        vals = np.array(curve, dtype=np.float64)
        steps = np.arange(1, len(vals) + 1)
        ax.plot(steps, vals, label=label)
        bad = ~np.isfinite(vals)
        if bad.any():
            ax.axvline(steps[bad][0], color="red", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (log scale)")
    ax.set_title(f"RNN, SGD at lr={s.clip_lr}: with vs without gradient clipping")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig
