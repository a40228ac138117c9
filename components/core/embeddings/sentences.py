"""The corpus as word2vec sentences."""

from __future__ import annotations

from typing import Iterable

from ..corpus import iter_texts
from .vocab import word_tokenize


def corpus_sentences(texts: Iterable[str]) -> list[list[str]]:
    """One sentence per non-empty line (paragraph) of each document, as lowercased words."""
    return [toks for text in iter_texts(texts) for line in text.splitlines() if (toks := word_tokenize(line))]
