"""Inside the trained Transformer: what each head attends to (and whether several heads matter), the
FFN's neurons as key-value memories, probed on facts and on made-up entities, and what attending to
only the top-scoring keys costs.

    transformer_lm, transformer_1head_lm, labels, tokenizer, memory_induction ──► attention_heads
    transformer_lm, labels, tokenizer, corpus ──► ffn_memories (and a small BPE model per seed for the facts)
    transformer_lm, labels ──► attention_topk (top-k keys per query against the full softmax)
    transformer_lm, lstm_lm, tokenizer ──► article_examples (我爱你 / 你爱我, 今天 天气 真 不错, one query's mix,
                                                              the LSTM's gates)
"""

import math
from typing import Optional

import dagster as dg

from components.core.corpus import load_corpus
from components.core.labels import load_labels
from components.core.lm import load_lm
from components.core.manifests import (
    ArticleExamples,
    AttentionHeads,
    AttentionTopk,
    Corpus,
    FactSeed,
    FfnMemories,
    HeadAblation,
    HeadsDiffer,
    HeadStatistics,
    Labels,
    LanguageModel,
    MemoryInduction,
    Tokenizer,
    typed_rows,
)
from components.core.models.transformer import TransformerSettings
from components.core.studies.attention_topk import AttentionTopKSettings
from components.core.studies.attention_topk import attention_topk as run_attention_topk
from components.core.studies.examples import ExamplesSettings
from components.core.studies.examples import article_examples as run_article_examples
from components.core.studies.facts import FactSettings, fact_memories
from components.core.studies.inside import attention_heads as run_attention_heads
from components.core.studies.inside import ffn_memories as run_ffn_memories
from components.core.studies.inside import known_words
from components.core.studies.inside_settings import InsideSettings
from components.core.tokenizer import load_tokenizer
from components.core.train_settings import TrainSettings
from components.orchestration.language_model import TRAINING_POOL, TrainConfig, TransformerModelConfig
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "inside"


class InsideConfig(dg.Config, InsideSettings):
    """Sentences, thresholds and sizes of the look inside the Transformer."""


class ExamplesConfig(dg.Config, ExamplesSettings):
    """Sentences of the article's examples run through the trained models."""


class AttentionTopKConfig(dg.Config, AttentionTopKSettings):
    """Keys kept per query and validation blocks of the top-k attention evaluation."""


def _codec(tokenizer: Tokenizer):
    tok = load_tokenizer(tokenizer.path)
    return (lambda ids: tok.decode(ids, skip_special_tokens=False)), (
        lambda text: tok.encode(text, add_special_tokens=False).ids
    )


@dg.asset(group_name=GROUP, kinds={"pytorch"})
def attention_heads(
    context: dg.AssetExecutionContext,
    config: InsideConfig,
    transformer_lm: LanguageModel,
    transformer_1head_lm: LanguageModel,
    labels: Labels,
    tokenizer: Tokenizer,
    memory_induction: MemoryInduction,
    mlflow: MlflowTracker,
) -> dg.Output[AttentionHeads]:
    """Attention maps per layer and head; each head's share of attention on the previous, first and
    same token, mean distance and entropy over validation text, and its class (thresholds in the
    config); the loss increase when each head is zeroed; the model against its one-head twin; and,
    from `memory_induction`, the previous-token and induction heads found on repeated random spans
    and what zeroing them costs (what `heads_differ` judges)."""
    with stage(context, mlflow, config.model_dump()) as s:
        _, val, _ = load_labels(labels.path)
        decode, encode = _codec(tokenizer)
        r = run_attention_heads(
            load_lm(transformer_lm.weights),
            val,
            config,
            decode=decode,
            encode=encode,
            one_head=load_lm(transformer_1head_lm.weights),
        )
        metrics = r.metrics()
        thresholds = {
            k: getattr(config, k) for k in ("prev_threshold", "first_threshold", "self_threshold", "local_distance")
        }
        return s.publish(
            AttentionHeads(
                heads=typed_rows(HeadStatistics, r.heads),
                ablation=typed_rows(HeadAblation, r.ablation),
                differ=typed_rows(HeadsDiffer, r.differ),
                base_loss=r.base_loss,
                one_head_loss=math.nan if r.one_head_loss is None else r.one_head_loss,
                thresholds=thresholds,
                metrics=metrics,
                induction={k: getattr(memory_induction, k) for k in ("found", "base", "ablations", "heads", "n_layer")},
            ),
            metrics=metrics,
            tables={
                "heads": r.heads,
                "heads_differ": r.differ,
                "induction_heads": memory_induction.heads,
                "induction_ablations": memory_induction.ablations,
            },
            figures=r.figures,
            values={"thresholds": dg.MetadataValue.json(thresholds)},
        )


class FactModelConfig(TransformerModelConfig):
    """The fact model: a small Transformer over the fact study's BPE units."""

    block_size: int = 64


class FactTrainConfig(TrainConfig):
    """The fact model's training: about 0.7 of an epoch of the training split at BPE-2048."""

    max_steps: int = 600
    eval_interval: int = 0  # the whole validation split once, at the end
    eval_batch_size: Optional[int] = 64


class FactStudyConfig(dg.Config, FactSettings):
    """Which facts, how many seeds, and the neuron probe."""


class FfnMemoriesConfig(dg.Config):
    neurons: InsideConfig = InsideConfig()
    model: FactModelConfig = FactModelConfig()
    train: FactTrainConfig = FactTrainConfig()
    facts: FactStudyConfig = FactStudyConfig()


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def ffn_memories(
    context: dg.AssetExecutionContext,
    config: FfnMemoriesConfig,
    transformer_lm: LanguageModel,
    labels: Labels,
    tokenizer: Tokenizer,
    corpus: Corpus,
    mlflow: MlflowTracker,
) -> dg.Output[FfnMemories]:
    """FFN neurons as key-value memories. On the byte Transformer: the most selective neurons' top
    contexts and promoted tokens. On facts (a capital given its country, a city's state, a country's
    adjective, as the corpus names them): a BPE model trained per seed on the corpus, each fact's
    knowledge (its answer after its subject against after the relation's other subjects), the neurons
    chosen on some prompts zeroed on held-out prompts against activation-matched ones, the same in the
    untrained twin; the model on the same prompts about made-up entities."""
    with stage(context, mlflow, config.model_dump()) as s:
        _, val, _ = load_labels(labels.path)
        decode, _ = _codec(tokenizer)
        dd = load_corpus(corpus.path)
        texts = {split: list(dd[split]["text"]) for split in ("train", "validation")}
        neurons = run_ffn_memories(load_lm(transformer_lm.weights), val, config.neurons, decode=decode)
        r = fact_memories(
            texts["train"],
            texts["validation"],
            TransformerSettings(**config.model.model_dump()),
            TrainSettings(**config.train.model_dump()),
            FactSettings(**config.facts.model_dump()),
            s.tmp / "facts",
            known=known_words(texts["train"] + texts["validation"]),
        )
        metrics = r.metrics()
        fact_rows = [{"seed": x.seed, **row} for x in r.seeds for row in x.rows]
        control_rows = [{"seed": x.seed, **row} for x in r.seeds for row in x.control_rows]
        written = {"fact_tokenizer": r.tokenizer_path} | {f"fact_model_seed{x.seed}": x.weights for x in r.seeds}
        files = {name: path for name, path in written.items() if path is not None}
        if len(files) < len(written):
            raise RuntimeError(f"the fact study wrote no file for {sorted(set(written) - set(files))}")
        return s.publish(
            FfnMemories(
                neurons=neurons,
                facts_found=len(r.facts),
                seeds=typed_rows(
                    FactSeed,
                    [
                        {"seed": x.seed, "val_loss": x.val_loss, "steps": x.steps, **x.summary}
                        for x in r.seeds
                        if x.summary
                    ],
                ),
                fact_rows=fact_rows,
                made_up=r.made_up,
                prompts_in_training_text=r.prompts_in_training_text,
                metrics=metrics,
            ),
            metrics=metrics,
            tables={
                "neurons": [
                    {
                        **n,
                        "key_contexts": " | ".join(n["key_contexts"]),
                        "value_tokens": " ".join(repr(t) for t in n["value_tokens"]),
                    }
                    for n in neurons
                ],
                "facts": [
                    {
                        "relation": f.relation,
                        "subject": f.subject,
                        "answer": f.answer,
                        "training_sentences": f.cooccurrences,
                    }
                    for f in r.facts
                ],
                "fact_probe": fact_rows,
                "fact_probe_untrained": control_rows,
                "made_up": r.made_up,
            },
            figures=r.figures,
            files=files,
        )


@dg.asset(group_name=GROUP, kinds={"pytorch"})
def attention_topk(
    context: dg.AssetExecutionContext,
    config: AttentionTopKConfig,
    transformer_lm: LanguageModel,
    labels: Labels,
    mlflow: MlflowTracker,
) -> dg.Output[AttentionTopk]:
    """Soft attention against picking only the top-scoring keys: the trained Transformer's validation
    loss with each query restricted to its top-k keys (renormalised), for each k, against the full
    softmax; and the share of the softmax's weight those k keys carry."""
    with stage(context, mlflow, config.model_dump()) as s:
        _, val, _ = load_labels(labels.path)
        r = run_attention_topk(load_lm(transformer_lm.weights), val, config)
        metrics = r.metrics()
        return s.publish(
            AttentionTopk(rows=r.rows, block_size=r.block_size, blocks=r.blocks, metrics=metrics),
            metrics=metrics,
            tables={"topk": r.rows},
            figures=r.figures,
        )


@dg.asset(group_name=GROUP, kinds={"pytorch"})
def article_examples(
    context: dg.AssetExecutionContext,
    config: ExamplesConfig,
    transformer_lm: LanguageModel,
    lstm_lm: LanguageModel,
    tokenizer: Tokenizer,
    mlflow: MlflowTracker,
) -> dg.Output[ArticleExamples]:
    """The article's own examples through this run's tokenizer and models: 我爱你 / 你爱我 first-layer
    scores with and without positional encoding (equal up to the permutation without it); 今天 天气 真
    不错 as word-level input/label pairs; one query's attention as a weighted mix over a sentence; the
    trained LSTM's gates token by token."""
    with stage(context, mlflow, config.model_dump()) as s:
        decode, encode = _codec(tokenizer)
        r = run_article_examples(load_lm(transformer_lm.weights), load_lm(lstm_lm.weights), encode, decode, config)
        return s.publish(
            ArticleExamples(
                word_order={k: v for k, v in r.word_order.items() if k not in ("without_position", "with_position")},
                metrics=r.metrics,
                attention_mix=r.attention_mix,
                lstm_gates=r.lstm_gates,
                shifted_pairs=r.shifted_pairs,
            ),
            metrics=r.metrics,
            tables={"attention_mix": r.attention_mix, "lstm_gates": r.lstm_gates, "shifted_pairs": r.shifted_pairs},
            texts=r.texts,
        )
