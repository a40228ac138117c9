"""Evaluate word vectors: analogies, word similarity, neighbours, one-hot versus learned (cosines of
probe pairs, pairwise distances), a PCA plot.

Every evaluator takes plain `(words, vectors)` with row i ↔ words[i], so it runs on our vectors and
on gensim's (`kv.index_to_key, kv.vectors`) alike, and reproduces gensim's own numbers
(`evaluate_word_analogies`, `evaluate_word_pairs`, `most_similar`) on the same vectors.

Searches skip the special tokens and any zero row: [PAD] is the zero vector, which has no
direction, so its cosine with anything is undefined. Matching is case-insensitive like gensim's
(`case_insensitive=True`): words are compared upper-cased and, among case variants, the most
frequent (earliest) row stands for the word.

The index and the word-level test sets (analogies, word pairs, the claims' figures on them) are in
`word_tasks`; this module holds the settings, neighbours, one-hot versus learned, distances, PCA
and the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import ConfigError, PipelineInputError
from .word_tasks import (
    AnalogyResult,
    SimilarityResult,
    WordIndex,
    analogy_rank,
    evaluate_analogies,
    evaluate_word_pairs,
    similarity_meaning,
    wilson_interval,
)

DEFAULT_PROBE_WORDS = [
    "king",
    "queen",
    "man",
    "woman",
    "france",
    "paris",
    "germany",
    "berlin",
    "london",
    "war",
    "peace",
    "army",
    "music",
    "art",
    "science",
    "physics",
    "mathematics",
    "water",
    "river",
    "city",
    "country",
    "god",
    "church",
    "one",
    "two",
    "three",
    "january",
    "dog",
    "horse",
    "computer",
]
# anchor, a related word, an unrelated word: one-hot vectors cannot tell them apart, learned ones should
DEFAULT_PROBE_TRIPLES = [
    "cat dog tractor",
    "dog horse computer",
    "king queen river",
    "france germany music",
    "paris london physics",
    "one two church",
    "war army water",
    "music art january",
]


def gensim_test_file(name: str) -> str:
    """A file of gensim's test data (questions-words.txt, wordsim353.tsv, simlex999.txt)."""
    from gensim.test.utils import datapath

    return datapath(name)


class EmbeddingEvalSettings(BaseModel):
    """How the word vectors are evaluated."""

    model_config = ConfigDict(extra="forbid")

    analogy_path: Optional[str] = Field(
        default=None,
        description="Analogy questions (': section' headers, then 'a b c d' lines); None: gensim's "
        "questions-words.txt.",
    )
    wordsim_path: Optional[str] = Field(
        default=None, description="WordSim353 pairs 'w1<TAB>w2<TAB>score'; None: gensim's wordsim353.tsv."
    )
    simlex_path: Optional[str] = Field(
        default=None, description="SimLex-999 pairs 'w1<TAB>w2<TAB>score'; None: gensim's simlex999.txt."
    )
    restrict_vocab: int = Field(
        default=30000,
        ge=1,
        description="Analogies are searched among this many most frequent words (gensim's restrict_vocab).",
    )
    probe_words: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROBE_WORDS),
        description="Words whose nearest neighbours are listed and plotted (PCA).",
    )
    probe_triples: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROBE_TRIPLES),
        description="'anchor related unrelated' word triples for the one-hot versus learned comparison.",
    )
    topn: int = Field(
        default=5, ge=1, description="Neighbours listed per probe word and answers listed for king - man + woman."
    )
    min_analogy_questions: int = Field(
        default=100,
        ge=1,
        description="Fewer answerable analogy questions than this: report coverage only, no accuracy.",
    )
    min_similarity_pairs: int = Field(
        default=20,
        ge=1,
        description="Fewer in-vocabulary word pairs than this: report the OOV share only, no Spearman.",
    )
    distance_words: int = Field(
        default=500,
        ge=3,
        description="Pairwise distances (one-hot, learned, random) among this many most frequent words.",
    )

    @field_validator("probe_triples")
    @classmethod
    def _triples(cls, v: list[str]) -> list[str]:
        for t in v:
            if len(t.split()) != 3:
                raise ValueError(f"probe_triples entries must be 'anchor related unrelated', got {t!r}")
        return v


# --- neighbours, one-hot versus learned, PCA ----------------------------------------------------


def nearest_neighbours(
    index: WordIndex, probe_words: Sequence[str], topn: int = 5
) -> dict[str, list[tuple[str, float]]]:
    """Top-n cosine neighbours of each in-vocabulary probe word (the word itself excluded)."""
    return {w: index.most_similar([w], topn=topn) for w in probe_words if w in index}


def _identity_csr(n: int, dtype: type[np.floating]):
    """The n × n identity matrix in CSR form, as `scipy.sparse.identity(n, dtype, format="csr")` builds it
    (that function's untyped `format` leaves its result any sparse format to a type checker)."""
    import scipy.sparse as sp

    return sp.csr_matrix((np.ones(n, dtype=dtype), np.arange(n), np.arange(n + 1)), shape=(n, n))


def onehot_versus_learned(
    words: Sequence[str], vectors: np.ndarray, index: WordIndex, probe_triples: Sequence[str]
) -> dict:
    """Bytes of one-hot (dense, sparse CSR) and dense embedding matrices for this vocabulary, and the
    cosines of probe pairs under each: one-hot gives 0 for every distinct pair, learned vectors do not."""
    import scipy.sparse as sp

    V = len(words)
    onehot = _identity_csr(V, np.float32)  # row i is the one-hot vector of word i
    sparse_bytes = onehot.data.nbytes + onehot.indices.nbytes + onehot.indptr.nbytes
    # Every distinct pair: the Gram matrix of unit one-hot rows has no off-diagonal non-zero.
    gram = (onehot @ onehot.T).tocoo()
    offdiag = gram.data[gram.row != gram.col]
    max_offdiag = float(np.abs(offdiag).max()) if offdiag.size else 0.0
    row = {w: i for i, w in enumerate(words)}

    def onehot_cos(a: str, b: str) -> float:
        x, y = onehot[row[a]], onehot[row[b]]
        return float((x @ y.T).toarray()[0, 0] / (sp.linalg.norm(x) * sp.linalg.norm(y)))

    triples = []
    for t in probe_triples:
        anchor, related, unrelated = t.split()
        missing = [w for w in (anchor, related, unrelated) if w not in index or w not in row]
        if missing:
            triples.append({"triple": t, "missing": missing})
            continue
        triples.append(
            {
                "triple": t,
                "anchor": anchor,
                "related": related,
                "unrelated": unrelated,
                "onehot_related": onehot_cos(anchor, related),
                "onehot_unrelated": onehot_cos(anchor, unrelated),
                "learned_related": float(index.vector(anchor) @ index.vector(related)),
                "learned_unrelated": float(index.vector(anchor) @ index.vector(unrelated)),
            }
        )
    scored = [t for t in triples if "missing" not in t]
    return {
        "vocab_size": V,
        "dim": int(vectors.shape[1]),
        "onehot_dense_bytes": V * V * 4,  # float32, as the embedding; never allocated
        "onehot_sparse_bytes": int(sparse_bytes),
        "embedding_dense_bytes": V * int(vectors.shape[1]) * 4,
        "onehot_max_offdiag_cosine": max_offdiag,
        "triples": triples,
        "related_higher": sum(t["learned_related"] > t["learned_unrelated"] for t in scored),
        "triples_scored": len(scored),
    }


def distance_spread(index: WordIndex, n: int = 500, seed: int = 0) -> dict:
    """Euclidean distances between every pair of the `n` most frequent searchable words as unit vectors:
    one-hot (each word its own axis: every distinct pair √2 apart, whatever the words), the learned
    vectors, and random Gaussian directions of the same dimension (what "no structure" gives there).
    Per set: min, max, mean, std and cv = std / mean of the pairwise distances."""

    n = min(n, len(index))
    if n < 3:
        raise PipelineInputError(f"only {n} searchable words: too few for pairwise distances")
    iu = np.triu_indices(n, 1)

    def distances(gram: np.ndarray) -> np.ndarray:
        sq = np.diag(gram)[:, None] + np.diag(gram)[None, :] - 2 * gram  # (n, n) squared distances
        return np.sqrt(np.clip(sq[iu], 0, None))

    def stats(d: np.ndarray) -> dict[str, float]:
        mean = float(d.mean())
        return {
            "min": float(d.min()),
            "max": float(d.max()),
            "mean": mean,
            "std": float(d.std()),
            "cv": float(d.std() / mean),
        }

    onehot = _identity_csr(int(index.rows.max()) + 1, np.float64)[index.rows[:n]]  # (n, V) one-hot rows
    learned = index.unit[:n].astype(np.float64)  # (n, D)
    rand = np.random.default_rng(seed).standard_normal(learned.shape)
    rand /= np.linalg.norm(rand, axis=1, keepdims=True)
    return {
        "words": n,
        "pairs": int(len(iu[0])),
        "onehot": stats(distances((onehot @ onehot.T).toarray())),
        "learned": stats(distances(learned @ learned.T)),
        "random": stats(distances(rand @ rand.T)),
    }


def spread_metrics(spread: dict) -> dict[str, float]:
    """`distance_spread` under metric names: distance/words, distance/<onehot|learned|random>_<min|max|mean|std|cv>."""
    m = {"distance/words": float(spread["words"])}
    for kind in ("onehot", "learned", "random"):
        m.update({f"distance/{kind}_{k}": v for k, v in spread[kind].items()})
    return m


def pca_figure(index: WordIndex, probe_words: Sequence[str], title: str = "PCA of probe word vectors"):
    """2-D PCA (SVD of the centred unit vectors) of the in-vocabulary probe words, as a matplotlib Figure."""
    from matplotlib.figure import Figure

    present = [w for w in dict.fromkeys(probe_words) if w in index]
    fig = Figure(figsize=(7, 6), tight_layout=True)
    ax = fig.add_subplot()
    ax.set_title(title)
    if len(present) < 3:
        ax.text(0.5, 0.5, f"only {len(present)} probe words in the vocabulary", ha="center", va="center")
        return fig
    X = np.stack([index.vector(w) for w in present])  # (P, D)
    X = X - X.mean(axis=0)
    U, S, _ = np.linalg.svd(X, full_matrices=False)
    xy = U[:, :2] * S[:2]  # (P, 2)
    explained = (S[:2] ** 2).sum() / (S**2).sum()
    ax.scatter(xy[:, 0], xy[:, 1], s=12)
    for w, (x, y) in zip(present, xy):
        ax.annotate(w, (x, y), fontsize=8, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel("PC1")
    ax.set_ylabel("PC2")
    ax.set_title(f"{title} ({explained:.0%} of variance)")
    return fig


# --- the report ---------------------------------------------------------------------------------


def _fmt(x: float, pct: bool = False) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.4f}"


@dataclass
class EmbeddingReport:
    analogy: AnalogyResult
    wordsim: SimilarityResult
    simlex: SimilarityResult
    neighbours: dict[str, list[tuple[str, float]]]
    king_man_woman: list[tuple[str, float]]  # empty when a word is missing
    onehot: dict
    figure: object  # matplotlib.figure.Figure
    spread: dict = field(default_factory=dict)  # `distance_spread`
    notes: list[str] = field(default_factory=list)
    meaning: dict = field(default_factory=dict)  # `similarity_meaning` on WordSim353
    king_rank: dict = field(default_factory=dict)  # `analogy_rank`: king − man + woman → queen against random words
    searchable: int = 0  # words the analogies are searched among (chance = 1 / (this − 3))

    def metrics(self) -> dict[str, float]:
        """Headline numbers under stable names. An accuracy or correlation computed on too few
        questions/pairs is left out (its coverage / OOV share is still reported)."""
        m = {
            "analogy/coverage": self.analogy.coverage,
            "analogy/answered": float(self.analogy.answered),
            "wordsim353/oov": self.wordsim.oov_ratio,
            "simlex999/oov": self.simlex.oov_ratio,
            "onehot/dense_bytes": float(self.onehot["onehot_dense_bytes"]),
            "onehot/sparse_bytes": float(self.onehot["onehot_sparse_bytes"]),
            "embedding/dense_bytes": float(self.onehot["embedding_dense_bytes"]),
            "onehot/max_offdiag_cosine": self.onehot["onehot_max_offdiag_cosine"],
        }
        if self.analogy.reliable:
            m["analogy/accuracy"] = self.analogy.accuracy
        for name, r in (("wordsim353", self.wordsim), ("simlex999", self.simlex)):
            if r.reliable and not math.isnan(r.spearman):
                m[f"{name}/spearman"] = r.spearman
        if self.onehot["triples_scored"]:
            m["probe/related_higher_share"] = self.onehot["related_higher"] / self.onehot["triples_scored"]
        if self.spread:
            m.update(spread_metrics(self.spread))
        m.update({f"wordsim353/{k}": float(v) for k, v in self.meaning.items()})
        m.update({f"king/{k}": float(v) for k, v in self.king_rank.items() if isinstance(v, (int, float))})
        if self.searchable > 3 and self.analogy.answered:
            lo, hi = wilson_interval(self.analogy.correct, self.analogy.answered)
            m.update(
                {
                    "analogy/chance": 1.0 / (self.searchable - 3),
                    "analogy/accuracy_lo": lo,
                    "analogy/accuracy_hi": hi,
                    "analogy/correct": float(self.analogy.correct),
                }
            )
        return m

    def tables(self) -> dict[str, str]:
        """Markdown tables: analogy sections, neighbours, king - man + woman, one-hot versus learned."""
        a = self.analogy
        rows = ["| section | accuracy | correct | answered | questions |", "|---|---:|---:|---:|---:|"]
        for s in a.sections:
            rows.append(
                f"| {s['section']} | {_fmt(s['accuracy'], True)} | {s['correct']} | {s['answered']} | {s['total']} |"
            )
        rows.append(f"| **total** | {_fmt(a.accuracy, True)} | {a.correct} | {a.answered} | {a.total} |")
        analogy = "\n".join(rows)

        rows = ["| word | neighbours (cosine) |", "|---|---|"]
        for w, nb in self.neighbours.items():
            rows.append(f"| {w} | " + ", ".join(f"{n} ({s:.2f})" for n, s in nb) + " |")
        neighbours = "\n".join(rows)

        rows = ["| rank | word | cosine |", "|---:|---|---:|"]
        rows += [f"| {i} | {w} | {s:.4f} |" for i, (w, s) in enumerate(self.king_man_woman, start=1)]
        if not self.king_man_woman:
            rows.append("| - | king, man or woman is not in the vocabulary | - |")
        k = self.king_rank
        if k:
            rows += [
                "",
                f"{k['target']} ranks {k['target_rank']} of {k['candidates']} candidates for {k['query']}; "
                f"{k['random_words']} random "
                f"words rank {k['random_rank_median']:.0f} at the median and {k['random_rank_p05']:.0f} at the 5th "
                f"percentile.",
            ]
        king = "\n".join(rows)

        o = self.onehot
        mb = 1 / 2**20
        rows = [
            f"Vocabulary {o['vocab_size']} words, {o['dim']} dimensions. One-hot dense "
            f"{o['onehot_dense_bytes'] * mb:.1f} MiB, "
            f"one-hot sparse (CSR) {o['onehot_sparse_bytes'] * mb:.2f} MiB, learned dense "
            f"{o['embedding_dense_bytes'] * mb:.2f} MiB. "
            f"Largest cosine between distinct one-hot vectors: {o['onehot_max_offdiag_cosine']:.1f}.",
            *(
                [
                    "",
                    f"Pairwise distances among the {self.spread['words']} most frequent words (unit vectors): one-hot "
                    f"{self.spread['onehot']['min']:.6f} … {self.spread['onehot']['max']:.6f} (every pair √2); learned "
                    f"{self.spread['learned']['min']:.3f} … {self.spread['learned']['max']:.3f} (std/mean "
                    f"{self.spread['learned']['cv']:.3f}); "
                    f"random directions of the same dimension: std/mean {self.spread['random']['cv']:.3f}.",
                ]
                if self.spread
                else []
            ),
            "",
            "| anchor | related | unrelated | one-hot cos (related) | one-hot cos (unrelated) | learned cos (related) "
            "| learned cos (unrelated) |",
            "|---|---|---|---:|---:|---:|---:|",
        ]
        for t in o["triples"]:
            if "missing" in t:
                rows.append(
                    f"| {' | '.join(t['triple'].split())} | - | - | not in vocabulary: {', '.join(t['missing'])} | - |"
                )
            else:
                rows.append(
                    f"| {t['anchor']} | {t['related']} | {t['unrelated']} | {t['onehot_related']:.1f} | "
                    f"{t['onehot_unrelated']:.1f} "
                    f"| {t['learned_related']:.3f} | {t['learned_unrelated']:.3f} |"
                )
        onehot = "\n".join(rows)
        return {
            "analogy_sections": analogy,
            "neighbours": neighbours,
            "king_man_woman": king,
            "onehot_vs_learned": onehot,
        }


def evaluate_embeddings(
    words: Sequence[str],
    vectors: np.ndarray,
    probe_words: Sequence[str] = tuple(DEFAULT_PROBE_WORDS),
    analogy_path: Optional[str | Path] = None,
    wordsim_path: Optional[str | Path] = None,
    simlex_path: Optional[str | Path] = None,
    *,
    probe_triples: Sequence[str] = tuple(DEFAULT_PROBE_TRIPLES),
    restrict_vocab: int = 30000,
    topn: int = 5,
    min_analogy_questions: int = 100,
    min_similarity_pairs: int = 20,
    distance_words: int = 500,
) -> EmbeddingReport:
    """All evaluations of one set of word vectors (row i ↔ words[i]); paths default to gensim's test data."""
    words = list(words)
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or len(words) != vectors.shape[0]:
        raise ConfigError(f"vectors of shape {vectors.shape} do not match {len(words)} words")
    index = WordIndex(words, vectors)
    if len(index) < 2:
        raise PipelineInputError(f"only {len(index)} non-zero word vectors to evaluate; was the embedding trained?")
    analogy = evaluate_analogies(
        words, vectors, analogy_path or gensim_test_file("questions-words.txt"), restrict_vocab, min_analogy_questions
    )
    wordsim = evaluate_word_pairs(
        words, vectors, wordsim_path or gensim_test_file("wordsim353.tsv"), min_pairs=min_similarity_pairs
    )
    simlex = evaluate_word_pairs(
        words, vectors, simlex_path or gensim_test_file("simlex999.txt"), min_pairs=min_similarity_pairs
    )
    notes = []
    if not analogy.reliable:
        notes.append(
            f"analogy: only {analogy.answered} of {analogy.total} questions answerable (coverage "
            f"{analogy.coverage:.1%}, "
            f"need {min_analogy_questions}); accuracy not reported"
        )
    for r in (wordsim, simlex):
        if not r.reliable:
            notes.append(
                f"{r.name}: only {r.pairs} pairs in vocabulary (OOV {r.oov_ratio:.1%}, need {min_similarity_pairs}); "
                f"Spearman not reported"
            )
    king = (
        index.most_similar(["king", "woman"], ["man"], topn=topn)
        if all(w in index for w in ("king", "man", "woman"))
        else []
    )
    return EmbeddingReport(
        analogy=analogy,
        wordsim=wordsim,
        simlex=simlex,
        neighbours=nearest_neighbours(index, probe_words, topn),
        king_man_woman=king,
        onehot=onehot_versus_learned(words, vectors, index, probe_triples),
        figure=pca_figure(index, probe_words),
        spread=distance_spread(index, distance_words) if len(index) >= 3 else {},
        notes=notes,
        meaning=similarity_meaning(words, vectors, wordsim_path or gensim_test_file("wordsim353.tsv")),
        king_rank=analogy_rank(words, vectors, restrict_vocab=restrict_vocab),
        searchable=len(WordIndex(words, vectors, restrict_vocab)),
    )


def evaluate_with_settings(
    words: Sequence[str], vectors: np.ndarray, settings: EmbeddingEvalSettings
) -> EmbeddingReport:
    """`evaluate_embeddings` driven by an `EmbeddingEvalSettings` (what the Dagster asset calls)."""
    return evaluate_embeddings(
        words,
        vectors,
        settings.probe_words,
        settings.analogy_path,
        settings.wordsim_path,
        settings.simlex_path,
        probe_triples=settings.probe_triples,
        restrict_vocab=settings.restrict_vocab,
        topn=settings.topn,
        min_analogy_questions=settings.min_analogy_questions,
        min_similarity_pairs=settings.min_similarity_pairs,
        distance_words=settings.distance_words,
    )
