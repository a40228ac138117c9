"""Manifests of the data stages: the corpus, the tokenizer, the labels (and their shards), the word
vectors and their evaluation, and the n-gram baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import Manifest


@dataclass(frozen=True, kw_only=True)
class Corpus(Manifest):
    KIND = "corpus"

    path: str  # the Arrow dataset folder
    content_sha256: str
    documents: int
    train_documents: int
    validation_documents: int
    characters: int
    train_characters: int
    validation_characters: int
    words: int
    bytes: int
    non_ascii_share: float
    dropped_null_rows: int
    dropped_short_documents: int
    skipped_files: int


@dataclass(frozen=True, kw_only=True)
class CorpusShard(Corpus):
    KIND = "corpus_shard"

    shard: str
    source: dict[str, Any] = field(default_factory=dict)  # the shard's source file: path, bytes, …


@dataclass(frozen=True, kw_only=True)
class Tokenizer(Manifest):
    KIND = "tokenizer"

    path: str  # tokenizer.json
    kind: str  # bpe | word | char
    sha256: str
    vocab_requested: int
    vocab_learned: int
    vocab_size: int
    unk_rate: float
    chars_per_token: float
    bytes_per_token: float
    val_tokens: int


@dataclass(frozen=True, kw_only=True)
class ShardTokenizer(Tokenizer):
    KIND = "shard_tokenizer"

    trained_on: dict[str, Any] = field(default_factory=dict)  # the shards it was trained on


@dataclass(frozen=True, kw_only=True)
class Labels(Manifest):
    """Shifted next-token labels: token blocks of `block_size`, the model's context length."""

    KIND = "labels"

    path: str  # the folder with train/validation arrays and meta.json
    tokenizer_sha256: str
    vocab_size: int
    block_size: int
    pad_id: int
    eos_id: int
    ignore_index: int
    train_tokens: int
    train_blocks: int
    train_targets: int
    validation_tokens: int
    validation_blocks: int
    validation_targets: int


@dataclass(frozen=True, kw_only=True)
class LabelShard(Labels):
    KIND = "label_shard"

    shard: str


@dataclass(frozen=True, kw_only=True)
class ShardedLabels(Labels):
    KIND = "sharded_labels"

    n_shards: int
    shards: dict[str, str] = field(default_factory=dict)  # shard → the Dagster run that labelled it


@dataclass(frozen=True, kw_only=True)
class WordEmbeddings(Manifest):
    KIND = "word_embeddings"

    path: str
    vocab_size: int
    metrics: dict[str, float] = field(default_factory=dict)
    reference_path: str | None = None  # gensim's vectors on the same sentences and settings (word2vec text format)


@dataclass(frozen=True, kw_only=True)
class EmbeddingEval(Manifest):
    KIND = "embedding_eval"

    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class NgramRung:
    """One order of the count ladder: its loss on the held-out end of the training stream (counted
    without it; this chooses the order) and on the validation targets (counted over all of it)."""

    order: int
    model: str  # kn_<order>gram
    heldout_loss: float
    val_loss: float
    val_ppl: float
    discounts: list[list[float]] = field(default_factory=list)  # per order 1…n: D1, D2, D3+
    types: int = 0  # distinct n-grams of the top order


@dataclass(frozen=True, kw_only=True)
class NgramBaseline(Manifest):
    """The count ladder: interpolated modified Kneser–Ney n-grams of orders 1, 2, … counted over the
    training tokens, scored on the validation targets the language models are scored on. `chosen`
    ("the count model") is the order with the lowest loss on the held-out end of the training stream."""

    KIND = "ngram_baseline"
    VERSION = 2

    rows: list[NgramRung] = field(default_factory=list)
    chosen: NgramRung
    val_loss: float  # the count model's
    block_size: int
    n_targets: int
    n_heldout_targets: int
    n_train_tokens: int
    vocab_size: int
    tokenizer_sha256: str
