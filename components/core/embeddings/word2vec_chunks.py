"""The machinery under `word2vec.train_word2vec`: the corpus as flat arrays, each epoch cut into
chunks (subsampling, windows and negatives drawn in vectorised numpy; the windows' pairs in
`word2vec_windows`), and one update of a chunk (`SkipGramWorker` / `CbowWorker`). The method and
why it is fast: the module doc of `components.core.embeddings.word2vec`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError, PipelineInputError
from .vocab import N_SPECIAL, Vocab
from .word2vec_windows import cbow_bands, skipgram_masks

if TYPE_CHECKING:
    from .word2vec_settings import Word2VecSettings

_Positions = TypeVar("_Positions", int, np.ndarray)  # one token position, or an array of them

# --- the corpus as flat arrays ------------------------------------------------------------------


@dataclass
class Corpus:
    ids: np.ndarray  # (N,) int64 token ids of all sentences, concatenated
    sentence: np.ndarray  # (N,) int32 sentence number of each token


def flatten(sentences: list[np.ndarray], vocab: Vocab, window: int) -> Corpus:
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
    return Corpus(ids, sentence)


def keep_probability(counts: np.ndarray, sample: float) -> np.ndarray:
    """gensim's subsampling: keep a word with p = (sqrt(c / t) + 1) * t / c, t = sample * total count."""
    counts = counts.astype(np.float64)
    if sample <= 0:
        return (counts > 0).astype(np.float64)
    t = sample * counts.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        p = (np.sqrt(counts / t) + 1) * t / counts
    return np.where(counts > 0, np.minimum(p, 1.0), 0.0)


def negative_cdf(counts: np.ndarray, power: float = 0.75) -> np.ndarray:
    """Cumulative unigram^0.75 distribution; zero-count rows (the specials) are never drawn."""
    w = counts.astype(np.float64) ** power
    return np.cumsum(w) / w.sum()


class UnigramSampler:
    """Draws from the distribution of `cdf` (`negative_cdf`) in O(1) a sample: Walker's alias method
    (Vose's construction) over the ids of positive probability, so a zero-count id is never drawn.

    Exact, as the binary search over the cdf (gensim's `cum_table`) that it replaces: an id's
    probability is its share of the table slot it owns plus the shares that other slots alias to it.
    About 7x faster than `np.searchsorted` on the cdf for a 10k-word vocabulary (the search was ~15 %
    of chunk building)."""

    def __init__(self, cdf: np.ndarray):
        p = np.diff(np.r_[0.0, np.asarray(cdf, dtype=np.float64)])
        self.ids = np.flatnonzero(p > 0)  # (n,) the ids that can be drawn
        n = len(self.ids)
        q = (p[self.ids] / p[self.ids].sum() * n).tolist()  # each slot's share, times n
        prob, alias = [1.0] * n, list(range(n))
        small = [i for i in range(n) if q[i] < 1.0]
        large = [i for i in range(n) if q[i] >= 1.0]
        while small and large:
            lo, hi = small.pop(), large[-1]
            prob[lo], alias[lo] = q[lo], hi  # slot lo: itself with q[lo], else hi
            q[hi] -= 1.0 - q[lo]
            if q[hi] < 1.0:
                small.append(large.pop())
        # what is left holds (up to rounding) exactly one slot's worth: it keeps its slot whole (prob 1)
        self.prob = np.array(prob)
        self.alias = self.ids[np.array(alias, dtype=np.int64)]

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """int64 ids of `shape`, each drawn independently with the cdf's probabilities."""
        slot = rng.integers(0, len(self.ids), shape)
        return np.where(rng.random(shape) < self.prob[slot], self.ids[slot], self.alias[slot])


@dataclass
class Chunk:
    """One update: a fixed-size window of C kept tokens, with everything drawn in advance.

    Chunks overlap by 2 * window tokens; a chunk owns the centres at local positions
    window .. C - window, so every pair is trained once and every owned centre has its whole window
    inside the chunk. Positions before or past the corpus are [PAD] (id 0, no pairs).
    """

    ids: torch.Tensor  # (C,) int64
    # skip-gram only (else None), (C, W, 2) 0/1 float32:
    # [i, o-1] = [pair (centre i, context i+o), pair (centre i+o, context i)]
    masks: Optional[torch.Tensor]
    n_context: torch.Tensor  # (C,) float32 pairs in which token j is the input (context) word
    n_centre: torch.Tensor  # (C,) float32 pairs in which token i is the centre word
    # CBOW only (else None), the masks as two bands: [i, 0, W + d] weighs context i+d in the mean of the
    # owned centre W+i ((C - 2W, 1, 2W + 1), 1/n_centre or 0); [j, 0, W + d] = 1 where centre j+d has context j
    band: Optional[torch.Tensor]
    band_t: Optional[torch.Tensor]
    has_pairs: Optional[torch.Tensor]  # CBOW only: (C,) float32 1 where token i is a centre with a context
    # (C/G * K,) int64 negative samples: token j uses the K of its block (block_of)
    pool: torch.Tensor
    rows: torch.Tensor  # (C + C/G * K,) int64 rows gathered and updated: the tokens, then the samples
    in_terms: Optional[torch.Tensor]  # (len(rows),) pair gradients each row's input half takes (None: no cap)
    out_terms: Optional[torch.Tensor]  # (len(rows),) ... its output half
    lr: float
    raw_words: int  # raw (pre-subsampling) tokens whose centres this chunk owns, for progress and words/s
    compute_loss: bool
    pairs: float  # (centre, context) pairs this chunk trains
    kept: int  # kept (subsampled) tokens whose centres this chunk owns
    start: int  # position of local token 0 among the epoch's kept tokens (negative: padding)


def block(C: int) -> int:
    """Tokens per negative-sharing block: 16, or the largest power of two dividing C below that."""
    return math.gcd(C, 16)


def _interleaved(s: Word2VecSettings) -> bool:
    """Whether a block is every (C/G)-th token (CBOW) rather than G consecutive ones (skip-gram).

    Neighbouring CBOW centres share most of their context, so G consecutive centres would meet one set
    of samples with nearly the same mean: measured, that cost CBOW about a sixth of its correct
    analogies at the same speed. Skip-gram's negatives meet each token's own input row, and it gained
    nothing from interleaving while the strided blocks cost it about 6 % of its speed."""
    return s.sg == 0


def block_of(j: _Positions, C: int, s: Word2VecSettings) -> _Positions:
    """The negative-sharing block of token j of a chunk of C tokens."""
    G = block(C)
    return j % (C // G) if _interleaved(s) else j // G


def _chunk_sizes(s: Word2VecSettings, progress: float) -> int:
    """Batch size at this point of training: `s.batch` while lr is high, doubling each time lr halves
    (up to batch_growth times), since a stale gradient errs in proportion to lr * batch."""
    lr = s.alpha - (s.alpha - s.min_alpha) * progress
    factor = 1
    while factor * 2 <= s.batch_growth and lr * factor * 2 <= s.alpha:
        factor *= 2
    return s.batch * factor


def cap_binds(rows: np.ndarray, terms: tuple[np.ndarray, ...], cap: float) -> np.ndarray:
    """(B,) whether some row of each chunk takes more than `cap` pair gradients under any of `terms`
    (each (B, L), aligned with `rows` (B, L)): the sum of a row's terms over the positions that hold it.

    A row's sum in one chunk is at most its count in all B chunks times the largest term, so only the
    rows above cap on that bound (the block's frequent words) can bind; their sums per chunk are one
    `bincount` over (chunk, row) for each of `terms`. The other rows share one more slot per chunk,
    whose sum is not looked at (2.5x faster than selecting the hot positions first)."""
    B, L = rows.shape
    binds = np.zeros(B, dtype=bool)
    top = max((float(t.max(initial=0.0)) for t in terms), default=0.0)
    counts = np.bincount(rows.ravel())
    hot = np.flatnonzero(counts * top > cap)
    if len(hot) == 0:
        return binds
    H = len(hot) + 1  # slots per chunk: the hot rows, then the others
    index = np.full(len(counts), len(hot), dtype=np.int64)
    index[hot] = np.arange(len(hot))
    bins = (index[rows] + np.arange(0, B * H, H)[:, None]).ravel()  # (chunk, slot)
    for t in terms:
        totals = np.bincount(bins, weights=t.ravel(), minlength=B * H).reshape(B, H)
        binds |= (totals[:, :-1] > cap).any(axis=1)
    return binds


def _subsample(
    corpus: Corpus, keep_p: np.ndarray, W: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The epoch's draws over the corpus: the raw positions that survive subsampling, their ids and
    sentences, and each kept centre's dynamic window (1..W words per side, int8)."""
    kept = np.flatnonzero(rng.random(len(corpus.ids)) < keep_p[corpus.ids])  # raw positions that survive subsampling
    ids_k, sent_k = corpus.ids[kept], corpus.sentence[kept]
    eff = (W - rng.integers(0, W, len(kept))).astype(np.int8)  # dynamic window: each centre sees 1..W words per side
    return kept, ids_k, sent_k, eff


def _chunk_plan(kept: np.ndarray, n: int, s: Word2VecSettings, epoch: int) -> list[tuple[int, int]]:
    """The epoch's chunk schedule, (a, C) each: owned centres [a, a + C - 2W), the chunk itself covers
    [a - W, a - W + C) of the kept tokens, its size C `_chunk_sizes` at the raw position it starts at."""
    plan: list[tuple[int, int]] = []
    a = 0
    while a < len(kept):
        C = _chunk_sizes(s, (epoch * n + (kept[a] if a else 0)) / (n * s.epochs))
        plan.append((a, C))
        a += C - 2 * s.window
    return plan


def _cap_terms(
    rows: np.ndarray, n_context: np.ndarray, n_centre: np.ndarray, has_pairs: Optional[np.ndarray], s: Word2VecSettings
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For `row_update_cap`: the pair gradients each of `rows` (B, C + C/G * K) takes, as input and as
    output (`Chunk.in_terms`, `Chunk.out_terms`), and (B,) whether the cap binds in each chunk."""
    B, C = n_context.shape
    G, K = block(C), s.draws
    # pair gradients a row takes: an input row 1 + negative per pair; an output row its pairs as
    # centre (skip-gram) or its one CBOW pair, plus the weight of every draw that picked it
    neg_weight = (n_context if has_pairs is None else has_pairs) * (s.negative / K)  # has_pairs: CBOW
    if _interleaved(s):  # every sample of a block: its tokens' weights
        per_block = neg_weight.reshape(B, G, C // G).sum(axis=1)
    else:
        per_block = neg_weight.reshape(B, C // G, G).sum(axis=2)
    pool_terms = np.repeat(per_block, K, axis=1)
    in_terms = np.hstack([n_context * (1 + s.negative), np.zeros_like(pool_terms)])  # the `rows` layout
    out_terms = np.hstack([n_centre if has_pairs is None else has_pairs, pool_terms])
    # Where no row reaches the cap the scale is exactly 1 for every row: such a chunk carries no
    # terms and its update skips the cap (most chunks but the large late ones; about a tenth
    # of skip-gram's time when every chunk paid for it).
    return in_terms, out_terms, cap_binds(rows, (in_terms, out_terms), s.row_update_cap)


def epoch_chunks(
    corpus: Corpus,
    keep_p: np.ndarray,
    negatives: UnigramSampler,
    s: Word2VecSettings,
    epoch: int,
    rng: np.random.Generator,
    device: torch.device | str,
    loss_every: int,
    block_tokens: int = 1 << 15,
) -> Iterator[Chunk]:
    """Subsample the corpus, draw the windows, cut the kept tokens into chunks and draw their
    negatives, a block of about `block_tokens` tokens at a time (vectorised, bounded memory)."""
    n = len(corpus.ids)
    on_cpu = torch.device(device).type == "cpu"
    W, K = s.window, s.draws
    total_words = n * s.epochs
    kept, ids_k, sent_k, eff = _subsample(corpus, keep_p, W, rng)
    nk = len(kept)
    plan = _chunk_plan(kept, n, s, epoch)
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
        masks = band = band_t = None
        if s.sg == 1:
            masks, n_context, n_centre = skipgram_masks(seg, e, owned, W)
        else:
            band, band_t, n_context, n_centre = cbow_bands(seg, e, owned, W)
        G = block(C)
        pool = negatives.draw(rng, (B, C // G * K))
        rows = np.hstack([ids, pool])  # the worker's gather layout
        has_pairs = None if s.sg == 1 else (n_centre > 0).astype(np.float32)  # CBOW's one pair per centre
        pairs = n_centre.sum(axis=1)
        in_terms = out_terms = binds = None
        if s.row_update_cap > 0:
            in_terms, out_terms, binds = _cap_terms(rows, n_context, n_centre, has_pairs, s)

        def t(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(x) if on_cpu else torch.from_numpy(x).to(device)

        for c in range(B):
            a = int(owned_start[c])
            b = min(a + C - 2 * W, nk)
            raw_start = 0 if a == 0 else int(raw_at[a])
            raw_end = n if b >= nk else int(raw_at[b])
            yield Chunk(
                ids=t(ids[c]),
                masks=None if masks is None else t(masks[c]),
                n_context=t(n_context[c]),
                n_centre=t(n_centre[c]),
                band=None if band is None else t(band[c]),
                band_t=None if band_t is None else t(band_t[c]),
                has_pairs=None if has_pairs is None else t(has_pairs[c]),
                pool=t(pool[c]),
                rows=t(rows[c]),
                in_terms=None if in_terms is None or binds is None or not binds[c] else t(in_terms[c]),
                out_terms=None if out_terms is None or binds is None or not binds[c] else t(out_terms[c]),
                lr=s.alpha - (s.alpha - s.min_alpha) * (epoch * n + raw_start) / total_words,
                raw_words=raw_end - raw_start,
                compute_loss=k_global % loss_every == 0,
                pairs=float(pairs[c]),
                kept=b - a,
                start=a - W,
            )
            k_global += 1
        i = j


# --- one update ---------------------------------------------------------------------------------
#
# Chunks have a fixed size, so each worker allocates its buffers and the slices it works on once,
# then per chunk only launches kernels into them: a few dozen calls, each a long vectorised loop.


class Worker:
    """One worker's buffers for chunks of size C, and the part of the update both models share.

    `rows` lists the C tokens, then the K samples of each block of G tokens; every row is gathered and
    scattered whole ([input | output]) in one call each (half rows through a strided view are
    several times slower). The samples' input halves are never changed.
    """

    def __init__(self, Wt: torch.Tensor, s: Word2VecSettings, C: int):
        D, K, G = s.vector_size, s.draws, block(C)
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
        self.interleaved = _interleaved(s)
        self.inp, self.g_in = self.X[:, 0], self.G[:, 0]
        self.score = torch.empty(self.nb, G, K, device=dev)
        self.score_t = self.score.transpose(1, 2)
        self.P_t = self.P.transpose(1, 2)
        self.weight = torch.empty(C, device=dev)
        self.weight_b = self._blocks(self.weight.unsqueeze(1))  # (C/G, G, 1)
        self.total = torch.zeros(Wt.shape[0], device=dev)  # row_update_cap: pair gradients per row
        # (C/G, G, D) by block, the rows `_negatives` scores against the samples: set by each model. Views
        # are built once per worker (the views a step made were about a third of its calls).
        self.src_b: torch.Tensor

    def step(self, ch: Chunk) -> Optional[float]:
        """Train on one chunk, updating the shared matrix; the chunk's loss if `ch.compute_loss`, else None."""
        raise NotImplementedError

    def _gather(self, ch: Chunk) -> None:
        torch.index_select(self.Wt, 0, ch.rows, out=self.rows)

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(C, ...) -> (C/G, G, ...): the view of x by negative-sharing block (block_of)."""
        if self.interleaved:  # block b: tokens b, b + C/G, b + 2C/G, ...
            return x.view(self.block, self.nb, *x.shape[1:]).transpose(0, 1)
        return x.view(self.nb, self.block, *x.shape[1:])

    def _negatives(self, ch: Chunk) -> tuple[float, torch.Tensor]:
        """Every token's `src` row (`src_b`) against its block's K samples in one batched SGD
        step: with g = self.weight_j * sigma(src_j . sample) (weight holds -lr * w_j), sample += g * src_j.
        Returns the loss and (C/G, G, D) by block the change of each src row, sum of g * sample.

        That change is a fresh tensor on purpose: torch's CPU `bmm` with `out=` took a per-matrix
        loop for this shape (32 x (16, 5) @ (5, 100)), 3-5x slower than without."""
        score = torch.bmm(self.src_b, self.P_t, out=self.score)  # (C/G, G, K)
        loss = float((F.logsigmoid(-score) * self.weight_b).sum()) / ch.lr if ch.compute_loss else 0.0
        g = score.sigmoid_().mul_(self.weight_b)  # (C/G, G, K)
        torch.bmm(self.score_t, self.src_b, out=self.gP_buf)  # (C/G, K, D)
        self.gP.copy_(self.gP_buf)
        return loss, torch.bmm(g, self.P)

    def _apply(self, ch: Chunk) -> None:
        """Sparse SGD: add the (capped) changes to the chunk's rows and to the samples' output rows."""
        if ch.in_terms is not None and ch.out_terms is not None:  # set together
            # a row that takes T > cap pair gradients in this update takes cap/T of their sum
            cap, D = self.s.row_update_cap, self.s.vector_size
            for terms, half in ((ch.in_terms, self.grad[:, :D]), (ch.out_terms, self.grad[:, D:])):
                self.total.index_add_(0, ch.rows, terms)  # (V,) per row, over the chunk
                scale = self.total[ch.rows].clamp_(min=cap).reciprocal_().mul_(cap)  # (len(rows),)
                self.total.index_fill_(0, ch.rows, 0.0)  # back to zero, touching only these rows
                half.mul_(scale.unsqueeze(1))
        self.Wt.index_add_(0, ch.rows, self.grad)


class SkipGramWorker(Worker):
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
            (
                inp[o:],
                out[:-o],
                out[o:],
                inp[:-o],
                self.m_right[: C - o, o - 1],
                self.m_left[: C - o, o - 1],
                s_r[o - 1],
                s_l[o - 1],
                s_r[o - 1].unsqueeze(1),
                s_l[o - 1].unsqueeze(1),
            )
            for o in range(1, W + 1)
        ]
        self.src_b = self._blocks(self.inp)  # token j is the input word of its pairs
        self.g_in_b = self._blocks(self.g_in)

    def step(self, ch: Chunk) -> Optional[float]:
        s = self.s
        self._gather(ch)
        self.X0.copy_(self.X)
        masks = ch.masks
        if masks is None:
            raise ValueError("a skip-gram update needs a skip-gram chunk (one with masks)")
        torch.mul(masks[:, :, 0], ch.lr, out=self.m_right)
        torch.mul(masks[:, :, 1], ch.lr, out=self.m_left)
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
        neg_loss, change = self._negatives(ch)
        self.g_in_b.add_(change)
        self._apply(ch)
        loss += neg_loss
        return loss if ch.compute_loss else None


class CbowWorker(Worker):
    """h_i = mean of the context input rows; raise sigma(h_i . out_i), lower sigma(h_i . out_neg).
    As gensim's cbow_mean=1, every context row then receives the full gradient of h_i.

    A chunk's windows are one band of its rows: the means are one batched product of each owned
    centre's 2W+1 weights with a strided (no-copy) view of the 2W+1 input rows around it, and the
    context rows' gradient is the same product with the transposed band over the centres' gradients."""

    def __init__(self, Wt: torch.Tensor, s: Word2VecSettings, C: int):
        super().__init__(Wt, s, C)
        D, W = s.vector_size, s.window
        dev = Wt.device
        n = C - 2 * W  # owned centres
        self.h = torch.zeros(C, D, device=dev)  # mean of each centre's context rows (0 where none)
        self.h_owned = self.h[W : C - W].unsqueeze(1)  # (n, 1, D)
        # the gradient of h, between W zero rows on each side so that every context's window fits
        self.work_pad = torch.zeros(C + 2 * W, D, device=dev)
        self.work = self.work_pad[W : C + W]
        self.pos_score = torch.empty(C, device=dev)
        self.g_in_buf = torch.empty(C, 1, D, device=dev)  # bmm writes here: into the strided G it is slower
        inp = self.X[:, 0]  # (C, D), rows 2D apart
        # [c, k] = input row c + k: the window of owned centre c + W (k = W + d: its context at distance d)
        self.windows = inp.as_strided((n, 2 * W + 1, D), (2 * D, 2 * D, 1))
        # [j, k] = work row j + k - W: the centres whose window holds token j (zero rows past the chunk)
        self.windows_t = self.work_pad.as_strided((C, 2 * W + 1, D), (D, D, 1))
        self.out, self.g_out = self.X[:, 1], self.G[:, 1]
        self.g_in_rows = self.g_in_buf.squeeze(1)
        self.g = self.pos_score.unsqueeze(1)  # (C, 1) lr * (1 - sigma), in place of the score
        self.src_b = self._blocks(self.h)  # the mean h_i is the input of centre i's pairs
        self.work_b, self.out_b, self.g_b = self._blocks(self.work), self._blocks(self.out), self._blocks(self.g)

    def step(self, ch: Chunk) -> Optional[float]:
        band, band_t, has_ctx = ch.band, ch.band_t, ch.has_pairs  # has_ctx: centres with at least one context
        if band is None or band_t is None or has_ctx is None:
            raise ValueError("a CBOW update needs a CBOW chunk (one with bands)")
        self._gather(ch)
        h = self.h
        torch.bmm(band, self.windows, out=self.h_owned)  # (C, D) mean of the context rows
        torch.linalg.vecdot(h, self.out, out=self.pos_score)  # (C,)
        loss = -float((F.logsigmoid(self.pos_score) * has_ctx).sum()) if ch.compute_loss else 0.0
        self.pos_score.neg_().sigmoid_().mul_(has_ctx).mul_(ch.lr)
        torch.mul(self.g, h, out=self.g_out)
        torch.mul(has_ctx, -ch.lr * self.s.negative / self.s.draws, out=self.weight)
        neg_loss, change = self._negatives(ch)
        loss += neg_loss
        torch.addcmul(change, self.g_b, self.out_b, out=self.work_b)  # the gradient of h: one pass, by block
        torch.bmm(band_t, self.windows_t, out=self.g_in_buf)  # each context row: its centres' work
        self.g_in.copy_(self.g_in_rows)
        self._apply(ch)
        return loss if ch.compute_loss else None
