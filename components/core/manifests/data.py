"""Manifests of the data stages: the corpus, the tokenizer, the labels (and their shards), the word
vectors and their evaluation, and the n-gram baseline."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .base import Manifest, R, metric_group


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
class AnalogyScores:
    """The analogy set's result (metrics under "analogy/"), with its 95 % interval and chance."""

    accuracy_lo: float
    accuracy_hi: float
    chance: float  # one right answer among the searchable words
    correct: float
    answered: float
    coverage: float
    accuracy: float | None = None  # logged when some analogy was answered

    @property
    def share_correct(self) -> float:
        return self.accuracy if self.accuracy is not None else self.correct / max(self.answered, 1)


@dataclass(frozen=True, kw_only=True)
class KingQuery:
    """king − man + woman: queen's rank among the candidates, against random target words' ranks ("king/")."""

    target_rank: float
    candidates: float
    random_rank_median: float = math.nan
    random_rank_p05: float = math.nan


@dataclass(frozen=True, kw_only=True)
class WordSimScores:
    """WordSim353 ("wordsim353/"): Spearman's correlation with human scores, its interval, related − unrelated."""

    spearman_lo: float
    spearman: float = math.nan
    related_minus_unrelated_lo: float | None = None


@dataclass(frozen=True, kw_only=True)
class DistanceSpread:
    """How spread the distances between words are ("distance/"): learned vectors against random ones."""

    learned_cv: float
    random_cv: float


@dataclass(frozen=True, kw_only=True)
class EmbeddingEval(Manifest):
    KIND = "embedding_eval"

    metrics: dict[str, float] = field(default_factory=dict)

    def _group(self, cls: type[R], prefix: str) -> R | None:
        return metric_group(cls, self.metrics, prefix, f"embedding_eval {self.asset}".strip())

    @property
    def analogy(self) -> AnalogyScores | None:
        return self._group(AnalogyScores, "analogy/")

    @property
    def king(self) -> KingQuery | None:
        return self._group(KingQuery, "king/")

    @property
    def wordsim(self) -> WordSimScores | None:
        return self._group(WordSimScores, "wordsim353/")

    @property
    def distance(self) -> DistanceSpread | None:
        return self._group(DistanceSpread, "distance/")

    @property
    def gensim_analogy(self) -> AnalogyScores | None:
        """gensim's Word2Vec on the same sentences and settings, where it was trained beside ours."""
        return self._group(AnalogyScores, "gensim/analogy/")

    @property
    def gensim_king(self) -> KingQuery | None:
        return self._group(KingQuery, "gensim/king/")

    @property
    def gensim_wordsim(self) -> WordSimScores | None:
        return self._group(WordSimScores, "gensim/wordsim353/")


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
