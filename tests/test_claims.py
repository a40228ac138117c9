"""The article's claims as the checks and the report judge them (`components.core.claims`), each on real
small data: trained word vectors, a Transformer trained on a task that needs blending, real training
histories; and each shown failing where the claim does not hold."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from components.core import claims as C
from components.core.data import TokenBlocks
from components.core.embeddings import WordIndex
from components.core.embeddings.evaluate import distance_spread, spread_metrics
from components.core.embeddings.vocab import build_vocab
from components.core.embeddings.word2vec import Word2VecResult, Word2VecSettings, save_embeddings, train_word2vec
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.studies.attention_topk import AttentionTopKSettings, attention_topk
from components.core.studies.inside import head_statistics
from components.core.device import seed_everything
from components.core.training import TrainSettings, train
from test_word2vec import SMALL, planted_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


# --- word vectors -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def word2vec() -> Word2VecResult:
    sentences = planted_corpus(600)
    vocab = build_vocab(sentences, min_count=1)
    return train_word2vec(vocab.encode(sentences), vocab, Word2VecSettings(**SMALL))


def test_pad_is_excluded_from_similarity_and_fails_when_its_row_is_not_zero(word2vec, tmp_path):
    save_embeddings(word2vec, tmp_path / "ok")
    v = C.pad_excluded_from_similarity({"path": str(tmp_path / "ok")})
    assert v.passed and v.figures["pad_in_neighbours"] == 0 and v.figures["pad_row_norm"] == 0
    assert v.figures["words_probed"] == len(word2vec.vocab) - 4 and v.figures["neighbours_listed"] > 0  # every word but the specials
    assert C.pad_row_is_zero({"path": str(tmp_path / "ok")}).passed
    # A [PAD] row that picked up a direction (say, trained like a word): both claims fail, with the figure.
    bad = Word2VecResult(word2vec.vectors.copy(), word2vec.context, word2vec.vocab, word2vec.settings, word2vec.metrics)
    bad.vectors[0] = word2vec.vectors[10]
    save_embeddings(bad, tmp_path / "bad")
    v = C.pad_excluded_from_similarity({"path": str(tmp_path / "bad")})
    assert not v.passed and not v.checks["pad_row_is_zero"] and v.figures["pad_row_norm"] > 0
    assert not C.pad_row_is_zero({"path": str(tmp_path / "bad")}).passed


def embedding_eval_manifest(words, vectors) -> dict:
    """What embedding_eval's manifest holds of the distances (`EmbeddingReport.metrics`)."""
    return {"metrics": spread_metrics(distance_spread(WordIndex(words, vectors), 500))}


def test_onehot_is_equidistant_learned_vectors_are_not(word2vec):
    words, vectors = word2vec.vocab.words, word2vec.vectors
    spread = distance_spread(WordIndex(words, vectors), 500)
    assert spread["words"] == len(words) - 4 and spread["pairs"] == spread["words"] * (spread["words"] - 1) // 2
    assert spread["onehot"]["min"] == pytest.approx(math.sqrt(2), abs=1e-12) == spread["onehot"]["max"]
    v = C.onehot_equidistant_learned_not(embedding_eval_manifest(words, vectors))
    assert v.passed, v
    assert v.figures["learned_cv"] > 1.5 * v.figures["random_cv"] and v.figures["learned_max"] > 2 * v.figures["learned_min"]
    # Vectors with no structure fail: mutually orthogonal ones (one-hot in disguise: every pair √2 apart)
    # and random directions (spread no wider than chance gives).
    n = len(words)
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((n, n)))
    orthogonal = (q * 3.0).astype(np.float32)
    orthogonal[0] = 0
    v = C.onehot_equidistant_learned_not(embedding_eval_manifest(words, orthogonal))
    assert not v.passed and v.checks["onehot_all_sqrt2"] and v.figures["learned_cv"] < 1e-5
    rand = np.random.default_rng(1).standard_normal(vectors.shape).astype(np.float32)
    rand[0] = 0
    assert not C.onehot_equidistant_learned_not(embedding_eval_manifest(words, rand)).passed


# --- a Transformer trained on a task that needs blending ------------------------------------------
# Each sequence draws its tokens (1, 2, 3) from its own random distribution; the best guess of the
# next token is the frequency of each token so far, which only averaging over every earlier token
# (soft attention) estimates. Top-k attention sees k tokens.

V, T = 6, 16


def frequency_blocks(n: int, seed: int) -> TokenBlocks:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet([0.5, 0.5, 0.5], size=n)
    seqs = np.stack([rng.choice([1, 2, 3], size=T + 1, p=pi) for pi in p])
    return TokenBlocks(seqs[:, :-1].astype(np.uint16), seqs[:, 1:].astype(np.int32))


@pytest.fixture(scope="module")
def blender(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    seed_everything(0)
    model = Transformer(TransformerSettings(n_layer=1, n_head=2, n_embd=32, block_size=T, pos_encoding="none"), V)
    s = TrainSettings(max_steps=150, batch_size=32, lr=3e-3, min_lr=3e-4, warmup_steps=10, eval_interval=0, log_interval=5,
                      grad_clip=0.5, seed=0)
    result = train(model, frequency_blocks(2048, 0), frequency_blocks(64, 1), s, tmp_path_factory.mktemp("blender"))
    torch.set_num_threads(threads)
    return model.eval(), result, s


def test_soft_attention_beats_topk_on_a_task_that_needs_blending_and_fails_when_k_covers_every_key(blender):
    model, _, _ = blender
    val = frequency_blocks(128, 2)
    r = attention_topk(model, val, AttentionTopKSettings(ks=[1, 2, 4], eval_blocks=128, device="cpu"))
    assert [row["keys"] for row in r.rows] == ["top-1", "top-2", "top-4", "all (softmax)"] and r.blocks == 128
    v = C.soft_attention_beats_topk({"rows": r.rows})
    assert v.passed, v
    assert v.figures["top1_loss_increase"] > v.figures["top2_loss_increase"] > v.figures["top4_loss_increase"] > 0
    assert 0 < v.figures["top1_weight_share"] < v.figures["top2_weight_share"] < v.figures["top4_weight_share"] < 1
    # Keeping every key (k = the block size) is the full softmax: no better, no worse, so the claim fails.
    r = attention_topk(model, val, AttentionTopKSettings(ks=[T], eval_blocks=128, device="cpu"))
    assert r.rows[0]["val_loss"] == pytest.approx(r.full_loss, abs=1e-6)
    assert r.rows[0]["weight_share"] == pytest.approx(1.0)
    # So does a k beyond the block size (it keeps every key a query has).
    r = attention_topk(model, val, AttentionTopKSettings(ks=[2, 4 * T], eval_blocks=128, device="cpu"))
    assert r.rows[1]["val_loss"] == pytest.approx(r.full_loss, abs=1e-6) and r.rows[1]["weight_share"] == pytest.approx(1.0)
    assert not C.soft_attention_beats_topk({"rows": r.rows}).passed


def test_attention_rows_sum_to_one_on_the_trained_model_and_not_when_cut_without_renormalising(blender):
    model, _, _ = blender
    x = torch.from_numpy(frequency_blocks(8, 3).x.astype(np.int64))
    weights = model.attention_weights(x)
    stats = head_statistics(weights)
    v = C.attention_rows_sum_to_one({"metrics": {"heads/max_row_sum_error": max(h["max_row_sum_error"] for h in stats)}, "heads": stats})
    assert v.passed and v.figures["max_row_sum_error"] < 1e-6
    # The top-1 weight alone, not renormalised, is no distribution.
    cut = [w * (w == w.max(-1, keepdim=True).values) for w in weights]
    stats = head_statistics(cut)
    v = C.attention_rows_sum_to_one({"metrics": {"heads/max_row_sum_error": max(h["max_row_sum_error"] for h in stats)}, "heads": stats})
    assert not v.passed and v.figures["max_row_sum_error"] > 0.1


def test_clipping_bounds_the_gradient_norm_in_a_real_history_and_fails_without_clipping(blender, tmp_path):
    _, result, s = blender
    v = C.clipping_bounds_gradient({"history": result.history, "train_settings": s.model_dump()})
    assert v.passed, v
    assert v.figures["log_points"] == 30 and v.figures["max_grad_norm_clipped"] <= 0.5 * (1 + 1e-4)
    assert v.figures["points_over_clip"] > 0 and v.figures["max_grad_norm"] > 0.5  # the bound was needed
    # The same training with clipping off: judged against 0.5, the norms exceed it.
    seed_everything(0)
    model = Transformer(TransformerSettings(n_layer=1, n_head=2, n_embd=32, block_size=T, pos_encoding="none"), V)
    off = s.model_copy(update={"grad_clip": 0.0, "max_steps": 10, "log_interval": 1})
    history = train(model, frequency_blocks(256, 0), frequency_blocks(32, 1), off, tmp_path).history
    assert C.clipping_bounds_gradient({"history": history, "train_settings": off.model_dump()}).note.startswith("clipping is off")
    v = C.clipping_bounds_gradient({"history": history, "train_settings": {"grad_clip": 0.5}})
    assert not v.passed and v.figures["max_grad_norm_clipped"] > 0.5


# --- the registry ---------------------------------------------------------------------------------


def test_every_claim_is_judged_once_per_asset_and_a_missing_or_broken_input_is_not_judged():
    names = [c.name for c in C.CLAIMS]
    assert len(names) == len(set(names))
    baseline = {"val_loss": 4.5, "model": "kn_3gram", "block_size": 32, "n_targets": 100, "tokenizer_sha256": "t"}
    manifests = {"rnn_lm": {"vocab_size": 100, "metrics": {"val/loss": 4.0, "val/targets": 100}, "history": [], "tokenizer_sha256": "t",
                            "train_settings": {"grad_clip": 1.0, "block_size": 32}, "baseline": baseline},
                 "attention_topk": {"rows": "not rows"}}
    js = C.judge_all(manifests, ["rnn_lm"], [C.claim("beats_ngram_baseline"), C.claim("soft_attention_beats_topk"), C.claim("heads_differ")])
    by = {(j.claim.name, j.asset): j for j in js}
    assert by[("beats_ngram_baseline", "rnn_lm")].status == "passed"
    assert by[("soft_attention_beats_topk", "attention_topk")].status == "not judged" and "TypeError" in by[("soft_attention_beats_topk", "attention_topk")].error
    assert by[("heads_differ", "attention_heads")].status == "not judged"
    worse = C.judge_all({"rnn_lm": {**manifests["rnn_lm"], "metrics": {"val/loss": 5.0, "val/targets": 100}}}, ["rnn_lm"], [C.claim("beats_ngram_baseline")])
    assert worse[0].status == "warning"  # a finding (warn), not an error
