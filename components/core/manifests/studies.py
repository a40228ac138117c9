"""Manifests of the studies: long-context cost, inside the Transformer, the memory tasks,
quantization and export, and the run's report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .base import Manifest

Rows = list[dict[str, Any]]


# --- long context


@dataclass(frozen=True, kw_only=True)
class AttentionCost(Manifest):
    KIND = "attention_cost"

    rows: Rows = field(default_factory=list)
    fits: Rows = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GenerationCost(Manifest):
    KIND = "generation_cost"

    rows: Rows = field(default_factory=list)
    fits: Rows = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class LongContextCost(Manifest):
    KIND = "long_context_cost"

    exponents: Rows = field(default_factory=list)
    crossovers: Rows = field(default_factory=list)
    arithmetic: Rows = field(default_factory=list)
    kv_check: Rows = field(default_factory=list)
    scores_check: Rows = field(default_factory=list)
    train_rows: Rows = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ContextUsage(Manifest):
    KIND = "context_usage"

    curves: dict[str, list[float]] = field(default_factory=dict)
    summaries: Rows = field(default_factory=list)
    window_gaps: Rows = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


# --- inside the Transformer


@dataclass(frozen=True, kw_only=True)
class AttentionHeads(Manifest):
    KIND = "attention_heads"

    heads: Rows = field(default_factory=list)
    ablation: Rows = field(default_factory=list)
    differ: Rows = field(default_factory=list)  # per layer: the costliest against the cheapest head, held out
    base_loss: float = math.nan
    one_head_loss: float = math.nan
    thresholds: dict[str, float] = field(default_factory=dict)
    induction: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class FactSeed:
    """One seed of the fact model (studies/facts.py): intervals are 95 % bootstrap over facts."""

    seed: int
    val_loss: float
    steps: int
    facts: int
    known_share: float  # facts whose answer its own subject raises
    knowledge_mean: float  # nats: log p(answer | its subject) − mean over the relation's other subjects
    knowledge_lo: float
    knowledge_hi: float
    extra_drop_mean: float  # what the chosen neurons take from it beyond activation-matched ones
    extra_drop_lo: float
    extra_drop_hi: float
    control_knowledge_mean: float  # the untrained twin (same shape, same seed)
    control_extra_drop_mean: float
    control_extra_drop_lo: float
    control_extra_drop_hi: float
    extra_drop_over_control_mean: float  # paired per fact: trained minus untrained
    extra_drop_over_control_lo: float
    extra_drop_over_control_hi: float


@dataclass(frozen=True, kw_only=True)
class FfnMemories(Manifest):
    KIND = "ffn_memories"
    VERSION = 2  # 2: facts on word-sized units, a fact model per seed (was: one next byte on the byte model)

    neurons: Rows = field(default_factory=list)  # the byte Transformer's most selective neurons
    facts_found: int = 0  # facts of the corpus (pairs of the analogy relations it names together)
    seeds: list[FactSeed] = field(default_factory=list)
    fact_rows: Rows = field(default_factory=list)  # per seed and fact
    made_up: Rows = field(default_factory=list)
    prompts_in_training_text: list[str] = field(default_factory=list)  # held-out prompts the corpus holds (none)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class AttentionTopk(Manifest):
    KIND = "attention_topk"

    rows: Rows = field(default_factory=list)
    block_size: int = 0
    blocks: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ArticleExamples(Manifest):
    KIND = "article_examples"

    word_order: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    attention_mix: Rows = field(default_factory=list)
    shifted_pairs: Rows = field(default_factory=list)
    lstm_gates: Rows = field(default_factory=list)


# --- memory tasks


@dataclass(frozen=True, kw_only=True)
class MemoryDelay(Manifest):
    KIND = "memory_delay"

    rows: Rows = field(default_factory=list)
    models: Rows = field(default_factory=list)
    chance: float = math.nan
    val_sequences: int = 0
    delays: list[int] = field(default_factory=list)
    gradients: Rows = field(default_factory=list)
    training: str = "mixed"  # per_delay: one model per architecture and delay; mixed: one trained on every delay


@dataclass(frozen=True, kw_only=True)
class MemoryRecall(Manifest):
    KIND = "memory_recall"

    rows: Rows = field(default_factory=list)
    models: Rows = field(default_factory=list)
    chance: float = math.nan
    val_sequences: int = 0
    pairs: list[int] = field(default_factory=list)
    receptive_fields: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class MemoryInduction(Manifest):
    KIND = "memory_induction"

    rows: Rows = field(default_factory=list)
    models: Rows = field(default_factory=list)
    chance: float = math.nan
    span: int = 0
    n_layer: int = 0
    base: dict[str, float] = field(default_factory=dict)
    heads: Rows = field(default_factory=list)
    found: dict[str, list[int]] = field(default_factory=dict)
    ablations: Rows = field(default_factory=list)


# --- quantization and export


@dataclass(frozen=True, kw_only=True)
class QuantizedModels(Manifest):
    KIND = "quantized_models"

    rows: Rows = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    device: str = ""
    main_model: str = ""
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # model → what its language model recorded
    weights: dict[str, dict[str, str]] = field(default_factory=dict)  # model → variant → safetensors path
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)  # claim → its figures


@dataclass(frozen=True, kw_only=True)
class ModelExport(Manifest):
    KIND = "model_export"

    model: str
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant → folder, files
    rows: Rows = field(default_factory=list)
    reload_ok: bool = False
    samples: dict[str, str] = field(default_factory=dict)
    registered_model: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class WeightsArithmetic(Manifest):
    KIND = "weights_arithmetic"

    reference: Rows = field(default_factory=list)
    measured: Rows = field(default_factory=list)


# --- the report


@dataclass(frozen=True, kw_only=True)
class Report(Manifest):
    KIND = "report"

    path: str
    claims: Rows = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # the evidence, each claim once
    demonstration_counts: dict[str, int] = field(default_factory=dict)
    invariant_counts: dict[str, int] = field(default_factory=dict)
    mlflow_parent_run_id: str = ""
