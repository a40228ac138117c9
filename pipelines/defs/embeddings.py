"""Embedding stage: word2vec (skip-gram / CBOW) in PyTorch on the corpus, and its evaluation on the
standard sets shipped in gensim's test data."""

import time

import dagster as dg
from pydantic import Field

from components.core.corpus import load_corpus
from components.core.embeddings import (
    EmbeddingEvalSettings,
    Word2VecSettings,
    build_vocab,
    evaluate_with_settings,
    load_embeddings,
    save_embeddings,
    train_word2vec,
)
from components.core.embeddings.reference import load_reference, save_reference, train_gensim
from components.core.embeddings.sentences import corpus_sentences
from components.core.manifests import Corpus, EmbeddingEval, WordEmbeddings
from components.core.tokenizer import word_level_from_vocab
from components.orchestration.language_model import TRAINING_POOL
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "embeddings"
# gensim's figures embedding_eval reports beside ours (as gensim/<name>)
REFERENCE_METRICS = ("analogy/", "wordsim353/", "simlex999/", "king/target_rank", "king/candidates")


class WordEmbeddingsConfig(dg.Config, Word2VecSettings):
    """word2vec, with gensim's parameter names."""

    gensim_reference: bool = Field(
        default=True,
        description="Also train gensim's Word2Vec on the same sentences with the same settings: the reference "
        "embedding_eval scores beside ours (the analogy claim judges ours not below it).",
    )


class EmbeddingEvalConfig(dg.Config, EmbeddingEvalSettings):
    """Evaluation sets and probes."""


@dg.asset(group_name=GROUP, kinds={"pytorch", "safetensors"}, pool=TRAINING_POOL)
def word_embeddings(
    context: dg.AssetExecutionContext, config: WordEmbeddingsConfig, corpus: Corpus, mlflow: MlflowTracker
) -> dg.Output[WordEmbeddings]:
    """Word vectors trained on the corpus' train split: `vectors.safetensors` ([PAD] row zero), the
    vocabulary with counts (`vocab.tsv`) and a word-level `tokenizer.json` whose ids are the rows;
    the trainable state (context vectors) kept apart in `trainable/`."""
    with stage(context, mlflow, config.model_dump()) as s:
        sentences = corpus_sentences(load_corpus(corpus.path)["train"]["text"])
        vocab = build_vocab(sentences, config.min_count)
        result = train_word2vec(vocab.encode(sentences), vocab, config, log_metrics=s.run.log_progress)
        files = save_embeddings(result, s.tmp / "embeddings")
        word_level_from_vocab(vocab.words).save(str(s.tmp / "embeddings" / "tokenizer.json"))
        metrics, reference = dict(result.metrics), None
        if config.gensim_reference:
            t0 = time.perf_counter()
            model = train_gensim(sentences, config)
            metrics["gensim/train_seconds"] = time.perf_counter() - t0
            reference = s.final_path(save_reference(model, s.tmp / "embeddings"))
        return s.publish(
            WordEmbeddings(
                path=s.final_path(s.tmp / "embeddings"),
                vocab_size=len(vocab),
                metrics=metrics,
                reference_path=reference,
            ),
            metrics=metrics,
            files={"embeddings": s.tmp / "embeddings"},
            artifacts=[files["vocab"]],
            values={
                "vocab_size": len(vocab),
                "corpus_words": vocab.total_count,
                "sentences": len(sentences),
                "pad_row_is_zero": bool((result.vectors[0] == 0).all()),
            },
        )


@dg.asset(group_name=GROUP, kinds={"python"})
def embedding_eval(
    context: dg.AssetExecutionContext,
    config: EmbeddingEvalConfig,
    word_embeddings: WordEmbeddings,
    mlflow: MlflowTracker,
) -> dg.Output[EmbeddingEval]:
    """Analogies (3CosAdd, top 30k words), WordSim353 and SimLex-999 Spearman, nearest neighbours,
    king − man + woman, one-hot versus learned vectors, and a PCA plot of the probe words (our own
    evaluators, checked against gensim's on gensim's evaluation sets)."""
    with stage(context, mlflow, config.model_dump()) as s:
        emb = load_embeddings(word_embeddings.path)
        report = evaluate_with_settings(emb.vocab.words, emb.vectors, config)
        metrics = report.metrics()
        if word_embeddings.reference_path:  # gensim's vectors, scored by the same evaluators
            ref = evaluate_with_settings(*load_reference(word_embeddings.reference_path), config).metrics()
            metrics.update({f"gensim/{k}": v for k, v in ref.items() if k.startswith(REFERENCE_METRICS)})
        return s.publish(
            EmbeddingEval(metrics=metrics),
            metrics=metrics,
            figures={"pca_probe_words": report.figure},
            texts=report.tables(),
            warnings=report.notes,
        )
