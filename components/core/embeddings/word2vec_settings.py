"""word2vec's settings (`Word2VecSettings`): a leaf module, imported by the trainer (`word2vec`) and
its chunks and updates (`word2vec_chunks`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Word2VecSettings(BaseModel):
    """word2vec hyper-parameters, named and meant as in gensim's `Word2Vec`."""

    model_config = ConfigDict(extra="forbid")

    vector_size: int = Field(default=100, ge=1, description="Dimensions of the word vectors.")
    window: int = Field(
        default=5, ge=1, description="Largest distance between centre and context word (each centre draws 1..window)."
    )
    min_count: int = Field(default=5, ge=1, description="Words rarer than this are dropped from the vocabulary.")
    sg: int = Field(
        default=1, ge=0, le=1, description="1: skip-gram, 0: CBOW (mean of the context vectors, gensim's cbow_mean=1)."
    )
    negative: int = Field(
        default=5, ge=1, description="Negative samples per positive pair, drawn from unigram counts^0.75."
    )
    sample: float = Field(
        default=1e-3, ge=0.0, allow_inf_nan=False, description="Subsampling threshold for frequent words (0 disables)."
    )
    epochs: int = Field(default=5, ge=1, description="Passes over the corpus.")
    alpha: float = Field(default=0.025, gt=0.0, lt=1.0, description="Initial learning rate of plain SGD.")
    min_alpha: float = Field(
        default=0.0001, ge=0.0, description="Learning rate at the end; it decays linearly from alpha."
    )
    seed: int = Field(default=1, ge=0, description="Seed of initialisation, subsampling, windows and negatives.")
    workers: int = Field(
        default=2,
        ge=1,
        description="CPU workers training at once on one shared matrix without locks, like gensim's threads (forked "
        "processes, so they do not share a GIL); 1 trains in the calling thread and is deterministic.",
    )
    batch_size: int = Field(
        default=0,
        ge=0,
        description="Kept tokens per update and worker while lr is high; 0: 256 for skip-gram, 512 for CBOW. Larger "
        "is faster but each update works from staler vectors: at alpha=0.025 skip-gram's quality drops above ~512 "
        "and breaks down at 1024. CBOW makes one update per centre and kept gensim's quality at 512.",
    )
    batch_growth: int = Field(
        default=8,
        ge=1,
        description="The batch doubles each time the learning rate halves, up to this factor (1: fixed): a stale "
        "minibatch gradient errs in proportion to lr * batch, so late batches can be larger.",
    )
    row_update_cap: float = Field(
        default=1024.0,
        ge=0.0,
        allow_inf_nan=False,
        description="Most pair gradients one row takes per update at full rate: a row taking T > cap (a frequent "
        "word, many times in one batch) gets cap/T of its summed change. A safety net for large batches; 0 disables.",
    )
    negative_draws: int = Field(
        default=0,
        ge=0,
        description="Negative samples drawn per block of tokens and shared by them, each weighted to keep `negative` "
        "per pair in expectation; more lowers the variance and costs time. 0: 2 * negative (skip-gram), negative "
        "(CBOW).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: cuda when available, else cpu.")

    @property
    def batch(self) -> int:
        """Kept tokens per update while lr is high: `batch_size`, or the model's default."""
        return self.batch_size or (256 if self.sg == 1 else 512)

    @property
    def draws(self) -> int:
        """Negative samples drawn per block of tokens (shared by its tokens, each weighted to keep `negative`
        per pair in expectation): `negative_draws`, or by default 2 * negative (skip-gram), negative (CBOW)."""
        return self.negative_draws or (2 * self.negative if self.sg == 1 else self.negative)

    @model_validator(mode="after")
    def _check(self) -> "Word2VecSettings":
        if self.min_alpha > self.alpha:
            raise ValueError(f"min_alpha must be at most alpha={self.alpha}, got {self.min_alpha}")
        if self.batch < 4 * self.window:
            raise ValueError(f"batch_size must be at least 4 * window = {4 * self.window}, got {self.batch}")
        if self.batch_growth & (self.batch_growth - 1):
            raise ValueError(f"batch_growth must be a power of two (1, 2, 4, ...), got {self.batch_growth}")
        return self
