"""`CLAIMS`, every check in the report's order (the article's sections, then the invariants, then the
memory tasks), and judging them: `judge_all` over a run's manifests.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..manifests import Manifest
from .base import LANGUAGE_MODELS, Claim, Verdict
from .language_models import clipping_bounds_gradient
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
from .quantization import int8_weights_size, nf4_weights_size, reload_reproduces_logits
from .sections import SECTION_CLAIMS
from .transformer import ROW_SUM_TOLERANCE, attention_rows_sum_to_one, ffn_holds_two_thirds
from .word_vectors import pad_excluded_from_similarity, pad_row_is_zero

# --------------------------------------------------------------------------------------------------
# The registry


OTHER_CLAIMS: list[Claim] = [
    # --- invariants: true by construction; a failure is a bug
    Claim(
        "pad_row_is_zero",
        "word_embeddings",
        "The [PAD] row is exactly the zero vector and no vector is NaN/inf.",
        pad_row_is_zero,
        blocking=True,
        kind="invariant",
        section="1.1",
        statement_zh="[PAD] 的向量恒为零，且没有 NaN/inf。",
        falsifier="A [PAD] row with any non-zero entry, or a non-finite vector.",
    ),
    Claim(
        "pad_excluded_from_similarity",
        "word_embeddings",
        "[PAD]'s vector is excluded from similarity: its row is zero (no direction), the similarity search leaves it "
        "out, and it "
        "is never among the nearest neighbours of the 200 most frequent words.",
        pad_excluded_from_similarity,
        blocking=True,
        kind="invariant",
        section="1.1",
        statement_zh="[PAD] 不参与相似度：它的行为零，检索跳过它，它从不出现在近邻里。",
        falsifier="[PAD] searchable, non-zero, or among a frequent word's neighbours.",
    ),
    Claim(
        "clipping_bounds_gradient",
        LANGUAGE_MODELS,
        "Clipping bounds the gradient norm: after clipping it is at most grad_clip at every log point (clip_grad_norm_ "
        "does this "
        "by construction; how often the norm before clipping exceeded grad_clip is reported beside it).",
        clipping_bounds_gradient,
        blocking=True,
        kind="invariant",
        section="2.2",
        statement_zh="裁剪后梯度范数不超过阈值（由 clip_grad_norm_ 的构造保证）。",
        falsifier="A clipped norm above grad_clip at a log point.",
    ),
    Claim(
        "ffn_holds_two_thirds",
        "model_comparison",
        "The FFN holds about two thirds of each Transformer's block parameters (attention + FFN + norms; 8d² of 12d² "
        "per layer for a "
        "4× FFN, measured from the module; its share of all parameters, embedding included, beside it).",
        ffn_holds_two_thirds,
        blocking=True,
        kind="invariant",
        section="3.3",
        statement_zh="4 倍宽的 FFN 占每层参数约三分之二（8d²/12d²，由结构决定）。",
        falsifier="An FFN share of the blocks' parameters more than 0.05 from 2/3.",
    ),
    Claim(
        "attention_rows_sum_to_one",
        "attention_heads",
        f"Attention weights are a distribution per query: on validation text every row of every head of the trained "
        f"Transformer "
        f"sums to 1 (within {ROW_SUM_TOLERANCE:g}).",
        attention_rows_sum_to_one,
        blocking=True,
        kind="invariant",
        section="3.1",
        statement_zh="每个查询的注意力权重是一个分布：每行之和为 1（softmax 的构造）。",
        falsifier="A row summing to more than 1e-5 away from 1.",
    ),
    Claim(
        "int8_weights_size",
        "quantized_models",
        "INT8 (codes + per-row scales) of the Transformer's quantized layers ≤ 0.55× their FP16 bytes (8 of 16 bits by "
        "the format).",
        int8_weights_size,
        blocking=True,
        kind="invariant",
        section="5.1",
        statement_zh="INT8 量化层（码 + 每行尺度）≤ 同层 FP16 字节的 0.55 倍（格式决定）。",
        falsifier="Quantized layers above 0.55× FP16.",
    ),
    Claim(
        "nf4_weights_size",
        "quantized_models",
        "NF4 (4-bit codes + absmax blocks) of the Transformer's quantized layers ≤ 0.30× their FP16 bytes (4 of 16 "
        "bits by the format).",
        nf4_weights_size,
        blocking=True,
        kind="invariant",
        section="5.1",
        statement_zh="NF4 量化层（4 比特码 + 分块尺度）≤ 同层 FP16 字节的 0.30 倍（格式决定）。",
        falsifier="Quantized layers above 0.30× FP16.",
    ),
    Claim(
        "reload_reproduces_logits",
        "model_export",
        "Every export folder, reloaded on its own, reproduces the exported model (float: bit-exact logits; quantized: "
        "the same "
        "evaluation).",
        reload_reproduces_logits,
        blocking=True,
        kind="invariant",
        section="5.2",
        statement_zh="每个导出文件夹单独重新加载后复现导出时的模型。",
        falsifier="A reloaded folder whose logits or evaluation differ.",
    ),
    # Memory tasks: where the article's thesis is structural
    Claim(
        "rnn_forgets_where_lstm_remembers",
        "memory_delay",
        "Gradients vanish across time in an RNN, the LSTM's gates carry information further: on delayed recall the "
        "RNN's "
        f"accuracy falls to chance (95% interval within {MEMORY_NEAR_CHANCE} of it) at a delay where the LSTM still "
        f"solves the "
        f"task (lower bound ≥ {MEMORY_SOLVED}).",
        rnn_forgets_where_lstm_remembers,
        warn=True,
        section="2.3",
        statement_zh="门控让 LSTM 记得更久：在延迟回忆任务上，RNN 在某个延迟处掉到随机水平，而 LSTM "
        "在同一延迟仍能答对。",
        falsifier='No delay where the RNN is at chance while the LSTM solves it (e.g. delays short enough for the RNN, '
        'or an LSTM at chance too).',
        counterexample="tests/test_memory.py::test_rnn_that_bridges_every_short_delay_fails_the_delay_claims",
    ),
    Claim(
        "lstm_carries_gradient_further",
        "memory_delay",
        "The LSTM forgets more slowly, in trained models: at the longest delay of delayed recall, the gradient the "
        "query's loss sends back to the symbol (relative to the query's own) is at least "
        f"{GRADIENT_RATIO:g}× larger in the LSTM than in the RNN.",
        lstm_carries_gradient_further,
        warn=True,
        section="2.3",
        statement_zh="LSTM 忘得更慢（在训练好的模型上测）：在最长的延迟处，查询位置的损失传回到符号位置的梯度"
        f"（相对查询位置本身），LSTM 至少是 RNN 的 {GRADIENT_RATIO:g} 倍。",
        falsifier="At the longest delay, the trained RNN's relative gradient above a tenth of the LSTM's (e.g. delays "
        "short enough that the gradient reaches the symbol in both).",
        counterexample="tests/test_memory.py::test_rnn_that_bridges_every_short_delay_fails_the_delay_claims",
    ),
    Claim(
        "attention_bridges_every_delay",
        "memory_delay",
        f"Attention makes every two positions one step apart: the Transformer solves delayed recall at every delay "
        f"measured "
        f"(95% lower bound ≥ {MEMORY_SOLVED}).",
        attention_bridges_every_delay,
        warn=True,
        section="3.1",
        statement_zh="注意力让任意两个位置只隔一步：Transformer 在每个测到的延迟上都能答对。",
        falsifier="A delay at which the Transformer's accuracy lower bound falls below the solved threshold (e.g. an "
        "untrained model).",
        counterexample="tests/test_memory.py::test_untrained_models_fail_the_delay_claims",
    ),
    Claim(
        "attention_recall_ignores_distance",
        "memory_recall",
        f"Attention does not forget: on multi-query associative recall the Transformer solves the nearest keys (lower "
        f"bound ≥ "
        f"{MEMORY_SOLVED}) and its accuracy on the farthest is no more than {MEMORY_DISTANCE_DROP} lower, beyond the "
        f"intervals.",
        attention_recall_ignores_distance,
        warn=True,
        section="3.1",
        statement_zh="注意力不遗忘：在多查询联想回忆上，最近的键能答对，最远的键准确率不明显更低。",
        falsifier='The nearest keys not solved, or the farthest keys lower by more than the allowed drop beyond the '
        'intervals.',
        counterexample="tests/test_memory.py::test_window_asked_beyond_its_field_fails",
    ),
    Claim(
        "recurrent_state_runs_out",
        "memory_recall",
        "A fixed recurrent state runs out: the RNN's and the LSTM's recall accuracy at the most key-value pairs is "
        "below their accuracy at the fewest and below the Transformer's (beyond the 95% intervals); a recurrent "
        "model at chance even at the fewest pairs learned nothing to run out of and is named, not judged.",
        recurrent_state_runs_out,
        warn=True,
        section="2.3",
        statement_zh="固定大小的循环状态会被用完：键值对越多，RNN 和 LSTM 的回忆准确率越低，并低于 Transformer。",
        falsifier="A recurrent model that learned the task (above chance at the fewest pairs) whose accuracy at the "
        "most pairs is not below its accuracy at the fewest, or not below the Transformer's.",
        counterexample="tests/test_memory.py::test_attention_as_the_recurrent_model_does_not_run_out",
    ),
    Claim(
        "window_answers_within_field_only",
        "memory_recall",
        f"A sliding-window Transformer solves keys whose value lies within its receptive field (95% lower bound "
        f"≥ {MEMORY_SOLVED}) and is at chance beyond it (upper bound within {MEMORY_NEAR_CHANCE} of chance).",
        window_answers_within_field_only,
        warn=True,
        section="4.1",
        statement_zh="滑动窗口模型能答对感受野内的键，超出感受野就是随机水平。",
        falsifier="A window model short of solving the keys within its field, or above chance beyond it (it "
        "sees what its mask should hide).",
        counterexample="tests/test_memory.py::test_window_trained_one_step_fails_within_its_field",
    ),
    Claim(
        "induction_head_copies",
        "memory_induction",
        f"Heads specialise into named, necessary roles: on repeated random spans a two-layer Transformer copies the "
        f"repeat "
        f"(accuracy ≥ {INDUCTION_COPIES}, the first part at chance) through an induction head found by its "
        f"prefix-matching score "
        f"(≥ 0.5) in a layer after the previous-token head; zeroing the induction heads (every later-layer head at "
        f"≥ 0.5) costs the repeat ≥ {INDUCTION_COLLAPSE} accuracy, more than zeroing the other heads of lowest "
        "prefix-matching score (as many where as many exist besides the previous-token head; which heads, beside "
        "it).",
        induction_head_copies,
        warn=True,
        section="3.3",
        statement_zh="多头分工有名有实：两层 Transformer "
        "在重复的随机片段上靠归纳头复制，置零归纳头复制就崩溃，置零其他头则不会。",
        falsifier='No copying of the repeat, no induction head after a previous-token head, or zeroing the '
        'induction heads costs no more than zeroing as many other heads (e.g. a one-layer model).',
        counterexample="tests/test_memory.py::test_one_layer_model_has_no_induction_head",
    ),
]

CLAIMS: list[Claim] = [*SECTION_CLAIMS, *OTHER_CLAIMS]

BY_NAME = {c.name: c for c in CLAIMS}


def claim(name: str) -> Claim:
    return BY_NAME[name]


def evidence(claims: list[Claim] | None = None) -> list[Claim]:
    """The article's claims this run could contradict: the only ones the headline counts."""
    return [c for c in (claims if claims is not None else CLAIMS) if c.kind == "evidence"]


article_claims = evidence  # the older name


def demonstrations(claims: list[Claim] | None = None) -> list[Claim]:
    """The article's points where they hold by construction or by mathematics: shown, never counted."""
    return [c for c in (claims if claims is not None else CLAIMS) if c.kind == "demonstration"]


def invariants(claims: list[Claim] | None = None) -> list[Claim]:
    return [c for c in (claims if claims is not None else CLAIMS) if c.kind == "invariant"]


@dataclass(frozen=True)
class Judgement:
    claim: Claim
    asset: str
    verdict: Verdict | None  # None: the asset's manifest is not there to judge
    error: str = ""

    @property
    def status(self) -> str:
        """passed, failed (an error), warning (a failed finding), not judged."""
        if self.verdict is None or not self.verdict.judged:
            return "not judged"
        if self.verdict.passed:
            return "passed"
        return "warning" if self.claim.warn else "failed"


def judge_all(
    manifests: dict[str, Manifest], language_models: list[str], claims: list[Claim] | None = None
) -> list[Judgement]:
    """Every claim on the manifests at hand (asset name → manifest); LANGUAGE_MODELS claims once per
    language model. A claim whose asset is missing, or whose judge raises, is reported as not judged."""
    out = []
    for c in claims if claims is not None else CLAIMS:
        for asset in language_models if c.asset == LANGUAGE_MODELS else [c.asset]:
            if asset not in manifests:
                out.append(Judgement(c, asset, None, f"`{asset}` is not among the report's inputs"))
                continue
            try:
                out.append(Judgement(c, asset, c.judge(manifests[asset])))
            except Exception as e:  # noqa: BLE001 - a report shows what it could not judge instead of failing
                out.append(Judgement(c, asset, None, f"{type(e).__name__}: {e}"))
    return out
