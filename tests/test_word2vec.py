"""word2vec in PyTorch: the update it computes, what it learns, its files and its errors."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from components.core.embeddings.vocab import SPECIAL_TOKENS, Vocab, build_vocab, word_tokenize
from components.core.embeddings.word2vec import (
    load_embeddings,
    save_embeddings,
    split_shards,
    train_from_tokens,
    train_word2vec,
)
from components.core.embeddings.word2vec_chunks import (
    CbowWorker,
    SkipGramWorker,
    UnigramSampler,
    block,
    block_of,
    epoch_chunks,
    flatten,
    keep_probability,
    negative_cdf,
)
from components.core.embeddings.word2vec_settings import Word2VecSettings
from components.core.errors import ConfigError, PipelineInputError


def unigram(counts: np.ndarray) -> "UnigramSampler":
    """The negatives' sampler over `counts`, as `train_word2vec` builds it."""
    return UnigramSampler(negative_cdf(counts))


# --- a synthetic corpus with a planted relation -------------------------------------------------
# Animals and vehicles never share a sentence; each group has its own context words. Words of one
# group therefore share contexts and must end up closer to each other than to the other group.
ANIMALS = ["cat", "dog", "horse", "cow", "sheep", "goat"]
VEHICLES = ["car", "truck", "bus", "tractor", "van", "train"]
ANIMAL_CONTEXT = ["eats", "grass", "farm", "barn", "fur", "milk", "legs", "sleeps"]
VEHICLE_CONTEXT = ["drives", "road", "fuel", "engine", "wheels", "garage", "parks", "speed"]
FILLER = ["the", "a", "and", "then", "there"]


def planted_corpus(n_sentences: int = 1200, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(n_sentences):
        if rng.random() < 0.5:
            group, ctx = ANIMALS, ANIMAL_CONTEXT
        else:
            group, ctx = VEHICLES, VEHICLE_CONTEXT
        words = list(rng.choice(group, 2)) + list(rng.choice(ctx, 4)) + list(rng.choice(FILLER, 2))
        rng.shuffle(words)
        sentences.append(words)
    return sentences


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def group_similarity(words: list[str], vectors: np.ndarray) -> tuple[float, float]:
    """Mean cosine within the groups and across them."""
    idx = {w: i for i, w in enumerate(words)}
    A = unit(vectors[[idx[w] for w in ANIMALS]])
    B = unit(vectors[[idx[w] for w in VEHICLES]])
    within = np.concatenate([(A @ A.T)[np.triu_indices(len(A), 1)], (B @ B.T)[np.triu_indices(len(B), 1)]])
    across = (A @ B.T).ravel()
    return float(within.mean()), float(across.mean())


SMALL: dict[str, Any] = dict(
    vector_size=24, window=3, min_count=1, negative=4, epochs=5, sample=0.0, batch_size=256, workers=1
)


@pytest.fixture(scope="module")
def planted() -> list[list[str]]:
    return planted_corpus()


@pytest.mark.parametrize("sg", [1, 0])
def test_pad_row_stays_exactly_zero_and_specials_untouched(planted, sg):
    vocab = build_vocab(planted, min_count=1)
    settings = Word2VecSettings(**SMALL, sg=sg)
    result = train_word2vec(vocab.encode(planted), vocab, settings)
    assert result.words[:4] == list(SPECIAL_TOKENS)
    assert np.all(result.vectors[0] == 0.0) and np.all(result.context[0] == 0.0)
    assert result.metrics["pad_row_max_abs"] == 0.0
    # [UNK]/[BOS]/[EOS] never occur in training nor among the negatives: their rows stay zero too
    assert np.all(result.context[1:4] == 0.0)
    assert np.all(result.vectors[1:4] == 0.0)
    # ... while every word moved away from its initial vector (gensim's init: uniform in [-1, 1) / D)
    init = torch.Generator().manual_seed(settings.seed)
    start = ((torch.rand(len(vocab) - 4, settings.vector_size, generator=init) * 2 - 1) / settings.vector_size).numpy()
    untrained = train_word2vec(
        vocab.encode(planted), vocab, settings.model_copy(update={"alpha": 1e-9, "min_alpha": 0.0})
    )
    np.testing.assert_allclose(untrained.vectors[4:], start, atol=1e-7)  # the initialisation, as stated
    assert np.all(np.abs(result.vectors[4:] - start).max(axis=1) > 1e-3)


@pytest.mark.parametrize("sg", [1, 0])
def test_planted_relation_is_learned(planted, sg):
    result = train_from_tokens(planted, Word2VecSettings(**SMALL, sg=sg))
    within, across = group_similarity(result.words, result.vectors)
    assert within > across + 0.3, (within, across)
    # every animal's nearest trained word among the animals+vehicles is another animal (and vice versa)
    idx = {w: i for i, w in enumerate(result.words)}
    names = ANIMALS + VEHICLES
    U = unit(result.vectors[[idx[w] for w in names]])
    sims = U @ U.T
    np.fill_diagonal(sims, -np.inf)
    nearest = sims.argmax(axis=1)
    assert all((n < len(ANIMALS)) == (i < len(ANIMALS)) for i, n in enumerate(nearest))
    # and training lowered the loss
    assert result.history[-1]["loss"] < result.history[0]["loss"]


def test_untrained_vectors_do_not_show_the_relation(planted):
    """The planted-relation test can fail: with no training (alpha tiny) the groups are not separated."""
    result = train_from_tokens(planted, Word2VecSettings(**{**SMALL, "epochs": 1}, alpha=1e-6, min_alpha=0.0))
    within, across = group_similarity(result.words, result.vectors)
    assert not within > across + 0.3, (within, across)


def reference_update(Wt: torch.Tensor, ch, s: Word2VecSettings) -> np.ndarray:
    """Loops in float64: the update the vectorised code must reproduce (no cap)."""
    W = Wt.numpy().astype(np.float64)
    D, K, lr = s.vector_size, s.draws, ch.lr
    ids, pool, n_ctx = ch.ids.numpy(), ch.pool.numpy(), ch.n_context.numpy()
    C = len(ids)
    dW = np.zeros_like(W)

    def sig(x):
        return 1 / (1 + np.exp(-x))

    if s.sg == 1:
        m = ch.masks.numpy()
        # positives: offset after offset, updating the chunk's copies in place, in the step's order
        L = W[ids].copy()  # (C, 2D) local [input | output] rows
        L0 = L.copy()
        for o in range(1, s.window + 1):
            i = np.arange(C - o)
            g_r = (1 - sig(np.sum(L[i + o, :D] * L[i, D:], axis=1))) * lr * m[i, o - 1, 0]
            g_l = (1 - sig(np.sum(L[i + o, D:] * L[i, :D], axis=1))) * lr * m[i, o - 1, 1]
            L[i + o, :D] += g_r[:, None] * L[i, D:]  # in_{i+o}
            L[i, D:] += g_r[:, None] * L[i + o, :D]  # out_i
            L[i + o, D:] += g_l[:, None] * L[i, :D]  # out_{i+o}
            L[i, :D] += g_l[:, None] * L[i + o, D:]  # in_i
        for p in range(C):
            dW[ids[p]] += L[p] - L0[p]
        # negatives, batched: every token against its K draws from the updated input rows
        for j in range(C):
            for k in range(K):
                p, x = pool[block_of(j, C, s) * K + k], ids[j]
                g = -sig(L[j, :D] @ W[p, D:]) * lr * n_ctx[j] * s.negative / K
                dW[x, :D] += g * W[p, D:]
                dW[p, D:] += g * L[j, :D]
    else:
        Wn, band = s.window, ch.band.numpy()[:, 0]  # (C - 2W, 2W + 1): owned centre W + c, context W + c + k - W
        for i in range(C):
            ctx = [i + k - Wn for k in range(2 * Wn + 1) if Wn <= i < C - Wn and band[i - Wn, k] > 0]
            if not ctx:
                continue
            h = np.mean([W[ids[x], :D] for x in ctx], axis=0)
            g = (1 - sig(h @ W[ids[i], D:])) * lr
            work = g * W[ids[i], D:]
            dW[ids[i], D:] += g * h
            for k in range(K):
                p = pool[block_of(i, C, s) * K + k]
                g = -sig(h @ W[p, D:]) * lr * s.negative / K
                work = work + g * W[p, D:]
                dW[p, D:] += g * h
            for x in ctx:
                dW[ids[x], :D] += work
    return W + dW


@pytest.mark.parametrize("sg, C", [(1, 16), (1, 24), (1, 40), (0, 16), (0, 40)])
def test_vectorised_step_equals_per_pair_reference(sg, C):
    s = Word2VecSettings(
        vector_size=8, window=3, negative=2, negative_draws=3, sg=sg, batch_size=C, batch_growth=1, row_update_cap=0
    )
    counts = np.r_[0, 0, 0, 0, np.arange(8, 0, -1) * 10]
    vocab = Vocab(list(SPECIAL_TOKENS) + [f"w{i}" for i in range(8)], counts)
    rng = np.random.default_rng(3)
    sentences = [rng.integers(4, len(vocab), size=n) for n in (7, 1, 9, 5, 12, 3)]
    corpus = flatten(sentences, vocab, s.window)
    keep_all = np.ones(len(vocab))
    chunks = list(epoch_chunks(corpus, keep_all, unigram(counts), s, 0, rng, torch.device("cpu"), 1))
    assert all(len(c.ids) == C for c in chunks) and len(chunks) == -(-37 // (C - 6))  # C - 2*window new centres each
    Wt = torch.randn(len(vocab), 2 * s.vector_size, generator=torch.Generator().manual_seed(0)) * 0.5
    Wt[0] = 0
    worker = (SkipGramWorker if sg else CbowWorker)(Wt, s, C)
    for ch in chunks:
        expected = reference_update(Wt, ch, s)
        worker.step(ch)
        np.testing.assert_allclose(Wt.numpy(), expected, atol=1e-6)
        assert torch.all(Wt[0] == 0)  # padding positions add exact zeros to [PAD]


def test_row_update_cap_scales_a_frequent_rows_change():
    """A row taking T > cap pair gradients in one update gets cap/T of its change; other rows are untouched."""
    import dataclasses

    s = Word2VecSettings(
        vector_size=8, window=2, negative=2, batch_size=64, batch_growth=1, sample=0.0, row_update_cap=40
    )
    counts = np.r_[0, 0, 0, 0, 500, 10, 10, 10]
    vocab = Vocab(list(SPECIAL_TOKENS) + ["the", "a", "b", "c"], counts)
    rng = np.random.default_rng(0)
    sentence = np.where(rng.random(60) < 0.5, 4, rng.integers(5, 8, 60))  # "the" every other word
    corpus = flatten([sentence], vocab, s.window)
    ch = next(epoch_chunks(corpus, np.ones(len(vocab)), unigram(counts), s, 0, rng, torch.device("cpu"), 1))
    W0 = torch.randn(len(vocab), 16, generator=torch.Generator().manual_seed(1)) * 0.3
    W0[0] = 0
    capped, free = W0.clone(), W0.clone()
    SkipGramWorker(capped, s, len(ch.ids)).step(ch)
    SkipGramWorker(free, s, len(ch.ids)).step(dataclasses.replace(ch, in_terms=None, out_terms=None))
    rows = ch.rows.numpy()
    assert ch.in_terms is not None and ch.out_terms is not None  # the cap binds in this chunk
    t_in = np.bincount(rows, weights=ch.in_terms.numpy(), minlength=len(vocab))
    t_out = np.bincount(rows, weights=ch.out_terms.numpy(), minlength=len(vocab))
    assert t_in[4] > s.row_update_cap and t_out[4] > s.row_update_cap  # "the" is over the cap
    for half, t in ((slice(0, 8), t_in), (slice(8, 16), t_out)):
        scale = s.row_update_cap / np.maximum(t, s.row_update_cap)
        expected = W0[:, half] + (free - W0)[:, half] * torch.from_numpy(scale).float().unsqueeze(1)
        torch.testing.assert_close(capped[:, half], expected, atol=1e-6, rtol=1e-5)


def test_only_chunks_where_a_row_reaches_the_cap_carry_its_terms(monkeypatch):
    """A chunk whose rows all stay under the cap would be scaled by exactly 1: it carries no terms and
    skips the cap. The chunks that carry them are exactly those where some row's total (bincount)
    exceeds the cap, with the same terms as when every chunk carries them."""
    from components.core.embeddings import word2vec_chunks

    s = Word2VecSettings(
        vector_size=8, window=2, negative=2, batch_size=64, batch_growth=1, sample=0.0, row_update_cap=250
    )
    counts = np.r_[0, 0, 0, 0, 30, 10, 10, 10]
    vocab = Vocab(list(SPECIAL_TOKENS) + ["the", "a", "b", "c"], counts)
    rng = np.random.default_rng(0)
    dense = np.where(rng.random(120) < 0.6, 4, rng.integers(5, 8, 120))  # "the" in most places: over the cap
    sentence = np.r_[dense, rng.integers(5, 8, 360)]  # then never: every row under it
    corpus = flatten([sentence], vocab, s.window)
    negatives = unigram(counts)

    def chunks():
        it = epoch_chunks(
            corpus, np.ones(len(vocab)), negatives, s, 0, np.random.default_rng(1), torch.device("cpu"), 1
        )
        return list(it)

    got = chunks()
    monkeypatch.setattr(word2vec_chunks, "cap_binds", lambda rows, terms, cap: np.ones(len(rows), dtype=bool))
    every = chunks()
    over = []
    for g, e in zip(got, every, strict=True):
        rows = e.rows.numpy()
        assert e.in_terms is not None and e.out_terms is not None  # every chunk carries them here
        totals = [np.bincount(rows, weights=t.numpy()).max() for t in (e.in_terms, e.out_terms)]
        over.append(max(totals) > s.row_update_cap)
        assert (g.in_terms is not None) == (g.out_terms is not None) == over[-1]
        if over[-1]:
            assert g.in_terms is not None and g.out_terms is not None
            assert torch.equal(g.in_terms, e.in_terms) and torch.equal(g.out_terms, e.out_terms)
    assert any(over) and not all(over)  # both kinds occur here


@pytest.mark.parametrize("cap", [0.5, 5.0, 8.0, 12.0, 1e9])
def test_cap_binds_exactly_where_a_rows_sum_in_its_chunk_passes_the_cap(cap):
    """Against the plain per-chunk sums, on chunks with frequent and rare rows, terms zero and not."""
    from components.core.embeddings.word2vec_chunks import cap_binds

    rng = np.random.default_rng(int(cap))
    B, L = 40, 30
    rows = np.where(rng.random((B, L)) < 0.3, rng.integers(0, 3, (B, L)), rng.integers(3, 500, (B, L)))
    terms = (rng.random((B, L)) * 3, np.where(rng.random((B, L)) < 0.5, 0.0, rng.random((B, L)) * 2))
    expected = np.array([any(np.bincount(rows[b], weights=t[b]).max() > cap for t in terms) for b in range(B)])
    got = cap_binds(rows, terms, cap)
    np.testing.assert_array_equal(got, expected)
    assert cap > 100 or cap < 1 or (expected.any() and not expected.all())  # both kinds at the middle caps


def test_every_pair_is_trained_once_within_its_sentence():
    """Overlapping chunks own disjoint centres; each centre sees the same 1..window words on each side."""
    W = 4
    s = Word2VecSettings(window=W, batch_size=40, batch_growth=1, sample=0.0)
    counts = np.r_[0, 0, 0, 0, np.full(6, 100)]
    vocab = Vocab(list(SPECIAL_TOKENS) + [f"w{i}" for i in range(6)], counts)
    rng = np.random.default_rng(0)
    sentences = [rng.integers(4, 10, size=n) for n in rng.integers(1, 30, size=40)]
    corpus = flatten(sentences, vocab, W)
    chunks = list(epoch_chunks(corpus, np.ones(len(vocab)), unigram(counts), s, 0, rng, torch.device("cpu"), 1))
    pairs: list[tuple[int, int]] = []  # (centre, context) in corpus positions (sample=0 keeps every token)
    for ch in chunks:
        assert ch.masks is not None  # skip-gram
        m = ch.masks.numpy()  # (C, W, 2)
        C = len(ch.ids)
        for i, o, t in zip(*np.nonzero(m)):
            assert i + o + 1 < C
            centre, context = (i, i + o + 1) if t == 0 else (i + o + 1, i)
            pairs.append((ch.start + centre, ch.start + context))
        n_centre = m[:, :, 0].sum(1).copy()
        for o in range(1, W + 1):
            n_centre[o:] += m[: C - o, o - 1, 1]
        np.testing.assert_array_equal(n_centre, ch.n_centre.numpy())
    assert len(pairs) == len(set(pairs))  # no pair twice
    sent = corpus.sentence
    assert all(sent[c] == sent[x] for c, x in pairs)  # none across a sentence end
    by_centre: dict[int, set[int]] = {}
    for c, x in pairs:
        by_centre.setdefault(c, set()).add(x - c)
    for c, offsets in by_centre.items():
        b = max(abs(o) for o in offsets)  # the drawn window: every same-sentence word within b, both sides
        expected = {o for o in range(-b, b + 1) if o and 0 <= c + o < len(sent) and sent[c + o] == sent[c]}
        assert offsets == expected and 1 <= b <= W
    has_neighbour = [
        i
        for i in range(len(sent))
        if (i > 0 and sent[i - 1] == sent[i]) or (i + 1 < len(sent) and sent[i + 1] == sent[i])
    ]
    assert sorted(by_centre) == has_neighbour  # every token with a neighbour is a centre, once
    assert sum(ch.raw_words for ch in chunks) == len(sent)


def test_cbow_bands_hold_the_skip_gram_masks_of_the_same_draws():
    """CBOW's chunks describe their pairs as two bands; drawn from the same seed, they hold exactly the
    pairs of skip-gram's masks, with the mean's weights 1/n_centre, and the same pair counts."""
    W, C = 3, 32
    counts = np.r_[0, 0, 0, 0, np.full(6, 100)]
    vocab = Vocab(list(SPECIAL_TOKENS) + [f"w{i}" for i in range(6)], counts)
    rng = np.random.default_rng(0)
    sentences = [rng.integers(4, 10, size=n) for n in rng.integers(1, 12, size=30)]
    corpus = flatten(sentences, vocab, W)

    def chunks(sg):
        s = Word2VecSettings(window=W, sg=sg, batch_size=C, batch_growth=1, sample=0.0, negative_draws=5)
        gen = np.random.default_rng(1)
        return list(epoch_chunks(corpus, np.ones(len(vocab)), unigram(counts), s, 0, gen, "cpu", 1))

    for sk, cb in zip(chunks(1), chunks(0), strict=True):
        assert sk.masks is not None and cb.band is not None and cb.band_t is not None and cb.has_pairs is not None
        m, band, band_t = sk.masks.numpy(), cb.band.numpy()[:, 0], cb.band_t.numpy()[:, 0]
        assert cb.masks is None and sk.band is None
        around = np.zeros((C, 2 * W + 1))  # [centre i, W + d]: context i + d
        within = np.zeros((C, 2 * W + 1))  # [context j, W + d]: centre j + d
        for i, o, t in zip(*np.nonzero(m)):
            centre, context = (i, i + o + 1) if t == 0 else (i + o + 1, i)
            around[centre, W + context - centre] = 1
            within[context, W + centre - context] = 1
        assert around.sum() > 0 and not around[:W].any() and not around[C - W :].any()  # owned centres only
        n = around.sum(1)
        np.testing.assert_allclose(band, around[W : C - W] / np.maximum(n[W : C - W], 1)[:, None], rtol=1e-6)
        np.testing.assert_array_equal(band_t, within)
        np.testing.assert_array_equal(cb.n_centre.numpy(), sk.n_centre.numpy())
        np.testing.assert_array_equal(cb.n_context.numpy(), sk.n_context.numpy())
        np.testing.assert_array_equal(cb.has_pairs.numpy(), n > 0)
        assert cb.pairs == sk.pairs


def test_cbow_blocks_interleave_and_the_cap_counts_each_samples_block(monkeypatch):
    """A CBOW block is every (C/G)-th token (neighbouring centres share most of their context); a
    sample's output half takes the weights of the tokens of its own block."""
    from components.core.embeddings import word2vec_chunks

    C, K = 64, 3
    s = Word2VecSettings(window=2, sg=0, negative=3, batch_size=C, batch_growth=1, sample=0.0)
    G, nb = block(C), C // block(C)
    assert block_of(np.arange(C), C, s).tolist() == [j % nb for j in range(C)]
    assert block_of(np.arange(C), C, s.model_copy(update={"sg": 1})).tolist() == [j // G for j in range(C)]
    monkeypatch.setattr(word2vec_chunks, "cap_binds", lambda rows, terms, cap: np.ones(len(rows), dtype=bool))
    counts = np.r_[0, 0, 0, 0, np.full(6, 100)]
    vocab = Vocab(list(SPECIAL_TOKENS) + [f"w{i}" for i in range(6)], counts)
    rng = np.random.default_rng(0)
    sentences = [rng.integers(4, 10, size=n) for n in rng.integers(1, 30, size=20)]
    corpus = flatten(sentences, vocab, 2)
    chunks = list(epoch_chunks(corpus, np.ones(len(vocab)), unigram(counts), s, 0, rng, "cpu", 1))
    for ch in chunks:
        assert ch.has_pairs is not None and ch.out_terms is not None  # CBOW, every chunk carrying its terms
        per_block = np.bincount(block_of(np.arange(C), C, s), weights=ch.has_pairs.numpy(), minlength=nb)
        np.testing.assert_allclose(ch.out_terms.numpy()[C:], np.repeat(per_block, K) * s.negative / K)


def test_subsampling_and_negative_table_match_gensim():
    from gensim.models import Word2Vec

    sentences = planted_corpus(300)
    model = Word2Vec(vector_size=8, min_count=1, sample=1e-2, workers=1)
    model.build_vocab(sentences)
    vocab = build_vocab(sentences, min_count=1)
    assert vocab.words[4:] == model.wv.index_to_key
    np.testing.assert_array_equal(vocab.counts[4:], [model.wv.get_vecattr(w, "count") for w in model.wv.index_to_key])
    keep = keep_probability(vocab.counts, 1e-2)[4:]
    gensim_keep = np.array([model.wv.get_vecattr(w, "sample_int") for w in model.wv.index_to_key]) / (2**32 - 1)
    np.testing.assert_allclose(keep, gensim_keep, rtol=1e-6)
    cdf = negative_cdf(vocab.counts)
    assert model.cum_table is not None  # built by build_vocab
    np.testing.assert_allclose(cdf[4:], model.cum_table / model.cum_table[-1], rtol=1e-6)
    assert np.all(cdf[:4] == 0)  # the specials are never drawn as negatives


@pytest.mark.parametrize("counts", [np.r_[0, 0, 0, 0, 500, 120, 40, 9, 5, 5, 1], np.r_[0, 0, 0, 0, 7]])
def test_negatives_are_drawn_with_the_unigram_table_probabilities(counts):
    """The alias sampler draws each id with its cdf step (gensim's cum_table), never a zero-count one."""
    p = np.diff(np.r_[0.0, negative_cdf(counts)])
    n = 400_000
    got = np.bincount(unigram(counts).draw(np.random.default_rng(5), (n // 4, 4)).ravel(), minlength=len(counts))
    assert got.sum() == n and np.all(got[counts == 0] == 0)
    sd = np.sqrt(n * p * (1 - p))
    assert np.all(np.abs(got - n * p) <= 5 * sd + 1e-9), (got, n * p)
    # a wrong table is caught: the plain unigram (power 1) is far outside these bounds
    plain = counts / counts.sum()
    assert len(counts) == 5 or np.any(np.abs(got - n * plain) > 5 * sd)


def test_build_vocab_order_counts_and_encode():
    tokens = [["b", "a", "c", "a"], ["c", "b", "d", "[PAD]"], ["a"]]
    vocab = build_vocab(tokens, min_count=2)
    # a: 3; b, c: 2 each (gensim puts the later-first-seen word of a tie first); d and "[PAD]" text dropped
    assert vocab.words == list(SPECIAL_TOKENS) + ["a", "c", "b"]
    assert vocab.counts.tolist() == [0, 0, 0, 0, 3, 2, 2]
    enc = vocab.encode(tokens)
    assert [e.tolist() for e in enc] == [[6, 4, 5, 4], [5, 6], [4]]
    assert all(e.dtype == np.int32 for e in enc)


def test_word_tokenize_lowercases_and_drops_punctuation():
    assert word_tokenize("Hello, World! It's 2024 -- ok?") == ["hello", "world", "it", "s", "2024", "ok"]
    assert word_tokenize("Élan vital (Bergson)") == ["élan", "vital", "bergson"]
    assert word_tokenize("苹果公司发布了新手机。") == ["苹果公司", "发布", "了", "新手机"]  # jieba words, not one token


def test_one_worker_is_deterministic(planted):
    settings = Word2VecSettings(**{**SMALL, "epochs": 2})
    a = train_from_tokens(planted, settings)
    b = train_from_tokens(planted, settings)
    np.testing.assert_array_equal(a.vectors, b.vectors)
    c = train_from_tokens(planted, settings.model_copy(update={"seed": 2}))
    assert not np.array_equal(a.vectors, c.vectors)


@pytest.mark.parametrize("start_methods", [None, ["spawn"]], ids=["processes", "threads"])
def test_two_workers_train_too(planted, monkeypatch, start_methods):
    """workers=2: two forked processes on one shared matrix, or threads where fork is unavailable."""
    import multiprocessing

    if start_methods is not None:
        monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: start_methods)
    threads = torch.get_num_threads()
    result = train_from_tokens(planted, Word2VecSettings(**{**SMALL, "workers": 2, "batch_size": 64}))
    within, across = group_similarity(result.words, result.vectors)
    assert within > across + 0.3
    assert np.all(result.vectors[0] == 0)
    assert result.history[-1]["kept_tokens"] == result.metrics["corpus_tokens"]  # sample=0: both shards trained
    assert torch.get_num_threads() == threads  # the setting is restored


def test_shards_split_at_sentence_ends():
    counts = np.r_[0, 0, 0, 0, np.full(4, 50)]
    vocab = Vocab(list(SPECIAL_TOKENS) + ["a", "b", "c", "d"], counts)
    sentences = [np.full(n, 4 + i % 4) for i, n in enumerate([5, 7, 3, 9, 4, 6])]
    corpus = flatten(sentences, vocab, 2)
    shards = split_shards(corpus, 3)
    assert sum(len(sh.ids) for sh in shards) == len(corpus.ids) and len(shards) == 3
    for a, b in zip(shards[:-1], shards[1:]):
        assert a.sentence[-1] != b.sentence[0]  # no sentence is cut
    assert len(split_shards(corpus, 20)) == 6  # at most one shard per sentence


def test_log_metrics_callback_and_metrics(planted):
    seen: list[tuple[dict, int]] = []
    result = train_from_tokens(planted, Word2VecSettings(**SMALL), log_metrics=lambda m, step: seen.append((m, step)))
    steps = [s for _, s in seen]
    assert steps == sorted(steps) and steps[-1] == result.metrics["corpus_tokens"] * SMALL["epochs"]
    assert {"word2vec/lr", "word2vec/loss", "word2vec/words_per_s"} <= set(seen[0][0])
    lrs = [m["word2vec/lr"] for m, _ in seen if "word2vec/lr" in m]
    assert lrs[0] > lrs[-1]  # linear decay
    assert len(result.history) == SMALL["epochs"]
    for key in ("train_seconds", "words_per_s", "kept_share", "pairs_per_epoch", "final_loss"):
        assert np.isfinite(result.metrics[key])


def test_save_and_load_roundtrip(tmp_path, planted):
    from safetensors import safe_open

    result = train_from_tokens(planted, Word2VecSettings(**{**SMALL, "epochs": 1}))
    paths = save_embeddings(result, tmp_path / "emb")
    assert paths["vectors"].name == "vectors.safetensors" and paths["vocab"].parent == paths["vectors"].parent
    assert paths["trainable"].parent.name == "trainable"
    loaded = load_embeddings(tmp_path / "emb")
    np.testing.assert_array_equal(loaded.vectors, result.vectors)
    assert loaded.words == result.words and loaded.vocab.counts.tolist() == result.vocab.counts.tolist()
    assert loaded.settings["vector_size"] == SMALL["vector_size"]
    with safe_open(str(paths["vectors"]), framework="numpy") as fh:
        assert list(fh.keys()) == ["vectors"]  # the context vectors live apart
        assert json.loads(fh.metadata()["settings"])["sg"] == 1
    with safe_open(str(paths["trainable"]), framework="numpy") as fh:
        np.testing.assert_array_equal(fh.get_tensor("output"), result.context)
    lines = paths["vocab"].read_text(encoding="utf-8").splitlines()
    assert lines[0] == "[PAD]\t0" and len(lines) == len(result.words)


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(PipelineInputError, match="vectors.safetensors"):
        load_embeddings(tmp_path)
    (tmp_path / "vectors.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / "vocab.tsv").write_text("[PAD]\t0\n")
    with pytest.raises(PipelineInputError, match="vectors.safetensors"):
        load_embeddings(tmp_path)


@pytest.mark.parametrize(
    "field, value",
    [
        ("vector_size", 0),
        ("vector_size", -3),
        ("window", 0),
        ("sg", 2),
        ("negative", 0),
        ("epochs", 0),
        ("sample", -1.0),
        ("sample", float("nan")),
        ("alpha", 1.5),
        ("negative_draws", -1),
        ("batch_size", -1),
        ("row_update_cap", float("inf")),
        ("seed", -1),
    ],
)
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        Word2VecSettings(**{field: value})


def test_bad_settings_combinations():
    with pytest.raises(ValidationError, match="min_alpha"):
        Word2VecSettings(alpha=0.01, min_alpha=0.02)
    with pytest.raises(ValidationError, match="batch_size"):
        Word2VecSettings(window=5, batch_size=8)
    with pytest.raises(ValidationError, match="batch_size must be at least 4 \\* window = 400, got 256"):
        Word2VecSettings(window=100)  # the model's default batch is checked too
    with pytest.raises(ValidationError, match="extra"):
        Word2VecSettings(size=100)  # pyright: ignore[reportCallIssue]  # gensim 3's old name is not silently ignored


def test_batch_size_and_draws_zero_take_the_models_defaults():
    assert (Word2VecSettings(sg=1).batch, Word2VecSettings(sg=0).batch) == (256, 512)
    assert (Word2VecSettings(sg=1).draws, Word2VecSettings(sg=0).draws) == (10, 5)
    assert Word2VecSettings(sg=0, batch_size=64, negative_draws=7).batch == 64
    assert Word2VecSettings(sg=0, batch_size=64, negative_draws=7).draws == 7


def test_min_count_that_empties_the_vocabulary_is_a_clear_error(planted):
    with pytest.raises(ConfigError, match="min_count=100000"):
        build_vocab(planted, min_count=100000)
    with pytest.raises(ConfigError, match="min_count"):
        train_from_tokens(planted, Word2VecSettings(min_count=10**6))


def test_corpus_shorter_than_one_window_is_a_clear_error():
    tokens = [["alpha", "beta", "gamma", "delta", "epsilon"]] * 1
    vocab = build_vocab(tokens, min_count=1)
    with pytest.raises(ConfigError, match="window"):
        train_word2vec(vocab.encode(tokens), vocab, Word2VecSettings(window=5, min_count=1))


def test_ids_from_another_vocabulary_are_rejected(planted):
    vocab = build_vocab(planted, min_count=1)
    bad = [np.array([4, 5, len(vocab) + 7], dtype=np.int32)] * 20
    with pytest.raises(PipelineInputError, match="vocab.encode"):
        train_word2vec(bad, vocab, Word2VecSettings(**SMALL))
