"""The article's claims, each judged on a run's own artifacts, and the invariants kept apart from them.

One function per check. It takes the typed manifest (`components.core.manifests`) an asset hands
downstream of the
asset whose output it judges, reads the files that manifest names when it needs them, and returns a
`Verdict`: whether it held, its sub-checks and the measured figures. The asset checks call these
functions and so does the run's report, so a check and the report never disagree.

`CLAIMS` lists every check with its kind:
- **evidence** (`kind="evidence"`): an empirical statement of the article that a plausible wrong
  model, wrong data or wrong implementation would contradict on this run. It names the article's
  section, says in Chinese and in English what it claims, and its `falsifier` says which result would
  fail it; a test builds that world and asserts the failure. Only these are counted in the report's
  headline. Where a direct test of a point exists, it is the evidence and a proxy is a figure beside it.
- a **demonstration** (`kind="demonstration"`): the article's point where it holds by construction or
  by mathematics (a spectral radius set to 3.0, unit-variance q·k at init, attention without
  positions, a cache allocated by its formula, a size set by the format). Shown in the article's
  order with its figures, never counted as evidence; a failure is a bug (error severity).
- an **invariant** (`kind="invariant"`): true by construction of the code (a zeroed PAD row, softmax
  rows summing to one, the byte arithmetic of a format). A failure is a bug: a blocking integrity
  check, listed apart and never counted as evidence for the article.
A verdict that measured nothing is "not judged" (`Verdict.judged` false): never counted as passed.

The package: `base` (Verdict, Claim, SECTIONS), the checks by the article's parts (`word_vectors`,
`language_models`, `transformer`, `long_context`, `quantization`, `memory`), and the registry
(`sections`: the article's sections 1–5; `registry`: the invariants, the memory tasks, `CLAIMS` and
`judge_all`). Every name is importable from `components.core.claims` as before.
"""

from __future__ import annotations

from .base import KINDS, LANGUAGE_MODELS, SECTIONS, Claim, Verdict, not_judged, not_measured, verdict
from .language_models import (
    CLIP_TOLERANCE,
    SCALING_Z,
    clipping_bounds_gradient,
    clipping_tames_exploding_gradients,
    count_model_at_scale,
    gradients_vanish_and_explode,
    language_models_beat_the_count_model,
    transformer_overtakes_lstm_with_compute,
)
from .long_context import (
    arithmetic_matches_measurement,
    attention_scales_as_claimed,
    attention_time_scales_as_claimed,
    kv_cache_grows_recurrent_state_does_not,
    kv_cache_pays,
    later_context_helps,
    recurrence_is_the_serial_bottleneck,
)
from .memory import (
    GRADIENT_RATIO,
    INDUCTION_COLLAPSE,
    INDUCTION_COPIES,
    MEMORY_DISTANCE_DROP,
    MEMORY_NEAR_CHANCE,
    MEMORY_SOLVED,
    attention_bridges_every_delay,
    attention_recall_ignores_distance,
    induction_head_copies,
    lstm_carries_gradient_further,
    recurrent_state_runs_out,
    rnn_forgets_where_lstm_remembers,
    window_answers_within_field_only,
)
from .quantization import (
    int8_model_size,
    int8_perplexity_cost,
    int8_weights_size,
    nf4_model_size,
    nf4_perplexity_cost,
    nf4_weights_size,
    reload_reproduces_logits,
)
from .registry import (
    BY_NAME,
    CLAIMS,
    OTHER_CLAIMS,
    Judgement,
    article_claims,
    claim,
    demonstrations,
    evidence,
    invariants,
    judge_all,
)
from .sections import NOT_MEASURED, SECTION_CLAIMS, NotMeasured
from .transformer import (
    DEPTH_LOSS_MARGIN,
    HARD_MARGIN,
    ROW_SUM_TOLERANCE,
    attention_rows_sum_to_one,
    fact_neurons_matter,
    ffn_holds_two_thirds,
    heads_differ,
    position_breaks_order_symmetry,
    residuals_let_depth_train,
    soft_attention_trains_better_than_hard,
    sqrt_d_keeps_softmax_unsaturated,
)
from .word_vectors import (
    distance_figures,
    king_man_woman_queen,
    pad_excluded_from_similarity,
    pad_row_is_zero,
    word_vectors_carry_similarity,
)

__all__ = [
    "LANGUAGE_MODELS",
    "KINDS",
    "SECTIONS",
    "Verdict",
    "verdict",
    "not_judged",
    "not_measured",
    "Claim",
    "pad_row_is_zero",
    "pad_excluded_from_similarity",
    "word_vectors_carry_similarity",
    "distance_figures",
    "king_man_woman_queen",
    "CLIP_TOLERANCE",
    "language_models_beat_the_count_model",
    "count_model_at_scale",
    "SCALING_Z",
    "transformer_overtakes_lstm_with_compute",
    "clipping_bounds_gradient",
    "gradients_vanish_and_explode",
    "clipping_tames_exploding_gradients",
    "ROW_SUM_TOLERANCE",
    "position_breaks_order_symmetry",
    "sqrt_d_keeps_softmax_unsaturated",
    "DEPTH_LOSS_MARGIN",
    "residuals_let_depth_train",
    "ffn_holds_two_thirds",
    "attention_rows_sum_to_one",
    "heads_differ",
    "fact_neurons_matter",
    "HARD_MARGIN",
    "soft_attention_trains_better_than_hard",
    "attention_scales_as_claimed",
    "attention_time_scales_as_claimed",
    "kv_cache_grows_recurrent_state_does_not",
    "kv_cache_pays",
    "arithmetic_matches_measurement",
    "recurrence_is_the_serial_bottleneck",
    "later_context_helps",
    "int8_weights_size",
    "nf4_weights_size",
    "int8_perplexity_cost",
    "nf4_perplexity_cost",
    "int8_model_size",
    "nf4_model_size",
    "reload_reproduces_logits",
    "MEMORY_SOLVED",
    "MEMORY_NEAR_CHANCE",
    "MEMORY_DISTANCE_DROP",
    "rnn_forgets_where_lstm_remembers",
    "GRADIENT_RATIO",
    "lstm_carries_gradient_further",
    "attention_bridges_every_delay",
    "attention_recall_ignores_distance",
    "recurrent_state_runs_out",
    "window_answers_within_field_only",
    "INDUCTION_COPIES",
    "INDUCTION_COLLAPSE",
    "induction_head_copies",
    "SECTION_CLAIMS",
    "NOT_MEASURED",
    "NotMeasured",
    "OTHER_CLAIMS",
    "CLAIMS",
    "BY_NAME",
    "claim",
    "article_claims",
    "evidence",
    "demonstrations",
    "invariants",
    "Judgement",
    "judge_all",
]
