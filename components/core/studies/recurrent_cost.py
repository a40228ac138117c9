"""What a recurrent model costs as the sequence grows: wall time per training step and per generated token.

A recurrent layer must finish step t before it can start step t + 1, so a training step over T
tokens does T sequential steps: its time grows linearly in T (a straight line through the rows,
slope = ms per token), and tokens/s stays flat — there is no parallelism over time to exploit, only
over the batch and the hidden units. Generation carries a fixed-size state, so the time per new
token does not depend on how long the context already is. Both numbers feed the long-context
comparison with the Transformer (whose attention is parallel over time but grows with T).

Method: for each model and length, `warmup` untimed repetitions, then the median of `repeats`
timed ones (time.perf_counter, with a CUDA synchronize around each on a GPU). Inputs are random
token ids: the time of these models does not depend on which tokens they read.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..device import DeviceSetting, median_seconds, resolve_device, seed_everything
from ..models.recurrent import RecurrentLM, RecurrentSettings, require_recurrent
from ..models.sizing import count_parameters
from .decode_timing import recurrent_prefill_decode


class RecurrentCostSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq_lens: list[int] = Field(default=[64, 128, 256, 512, 1024, 2048], description="Sequence lengths T to time.")
    batch_size: int = Field(default=8, ge=1, description="Sequences per training step (and per generation batch).")
    repeats: int = Field(default=3, ge=1, description="Timed repetitions per point (the median is reported).")
    warmup: int = Field(default=1, ge=0, description="Untimed repetitions before timing each point.")
    gen_tokens: int = Field(
        default=32, ge=1, description="Tokens generated after a T-token prompt to time one generation step."
    )
    device: DeviceSetting = Field(default="auto", description="Where to time: 'auto' = CUDA if present, else CPU.")
    threads: int = Field(default=0, ge=0, description="torch.set_num_threads when > 0 (CPU).")
    seed: int = Field(default=0, description="Seed of the models' initialisation and the random inputs.")

    @field_validator("seq_lens")
    @classmethod
    def _lens(cls, v: list[int]) -> list[int]:
        if not v or any(t < 1 for t in v):
            raise ValueError(f"seq_lens must be a non-empty list of lengths >= 1, got {v}")
        return sorted(set(v))


def timing_optimizer(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """The AdamW that `train_step_seconds` steps (a small lr: the timed steps barely move the weights)."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=device.type == "cuda")


def train_step_seconds(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device,
    *,
    warmup: int,
    repeats: int,
) -> float:
    """Median seconds of one training step (forward, backward, optimizer) of a model with the
    forward(idx, targets) -> (logits, loss) contract: the same measurement for every family."""
    model.train()

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return median_seconds(step, device, warmup=warmup, repeats=repeats)


def measure_recurrent_cost(
    models: dict[str, nn.Module] | dict[str, RecurrentSettings],
    settings: RecurrentCostSettings,
    *,
    vocab_size: int | None = None,
) -> list[dict]:
    """Rows {model, seq_len, batch_size, train_step_ms, tokens_per_s, prefill_ms, ms_per_generated_token, params}.

    `models` maps a name to a built `RecurrentLM` or to its settings (then `vocab_size` is needed).
    Built models are timed on a copy, so the caller's weights and device are untouched.
    """
    s = settings
    if s.threads > 0:
        torch.set_num_threads(s.threads)
    device, _ = resolve_device(s.device)
    rows = []
    for name, m in models.items():
        if isinstance(m, RecurrentSettings):
            if vocab_size is None:
                raise ValueError("measure_recurrent_cost: vocab_size is needed to build models from settings")
            seed_everything(s.seed)
            m = RecurrentLM(m, vocab_size)
        else:
            m = require_recurrent(copy.deepcopy(m), "measure_recurrent_cost")
        m = m.to(device)
        vocab = m.vocab_size
        opt = timing_optimizer(m, device)
        gen = torch.Generator(device="cpu").manual_seed(s.seed)
        for T in s.seq_lens:
            x = torch.randint(1, vocab, (s.batch_size, T), generator=gen).to(device)  # (B, T)
            y = torch.randint(1, vocab, (s.batch_size, T), generator=gen).to(device)  # (B, T)
            step_s = train_step_seconds(m, opt, x, y, device, warmup=s.warmup, repeats=s.repeats)

            m.eval()
            prefill_s, decode_s, _ = recurrent_prefill_decode(
                m, x, s.gen_tokens, device, warmup=s.warmup, repeats=s.repeats
            )
            rows.append(
                {
                    "model": name,
                    "seq_len": T,
                    "batch_size": s.batch_size,
                    "train_step_ms": 1000 * step_s,
                    "tokens_per_s": s.batch_size * T / step_s,
                    "prefill_ms": 1000 * prefill_s,
                    "ms_per_generated_token": 1000 * decode_s / s.gen_tokens,
                    "params": count_parameters(m),
                    # the critical path of a forward pass: every layer's step t waits for its step t − 1
                    "sequential_steps": T * m.config.n_layer,
                    "device": str(device),
                }
            )
    return rows


def linear_fit(x: list[float], y: list[float]) -> dict[str, float]:
    """Least-squares y = slope * x + intercept, with R^2."""
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(xa) < 2:
        return {"slope": float("nan"), "intercept": float("nan"), "r2": float("nan")}
    slope, intercept = np.polyfit(xa, ya, 1)
    ss_res = float(((ya - (slope * xa + intercept)) ** 2).sum())
    ss_tot = float(((ya - ya.mean()) ** 2).sum())
    return {"slope": float(slope), "intercept": float(intercept), "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0}


def fit_cost(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per model: train-step time vs T (slope = ms per token, R^2 near 1 = linear) and the generation
    time per token vs context length (slope near 0 = independent of the context)."""
    fits = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == name]
        T = [r["seq_len"] for r in rs]
        train = linear_fit(T, [r["train_step_ms"] for r in rs])
        gen = linear_fit(T, [r["ms_per_generated_token"] for r in rs])
        g = [r["ms_per_generated_token"] for r in rs]
        fits[name] = {
            "train_ms_per_token": train["slope"],
            "train_intercept_ms": train["intercept"],
            "train_r2": train["r2"],
            "gen_ms_per_token_mean": float(np.mean(g)),
            "gen_slope_ms_per_context_token": gen["slope"],
            "gen_max_over_min": max(g) / min(g) if min(g) > 0 else float("nan"),
        }
    return fits


def plot_cost(rows: list[dict], fits: dict[str, dict[str, float]] | None = None) -> Figure:
    fits = fits or fit_cost(rows)
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_train, ax_gen = fig.subplots(1, 2)
    for name in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == name]
        T = np.array([r["seq_len"] for r in rs], dtype=np.float64)
        f = fits[name]
        (line,) = ax_train.plot(T, [r["train_step_ms"] for r in rs], "o", label=f"{name} (R²={f['train_r2']:.3f})")
        ax_train.plot(T, f["train_ms_per_token"] * T + f["train_intercept_ms"], "-", color=line.get_color(), alpha=0.6)
        ax_gen.plot(T, [r["ms_per_generated_token"] for r in rs], "o-", label=name)
    ax_train.set_xlabel("sequence length T (tokens)")
    ax_train.set_ylabel("training step (ms)")
    ax_train.set_title("training step time vs length (line: linear fit)")
    ax_gen.set_xlabel("context length before generating (tokens)")
    ax_gen.set_ylabel("ms per generated token")
    ax_gen.set_title("generation: time per new token")
    ax_gen.set_ylim(bottom=0)
    for ax in (ax_train, ax_gen):
        ax.grid(True, alpha=0.3)
        ax.legend()
    return fig


@dataclass
class RecurrentCostResult:
    rows: list[dict]
    fits: dict[str, dict[str, float]]
    figures: dict[str, Figure] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        out = {}
        for name, f in self.fits.items():
            out[f"cost/{name}/train_ms_per_token"] = f["train_ms_per_token"]
            out[f"cost/{name}/train_r2"] = f["train_r2"]
            out[f"cost/{name}/gen_ms_per_token"] = f["gen_ms_per_token_mean"]
        return out


def recurrent_cost(
    models: dict[str, nn.Module] | dict[str, RecurrentSettings],
    settings: RecurrentCostSettings,
    *,
    vocab_size: int | None = None,
) -> RecurrentCostResult:
    """`measure_recurrent_cost` + the linear fits + the figure, for an asset to log."""
    rows = measure_recurrent_cost(models, settings, vocab_size=vocab_size)
    fits = fit_cost(rows)
    return RecurrentCostResult(rows=rows, fits=fits, figures={"recurrent_cost": plot_cost(rows, fits)})
