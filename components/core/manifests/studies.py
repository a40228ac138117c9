"""Manifests of the studies: long-context cost, inside the Transformer, the memory tasks,
quantization and export, and the run's report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Manifest

Rows = list[dict[str, Any]]


# --- long context


@dataclass(frozen=True, kw_only=True)
class AttentionFit:
    """One implementation in one pass of the attention sweep (studies/attention_cost.py `fit_rows`): the
    log-log exponents of time and peak memory against N with their R², over `points` lengths from
    `n_min` to `n_max` (None: nothing measured), and cost(2N)/cost(N) at the top doubling (NaN: none)."""

    ALIASES: ClassVar[dict[str, str]] = {"pass": "pass_"}  # the study's key → the field (`pass` is Python's)

    pass_: str  # forward | forward_backward
    impl: str
    n_min: int | None
    n_max: int | None
    points: int
    time_exponent: float
    time_r2: float
    time_ratio_last_doubling: float
    memory_exponent: float
    memory_r2: float
    memory_ratio_last_doubling: float


@dataclass(frozen=True, kw_only=True)
class AttentionCost(Manifest):
    KIND = "attention_cost"
    VERSION = 2  # 2: fits typed, their "pass" stored as "pass_"

    rows: Rows = field(default_factory=list)
    fits: list[AttentionFit] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GenerationRow:
    """One model at one context length (studies/generation_cost.py): ms per generated token and the bytes it
    carries per sequence between tokens; a point the model cannot run says why in `skipped`, and has no figures."""

    model: str  # rnn | lstm | <transformer>_kv_cache | <transformer>_no_cache
    context_len: int
    batch_size: int | None = None
    prefill_ms: float | None = None
    ms_per_token: float | None = None
    bytes_per_sequence: int | None = None
    device: str | None = None
    skipped: str | None = None  # e.g. learned positions end before context_len + the generated tokens


@dataclass(frozen=True, kw_only=True)
class GenerationFit:
    """One model's per-token time against context length: log-log exponent and R², the largest context's
    time over the smallest's, and the time and bytes at the largest (`context_max`)."""

    model: str
    time_exponent: float
    time_r2: float
    max_over_min: float
    ms_per_token_at_max: float
    context_max: int
    bytes_per_sequence_at_max: int


@dataclass(frozen=True, kw_only=True)
class GenerationCost(Manifest):
    KIND = "generation_cost"
    VERSION = 2  # 2: rows and fits typed (every row has every field, "skipped" null where measured)

    rows: list[GenerationRow] = field(default_factory=list)
    fits: list[GenerationFit] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TrainStepRow:
    """One model's training step (forward, backward, AdamW) timed at one sequence length."""

    model: str
    seq_len: int
    batch_size: int
    train_step_ms: float
    tokens_per_s: float
    sequential_steps: int | None = None  # dependent steps of a forward pass (None: not recorded)
    device: str | None = None  # recorded for the Transformer's steps (the recurrent ones: recurrent_cost's)


@dataclass(frozen=True, kw_only=True)
class Crossover:
    """Where the Transformer's per-token training cost overtakes one recurrent model's (µs per token)."""

    recurrent: str
    measured_lens: str  # "first…last" of the lengths both were timed at ("" if none)
    transformer_us_per_token_intercept: float  # the Transformer's c(T) ≈ a + b·T
    transformer_us_per_token_slope: float
    transformer_fit_r2: float
    recurrent_us_per_token_mean: float
    first_measured_len_transformer_costlier: int | None  # None: at no measured length
    transformer_costlier_at_every_len: bool
    fitted_crossover_len: float  # the lines' intersection (NaN: the Transformer's line does not grow)
    fitted_crossover_extrapolated: bool
    ratio_at_max_len: float | None = None  # Transformer over recurrent at the longest common length


@dataclass(frozen=True, kw_only=True)
class KvCheck:
    """Our Transformer's KV cache as generation_cost held it, against the formula 2·n_layer·n_head·head_dim·L·4."""

    context_len: int
    measured_bytes: int
    predicted_bytes: int
    measured_over_predicted: float


@dataclass(frozen=True, kw_only=True)
class LongContextCost(Manifest):
    KIND = "long_context_cost"
    VERSION = 2  # 2: crossovers, kv_check and train_rows typed (every row has every field)

    exponents: Rows = field(default_factory=list)
    crossovers: list[Crossover] = field(default_factory=list)
    arithmetic: Rows = field(default_factory=list)
    kv_check: list[KvCheck] = field(default_factory=list)
    scores_check: Rows = field(default_factory=list)
    train_rows: list[TrainStepRow] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ContextSummary:
    """One model's validation loss by position (studies/context_usage.py), summed up: how much the later
    positions gain over the first and where the gain stops."""

    model: str
    positions: int
    window: int | None = None  # a sliding-window Transformer's window
    receptive_field: int | None = None  # … and how far its stack reaches (None: unbounded)
    loss_first_position: float
    loss_first_bucket: float
    loss_last_bucket: float
    gain_from_context: float  # first bucket's loss minus the last's
    saturation_position: int
    mean_loss: float
    context_helps_until: int


@dataclass(frozen=True, kw_only=True)
class WindowGap:
    """A sliding-window model's loss minus full attention's (`versus`), by where the target sits: within its
    window, after it, beyond its receptive field (NaN: no position there); 95 % bootstrap over blocks."""

    model: str
    versus: str
    window: int
    receptive_field: int
    gap_within_window: float
    gap_after_window: float
    gap_within_window_low: float
    gap_within_window_high: float
    gap_beyond_field: float
    gap_beyond_field_low: float
    gap_beyond_field_high: float
    positions_beyond_field: int


@dataclass(frozen=True, kw_only=True)
class ContextUsage(Manifest):
    KIND = "context_usage"

    curves: dict[str, list[float]] = field(default_factory=dict)
    summaries: list[ContextSummary] = field(default_factory=list)
    window_gaps: list[WindowGap] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


# --- inside the Transformer


@dataclass(frozen=True, kw_only=True)
class HeadStatistics:
    """What one head of the trained language model attends to, on validation text."""

    layer: int
    head: int
    kind: str = ""  # previous-token | self | first-token sink | local | broad ("": not classified)
    entropy: float
    mean_distance: float
    prev_token_share: float
    self_share: float
    first_token_share: float
    max_row_sum_error: float  # |Σ row − 1|, the largest


@dataclass(frozen=True, kw_only=True)
class HeadAblation:
    layer: int
    head: int
    kind: str
    loss_increase: float  # validation loss with the head zeroed, over the whole model's


@dataclass(frozen=True, kw_only=True)
class HeadsDiffer:
    """Per layer: zeroing the costliest head (chosen on half the blocks) against the cheapest, on the other half."""

    layer: int
    costliest_head: int
    cheapest_head: int
    difference: float  # loss increase, costliest minus cheapest, mean over the held-out blocks
    low: float  # its 95 % bootstrap interval
    high: float
    heldout_blocks: int


@dataclass(frozen=True, kw_only=True)
class AttentionHeads(Manifest):
    KIND = "attention_heads"

    heads: list[HeadStatistics] = field(default_factory=list)
    ablation: list[HeadAblation] = field(default_factory=list)
    differ: list[HeadsDiffer] = field(default_factory=list)  # per layer: the costliest against the cheapest head
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
class AccuracyRow:
    """One accuracy of a memory task: `model` measured over `n` queries grouped `by` a quantity (delay,
    pairs, distance, field, part) at its value `at`, with the 95 % interval [low, high]."""

    model: str
    by: str
    at: int | str
    n: int
    accuracy: float
    low: float = math.nan
    high: float = math.nan


@dataclass(frozen=True, kw_only=True)
class DelayRow(AccuracyRow):
    delay: int


@dataclass(frozen=True, kw_only=True)
class RecallRow(AccuracyRow):
    pairs: int | None = None  # by pairs
    distance: int | None = None  # by distance: the bucket's upper end
    distance_from: int | None = None  # … and its lower end


@dataclass(frozen=True, kw_only=True)
class InductionRow(AccuracyRow):
    loss: float


@dataclass(frozen=True, kw_only=True)
class MemoryModel:
    """One trained model of a memory task."""

    model: str
    parameters: int
    state_size: int
    first_loss: float
    final_loss: float
    train_seconds: float
    train_steps: int = 0
    seq_len: int | None = None  # delayed recall: the sequence length it trained on
    delay: int | None = None  # delayed recall, one model per delay
    solved_at: int | None = None  # the step it solved the task at (early stop), None: never or not asked
    receptive_field: int | None = None  # associative recall: a window's reach


@dataclass(frozen=True, kw_only=True)
class DelayGradient:
    """How much of the gradient the query's loss sends back reaches the symbol `delay` steps before."""

    model: str
    delay: int
    grad_norm: float
    relative_to_last: float  # over the gradient at the query itself


@dataclass(frozen=True, kw_only=True)
class InductionScores:
    """The induction model's repeat and first part, whole or with heads zeroed."""

    repeat_accuracy: float
    first_accuracy: float
    repeat_loss: float
    first_loss: float


@dataclass(frozen=True, kw_only=True)
class InductionAblation(InductionScores):
    ablated: str  # "induction heads" | "other heads"
    layer: int
    head: int
    heads: list[list[int]] = field(default_factory=list)  # (layer, head) zeroed


@dataclass(frozen=True, kw_only=True)
class InductionHead:
    layer: int
    head: int
    role: str
    previous_token_score: float
    prefix_matching_score: float


@dataclass(frozen=True, kw_only=True)
class InductionFound:
    previous_token_head: list[int]  # (layer, head)
    induction_head: list[int] | None = None  # (layer, head); None: no later layer holds one


@dataclass(frozen=True, kw_only=True)
class MemoryDelay(Manifest):
    KIND = "memory_delay"
    VERSION = 2  # 2: rows and models typed (every model row has every field)

    rows: list[DelayRow] = field(default_factory=list)
    models: list[MemoryModel] = field(default_factory=list)
    chance: float = math.nan
    val_sequences: int = 0
    delays: list[int] = field(default_factory=list)
    gradients: list[DelayGradient] = field(default_factory=list)
    training: str = "mixed"  # per_delay: one model per architecture and delay; mixed: one trained on every delay


@dataclass(frozen=True, kw_only=True)
class MemoryRecall(Manifest):
    KIND = "memory_recall"
    VERSION = 2  # 2: rows and models typed (every row has every field)

    rows: list[RecallRow] = field(default_factory=list)
    models: list[MemoryModel] = field(default_factory=list)
    chance: float = math.nan
    val_sequences: int = 0
    pairs: list[int] = field(default_factory=list)
    receptive_fields: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class MemoryInduction(Manifest):
    KIND = "memory_induction"
    VERSION = 2  # 2: rows, models, heads and ablations typed

    rows: list[InductionRow] = field(default_factory=list)
    models: list[MemoryModel] = field(default_factory=list)
    chance: float = math.nan
    span: int = 0
    n_layer: int = 0
    base: InductionScores | None = None
    heads: list[InductionHead] = field(default_factory=list)
    found: InductionFound | None = None
    ablations: list[InductionAblation] = field(default_factory=list)


# --- quantization and export


@dataclass(frozen=True, kw_only=True)
class QuantCheck:
    """One quantization claim's figures (studies/quantization.py `check_figures`): its measured `value`
    against its `limit` (None: the variant was not measured). Size checks add `all_in`; whole-model checks
    the bytes against FP16's and what was kept in float."""

    value: float | None
    limit: float
    all_in: float | None = None  # size: codes, scales and code books over the same layers in FP16
    bytes: int | None = None  # whole model: the quantized variant's bytes in memory
    fp16_bytes: int | None = None  # … and the FP16 model's
    layer_ratio: float | None = None  # … the quantized layers alone over FP16
    quantized_share: float | None = None  # … the share of the parameters quantized
    kept_float: str | None = None  # … what stayed in float


@dataclass(frozen=True, kw_only=True)
class SourceModel:
    """The language model a quantization started from: what its manifest recorded, the part kept."""

    name: str
    family: str
    weights: str
    model_config: dict[str, Any]
    vocab_size: int
    tokenizer_sha256: str
    dagster_run_id: str
    mlflow_run_id: str
    metrics: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class QuantizedModels(Manifest):
    KIND = "quantized_models"
    VERSION = 2  # 2: checks typed (every check has every field, null where it does not apply)

    rows: Rows = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    device: str = ""
    main_model: str = ""
    models: dict[str, SourceModel] = field(default_factory=dict)  # model → what its language model recorded
    weights: dict[str, dict[str, str]] = field(default_factory=dict)  # model → variant → safetensors path
    checks: dict[str, QuantCheck] = field(default_factory=dict)  # claim → its figures


@dataclass(frozen=True, kw_only=True)
class ExportRow:
    """One exported variant (studies/quant_export.py): its folder's sizes, whether the folder alone reloads
    the exported model (`criterion`: bit-exact logits, or the same validation loss for a quantized one),
    and load times (safetensors against torch.load; to the GPU on CUDA only)."""

    variant: str
    scheme: str
    folder_bytes: int
    weights_bytes: int
    header_bytes: int
    reload_logits_max_abs_diff: float
    reload_bit_exact: bool
    exported_val_loss: float
    reloaded_val_loss: float
    study_val_loss: float | None = None  # what quantized_models measured (None: not measured there)
    study_val_loss_rel_diff: float | None = None
    reload_ok: bool
    criterion: str
    safetensors_mmap_ms: float
    safetensors_load_file_ms: float
    torch_load_ms: float
    torch_load_mmap_ms: float
    safetensors_to_gpu_ms: float | None = None  # CUDA only
    torch_load_to_gpu_ms: float | None = None  # CUDA only
    load_speedup_vs_torch_load: float
    sample_tokens_per_s: float


@dataclass(frozen=True, kw_only=True)
class ModelExport(Manifest):
    KIND = "model_export"
    VERSION = 2  # 2: rows typed (every row has every field, the CUDA-only load times null elsewhere)

    model: str
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant → folder, files
    rows: list[ExportRow] = field(default_factory=list)
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
