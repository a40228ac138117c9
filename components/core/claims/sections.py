"""The registry's entries for the article's sections 1–5 (`SECTION_CLAIMS`), in the order the report
lists them; `registry.CLAIMS` puts the invariants and the memory tasks' claims after them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import LANGUAGE_MODELS, Claim
from .language_models import (
    clipping_tames_exploding_gradients,
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
from .quantization import int8_model_size, int8_perplexity_cost, nf4_model_size, nf4_perplexity_cost
from .transformer import (
    HARD_MARGIN,
    fact_neurons_matter,
    heads_differ,
    position_breaks_order_symmetry,
    residuals_let_depth_train,
    soft_attention_trains_better_than_hard,
    sqrt_d_keeps_softmax_unsaturated,
)
from .word_vectors import king_man_woman_queen, word_vectors_carry_similarity

SECTION_CLAIMS: list[Claim] = [
    # --- 1 word vectors
    Claim(
        "word_vectors_carry_similarity",
        "embedding_eval",
        "Learned vectors carry meaning: their cosine correlates with human similarity judgements (WordSim353 Spearman, "
        "95 % "
        "bootstrap interval above 0) and related pairs (human score ≥ 7) sit closer than unrelated ones (≤ 3).",
        word_vectors_carry_similarity,
        warn=True,
        section="1.2",
        statement_zh="学到的词向量带有语义：余弦相似度与人工打分（WordSim353）正相关（Spearman 的 95% 区间在 0 "
        "以上），相关词对比无关词对更近。",
        falsifier="A Spearman interval that reaches 0, or related pairs no closer than unrelated ones beyond their "
        "interval "
        "(e.g. random or shuffled vectors).",
        counterexample="tests/test_claims.py::test_word_vectors_trained_on_a_shuffled_corpus_carry_no_similarity",
    ),
    Claim(
        "king_man_woman_queen",
        "embedding_eval",
        "king − man + woman ≈ queen: for that query queen ranks above the 5th percentile of random words' ranks, the "
        "analogy accuracy's 95 % interval lies above chance, and gensim's Word2Vec trained on the same sentences with "
        "the same settings does not score above that interval (the corpus size, not the method, keeps it low: see "
        "the note).",
        king_man_woman_queen,
        warn=True,
        section="1.2",
        statement_zh="国王 − 男人 + 女人 ≈ 女王：queen 的排名明显好于随机词，类比准确率的 95% "
        "区间高于随机猜测，且同一语料、同一设置下 gensim 的准确率不高于该区间（语料规模限制了准确率）。",
        falsifier="queen ranking no better than the 5th percentile of random words, an analogy accuracy interval "
        "reaching chance (e.g. vectors trained on a shuffled corpus), or gensim's accuracy on the same corpus "
        "above our interval.",
        counterexample="tests/test_claims.py::test_word2vec_on_the_shuffled_wikipedia_sample_fails_the_analogy_claim",
    ),
    # --- 2 recurrent networks
    Claim(
        "language_models_beat_the_count_model",
        LANGUAGE_MODELS,
        "The model learned more than counts: its validation loss is below the count model's, the interpolated "
        "modified Kneser–Ney n-gram whose order (1 to 8) was chosen on held-out training data, counted over the same "
        "training tokens and scored on the same validation targets.",
        language_models_beat_the_count_model,
        warn=True,
        section="2.1",
        statement_zh="语言模型学到的不止是计数：在同一组验证目标上，它的验证损失低于计数模型——"
        "阶数（1 到 8）在留出的训练数据上选定的修正 Kneser–Ney n 元模型，用同样的训练词元统计。",
        falsifier="A validation loss at or above the count model's on the same targets (e.g. an untrained or barely "
        "trained model, or too little compute), or a comparison on other targets, tokenizer or block size.",
        counterexample=(
            "tests/test_ngram.py::test_beating_the_count_model_passes_for_a_trained_model_and_fails_untrained_or_on_other_targets"
        ),
    ),
    Claim(
        "transformer_overtakes_lstm_with_compute",
        "scaling_laws",
        "As training compute grows, the Transformer overtakes the LSTM: at the scaling job's largest budget its "
        "validation loss is below the LSTM's by more than 1.96 σ of their seed noise; where the curves cross per "
        "FLOP and per second of training is reported beside it. Judged from the scaling job's latest run; not "
        "judged where none exists.",
        transformer_overtakes_lstm_with_compute,
        warn=True,
        section="3.1",
        statement_zh="算力增长时 Transformer 超过 LSTM：在扩展实验最大的算力预算上，它的验证损失比 LSTM 低，且超出两者"
        "种子噪声（1.96 σ）；两条曲线按 FLOP 和按训练秒数的交点一并报告。",
        falsifier="At the largest budget the Transformer is not ahead of the LSTM beyond seed noise (e.g. a "
        "Transformer whose attention sees only its own position, or budgets too small for it to catch up).",
        counterexample=(
            "tests/test_scaling.py::test_a_transformer_that_sees_only_its_own_position_does_not_overtake_the_lstm"
        ),
    ),
    Claim(
        "gradients_vanish_and_explode",
        "gradient_study",
        "Vanishing and exploding both show: the contractive RNN's gradient decays per step (< 1) and the expansive "
        "one's grows (> 1). That the LSTM forgets more slowly is judged on trained models: "
        "lstm_carries_gradient_further.",
        gradients_vanish_and_explode,
        kind="demonstration",
        section="2.2",
        statement_zh="梯度沿时间回传会消失也会爆炸：收缩的 RNN 每步衰减（< 1），扩张的 RNN 每步增长（> 1）。"
        "LSTM 忘得更慢，在训练好的模型上判（lstm_carries_gradient_further）。",
        falsifier="A per-step gradient factor ≥ 1 for the contractive RNN, or ≤ 1 for the expansive one.",
    ),
    Claim(
        "clipping_tames_exploding_gradients",
        "gradient_study",
        "At a learning rate where plain SGD on an RNN diverges, the same run with its gradient norm clipped stays "
        "finite and trains: "
        "the clip engaged (the norm before clipping exceeded the threshold) and the clipped norm never exceeded it.",
        clipping_tames_exploding_gradients,
        section="2.2",
        statement_zh="在让普通 SGD 训练 RNN "
        "发散的学习率下，同一训练加上梯度裁剪就不发散且能学：裁剪确实起了作用（裁剪前的范数超过阈值）。",
        falsifier="The unclipped run does not diverge, the clipped one diverges or does not train, or the clip never "
        "engaged.",
        counterexample="tests/test_gradients.py::test_clipping_claim_fails_on_a_measured_world_with_nothing_to_tame",
    ),
    # --- 3 the Transformer
    Claim(
        "position_breaks_order_symmetry",
        "transformer_ablations",
        "Without positional encoding the model (bidirectional attention) is permutation-equivariant; with it, it is "
        "not.",
        position_breaks_order_symmetry,
        kind="demonstration",
        section="3.2",
        statement_zh="没有位置编码，注意力对词序是置换等变的（“我爱你”和“你爱我”只是同一组数换了行）；加上位置编码就不是了。",
        falsifier="The model with positional encoding permutes its outputs with its inputs (relative error no larger "
        "than float "
        "noise), or the model without it does not.",
    ),
    Claim(
        "sqrt_d_keeps_softmax_unsaturated",
        "transformer_ablations",
        "Dividing the scores by √d keeps the softmax from saturating: with unit-variance queries and keys, the "
        "unscaled "
        "attention rows' entropy falls as the head size d grows (below half the scaled entropy at the largest d) and "
        "passes "
        "less gradient, while the scaled entropy stays steady (within 30 % across d).",
        sqrt_d_keeps_softmax_unsaturated,
        kind="demonstration",
        section="3.1",
        statement_zh="除以 √d 防止 softmax 饱和：不缩放时，注意力行的熵随头维度 d "
        "增大而下降（趋向独热），梯度变小；缩放后熵基本不变。",
        falsifier="An unscaled entropy that does not fall with d, a scaled entropy that moves by more than 30 % across "
        "d, or "
        "scaled scores passing no more gradient than unscaled ones at the largest d.",
    ),
    Claim(
        "residuals_let_depth_train",
        "transformer_ablations",
        "Residual connections let depth train: on the same short budget, without residuals the first layer of the "
        "deepest "
        "model gets under a tenth of the gradient it gets with them and the deep model ends worse; with residuals the "
        "deepest "
        "model is no worse than the shallowest (within 0.02 nats).",
        residuals_let_depth_train,
        warn=True,
        section="3.3",
        statement_zh="残差连接让深层网络能训练：没有残差时，最深模型第一层收到的梯度不到有残差时的十分之一，且结果更差；有残差时加深不再变差。",
        falsifier="A model without residuals whose first layer keeps a tenth of the gradient or more at depth, or that "
        "trains "
        "no worse; or, with residuals, a deepest model worse than the shallowest by more than 0.02 nats.",
        counterexample=(
            "tests/test_ablations.py::test_residual_claim_fails_on_a_measured_depth_study_too_shallow_for_the_gradient_to_fade"
        ),
    ),
    Claim(
        "soft_attention_trains_better_than_hard",
        "transformer_ablations",
        "Soft attention trains better than picking one key: the same small Transformer, trained the same steps with "
        "hard attention (each query takes only its top-scoring key's value, one-hot forward, gradient through the "
        f"softmax), ends with a validation loss more than {HARD_MARGIN} nats above the soft-attention model's.",
        soft_attention_trains_better_than_hard,
        warn=True,
        section="3.1",
        statement_zh="软注意力比只挑一个词训练得更好：同一个小 Transformer 用硬注意力"
        "（每个查询只取得分最高的那个键的值，前向是独热，梯度走 softmax）训练同样的步数，"
        f"验证损失比软注意力高出 {HARD_MARGIN} nats 以上。",
        falsifier=f"A hard-attention model that trains to within {HARD_MARGIN} nats of the soft one, or better.",
        counterexample=(
            "tests/test_claims.py::test_soft_trains_better_than_hard_where_blending_is_needed_and_not_where_one_key_answers"
        ),
    ),
    Claim(
        "fact_neurons_matter",
        "ffn_memories",
        "The FFN's neurons store facts: on a model of word-sized units (BPE) trained on the corpus, for facts the "
        "corpus names (a capital given its country, a city's state, a country's adjective), on each of two seeds, the "
        "model knows the facts on held-out prompts (its answer is likelier after its own subject than after the "
        "relation's other subjects, 95 % interval over facts above 0) and a few neurons chosen on other prompts take "
        "more of that knowledge, beyond activation-matched neurons, than the same selection takes in the untrained "
        "twin (paired interval above 0).",
        fact_neurons_matter,
        warn=True,
        section="3.3",
        statement_zh="FFN 里存着“事实”：在语料上训练的词级（BPE）小模型，对语料里出现过的事实"
        "（国家的首都、城市所在的州、国家的形容词），两个种子上都在留出的提示上“知道”事实"
        "（答案跟在它自己的主语后面比跟在同类其他主语后面更可能），"
        "并且在其他提示上选出的少数神经元置零后，拿走的这部分知识（超出激活相当的神经元）"
        "比同样的选法在未训练的同形模型上拿走的更多。",
        falsifier="On some seed the knowledge interval reaches 0 (an untrained model, or one trained where the facts do"
        " not hold), or the chosen neurons take no more than the same selection takes in the untrained twin; not "
        "judged when the corpus names no fact often enough.",
        counterexample="tests/test_facts.py::test_a_model_trained_where_the_capitals_are_swapped_fails",
    ),
    # --- 4 long context
    Claim(
        "attention_scales_as_claimed",
        "attention_cost",
        "Double the length, four times the memory: the reference's peak memory grows as N² (exponent 1.8–2.2, ×3.6–4.4 "
        "at the last "
        "doubling), the fused kernel's as N (exponent ≤ 1.1), in the training pass.",
        attention_scales_as_claimed,
        section="4.1",
        statement_zh="长度翻倍，显存翻四倍：朴素注意力的峰值内存按 N² 增长；融合内核（FlashAttention 式）按 N 增长。",
        falsifier="A reference memory exponent outside 1.8–2.2 (or a last doubling outside ×3.6–4.4), or a fused "
        "kernel above N^1.1.",
        counterexample=(
            "tests/test_long_context.py::test_memory_claim_fails_when_the_reference_never_builds_the_score_matrix"
        ),
    ),
    Claim(
        "attention_time_scales_as_claimed",
        "attention_cost",
        "Double the length, about four times the time: the reference's time grows as N² (exponent 1.5–2.8), the "
        "sliding window's "
        "about as N (0.6–1.5, and below the reference's by 0.3 or more), in the training pass. Wall time on a shared "
        "CPU: a warning "
        "when load or cache effects bend it.",
        attention_time_scales_as_claimed,
        warn=True,
        section="4.1",
        statement_zh="长度翻倍，时间约翻四倍：朴素注意力的时间按 N² 增长，滑动窗口注意力约按 N 增长。",
        falsifier="A reference time exponent outside 1.5–2.8, or a window exponent outside 0.6–1.5 or not 0.3 below "
        "the reference's.",
        counterexample="tests/test_claims.py::test_attention_time_claim_fails_for_a_window_that_masks_full_attention",
    ),
    Claim(
        "kv_cache_grows_recurrent_state_does_not",
        "generation_cost",
        "The KV cache carried between generated tokens grows with the context (2·n_layer·L·n_embd values) while the "
        "RNN's and "
        "LSTM's state stays one size.",
        kv_cache_grows_recurrent_state_does_not,
        kind="demonstration",
        section="4.2",
        statement_zh="生成时 Transformer 的 KV 缓存随上下文变长而增长，RNN/LSTM 的隐状态大小不变。",
        falsifier="A KV cache that does not grow at every longer context, or a recurrent state whose size changes.",
    ),
    Claim(
        "kv_cache_pays",
        "generation_cost",
        "With the KV cache a token's time grows at most linearly with the context (exponent ≤ 1.1), grows less than "
        "without it (which reruns the context), and at the longest context is at most half the time without it. "
        "Wall time on a shared CPU: a warning when load bends it.",
        kv_cache_pays,
        warn=True,
        section="4.2",
        statement_zh="有了 KV 缓存，每生成一个词的时间随上下文至多线性增长，比不用缓存（每次重算整个上下文）增长得"
        "慢，并且在最长的上下文上不到不用缓存时的一半。",
        falsifier="A cached per-token time exponent above 1.1, an uncached time growing no faster than the cached "
        "one, or a cached token costing more than half an uncached one at the longest context (e.g. a cache that "
        "keeps the tokens and reruns them).",
        counterexample="tests/test_claims.py::test_a_cache_that_reruns_its_tokens_fails_the_kv_cache_claim",
    ),
    Claim(
        "arithmetic_matches_measurement",
        "long_context_cost",
        "The arithmetic holds on our own runs: the KV cache measured in generation_cost equals "
        "2·n_layer·n_head·head_dim·L·4 bytes "
        "at every L; the reference attention's peak memory is a constant multiple of its N×N score matrix (max/min of "
        "the ratio ≤ "
        "1.25 over the fitted N) and doubling N multiplies it by 3.6–4.4 (the article's ×4).",
        arithmetic_matches_measurement,
        kind="demonstration",
        section="4.1",
        statement_zh="文章的算术在我们自己的运行上成立：实测 KV 缓存等于 2·层数·头数·头维·L·4 "
        "字节；朴素注意力的峰值内存是 N×N 分数矩阵的固定倍数。",
        falsifier="A measured cache that differs from the formula, or a peak memory whose ratio to N² drifts by more "
        "than 1.25× "
        "over N.",
    ),
    Claim(
        "recurrence_is_the_serial_bottleneck",
        "long_context_cost",
        "Recurrence is the serial bottleneck: a recurrent forward pass has T·n_layer dependent steps (the 100th word "
        "waits for "
        "the 99 before it) while the Transformer's has 2·n_layer whatever T, and, measured, the Transformer's training "
        "step "
        "costs less per token than the RNN's and the LSTM's at the longest length (a timing: a warning when it does "
        "not).",
        recurrence_is_the_serial_bottleneck,
        warn=True,
        section="2.1",
        statement_zh="循环网络是串行的瓶颈：第 100 个词要等前 99 个算完（关键路径 T·层数步），Transformer "
        "的关键路径只有 2·层数步；实测在最长序列上 Transformer 每个词的训练时间更短。",
        falsifier="The Transformer costing more per token than a recurrent model at the longest length measured (as on "
        "a 2-core "
        "CPU, with no parallel width to use), or a critical path that does not grow with T for the recurrent models.",
        counterexample=(
            "tests/test_claims.py::test_a_transformer_run_position_by_position_is_no_cheaper_than_the_recurrence"
        ),
    ),
    Claim(
        "later_context_helps",
        "context_usage",
        "Later context helps: every model's loss falls from the first positions to the last (gain > 0); the windowed "
        "Transformer "
        "saturates no later than its receptive field and, beyond that field, is no better than full attention (95% "
        "bootstrap "
        "interval over validation blocks); how far context helps each model is reported.",
        later_context_helps,
        warn=True,
        section="4.1",
        statement_zh="更长的上下文有用：每个模型在靠后位置的损失低于开头；滑动窗口模型在感受野内就饱和，窗口之后不比全注意力好。",
        falsifier="A model whose loss does not fall with position, or a window model that keeps improving beyond its "
        "receptive "
        "field or beats full attention after its window.",
        counterexample=(
            "tests/test_long_context_cost.py::test_a_window_better_than_full_attention_beyond_its_field_fails_later_context_helps"
        ),
    ),
    Claim(
        "heads_differ",
        "attention_heads",
        "The heads do not all do one thing: on validation text, in some layer of the trained Transformer, zeroing "
        "the costliest head (chosen on half the blocks) costs more than zeroing the cheapest, beyond the 95 % "
        "interval on the other half (head classes and the one-head twin beside it).",
        heads_differ,
        warn=True,
        section="3.3",
        statement_zh="多头注意力的各个头分工不同：在验证文本上，同一层里置零代价最大的头（在一半验证块上选出）"
        "比置零代价最小的头损失更大，在另一半验证块上超出 95% 区间。",
        falsifier="No layer whose costliest and cheapest heads part beyond the held-out interval (e.g. a model whose "
        "heads are copies of one head).",
        counterexample=(
            "tests/test_claims.py::test_heads_differ_on_a_model_trained_on_real_text_and_fail_when_its_heads_are_copies_of_one"
        ),
    ),
    # --- 5 quantization
    Claim(
        "int8_model_size",
        "quantized_models",
        f"INT8 makes the whole model about half of FP16: every weight in memory (quantized layers, and what stays "
        f"unquantized) "
        f"≤ {0.60}× the whole FP16 model (the quantized layers' own ratio beside it).",
        int8_model_size,
        kind="demonstration",
        section="5.1",
        statement_zh="INT8 让整个模型的内存约为 FP16 的一半（整模型 ≤ 0.60×，含未量化的部分）。",
        falsifier="The whole INT8 model above 0.60× the FP16 model's bytes (e.g. when the embedding and head stay in "
        "float32).",
    ),
    Claim(
        "nf4_model_size",
        "quantized_models",
        f"4-bit (NF4) makes the whole model about a quarter of FP16: ≤ {0.35}× the whole FP16 model.",
        nf4_model_size,
        kind="demonstration",
        section="5.1",
        statement_zh="4 比特（NF4）让整个模型约为 FP16 的四分之一（整模型 ≤ 0.35×）。",
        falsifier="The whole NF4 model above 0.35× the FP16 model's bytes.",
    ),
    Claim(
        "int8_perplexity_cost",
        "quantized_models",
        "INT8 raises the Transformer's validation perplexity by at most 1 % (a warning: the figure is reported either "
        "way).",
        int8_perplexity_cost,
        warn=True,
        section="5.1",
        statement_zh="INT8 量化几乎不损失效果：验证困惑度最多上升 1%。",
        falsifier="A validation perplexity more than 1 % above FP32's.",
        counterexample=(
            "tests/test_quantization.py::test_perplexity_claims_fail_on_a_model_whose_weights_have_outlier_columns"
        ),
    ),
    Claim(
        "nf4_perplexity_cost",
        "quantized_models",
        "NF4 raises the Transformer's validation perplexity by at most 5 % (a warning: the figure is reported either "
        "way).",
        nf4_perplexity_cost,
        warn=True,
        section="5.1",
        statement_zh="NF4 量化的代价很小：验证困惑度最多上升 5%。",
        falsifier="A validation perplexity more than 5 % above FP32's.",
        counterexample=(
            "tests/test_quantization.py::test_perplexity_claims_fail_on_a_model_whose_weights_have_outlier_columns"
        ),
    ),
]


@dataclass(frozen=True)
class NotMeasured:
    """A statement of the article this pipeline does not measure, and why (listed in the report)."""

    section: str
    statement: str
    statement_zh: str
    reason: str


NOT_MEASURED: list[NotMeasured] = [
    NotMeasured(
        "3.3",
        "Residual connections are what let stacks of tens of layers train.",
        "残差连接让几十层的网络能够训练。",
        "The residual study trains 2 to 12 layers for 30 steps each on a 2-core CPU within the default run's time; "
        "deeper stacks trained long enough to judge are beyond that budget.",
    ),
    NotMeasured(
        "4.1",
        "FlashAttention's fused kernel saves GPU memory and time against materialising the score matrix.",
        "FlashAttention 的融合内核相比显式的注意力矩阵节省显存和时间。",
        "Measured on the CPU's fused SDPA kernel here; the GPU's memory and speed are measured only where a GPU is "
        "lent (configs/gpu.yaml, benchmarks/results/*gpu*), never on the default run.",
    ),
    NotMeasured(
        "5.1",
        "INT4 against NF4: which 4-bit format keeps more of the model.",
        "INT4 与 NF4 的比较：哪种 4 比特格式保留得更多。",
        "bitsandbytes quantizes to 4 bits as NF4 or FP4 only; a plain INT4 format needs another kernel library, "
        "outside the chosen dependencies.",
    ),
    NotMeasured(
        "3.3",
        "Models hallucinate: they answer fluently about what they never learned.",
        "模型会“幻觉”：对没学过的东西也能流利作答。",
        "The fact study reports the fact model's confidence on prompts about made-up entities (a figure), but no "
        "hallucination rate: that needs a generative model large enough to answer questions and a checked set of "
        "questions.",
    ),
]
