"""word2vec (skip-gram or CBOW with negative sampling) in PyTorch, fast on CPU.

The settings use gensim's names and meanings. What makes word2vec work is kept: frequent-word
subsampling, a dynamic (shrunk) window, negatives drawn from unigram counts^0.75, plain SGD with a
linearly decaying learning rate, gensim's initialisation. What makes it fast is that nothing runs
per pair (or per token) in Python:

- Each epoch is subsampled and its windows drawn in vectorised numpy, and the kept tokens are cut
  into overlapping fixed-size chunks: a chunk owns the centres in its middle and holds their whole
  windows, so every pair is trained exactly once.
- A worker gathers a chunk's rows once (one `index_select` of [input | output] rows) and trains on
  that copy. A pair at distance o lines up row i+o with row i, so one batched dot product per offset
  scores every pair at that distance, in both directions; 0/1 masks draw the window and sentence
  ends. Offsets run one after the other, updating the copy in place, so a centre's later pairs see
  its earlier updates as in word2vec's sequential SGD. The net change of every row goes back with one
  `index_add_` (sparse SGD: only the chunk's rows are touched).
- Negatives: each block of 16 consecutive tokens draws K samples that its tokens share, and each
  token shares them among its pairs (a negative's gradient depends on the input word only), weighted
  so that each pair keeps `negative` samples in expectation; scores and gradients are three batched
  matmuls.
- `workers` forked processes train on their share of the corpus at once and update one matrix in
  shared memory without locks (Hogwild, like word2vec's and gensim's threads). Processes, because
  threads would take turns on the GIL: an update is ~90 small torch calls.

A chunk is trained from a copy of its rows, so a word that occurs many times in one chunk sums
changes made from one stale value: the first batches are small (`batch_size`) and grow as the
learning rate decays (`batch_growth`); `row_update_cap` bounds the sum (a safety net for large batches).

Row 0 is [PAD]. The special tokens never occur in the training ids nor among the negatives; [PAD]
rows only pad the chunks, so their change is exactly zero and [PAD] stays the zero vector.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Literal, Optional

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..artifacts import atomic_dir, set_weights_mode
from ..errors import ConfigError, PipelineInputError
from .vocab import N_SPECIAL, Vocab, build_vocab, word_tokenize  # noqa: F401  (re-exported)

LogMetrics = Callable[[dict[str, float], int], None]
FORMAT = "word2vec-safetensors-v1"


class Word2VecSettings(BaseModel):
    """word2vec hyper-parameters, named and meant as in gensim's `Word2Vec`."""

    model_config = ConfigDict(extra="forbid")

    vector_size: int = Field(100, ge=1, description="Dimensions of the word vectors.")
    window: int = Field(
        5, ge=1, description="Largest distance between centre and context word (each centre draws 1..window)."
    )
    min_count: int = Field(5, ge=1, description="Words rarer than this are dropped from the vocabulary.")
    sg: int = Field(
        1, ge=0, le=1, description="1: skip-gram, 0: CBOW (mean of the context vectors, gensim's cbow_mean=1)."
    )
    negative: int = Field(5, ge=1, description="Negative samples per positive pair, drawn from unigram counts^0.75.")
    sample: float = Field(
        1e-3, ge=0.0, allow_inf_nan=False, description="Subsampling threshold for frequent words (0 disables)."
    )
    epochs: int = Field(5, ge=1, description="Passes over the corpus.")
    alpha: float = Field(0.025, gt=0.0, lt=1.0, description="Initial learning rate of plain SGD.")
    min_alpha: float = Field(0.0001, ge=0.0, description="Learning rate at the end; it decays linearly from alpha.")
    seed: int = Field(1, ge=0, description="Seed of initialisation, subsampling, windows and negatives.")
    workers: int = Field(
        2,
        ge=1,
        description="CPU workers training at once on one shared matrix without locks, like gensim's threads (forked "
        "processes, so they do not share a GIL); 1 trains in the calling thread and is deterministic.",
    )
    batch_size: int = Field(
        256,
        ge=1,
        description="Kept tokens per update and worker while lr is high. Larger is faster but each update works "
        "from staler vectors: at alpha=0.025 quality drops above ~512 and breaks down at 1024.",
    )
    batch_growth: int = Field(
        8,
        ge=1,
        description="The batch doubles each time the learning rate halves, up to this factor (1: fixed): a stale "
        "minibatch gradient errs in proportion to lr * batch, so late batches can be larger.",
    )
    row_update_cap: float = Field(
        1024.0,
        ge=0.0,
        allow_inf_nan=False,
        description="Most pair gradients one row takes per update at full rate: a row taking T > cap (a frequent "
        "word, many times in one batch) gets cap/T of its summed change. A safety net for large batches; 0 disables.",
    )
    negative_draws: int = Field(
        0,
        ge=0,
        description="Skip-gram: negative samples drawn per token, shared by its pairs and weighted to keep "
        "`negative` per pair in expectation; more lowers the variance and costs time. 0: 3 * negative.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available, else cpu.")

    @property
    def draws(self) -> int:
        """Negative samples drawn per token: CBOW has one pair per centre, so exactly `negative`."""
        if self.sg == 0:
            return self.negative
        return self.negative_draws or 3 * self.negative

    @model_validator(mode="after")
    def _check(self) -> "Word2VecSettings":
        if self.min_alpha > self.alpha:
            raise ValueError(f"min_alpha must be at most alpha={self.alpha}, got {self.min_alpha}")
        if self.batch_size < 4 * self.window:
            raise ValueError(f"batch_size must be at least 4 * window = {4 * self.window}, got {self.batch_size}")
        if self.batch_growth & (self.batch_growth - 1):
            raise ValueError(f"batch_growth must be a power of two (1, 2, 4, ...), got {self.batch_growth}")
        return self


@dataclass
class Word2VecResult:
    vectors: np.ndarray  # (V, D) float32 input vectors, the word embeddings; row 0 ([PAD]) is zero
    context: np.ndarray  # (V, D) float32 output ("context") vectors, trainable state only
    vocab: Vocab
    settings: Word2VecSettings
    metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)  # one entry per epoch

    @property
    def words(self) -> list[str]:
        return self.vocab.words


# --- the corpus as flat arrays ------------------------------------------------------------------


@dataclass
class _Corpus:
    ids: np.ndarray  # (N,) int64 token ids of all sentences, concatenated
    sentence: np.ndarray  # (N,) int32 sentence number of each token


def _flatten(sentences: list[np.ndarray], vocab: Vocab, window: int) -> _Corpus:
    lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
    n = int(lengths.sum())
    if n == 0:
        raise PipelineInputError(
            "the corpus has no in-vocabulary tokens to train on; check the corpus and word2vec min_count"
        )
    ids = np.concatenate([np.asarray(s).ravel() for s in sentences]).astype(np.int64, copy=False)
    if ids.min() < N_SPECIAL or ids.max() >= len(vocab):
        bad = int(ids.min()) if ids.min() < N_SPECIAL else int(ids.max())
        raise PipelineInputError(
            f"token id {bad} is not a trainable word of this vocabulary (ids {N_SPECIAL}..{len(vocab) - 1}); "
            "encode the sentences with `vocab.encode` of the same vocabulary"
        )
    if n <= 2 * window or lengths.max() < 2:
        raise ConfigError(
            f"the corpus has {n} in-vocabulary tokens (longest sentence {int(lengths.max())}), shorter than one window "
            f"(2 * window + 1 = {2 * window + 1}); lower word2vec window or min_count, or use a longer corpus"
        )
    sentence = np.repeat(np.arange(len(sentences), dtype=np.int32), lengths)
    return _Corpus(ids, sentence)


def _keep_probability(counts: np.ndarray, sample: float) -> np.ndarray:
    """gensim's subsampling: keep a word with p = (sqrt(c / t) + 1) * t / c, t = sample * total count."""
    counts = counts.astype(np.float64)
    if sample <= 0:
        return (counts > 0).astype(np.float64)
    t = sample * counts.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        p = (np.sqrt(counts / t) + 1) * t / counts
    return np.where(counts > 0, np.minimum(p, 1.0), 0.0)


def _negative_cdf(counts: np.ndarray, power: float = 0.75) -> np.ndarray:
    """Cumulative unigram^0.75 distribution; zero-count rows (the specials) are never drawn."""
    w = counts.astype(np.float64) ** power
    return np.cumsum(w) / w.sum()


@dataclass
class _Chunk:
    """One update: a fixed-size window of C kept tokens, with everything drawn in advance.

    Chunks overlap by 2 * window tokens; a chunk owns the centres at local positions
    window .. C - window, so every pair is trained once and every owned centre has its whole window
    inside the chunk. Positions before or past the corpus are [PAD] (id 0, no pairs).
    """

    ids: torch.Tensor  # (C,) int64
    masks: torch.Tensor  # (C, W, 2) bool: [i, o-1] = [pair (centre i, context i+o), pair (centre i+o, context i)]
    n_context: torch.Tensor  # (C,) float32 pairs in which token j is the input (context) word
    n_centre: torch.Tensor  # (C,) float32 pairs in which token i is the centre word
    pool: torch.Tensor  # (C/G * K,) int64 negative samples: token j uses the K of its block j // G (_block)
    rows: torch.Tensor  # (C + C/G * K,) int64 rows gathered and updated: the tokens, then the samples
    in_terms: Optional[torch.Tensor]  # (len(rows),) pair gradients each row's input half takes (None: no cap)
    out_terms: Optional[torch.Tensor]  # (len(rows),) ... its output half
    lr: float
    raw_words: int  # raw (pre-subsampling) tokens whose centres this chunk owns, for progress and words/s
    compute_loss: bool
    pairs: float  # (centre, context) pairs this chunk trains
    kept: int  # kept (subsampled) tokens whose centres this chunk owns
    start: int  # position of local token 0 among the epoch's kept tokens (negative: padding)


def _block(C: int) -> int:
    """Tokens per negative-sharing block: 16, or the largest power of two dividing C below that."""
    return math.gcd(C, 16)


def _chunk_sizes(s: Word2VecSettings, progress: float) -> int:
    """Batch size at this point of training: batch_size while lr is high, doubling each time lr halves
    (up to batch_growth times), since a stale gradient errs in proportion to lr * batch."""
    lr = s.alpha - (s.alpha - s.min_alpha) * progress
    factor = 1
    while factor * 2 <= s.batch_growth and lr * factor * 2 <= s.alpha:
        factor *= 2
    return s.batch_size * factor


def _epoch_chunks(
    corpus: _Corpus, keep_p: np.ndarray, cdf: np.ndarray, s: Word2VecSettings, epoch: int, rng: np.random.Generator,
    device: torch.device, loss_every: int, block_tokens: int = 1 << 19,
) -> Iterator[_Chunk]:
    """Subsample the corpus, draw the windows, cut the kept tokens into chunks and draw their
    negatives, a block of about `block_tokens` tokens at a time (vectorised, bounded memory)."""
    n, V = len(corpus.ids), len(cdf)
    W, K = s.window, s.draws
    total_words = n * s.epochs
    kept = np.flatnonzero(rng.random(n) < keep_p[corpus.ids])  # raw positions that survive subsampling
    nk = len(kept)
    ids_k, sent_k = corpus.ids[kept], corpus.sentence[kept]
    eff = (W - rng.integers(0, W, nk)).astype(np.int8)  # dynamic window: each centre sees 1..W words per side
    # chunk schedule: owned centres [a, a + C - 2W), the chunk itself covers [a - W, a - W + C)
    plan: list[tuple[int, int]] = []
    a = 0
    while a < nk:
        C = _chunk_sizes(s, (epoch * n + (kept[a] if a else 0)) / total_words)
        plan.append((a, C))
        a += C - 2 * W
    raw_at = np.r_[kept, n]  # raw position of each kept token, and the end
    k_global = 0
    i = 0
    while i < len(plan):
        C = plan[i][1]
        j = i
        while j < len(plan) and plan[j][1] == C and (j - i + 1) * C <= max(block_tokens, C):
            j += 1
        owned_start = np.array([p[0] for p in plan[i:j]])  # (B,)
        B = len(owned_start)
        pos = owned_start[:, None] - W + np.arange(C)  # (B, C) kept positions the chunks cover
        valid = (pos >= 0) & (pos < nk)
        pc = np.clip(pos, 0, nk - 1)
        ids = np.where(valid, ids_k[pc], 0)  # (B, C) [PAD] outside the corpus
        seg = np.where(
            valid, sent_k[pc].astype(np.int64), -1 - np.arange(B * C).reshape(B, C)
        )  # pads: unique, no pairs
        e = eff[pc]
        local = np.arange(C)
        owned = (local >= W) & (local < C - W)  # (C,) the middle: covered positions [a - W, a - W + C)
        owned = owned & valid
        masks = np.zeros((B, C, W, 2), dtype=bool)
        n_context = np.zeros((B, C), dtype=np.float32)
        n_centre = np.zeros((B, C), dtype=np.float32)
        for o in range(1, W + 1):
            same = seg[:, o:] == seg[:, :-o]
            right = same & (e[:, :-o] >= o) & owned[:, :-o]  # centre i, context i+o
            left = same & (e[:, o:] >= o) & owned[:, o:]  # centre i+o, context i
            masks[:, :-o, o - 1, 0] = right
            masks[:, :-o, o - 1, 1] = left
            n_context[:, o:] += right
            n_context[:, :-o] += left
            n_centre[:, :-o] += right
            n_centre[:, o:] += left
        G = _block(C)
        pool = np.minimum(np.searchsorted(cdf, rng.random((B, C // G * K)), side="right"), V - 1)
        rows = np.hstack([ids, pool])  # the worker's gather layout
        in_terms = out_terms = None
        if s.row_update_cap > 0:
            # pair gradients a row takes: an input row 1 + negative per pair; an output row its pairs as
            # centre (skip-gram) or its one CBOW pair, plus the weight of every draw that picked it
            has_pairs = (n_centre > 0).astype(np.float32)
            neg_weight = n_context * (s.negative / K) if s.sg == 1 else has_pairs
            per_block = neg_weight.reshape(B, C // G, G).sum(axis=2)  # every sample of a block: its tokens' weights
            pool_terms = np.repeat(per_block, K, axis=1)
            in_terms = np.hstack([n_context * (1 + s.negative), np.zeros_like(pool_terms)])  # the `rows` layout
            out_terms = np.hstack([n_centre if s.sg == 1 else has_pairs, pool_terms])

        def t(x: Optional[np.ndarray]) -> Optional[torch.Tensor]:
            return None if x is None else torch.from_numpy(x).to(device)

        for c in range(B):
            a = int(owned_start[c])
            b = min(a + C - 2 * W, nk)
            raw_start = 0 if a == 0 else int(raw_at[a])
            raw_end = n if b >= nk else int(raw_at[b])
            yield _Chunk(
                ids=t(ids[c]),
                masks=t(masks[c]),
                n_context=t(n_context[c]),
                n_centre=t(n_centre[c]),
                pool=t(pool[c]),
                rows=t(rows[c]),
                in_terms=t(None if in_terms is None else in_terms[c]),
                out_terms=t(None if out_terms is None else out_terms[c]),
                lr=s.alpha - (s.alpha - s.min_alpha) * (epoch * n + raw_start) / total_words,
                raw_words=raw_end - raw_start,
                compute_loss=k_global % loss_every == 0,
                pairs=float(n_centre[c].sum()),
                kept=b - a,
                start=a - W,
            )
            k_global += 1
        i = j


# --- one update ---------------------------------------------------------------------------------
#
# Chunks have a fixed size, so each worker allocates its buffers and the slices it works on once,
# then per chunk only launches kernels into them: a few dozen calls, each a long vectorised loop.


class _Worker:
    """One worker's buffers for chunks of size C, and the part of the update both models share.

    `rows` lists the C tokens, then the K samples of each block of G tokens; every row is gathered and
    scattered whole ([input | output]) in one call each (half rows through a strided view are
    several times slower). The samples' input halves are never changed.
    """

    def __init__(self, Wt: torch.Tensor, s: Word2VecSettings, C: int):
        D, K, G = s.vector_size, s.draws, _block(C)
        dev = Wt.device
        self.Wt, self.s, self.C, self.block, self.nb = Wt, s, C, G, C // G
        n_rows = C + self.nb * K
        self.rows = torch.empty(n_rows, 2 * D, device=dev)  # gathered rows
        self.grad = torch.zeros(n_rows, 2 * D, device=dev)  # their changes
        self.X = self.rows[:C].view(C, 2, D)  # (C, 2, D) [input | output] of the tokens
        self.G = self.grad[:C].view(C, 2, D)
        self.P = self.rows[C:, D:].view(self.nb, K, D)  # (C/G, K, D) output rows of each block's samples
        self.gP = self.grad[C:, D:].view(self.nb, K, D)
        self.inp, self.g_in = self.X[:, 0], self.G[:, 0]
        self.score = torch.empty(self.nb, G, K, device=dev)
        self.weight = torch.empty(C, device=dev)
        self.total = torch.zeros(Wt.shape[0], device=dev)  # row_update_cap: pair gradients per row

    def _gather(self, ch: _Chunk) -> None:
        torch.index_select(self.Wt, 0, ch.rows, out=self.rows)

    def _negatives(self, src: torch.Tensor, grad: torch.Tensor, ch: _Chunk) -> float:
        """Every token's `src` row against its block's K samples in one batched SGD step: with
        g = self.weight_j * sigma(src_j . sample) (weight holds -lr * w_j), grad_j += g * sample and
        sample += g * src_j."""
        nb, G = self.nb, self.block  # blocks, tokens per block
        src_b = src.view(nb, G, -1)  # (C/G, G, D)
        score = torch.bmm(src_b, self.P.transpose(1, 2), out=self.score)  # (C/G, G, K)
        weight = self.weight.view(nb, G, 1)
        loss = float((F.logsigmoid(-score) * weight).sum()) / ch.lr if ch.compute_loss else 0.0
        g = score.sigmoid_().mul_(weight)  # (C/G, G, K)
        grad.view(nb, G, -1).add_(torch.bmm(g, self.P))  # (C/G, G, D)
        torch.bmm(g.transpose(1, 2), src_b, out=self.gP)  # (C/G, K, D)
        return loss

    def _apply(self, ch: _Chunk) -> None:
        """Sparse SGD: add the (capped) changes to the chunk's rows and to the samples' output rows."""
        if ch.in_terms is not None:
            # a row that takes T > cap pair gradients in this update takes cap/T of their sum
            cap, D = self.s.row_update_cap, self.s.vector_size
            for terms, half in ((ch.in_terms, self.grad[:, :D]), (ch.out_terms, self.grad[:, D:])):
                self.total.index_add_(0, ch.rows, terms)  # (V,) per row, over the chunk
                scale = self.total[ch.rows].clamp_(min=cap).reciprocal_().mul_(cap)  # (len(rows),)
                self.total.index_fill_(0, ch.rows, 0.0)  # back to zero, touching only these rows
                half.mul_(scale.unsqueeze(1))
        self.Wt.index_add_(0, ch.rows, self.grad)


class _SkipGramWorker(_Worker):
    """For every pair (centre i, context j) raise sigma(in_j . out_i) and lower sigma(in_j . out_neg).

    The chunk's rows are updated in place, one offset after the other, so a centre's later pairs see
    the updates of its earlier ones as in word2vec's sequential SGD (a fully batched step overshoots:
    all of a centre's pairs would push its output row from the same stale value). The net change of
    each row is then added to the shared matrices. The negatives are one batched update after.
    """

    def __init__(self, Wt: torch.Tensor, s: Word2VecSettings, C: int):
        super().__init__(Wt, s, C)
        W, dev = s.window, Wt.device
        self.X0 = torch.empty_like(self.X)  # the gathered rows before the update
        self.m_right = torch.empty(C, W, device=dev)
        self.m_left = torch.empty(C, W, device=dev)
        inp, out = self.X[:, 0], self.X[:, 1]
        s_r = [torch.empty(C - o, device=dev) for o in range(1, W + 1)]
        s_l = [torch.empty(C - o, device=dev) for o in range(1, W + 1)]
        # offset o: the pair right of centre i (context i+o) and the pair left of centre i+o (context i)
        self.offsets = [
            (inp[o:], out[:-o], out[o:], inp[:-o], self.m_right[: C - o, o - 1], self.m_left[: C - o, o - 1],
             s_r[o - 1], s_l[o - 1], s_r[o - 1].unsqueeze(1), s_l[o - 1].unsqueeze(1))
            for o in range(1, W + 1)
        ]

    def step(self, ch: _Chunk) -> Optional[float]:
        s = self.s
        self._gather(ch)
        self.X0.copy_(self.X)
        torch.mul(ch.masks[:, :, 0], ch.lr, out=self.m_right)
        torch.mul(ch.masks[:, :, 1], ch.lr, out=self.m_left)
        loss = 0.0
        for in_hi, out_lo, out_hi, in_lo, m_r, m_l, s_r, s_l, g_r, g_l in self.offsets:
            torch.linalg.vecdot(in_hi, out_lo, out=s_r)  # (C-o,) in_{i+o} . out_i
            torch.linalg.vecdot(out_hi, in_lo, out=s_l)  # (C-o,) out_{i+o} . in_i
            if ch.compute_loss:
                loss -= float((F.logsigmoid(s_r) * (m_r > 0)).sum() + (F.logsigmoid(s_l) * (m_l > 0)).sum())
            s_r.neg_().sigmoid_().mul_(m_r)  # lr * (1 - sigma) on the real pairs
            s_l.neg_().sigmoid_().mul_(m_l)
            in_hi.addcmul_(g_r, out_lo)
            out_lo.addcmul_(g_r, in_hi)
            out_hi.addcmul_(g_l, in_lo)
            in_lo.addcmul_(g_l, out_hi)
        torch.sub(self.X, self.X0, out=self.G)  # (C, 2, D) the positives' change of each row
        # negatives: token j (the input word) against its block's K samples; each of its n pairs
        # wants `negative` samples, so the K shared ones weigh n * negative / K
        torch.mul(ch.n_context, -ch.lr * s.negative / s.draws, out=self.weight)
        loss += self._negatives(self.inp, self.g_in, ch)
        self._apply(ch)
        return loss if ch.compute_loss else None


class _CbowWorker(_Worker):
    """h_i = mean of the context input rows; raise sigma(h_i . out_i), lower sigma(h_i . out_neg).
    As gensim's cbow_mean=1, every context row then receives the full gradient of h_i."""

    def __init__(self, Wt: torch.Tensor, s: Word2VecSettings, C: int):
        super().__init__(Wt, s, C)
        D, W = s.vector_size, s.window
        dev = Wt.device
        self.h = torch.empty(C, D, device=dev)  # mean of each centre's context rows
        self.work = torch.empty(C, D, device=dev)  # gradient of h
        self.pos_score = torch.empty(C, device=dev)
        self.has_ctx = torch.empty(C, device=dev)
        X, G, h, work = self.X, self.G, self.h, self.work
        inp, g_in = X[:, 0], G[:, 0]
        self.m = m = torch.empty(C, W, 2, device=dev)
        # offset o: centre i gathers context i+o (flag m[i, o-1, 0]); centre i+o gathers context i (m[i, o-1, 1])
        self.offsets = [(h[:-o], h[o:], inp[o:], inp[:-o], m[: C - o, o - 1, 0:1], m[: C - o, o - 1, 1:2],
                         g_in[o:], g_in[:-o], work[:-o], work[o:]) for o in range(1, W + 1)]

    def step(self, ch: _Chunk) -> Optional[float]:
        self._gather(ch)
        self.m.copy_(ch.masks)
        h, work, G = self.h, self.work, self.G
        h.zero_()
        for h_r, h_l, in_r, in_l, m_r, m_l, *_ in self.offsets:
            h_r.addcmul_(m_r, in_r)
            h_l.addcmul_(m_l, in_l)
        self.has_ctx.copy_(ch.n_centre > 0)  # centres with at least one context
        h.div_(ch.n_centre.clamp(min=1).unsqueeze(1))  # (C, D) mean of the context rows
        out = self.X[:, 1]
        torch.linalg.vecdot(h, out, out=self.pos_score)  # (C,)
        loss = -float((F.logsigmoid(self.pos_score) * self.has_ctx).sum()) if ch.compute_loss else 0.0
        g = self.pos_score.neg_().sigmoid_().mul_(self.has_ctx).mul_(ch.lr).unsqueeze(1)  # (C, 1) lr * (1 - sigma)
        torch.mul(g, out, out=work)
        G.zero_()
        torch.mul(g, h, out=G[:, 1])
        torch.mul(self.has_ctx, -ch.lr, out=self.weight)
        loss += self._negatives(h, work, ch)
        for *_, m_r, m_l, g_r, g_l, w_r, w_l in self.offsets:  # each context row receives its centre's work
            g_r.addcmul_(m_r, w_r)
            g_l.addcmul_(m_l, w_l)
        self._apply(ch)
        return loss if ch.compute_loss else None


# --- training -----------------------------------------------------------------------------------


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("word2vec device='cuda' but no CUDA device is available; set device to 'auto' or 'cpu'")
    return torch.device(device)


def _shards(corpus: _Corpus, n: int) -> list[_Corpus]:
    """`n` contiguous runs of whole sentences with about equal token counts, one per worker."""
    if n == 1:
        return [corpus]
    starts = np.flatnonzero(np.r_[True, corpus.sentence[1:] != corpus.sentence[:-1]])  # sentence starts
    at = np.minimum(np.searchsorted(starts, np.arange(1, n) * len(corpus.ids) / n), len(starts) - 1)
    cuts = starts[at]
    bounds = [0, *sorted(set(int(c) for c in cuts) - {0}), len(corpus.ids)]
    return [_Corpus(corpus.ids[a:b], corpus.sentence[a:b]) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _train_shard(
    index: int, shard: _Corpus, Wt: torch.Tensor, s: Word2VecSettings, keep_p: np.ndarray, cdf: np.ndarray,
    report: Callable[[tuple], None], report_every: int = 16,
) -> None:
    """One worker: all epochs over its shard, updating the shared `Wt` in place (Hogwild).

    Reports ("progress", epoch, raw words, kept tokens, pairs, loss sum, loss pairs, lr) tuples.
    """
    if Wt.device.type == "cpu":
        torch.set_num_threads(1)  # the workers are the parallelism; one op stream each
    torch.set_flush_denormal(True)  # tiny early updates must not fall into slow denormal arithmetic
    rng = np.random.default_rng([s.seed, index])
    worker_class = _SkipGramWorker if s.sg == 1 else _CbowWorker
    buffers: dict[int, _Worker] = {}  # one set per chunk size
    lr = s.alpha
    for epoch in range(s.epochs):
        acc = [0, 0.0, 0.0, 0.0, 0.0]  # raw words, kept, pairs, loss sum, loss pairs
        reported = 0
        for k, ch in enumerate(_epoch_chunks(shard, keep_p, cdf, s, epoch, rng, Wt.device, loss_every=8)):
            C = ch.ids.shape[0]
            if C not in buffers:
                buffers[C] = worker_class(Wt, s, C)
            loss = buffers[C].step(ch)
            acc[0] += ch.raw_words
            acc[1] += ch.kept
            acc[2] += ch.pairs
            if loss is not None:
                acc[3] += loss
                acc[4] += ch.pairs
            lr = ch.lr
            if (k + 1) % report_every == 0:
                report(("progress", epoch, *acc, lr))
                reported += acc[0]
                acc = [0, 0.0, 0.0, 0.0, 0.0]
        acc[0] = len(shard.ids) - reported  # the rest of the epoch (all of it if subsampling left nothing)
        report(("progress", epoch, *acc, lr))


def _run_in_process(index, shard, Wt, s, keep_p, cdf, messages) -> None:
    try:
        _train_shard(index, shard, Wt, s, keep_p, cdf, messages.put)
        messages.put(("done", index))
    except BaseException:  # the parent re-raises it
        import traceback

        messages.put(("error", index, traceback.format_exc()))


def _start_workers(shards, Wt, s, keep_p, cdf) -> tuple[list, "queue.Queue"]:
    """One forked process per shard, all updating the shared-memory `Wt`: no GIL between them
    (threads would serialise on it, since an update is ~90 small torch calls). Falls back to
    threads where fork is unavailable or this process may not have children (a daemon)."""
    import multiprocessing as mp

    if "fork" in mp.get_all_start_methods() and not mp.current_process().daemon:
        ctx = mp.get_context("fork")
        messages = ctx.Queue()
        Wt.share_memory_()
        procs = [ctx.Process(target=_run_in_process, args=(i, sh, Wt, s, keep_p, cdf, messages), daemon=True)
                 for i, sh in enumerate(shards)]
        for p in procs:
            p.start()
        return procs, messages
    messages = queue.Queue()
    threads = [threading.Thread(target=_run_in_process, args=(i, sh, Wt, s, keep_p, cdf, messages), daemon=True)
               for i, sh in enumerate(shards)]
    for t in threads:
        t.start()
    return threads, messages


def train_word2vec(
    sentences: list[np.ndarray],
    vocab: Vocab,
    settings: Word2VecSettings,
    *,
    log_metrics: Optional[LogMetrics] = None,
) -> Word2VecResult:
    """Train word vectors on `sentences` (arrays of vocabulary ids, from `vocab.encode`).

    `workers` > 1 (CPU) splits the corpus into that many runs of sentences, trained at once by forked
    processes on one shared matrix; `workers=1` trains in this thread and is deterministic.
    `log_metrics(metrics, step)` receives the learning rate, loss and speed every 2% of training,
    with step = raw words processed; it is called from the calling thread only.
    """
    s = settings
    device = resolve_device(s.device)
    corpus = _flatten(sentences, vocab, s.window)
    V, D = len(vocab), s.vector_size
    keep_p = _keep_probability(vocab.counts, s.sample)
    cdf = _negative_cdf(vocab.counts)

    # One (V, 2D) matrix holds [input | output] rows, so a token's two rows are one gather and one
    # index_add_. Inputs start uniform in [-1, 1)/D (gensim 4; word2vec.c uses half that), outputs at 0.
    gen = torch.Generator().manual_seed(s.seed)
    Wt = torch.zeros(V, 2 * D)
    Wt[N_SPECIAL:, :D] = (torch.rand(V - N_SPECIAL, D, generator=gen) * 2 - 1) / D
    Wt = Wt.to(device)

    n = len(corpus.ids)
    total_words = n * s.epochs
    shards = _shards(corpus, s.workers if device.type == "cpu" else 1)
    history = [
        {
            "epoch": e + 1,
            "loss": math.nan,
            "kept_tokens": 0.0,
            "pairs": 0.0,
            "words": 0,
            "loss_sum": 0.0,
            "loss_pairs": 0.0,
        }
        for e in range(s.epochs)
    ]
    log_every = max(total_words // 50, 1)
    words_done, next_log = 0, log_every
    t0 = time.perf_counter()

    def on_progress(msg: tuple) -> None:
        nonlocal words_done, next_log
        _, epoch, raw, kept, pairs, loss_sum, loss_pairs, lr = msg
        h = history[epoch]
        words_done += raw
        h["words"] += raw
        h["kept_tokens"] += kept
        h["pairs"] += pairs
        h["loss_sum"] += loss_sum
        h["loss_pairs"] += loss_pairs
        if not math.isfinite(loss_sum):
            raise FloatingPointError(
                f"word2vec diverged in epoch {epoch + 1} (non-finite loss); lower alpha or batch_size"
            )
        if log_metrics is not None and words_done >= next_log:
            next_log += log_every
            log_metrics(
                {
                    "word2vec/lr": lr,
                    "word2vec/loss": h["loss_sum"] / max(h["loss_pairs"], 1.0),
                    "word2vec/words_per_s": words_done / max(time.perf_counter() - t0, 1e-9),
                    "word2vec/progress": words_done / total_words,
                },
                words_done,
            )
        if h["words"] == n:  # the epoch's last chunk
            h["loss"] = h["loss_sum"] / max(h["loss_pairs"], 1.0)
            h["seconds"] = time.perf_counter() - t0
            if log_metrics is not None:
                log_metrics({"word2vec/epoch_loss": h["loss"], "word2vec/epoch": float(h["epoch"])}, words_done)

    threads_before = torch.get_num_threads()
    flush_before = torch.set_flush_denormal(True)
    try:
        if len(shards) == 1:
            _train_shard(0, shards[0], Wt, s, keep_p, cdf, on_progress)
        else:
            workers, messages = _start_workers(shards, Wt, s, keep_p, cdf)
            running = len(workers)
            try:
                while running:
                    try:
                        msg = messages.get(timeout=0.5)
                    except queue.Empty:
                        dead = [w for w in workers if getattr(w, "exitcode", None) not in (None, 0)]
                        if dead:
                            raise RuntimeError(
                                f"a word2vec worker process died (exit code {dead[0].exitcode})"
                            ) from None
                        continue
                    if msg[0] == "progress":
                        on_progress(msg)
                    elif msg[0] == "done":
                        running -= 1
                    else:
                        raise RuntimeError(f"word2vec worker {msg[1]} failed:\n{msg[2]}")
            finally:
                for w in workers:
                    if hasattr(w, "terminate") and w.is_alive():
                        w.terminate()
                    w.join()
    finally:
        torch.set_num_threads(threads_before)
        torch.set_flush_denormal(flush_before)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if not torch.isfinite(Wt).all():
        raise FloatingPointError("word2vec diverged (non-finite weights); lower alpha or batch_size")
    for h in history:
        del h["loss_sum"], h["loss_pairs"], h["words"]
    kept_total = sum(h["kept_tokens"] for h in history)
    pairs_total = sum(h["pairs"] for h in history)

    W_all = Wt.cpu().numpy()
    vectors = np.ascontiguousarray(W_all[:, :D])
    context = np.ascontiguousarray(W_all[:, D:])
    metrics = {
        "train_seconds": seconds,
        "words_per_s": total_words / seconds,
        "vocab_size": float(V),
        "corpus_tokens": float(n),
        "kept_share": kept_total / total_words,
        "pairs_per_epoch": pairs_total / s.epochs,
        "final_loss": history[-1]["loss"],
        "pad_row_max_abs": float(np.abs(vectors[0]).max()),
    }
    return Word2VecResult(vectors, context, vocab, s, metrics, history)


# --- files --------------------------------------------------------------------------------------


@dataclass
class LoadedEmbeddings:
    vectors: np.ndarray  # (V, D) float32
    vocab: Vocab
    settings: dict
    metadata: dict

    @property
    def words(self) -> list[str]:
        return self.vocab.words


def save_embeddings(result: Word2VecResult, out_dir: str | Path) -> dict[str, Path]:
    """Write `vectors.safetensors` (+ model config in its metadata) and `vocab.tsv` beside it; the
    trainable state (context vectors, schedule) goes apart to `trainable/state.safetensors`.
    The folder is replaced atomically."""
    import json

    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    V, D = result.vectors.shape
    meta = {
        "format": FORMAT,
        "vocab_size": str(V),
        "vector_size": str(D),
        "pad_id": "0",
        "settings": json.dumps(result.settings.model_dump(), sort_keys=True),
        "metrics": json.dumps(result.metrics, sort_keys=True),
    }
    with atomic_dir(out_dir) as tmp:
        save_file(
            {"vectors": np.ascontiguousarray(result.vectors, dtype=np.float32)},
            str(tmp / "vectors.safetensors"),
            metadata=meta,
        )
        set_weights_mode(tmp / "vectors.safetensors")
        result.vocab.save_tsv(tmp / "vocab.tsv")
        (tmp / "trainable").mkdir()
        # Plain SGD has no optimizer moments: the state is the two matrices and where the schedule stopped.
        state_meta = dict(
            meta, optimizer="sgd", lr_at_end=str(result.settings.min_alpha), epochs_done=str(len(result.history))
        )
        save_file(
            {
                "input": np.ascontiguousarray(result.vectors, dtype=np.float32),
                "output": np.ascontiguousarray(result.context, dtype=np.float32),
            },
            str(tmp / "trainable" / "state.safetensors"),
            metadata=state_meta,
        )
        set_weights_mode(tmp / "trainable" / "state.safetensors")
    return {
        "vectors": out_dir / "vectors.safetensors",
        "vocab": out_dir / "vocab.tsv",
        "trainable": out_dir / "trainable" / "state.safetensors",
    }


def load_embeddings(path: str | Path) -> LoadedEmbeddings:
    """Read what `save_embeddings` wrote: the vectors, the vocabulary and the settings."""
    import json

    from safetensors import SafetensorError, safe_open

    path = Path(path)
    vec_file, vocab_file = path / "vectors.safetensors", path / "vocab.tsv"
    for f in (vec_file, vocab_file):
        if not f.is_file():
            raise PipelineInputError(
                f"{f} not found; materialize `word_embeddings` first (or point at its output folder)"
            )
    try:
        with safe_open(str(vec_file), framework="numpy") as fh:
            meta = fh.metadata() or {}
            vectors = fh.get_tensor("vectors")
    except (SafetensorError, OSError, KeyError) as e:
        raise PipelineInputError(f"{vec_file}: not a readable embedding file ({e})") from e
    if meta.get("format") != FORMAT:
        raise PipelineInputError(f"{vec_file}: unknown format {meta.get('format')!r}, expected {FORMAT!r}")
    vocab = Vocab.load_tsv(vocab_file)
    if len(vocab) != vectors.shape[0]:
        raise PipelineInputError(f"{vocab_file} has {len(vocab)} words but {vec_file} has {vectors.shape[0]} rows")
    return LoadedEmbeddings(vectors, vocab, json.loads(meta.get("settings", "{}")), meta)


def train_from_tokens(
    token_lists: list[list[str]], settings: Word2VecSettings, *, log_metrics: Optional[LogMetrics] = None
) -> Word2VecResult:
    """Convenience: build the vocabulary with `settings.min_count`, encode and train."""
    vocab = build_vocab(token_lists, settings.min_count)
    return train_word2vec(vocab.encode(token_lists), vocab, settings, log_metrics=log_metrics)
