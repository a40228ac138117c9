"""Word-level tokens and the word2vec vocabulary.

The vocabulary follows the pipeline's word-level tokenizer: ids 0-3 are the special tokens
[PAD], [UNK], [BOS], [EOS] (count 0, never trained), then the words with `count >= min_count`,
most frequent first. Ties are ordered as gensim orders them, so that ours and gensim's
`Word2Vec` see the same vocabulary in the same order when handed the same token lists.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import numpy as np

from ..errors import ConfigError, PipelineInputError
from ..tokenizer import segment_chinese

PAD, UNK, BOS, EOS = "[PAD]", "[UNK]", "[BOS]", "[EOS]"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)
N_SPECIAL = len(SPECIAL_TOKENS)
MIN_VOCAB_WORDS = 2  # fewer words than this make no pair to train on

_HAS_ALNUM = re.compile(r"[^\W_]")  # a letter or a digit, in any script


@lru_cache(maxsize=1)
def _pre_tokenizer():
    from tokenizers.pre_tokenizers import Whitespace

    return Whitespace()


def word_tokenize(text: str) -> list[str]:
    """Lowercased words as the pipeline's word-level tokenizer splits them.

    Runs of Chinese (Han) characters are cut into words by jieba first (`segment_chinese`), then
    `tokenizers`' Whitespace pre-tokenizer splits on `\\w+|[^\\w\\s]+`; punctuation-only pieces are
    dropped, so only tokens with a letter or digit remain.
    """
    pieces = _pre_tokenizer().pre_tokenize_str(segment_chinese(text.lower()))
    return [tok for tok, _ in pieces if _HAS_ALNUM.search(tok)]


@dataclass
class Vocab:
    """Words (row i of the embedding matrix is `words[i]`) and their corpus counts."""

    words: list[str]
    counts: np.ndarray  # (V,) int64; 0 for the special tokens
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.counts = np.asarray(self.counts, dtype=np.int64)
        if len(self.words) != len(self.counts):
            raise ValueError(f"{len(self.words)} words but {len(self.counts)} counts")
        if tuple(self.words[:N_SPECIAL]) != SPECIAL_TOKENS:
            raise ValueError(
                f"the first words must be the special tokens {SPECIAL_TOKENS}, got {self.words[:N_SPECIAL]}"
            )
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    @property
    def n_words(self) -> int:
        """Trainable words (the vocabulary without the special tokens)."""
        return len(self.words) - N_SPECIAL

    @property
    def total_count(self) -> int:
        return int(self.counts.sum())

    def encode(self, token_lists: Iterable[list[str]]) -> list[np.ndarray]:
        """Token lists → int32 id arrays; out-of-vocabulary tokens are dropped, as gensim drops them.

        A literal "[PAD]" in the text is not the padding token, so the specials never match.
        """
        index = self.index
        out = []
        for tokens in token_lists:
            ids = [i for i in (index.get(t, -1) for t in tokens) if i >= N_SPECIAL]
            out.append(np.asarray(ids, dtype=np.int32))
        return out

    def save_tsv(self, path: str | Path) -> Path:
        """`word<TAB>count` per line, row order = embedding row order."""
        path = Path(path)
        for w in self.words:
            if "\t" in w or "\n" in w:
                raise ValueError(f"word {w!r} contains a tab or newline and cannot be written to {path}")
        path.write_text("".join(f"{w}\t{int(c)}\n" for w, c in zip(self.words, self.counts)), encoding="utf-8")
        return path

    @classmethod
    def load_tsv(cls, path: str | Path) -> "Vocab":
        path = Path(path)
        if not path.exists():
            raise PipelineInputError(f"vocabulary file not found: {path} (materialize `word_embeddings` first)")
        words, counts = [], []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            parts = line.split("\t")
            if len(parts) != 2 or not parts[1].isdigit():
                raise PipelineInputError(f"{path}:{lineno}: expected 'word<TAB>count', got {line[:80]!r}")
            words.append(parts[0])
            counts.append(int(parts[1]))
        try:
            return cls(words, np.asarray(counts, dtype=np.int64))
        except ValueError as e:
            raise PipelineInputError(f"{path}: {e}") from e


def build_vocab(token_lists: Iterable[list[str]], min_count: int) -> Vocab:
    """Count words and keep those with `count >= min_count`, most frequent first (gensim's order).

    Raises ConfigError when `min_count` leaves fewer than MIN_VOCAB_WORDS words.
    """
    if min_count < 1:
        raise ConfigError(f"min_count must be >= 1, got {min_count}")
    counter: Counter[str] = Counter()
    for tokens in token_lists:
        counter.update(tokens)
    for special in SPECIAL_TOKENS:  # a literal "[PAD]" in the text is not the padding token
        counter.pop(special, None)
    kept = [(w, c) for w, c in counter.items() if c >= min_count]
    if len(kept) < MIN_VOCAB_WORDS:
        raise ConfigError(
            f"min_count={min_count} keeps only {len(kept)} distinct words of {len(counter)} in the corpus "
            f"(need at least {MIN_VOCAB_WORDS}); lower word2vec min_count or use a larger corpus"
        )
    # gensim's sort_by_descending_frequency: count descending, ties latest-first-seen first
    # (np.lexsort((-indices, -counts))). Counter keeps first-seen order, so `i` is that order.
    order = sorted(range(len(kept)), key=lambda i: (-kept[i][1], -i))
    words = list(SPECIAL_TOKENS) + [kept[i][0] for i in order]
    counts = np.asarray([0] * N_SPECIAL + [kept[i][1] for i in order], dtype=np.int64)
    return Vocab(words, counts)
