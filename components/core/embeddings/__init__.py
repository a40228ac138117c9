"""Word embeddings: word2vec (skip-gram / CBOW) in PyTorch and the standard evaluations."""

from .evaluate import (
    DEFAULT_PROBE_TRIPLES,
    DEFAULT_PROBE_WORDS,
    EmbeddingEvalSettings,
    EmbeddingReport,
    evaluate_embeddings,
    evaluate_with_settings,
    gensim_test_file,
)
from .vocab import SPECIAL_TOKENS, Vocab, build_vocab, word_tokenize
from .word2vec import (
    LoadedEmbeddings,
    Word2VecResult,
    load_embeddings,
    save_embeddings,
    train_from_tokens,
    train_word2vec,
)
from .word2vec_settings import Word2VecSettings
from .word_tasks import AnalogyResult, SimilarityResult, WordIndex, evaluate_analogies, evaluate_word_pairs

__all__ = [
    "DEFAULT_PROBE_TRIPLES",
    "DEFAULT_PROBE_WORDS",
    "SPECIAL_TOKENS",
    "AnalogyResult",
    "EmbeddingEvalSettings",
    "EmbeddingReport",
    "LoadedEmbeddings",
    "SimilarityResult",
    "Vocab",
    "WordIndex",
    "Word2VecResult",
    "Word2VecSettings",
    "build_vocab",
    "evaluate_analogies",
    "evaluate_embeddings",
    "evaluate_with_settings",
    "evaluate_word_pairs",
    "gensim_test_file",
    "load_embeddings",
    "save_embeddings",
    "train_from_tokens",
    "train_word2vec",
    "word_tokenize",
]
