"""The machinery under `word2vec.train_word2vec`: the corpus as flat arrays, each epoch cut into
chunks (subsampling, windows and negatives drawn in vectorised numpy), and one update of a chunk
(`_SkipGramWorker` / `_CbowWorker`). The method and why it is fast: the module doc of
`components.core.embeddings.word2vec`, which re-exports every name here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError, PipelineInputError
from .vocab import N_SPECIAL, Vocab

if TYPE_CHECKING:
    from .word2vec import Word2VecSettings

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
    # (C, W, 2) 0/1 float32: [i, o-1] = [pair (centre i, context i+o), pair (centre i+o, context i)]
    masks: torch.Tensor
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


def _cap_binds(rows: np.ndarray, terms: tuple[np.ndarray, ...], cap: float) -> np.ndarray:
    """(B,) whether some row of each chunk takes more than `cap` pair gradients under any of `terms`
    (each (B, L), aligned with `rows` (B, L)): the sum of a row's terms over the positions that hold it.
    Each chunk's rows are sorted once (a radix sort while ids fit in 16 bits); every run of one row
    is then summed with one `reduceat`."""
    B, L = rows.shape
    if rows.max(initial=0) < 2**15:
        order = np.argsort(rows.astype(np.int16), axis=1, kind="stable")
    else:
        order = np.argsort(rows, axis=1)
    r = np.take_along_axis(rows, order, axis=1)
    start = np.ones((B, L), dtype=bool)
    start[:, 1:] = r[:, 1:] != r[:, :-1]  # the first position of each run of one row
    starts = np.flatnonzero(start)  # every chunk's position 0 is one: runs never cross chunks
    first_run = np.searchsorted(starts, np.arange(B) * L)  # (B,) each chunk's first run
    binds = np.zeros(B, dtype=bool)
    for t in terms:
        totals = np.add.reduceat(np.take_along_axis(t, order, axis=1).ravel(), starts)  # one per run
        binds |= np.maximum.reduceat(totals, first_run) > cap
    return binds


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
        masks = np.zeros((B, C, W, 2), dtype=np.float32)  # 0/1 in the workers' dtype: no conversion per chunk
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
        in_terms = out_terms = binds = None
        if s.row_update_cap > 0:
            # pair gradients a row takes: an input row 1 + negative per pair; an output row its pairs as
            # centre (skip-gram) or its one CBOW pair, plus the weight of every draw that picked it
            has_pairs = (n_centre > 0).astype(np.float32)
            neg_weight = n_context * (s.negative / K) if s.sg == 1 else has_pairs
            per_block = neg_weight.reshape(B, C // G, G).sum(axis=2)  # every sample of a block: its tokens' weights
            pool_terms = np.repeat(per_block, K, axis=1)
            in_terms = np.hstack([n_context * (1 + s.negative), np.zeros_like(pool_terms)])  # the `rows` layout
            out_terms = np.hstack([n_centre if s.sg == 1 else has_pairs, pool_terms])
            # Where no row reaches the cap the scale is exactly 1 for every row: such a chunk carries no
            # terms and its update skips the cap (most chunks but the large late ones; about a tenth
            # of skip-gram's time when every chunk paid for it).
            binds = _cap_binds(rows, (in_terms, out_terms), s.row_update_cap)

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
                in_terms=t(None if in_terms is None or not binds[c] else in_terms[c]),
                out_terms=t(None if out_terms is None or not binds[c] else out_terms[c]),
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
        self.gP_buf = torch.empty(self.nb, K, D, device=dev)  # bmm writes here: into the strided gP it is ~5x slower
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
        grad_b = grad.view(nb, G, -1)  # (C/G, G, D)
        if grad.is_contiguous():
            grad_b.baddbmm_(g, self.P)
        else:  # baddbmm_ into a strided view is the slower of the two
            grad_b.add_(torch.bmm(g, self.P))
        torch.bmm(g.transpose(1, 2), src_b, out=self.gP_buf)  # (C/G, K, D)
        self.gP.copy_(self.gP_buf)
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
            # lr * (1 - sigma) on the real pairs, as m - m * sigma (m = lr * mask): two passes, not three
            torch.addcmul(m_r, m_r, s_r.sigmoid_(), value=-1, out=s_r)
            torch.addcmul(m_l, m_l, s_l.sigmoid_(), value=-1, out=s_l)
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
