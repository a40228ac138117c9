"""gensim's Word2Vec on the same sentences with the same settings: the reference our word vectors
are judged beside (the analogy claim: not below gensim on the same corpus), and the speed reference
of `benchmarks/word2vec_bench.py`. Its vectors are stored in the word2vec text format gensim reads
and writes (`KeyedVectors.save_word2vec_format`), never pickled."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .word2vec_settings import Word2VecSettings

REFERENCE_FILE = "gensim_vectors.txt"


def gensim_word2vec(settings: Word2VecSettings):
    """gensim's `Word2Vec` with `settings` (gensim's own parameter names; cbow_mean=1, as ours), its
    vocabulary not yet built."""
    from gensim.models import Word2Vec

    return Word2Vec(
        vector_size=settings.vector_size,
        window=settings.window,
        min_count=settings.min_count,
        sg=settings.sg,
        negative=settings.negative,
        sample=settings.sample,
        epochs=settings.epochs,
        alpha=settings.alpha,
        min_alpha=settings.min_alpha,
        seed=settings.seed,
        workers=settings.workers,
    )


def train_gensim(sentences: Sequence[Sequence[str]], settings: Word2VecSettings):
    """gensim's Word2Vec trained on `sentences` with `settings` (its vocabulary from the same min_count)."""
    model = gensim_word2vec(settings)
    model.build_vocab(sentences)
    model.train(sentences, total_examples=model.corpus_count, epochs=model.epochs)
    return model


def save_reference(model, folder: Path) -> Path:
    path = Path(folder) / REFERENCE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    model.wv.save_word2vec_format(str(path))
    return path


def load_reference(path: str | Path) -> tuple[list[str], np.ndarray]:
    """(words, vectors) of a reference saved by `save_reference`."""
    from gensim.models import KeyedVectors

    kv = KeyedVectors.load_word2vec_format(str(path))
    return list(kv.index_to_key), np.asarray(kv.vectors, dtype=np.float32)
