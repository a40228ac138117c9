"""Manifests of the language models and what compares and tunes them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .base import Manifest
from .data import NgramRung


@dataclass(frozen=True, kw_only=True)
class NgramReference:
    """The count model a language model is judged against (from `NgramBaseline`): the order chosen on
    held-out data, and the whole ladder (order, validation loss) to place the model on."""

    model: str
    val_loss: float
    block_size: int
    n_targets: int
    tokenizer_sha256: str
    ladder: list[NgramRung] = field(default_factory=list)  # every rung, orders 1, 2, …


@dataclass(frozen=True, kw_only=True)
class LanguageModel(Manifest):
    """One trained language model (RNN, LSTM or Transformer): its weights, metrics and settings."""

    KIND = "language_model"
    VERSION = 2  # 2: the baseline is the count model chosen on held-out data, with its ladder

    name: str
    family: str  # recurrent | transformer
    weights: str  # model.safetensors
    tokenizer_sha256: str
    vocab_size: int
    metrics: dict[str, float] = field(default_factory=dict)  # MLflow's names: val/loss, params, …
    model_config: dict[str, Any] = field(default_factory=dict)  # the architecture that trained (resolved)
    train_settings: dict[str, Any] = field(default_factory=dict)  # the `train:` config as run
    attention_backend: dict[str, Any] = field(default_factory=dict)
    resumed_from_step: int = 0
    launch: dict[str, Any] = field(default_factory=dict)  # launcher, world size
    inputs: dict[str, str] = field(default_factory=dict)  # upstream asset → its Dagster run
    history: list[dict[str, Any]] = field(default_factory=list)  # the log points
    registered_model: dict[str, str] = field(default_factory=dict)
    baseline: NgramReference | None = None

    @property
    def val_loss(self) -> float:
        """The validation loss on the labels' whole validation split (`val/targets` targets)."""
        return float(self.metrics.get("val/loss", math.nan))

    @property
    def val_targets(self) -> int:
        return int(self.metrics.get("val/targets", -1))

    @property
    def params(self) -> int:
        return int(self.metrics.get("params", -1))

    @property
    def grad_clip(self) -> float:
        """The clip the training ran with (nan when the settings do not say)."""
        return float(self.train_settings.get("grad_clip", math.nan))

    @property
    def context_length(self) -> int | None:
        """The context it trained and was scored on (`data.context_length` of the labels', the model's
        and the training's block sizes), None if not recorded."""
        c = self.metrics.get("context_length")
        return None if c is None else int(c)


@dataclass(frozen=True, kw_only=True)
class ModelComparison(Manifest):
    KIND = "model_comparison"

    rows: list[dict[str, Any]] = field(default_factory=list)
    matched_time_s: float = math.nan
    accounting: dict[str, dict[str, Any]] = field(default_factory=dict)  # model → parameter accounting
    pairs: list[dict[str, Any]] = field(default_factory=list)
    seeds: dict[str, dict[str, float]] = field(default_factory=dict)
    settledness: dict[str, Any] = field(default_factory=dict)
    baseline: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class GradientStudy(Manifest):
    KIND = "gradient_study"

    rows: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    clip_grad: float | None = None


@dataclass(frozen=True, kw_only=True)
class RecurrentCost(Manifest):
    KIND = "recurrent_cost"

    rows: list[dict[str, Any]] = field(default_factory=list)
    fits: dict[str, dict[str, float]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TransformerAblations(Manifest):
    KIND = "transformer_ablations"

    table: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    permutation: dict[str, Any] = field(default_factory=dict)
    scaling: dict[str, Any] = field(default_factory=dict)
    depth: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class LrSweep(Manifest):
    KIND = "lr_sweep"

    chosen: dict[str, dict[str, float]] = field(default_factory=dict)  # model → lr, min_lr, warmup_steps, val_loss
    trials: list[dict[str, Any]] = field(default_factory=list)
    budget_steps: int
    mlflow_url: str = ""


@dataclass(frozen=True, kw_only=True)
class ScalingTrial:
    """One training of the scaling study: a family at a budget (its point, or a sweep trial)."""

    model: str
    budget: float  # training FLOPs asked for
    role: str  # point | sweep
    lr: float
    batch_size: int
    steps: int
    params: int
    val_loss: float
    train_seconds: float  # seconds of optimizer steps
    flops: float  # training FLOPs spent (flops_per_token × tokens)
    tokens: int
    epochs: float  # tokens / training targets
    reused: bool = False  # the input model itself (trained by the default run)
    lr_at_edge: bool = False  # a point chosen at the edge of its sweep's learning rates
    # validation | heldout: a sweep trial is scored on the training split's tail (what chooses), a point on
    # validation (what is judged); manifests written before the split read as validation
    scored_on: str = "validation"


@dataclass(frozen=True, kw_only=True)
class ScalingFit:
    """L(x) = l_inf + a · (x / x0)^(−alpha), with 95 % bootstrap intervals."""

    l_inf: float
    a: float
    alpha: float
    x0: float
    l_inf_lo: float
    l_inf_hi: float
    alpha_lo: float
    alpha_hi: float


@dataclass(frozen=True, kw_only=True)
class Crossing:
    """Where a curve passes a level or another curve: the central fit's value, the bootstrap's median
    and 95 % interval (inf where redraws never cross), the share of redraws that never cross, and the
    first measured x where it was seen passing (None: no measured point did)."""

    central: float
    median: float
    lo: float
    hi: float
    never: float
    measured: float | None = None


@dataclass(frozen=True, kw_only=True)
class FamilyScaling:
    noise: float  # seed noise of the final loss (nats)
    noise_measured: bool  # False: assumed (no spread of this family was measured)
    fit_flops: ScalingFit
    fit_seconds: ScalingFit
    passes_count_model_flops: Crossing
    passes_count_model_seconds: Crossing


@dataclass(frozen=True, kw_only=True)
class TransformerVsLstm:
    transformer: str
    lstm: str
    largest_budget: float
    transformer_loss: float
    lstm_loss: float
    lstm_minus_transformer: float  # > 0: the Transformer is ahead at the largest budget
    noise: float  # the two families' seed noise combined
    transformer_drop: float  # loss gained from the smallest budget to the largest
    lstm_drop: float
    per_flop: Crossing  # where the Transformer's curve passes the LSTM's, in FLOPs
    per_second: Crossing  # … in training seconds


@dataclass(frozen=True, kw_only=True)
class Scaling(Manifest):
    """The scaling job: each family at growing training budgets, the fits and the crossings."""

    KIND = "scaling"

    budgets: list[float] = field(default_factory=list)
    trials: list[ScalingTrial] = field(default_factory=list)
    families: dict[str, FamilyScaling] = field(default_factory=dict)
    count_model: NgramRung
    versus: TransformerVsLstm | None = None
    tokenizer_sha256: str
    n_targets: int
    settings: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)  # the CPU (or GPU) it ran on
