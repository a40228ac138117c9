"""The searchable index of word vectors (`WordIndex`) and the word-level test sets scored with it:
analogy questions (`evaluate_analogies`), human-scored word pairs (`evaluate_word_pairs`), and the
claims' figures built on them (`similarity_meaning`, `analogy_rank`, `wilson_interval`). Split out of
`components.core.embeddings.evaluate`, whose module doc says how words are matched and which rows
are searched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import PipelineInputError
from .vocab import SPECIAL_TOKENS

# --- the searchable index -----------------------------------------------------------------------


class WordIndex:
    """Unit-length rows of the searchable words, in vocabulary (frequency) order.

    `restrict_vocab` keeps the first that many searchable rows, like gensim's argument of the same
    name (gensim's vectors carry no special tokens, so the two agree row for row).
    """

    def __init__(self, words: Sequence[str], vectors: np.ndarray, restrict_vocab: Optional[int] = None):
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(words):
            raise ValueError(f"vectors {vectors.shape} must be 2-D with one row per word ({len(words)} words)")
        norms = np.linalg.norm(vectors, axis=1)
        special = np.fromiter((w in SPECIAL_TOKENS for w in words), dtype=bool, count=len(words))
        rows = np.flatnonzero(~special & (norms > 0))
        if restrict_vocab is not None:
            rows = rows[:restrict_vocab]
        self.rows = rows  # (R,) row numbers in the original matrix
        self.words = [words[int(i)] for i in rows]
        self.unit = vectors[rows] / norms[rows, None]  # (R, D)
        self.key = [w.upper() for w in self.words]
        # upper-cased word -> first (most frequent) position; all positions for excluding inputs
        self.pos: dict[str, int] = {}
        self.variants: dict[str, list[int]] = {}
        for p, k in enumerate(self.key):
            self.pos.setdefault(k, p)
            self.variants.setdefault(k, []).append(p)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word.upper() in self.pos

    def vector(self, word: str) -> np.ndarray:
        return self.unit[self.pos[word.upper()]]

    def most_similar(
        self, positive: Sequence[str], negative: Sequence[str] = (), topn: int = 5
    ) -> list[tuple[str, float]]:
        """gensim's `most_similar`: cosine to the normalised mean of the unit input vectors, inputs excluded."""
        q = sum(self.vector(w) for w in positive) - sum((self.vector(w) for w in negative), np.zeros_like(self.unit[0]))
        q = q / np.linalg.norm(q)
        scores = self.unit @ q  # (R,)
        for w in list(positive) + list(negative):
            scores[self.variants[w.upper()]] = -np.inf
        best = np.argsort(-scores)[:topn]
        return [(self.words[p], float(scores[p])) for p in best if np.isfinite(scores[p])]


# --- analogies ----------------------------------------------------------------------------------


@dataclass
class AnalogyResult:
    correct: int
    answered: int  # questions whose four words are all among the `restrict_vocab` searchable words
    total: int  # well-formed questions in the file
    sections: list[dict]  # {"section", "correct", "answered", "total", "accuracy"}
    min_questions: int
    invalid_lines: int = 0

    @property
    def coverage(self) -> float:
        return self.answered / self.total if self.total else 0.0

    @property
    def reliable(self) -> bool:
        return self.answered >= self.min_questions

    @property
    def accuracy(self) -> float:
        """correct / answered; NaN when too few questions are answerable to mean anything."""
        return self.correct / self.answered if self.reliable and self.answered else math.nan


def _read_lines(path: str | Path, what: str) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise PipelineInputError(f"{what} file not found: {path} (point the {what} path setting at an existing file)")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise PipelineInputError(f"{path}: the {what} file is not UTF-8 text (byte offset {e.start})") from e


def read_analogies(path: str | Path) -> tuple[list[tuple[str, list[tuple[str, str, str, str]]]], int]:
    """Sections of (a, b, c, d) questions and the number of malformed lines skipped (as gensim skips them)."""
    sections: list[tuple[str, list]] = []
    invalid = 0
    for lineno, line in enumerate(_read_lines(path, "analogy"), start=1):
        if line.startswith(": "):
            sections.append((line[2:].strip(), []))
            continue
        parts = line.split()
        if not parts:
            continue
        if not sections:
            raise PipelineInputError(
                f"{path}:{lineno}: question before any ': section' header; an analogy file starts with a line like ': "
                f"capital-common-countries'"
            )
        if len(parts) != 4:
            invalid += 1
            continue
        sections[-1][1].append(tuple(parts))
    n = sum(len(q) for _, q in sections)
    if n == 0:
        raise PipelineInputError(
            f"{path}: no analogy questions found (expected ': section' headers and 'a b c d' lines)"
        )
    return sections, invalid


def evaluate_analogies(
    words: Sequence[str],
    vectors: np.ndarray,
    path: str | Path,
    restrict_vocab: int = 30000,
    min_questions: int = 1,
    batch: int = 512,
) -> AnalogyResult:
    """3CosAdd (b - a + c) over the `restrict_vocab` most frequent words, as gensim's `evaluate_word_analogies`.

    Questions with a word outside those words are skipped and lower the coverage instead.
    """
    index = WordIndex(words, vectors, restrict_vocab)
    sections, invalid = read_analogies(path)
    result_sections = []
    correct_total = answered_total = total = 0
    for name, questions in sections:
        keys = [tuple(w.upper() for w in q) for q in questions]
        ok = [k for k in keys if all(w in index.pos for w in k)]
        correct = 0
        for start in range(0, len(ok), batch):
            chunk = ok[start : start + batch]
            a, b, c, d = (np.array([index.pos[k[j]] for k in chunk]) for j in range(4))
            q = index.unit[b] - index.unit[a] + index.unit[c]  # (Q, D); the norm does not change the ranking
            scores = q @ index.unit.T  # (Q, R)
            for i, k in enumerate(chunk):  # the question words themselves (and their case variants) are no answers
                scores[i, [p for w in k[:3] for p in index.variants[w]]] = -np.inf
            predicted = scores.argmax(axis=1)
            correct += int(sum(index.key[p] == k[3] for p, k in zip(predicted, chunk)))
        result_sections.append(
            {
                "section": name,
                "correct": correct,
                "answered": len(ok),
                "total": len(questions),
                "accuracy": correct / len(ok) if ok else math.nan,
            }
        )
        correct_total += correct
        answered_total += len(ok)
        total += len(questions)
    return AnalogyResult(correct_total, answered_total, total, result_sections, min_questions, invalid)


# --- word similarity ----------------------------------------------------------------------------


@dataclass
class SimilarityResult:
    spearman_raw: float
    pearson_raw: float
    pairs: int  # pairs with both words in the vocabulary
    oov_pairs: int
    min_pairs: int
    invalid_lines: int = 0
    name: str = ""

    @property
    def oov_ratio(self) -> float:
        """Share of pairs with an unknown word (gensim returns the same share as a percentage)."""
        n = self.pairs + self.oov_pairs
        return self.oov_pairs / n if n else 1.0

    @property
    def reliable(self) -> bool:
        return self.pairs >= self.min_pairs

    @property
    def spearman(self) -> float:
        return self.spearman_raw if self.reliable else math.nan

    @property
    def pearson(self) -> float:
        return self.pearson_raw if self.reliable else math.nan


def read_word_pairs(path: str | Path, delimiter: str = "\t") -> tuple[list[tuple[str, str, float]], int]:
    """(word1, word2, human score) triples; '#' lines are comments; malformed lines are counted and skipped."""
    pairs, invalid = [], 0
    for line in _read_lines(path, "word-similarity"):
        if not line or line.startswith("#"):
            continue
        parts = line.split(delimiter)
        try:
            a, b, s = parts
            pairs.append((a, b, float(s)))
        except ValueError:
            invalid += 1
    if not pairs:
        raise PipelineInputError(
            f"{path}: no 'word1{delimiter!r}word2{delimiter!r}score' lines found; is this a word-similarity file?"
        )
    return pairs, invalid


def evaluate_word_pairs(
    words: Sequence[str],
    vectors: np.ndarray,
    path: str | Path,
    restrict_vocab: int = 300000,
    min_pairs: int = 1,
) -> SimilarityResult:
    """Spearman (and Pearson) correlation of cosine similarity with human scores, as gensim's `evaluate_word_pairs`."""
    from scipy import stats

    index = WordIndex(words, vectors, restrict_vocab)
    pairs, invalid = read_word_pairs(path)
    gold, model = [], []
    for a, b, s in pairs:
        if a in index and b in index:
            gold.append(s)
            model.append(float(index.vector(a) @ index.vector(b)))
    oov = len(pairs) - len(gold)
    if len(gold) >= 2 and np.ptp(model) > 0:
        spearman = _statistic(stats.spearmanr(gold, model))
        pearson = _statistic(stats.pearsonr(gold, model))
    else:
        spearman = pearson = math.nan
    return SimilarityResult(spearman, pearson, len(gold), oov, min_pairs, invalid, Path(path).name)


# --- the claims' figures: meaning with an interval, king − man + woman against chance ------------


def _statistic(result: Any) -> float:
    """The statistic of a scipy.stats test result (its item 0; scipy leaves the result's type open)."""
    return float(result[0])


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k/n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def similarity_meaning(
    words: Sequence[str],
    vectors: np.ndarray,
    path: str | Path,
    *,
    related: float = 7.0,
    unrelated: float = 3.0,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict:
    """Do related words sit closer? On a human-scored pair file (WordSim353: 0–10): the Spearman
    correlation of cosine with the human score with a bootstrap interval over pairs, and the mean
    cosine of related pairs (score ≥ `related`) minus unrelated ones (≤ `unrelated`), with its
    bootstrap interval. Empty when fewer than 10 pairs are in the vocabulary."""
    from scipy import stats

    index = WordIndex(words, vectors)
    pairs, _ = read_word_pairs(path)
    kept = [(s, float(index.vector(a) @ index.vector(b))) for a, b, s in pairs if a in index and b in index]
    if len(kept) < 10:
        return {}
    gold, cos = (np.array(x) for x in zip(*kept))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        i = rng.integers(0, len(gold), len(gold))
        if np.ptp(cos[i]) > 0 and np.ptp(gold[i]) > 0:
            boots.append(stats.spearmanr(gold[i], cos[i])[0])
    rel, unrel = cos[gold >= related], cos[gold <= unrelated]
    out = {
        "pairs": len(gold),
        "spearman": _statistic(stats.spearmanr(gold, cos)),
        "spearman_lo": float(np.percentile(boots, 2.5)),
        "spearman_hi": float(np.percentile(boots, 97.5)),
        "related_pairs": len(rel),
        "unrelated_pairs": len(unrel),
    }
    if len(rel) >= 3 and len(unrel) >= 3:
        diffs = [rng.choice(rel, len(rel)).mean() - rng.choice(unrel, len(unrel)).mean() for _ in range(n_boot)]
        out.update(
            related_cos=float(rel.mean()),
            unrelated_cos=float(unrel.mean()),
            related_minus_unrelated=float(rel.mean() - unrel.mean()),
            related_minus_unrelated_lo=float(np.percentile(diffs, 2.5)),
            related_minus_unrelated_hi=float(np.percentile(diffs, 97.5)),
        )
    return out


def analogy_rank(
    words: Sequence[str],
    vectors: np.ndarray,
    a: str = "man",
    b: str = "king",
    c: str = "woman",
    target: str = "queen",
    *,
    restrict_vocab: int = 30000,
    n_random: int = 200,
    seed: int = 0,
) -> dict:
    """Where `target` ranks for b − a + c (3CosAdd, the inputs excluded) among the `restrict_vocab`
    most frequent words, against where `n_random` random words rank for the same query: the article's
    king − man + woman ≈ queen, measured against chance. Empty when a word is missing."""
    index = WordIndex(words, vectors, restrict_vocab)
    if not all(w.upper() in index.pos for w in (a, b, c, target)):
        return {}
    q = index.unit[index.pos[b.upper()]] - index.unit[index.pos[a.upper()]] + index.unit[index.pos[c.upper()]]
    scores = index.unit @ (q / np.linalg.norm(q))
    excluded = {p for w in (a, b, c) for p in index.variants[w.upper()]}
    scores[list(excluded)] = -np.inf
    order = np.argsort(-scores)
    rank = {int(p): r for r, p in enumerate(order, start=1)}
    candidates = [p for p in range(len(index)) if p not in excluded and index.key[p] != target.upper()]
    rng = np.random.default_rng(seed)
    random_ranks = np.array(
        [rank[int(p)] for p in rng.choice(candidates, min(n_random, len(candidates)), replace=False)]
    )
    return {
        "query": f"{b} - {a} + {c}",
        "target": target,
        "target_rank": rank[index.pos[target.upper()]],
        "candidates": len(index) - len(excluded),
        "random_rank_median": float(np.median(random_ranks)),
        "random_rank_p05": float(np.percentile(random_ranks, 5)),
        "random_words": len(random_ranks),
        "top": [index.words[int(p)] for p in order[:5]],
    }
