"""Manifests of the language models and what compares and tunes them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .base import Manifest


@dataclass(frozen=True, kw_only=True)
class NgramReference:
    """The count model a language model is judged against (from `NgramBaseline`)."""

    model: str
    val_loss: float
    block_size: int
    n_targets: int
    tokenizer_sha256: str


@dataclass(frozen=True, kw_only=True)
class LanguageModel(Manifest):
    """One trained language model (RNN, LSTM or Transformer): its weights, metrics and settings."""

    KIND = "language_model"

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
