"""Manifests of the language models and what compares and tunes them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .base import Manifest, metric_group
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

    def grad_norms(self) -> list[tuple[float, float]]:
        """(before, after clipping) at every log point that recorded both."""
        return [
            (float(h["grad_norm"]), float(h["grad_norm_clipped"]))
            for h in self.history
            if "grad_norm" in h and "grad_norm_clipped" in h
        ]

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
class ParamComponents:
    """Parameters per component of a Transformer, counted from its tensors (a tied matrix once)."""

    token_embedding: int
    positional: int
    attention: int
    ffn: int
    norms: int
    head: int


@dataclass(frozen=True, kw_only=True)
class ParamAccounting:
    """Where a Transformer's parameters sit, and the FFN's share of its blocks' (attention + FFN + norms)."""

    components: ParamComponents
    total: int
    non_embedding: int
    blocks: int
    ffn_share: float
    ffn_share_formula: float  # 2m / (2m + 4) for FFN width m·d
    about_two_thirds: bool  # within 0.05 of 2/3
    tied: bool
    n_layer: int
    n_embd: int
    vocab_size: int


@dataclass(frozen=True, kw_only=True)
class SeedSpread:
    """One model's final validation loss over its seeds."""

    seeds: int
    mean: float
    min: float
    max: float
    spread: float  # max − min


@dataclass(frozen=True, kw_only=True)
class ModelComparison(Manifest):
    KIND = "model_comparison"

    rows: list[dict[str, Any]] = field(default_factory=list)
    matched_time_s: float = math.nan
    accounting: dict[str, ParamAccounting] = field(default_factory=dict)  # Transformer → its parameters
    pairs: list[dict[str, Any]] = field(default_factory=list)
    seeds: dict[str, SeedSpread] = field(default_factory=dict)
    settledness: dict[str, Any] = field(default_factory=dict)
    baseline: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class GradientStudy(Manifest):
    KIND = "gradient_study"

    rows: list[GradientFactor] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    clip_grad: float | None = None

    @property
    def clipping(self) -> ClipExperiment | None:
        """The clipping experiment's outcome (metrics under "clip/"), None when it did not run."""
        return metric_group(ClipExperiment, self.metrics, "clip/", f"gradient_study {self.asset}".strip())


@dataclass(frozen=True, kw_only=True)
class GradientFactor:
    """How the gradient of one recurrent model (`variant`: contractive, expansive, fresh, trained) scales per step."""

    model: str
    variant: str
    step_factor: float  # per step back in time, fitted over the sequence
    seq_len: int = 0
    spectral_radius: float = math.nan
    norm_d1: float = math.nan
    norm_dmax: float = math.nan
    fit_r2: float = math.nan


@dataclass(frozen=True, kw_only=True)
class ClipExperiment:
    """One expansive RNN trained with and without clipping: 1.0 / 0.0 flags, as logged."""

    unclipped_diverged: float
    clipped_diverged: float
    clipped_trained: float
    max_grad_norm_clipped: float | None = None
    steps_clip_engaged: float | None = None


@dataclass(frozen=True, kw_only=True)
class RecurrentCost(Manifest):
    KIND = "recurrent_cost"

    rows: list[dict[str, Any]] = field(default_factory=list)
    fits: dict[str, dict[str, float]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class AblationRun:
    """One row of the ablation table: the full model, or one part of it changed, trained the same way."""

    run: str
    val_loss: float
    change: str = ""
    baseline: str = ""  # the run it is compared with ("" for the full model)
    n_layer: int = 0
    params: int = 0
    steps: int = 0
    train_loss: float = math.nan
    val_ppl: float = math.nan
    delta_val_loss: float = math.nan  # over its baseline's
    tokens_per_s: float = math.nan
    attn_entropy: float = math.nan  # normalised softmax entropy (1: uniform, 0: one-hot)


@dataclass(frozen=True, kw_only=True)
class PermutationProbe:
    """Permute the input tokens: how far the outputs are from the permuted outputs (relative error)."""

    pos_encoding: str
    tokens: list[int]
    max_rel_err: float  # bidirectional attention, over the trials
    reversal_rel_err: float
    causal_max_rel_err: float
    equivariant: bool


@dataclass(frozen=True, kw_only=True)
class PermutationStudy:
    no_pe: PermutationProbe
    with_pe: PermutationProbe


@dataclass(frozen=True, kw_only=True)
class UnitVarianceProbe:
    """Causal softmax over q·k of unit-variance q and k with `head_dim` dimensions, scaled by 1/√d or not."""

    head_dim: int
    entropy_scaled: float  # normalised entropy of the rows
    entropy_unscaled: float
    max_weight_scaled: float
    max_weight_unscaled: float
    score_grad_rms_scaled: float  # the gradient reaching the scores
    score_grad_rms_unscaled: float


@dataclass(frozen=True, kw_only=True)
class SoftmaxScaling:
    """The √d study: the language model's attention at init with and without the scale, and the probes."""

    head_dim: int = 0  # the language model's
    scaled: dict[str, float] = field(default_factory=dict)
    unscaled: dict[str, float] = field(default_factory=dict)
    unit_variance: list[UnitVarianceProbe] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class DepthRun:
    """One run of the residual depth study."""

    n_layer: int
    residual: bool
    val_loss: float
    first_layer_grad_norm_init: float  # the gradient reaching the first layer, at init
    first_layer_grad_norm_trained: float = math.nan
    params: int = 0


@dataclass(frozen=True, kw_only=True)
class TransformerAblations(Manifest):
    KIND = "transformer_ablations"

    table: list[AblationRun] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    permutation: PermutationStudy | None = None
    scaling: SoftmaxScaling | None = None
    depth: list[DepthRun] = field(default_factory=list)


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
