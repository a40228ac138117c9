"""The gradient study: vanishing for contractive recurrent weights, exploding for expansive ones,
and clipping keeping a high-learning-rate RNN trainable."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from components.core import claims
from components.core import manifests as M
from components.core.device import seed_everything
from components.core.errors import ConfigError
from components.core.labels import pack_blocks, token_stream
from components.core.models.recurrent import RecurrentLM, RecurrentSettings
from components.core.studies.gradients import (
    GradientStudyResult,
    GradientStudySettings,
    clipping_experiment,
    fit_step_factor,
    gradient_study,
    hidden_grad_norms,
    recurrent_matrices,
    scale_spectral_radius,
    spectral_radius,
)
from components.core.tokenizer import TokenizerSettings, train_tokenizer

V = 512


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def blocks(wiki_texts):
    """Real labels (Wikipedia through a 512-token BPE) in blocks of 128."""
    tok = train_tokenizer(wiki_texts[:20], TokenizerSettings(vocab_size=V))
    return pack_blocks(token_stream(tok, wiki_texts[:12]), 128, V), pack_blocks(
        token_stream(tok, wiki_texts[20:23]), 128, V
    )


def rnn(cell="rnn", seed=0, **kw):
    seed_everything(seed)
    return RecurrentLM(RecurrentSettings(cell=cell, n_embd=32, hidden_size=64, **kw), V)


def test_scaling_sets_the_spectral_radius_on_a_copy():
    for cell in ("rnn", "lstm"):
        m = rnn(cell, n_layer=2)
        before = [w.clone() for w in recurrent_matrices(m)]
        scaled = scale_spectral_radius(m, 1.7)
        mats = recurrent_matrices(scaled)
        assert len(mats) == (2 if cell == "rnn" else 8)  # per layer, and per gate for the LSTM
        assert all(spectral_radius(w) == pytest.approx(1.7, rel=1e-5) for w in mats)
        assert all(torch.equal(a, b) for a, b in zip(before, recurrent_matrices(m)))  # original untouched


def test_contractive_rnn_vanishes_and_expansive_rnn_explodes(blocks):
    _, val_b = blocks
    x, y = val_b.batch(np.arange(4))  # (4, 128) real token blocks
    seed_everything(0)
    # Wide enough (H=64) that the spectrum has a bulk, not one outlier eigenvalue, near the set radius.
    m = RecurrentLM(RecurrentSettings(cell="rnn", n_embd=32, hidden_size=64), V)
    small = hidden_grad_norms(scale_spectral_radius(m, 0.5), x, y)
    large = hidden_grad_norms(scale_spectral_radius(m, 3.0), x, y)
    f_small, r2_small = fit_step_factor(small)
    f_large, r2_large = fit_step_factor(large)
    assert f_small < 0.8 and r2_small > 0.9  # exponential decay with distance ...
    assert small[0] < 1e-10 * small[-2]  # ... by many orders of magnitude over 127 steps
    assert f_large > 1.1 and r2_large > 0.9  # exponential growth
    assert large[0] > 1e4 * large[-2]
    # The LSTM at the same (contractive) radius keeps more of the gradient than the RNN.
    lstm_small = hidden_grad_norms(scale_spectral_radius(rnn("lstm"), 0.5), x, y)
    assert fit_step_factor(lstm_small)[0] > f_small


def test_last_step_norm_matches_the_closed_form(blocks):
    # dL_T/dh_T = W_head^T (softmax(logits) - onehot(y_T)) for a one-layer model without projection.
    _, val_b = blocks
    x, y = val_b.batch(np.arange(3))
    m = rnn().double().eval()
    with torch.no_grad():
        h, _ = m.forward_hidden(x)  # (B, T, H)
        p = F.softmax(m.lm_head(h[:, -1]), dim=-1)  # (B, V)
        p[torch.arange(3), y[:, -1]] -= 1.0
        per_seq = (p @ m.lm_head.weight).norm(dim=-1)  # (B,)
    want = per_seq.log().mean().exp().item()  # geometric mean over sequences
    assert hidden_grad_norms(m, x, y)[-1] == pytest.approx(want, rel=1e-9)


def test_fit_step_factor_recovers_a_known_rate():
    d = np.arange(50)[::-1]  # norms are indexed by t; distance T - t runs backwards
    factor, r2 = fit_step_factor(3.0 * 0.9**d)
    assert factor == pytest.approx(0.9) and r2 == pytest.approx(1.0)
    assert fit_step_factor(2.0 * 1.2**d)[0] == pytest.approx(1.2)


def test_clipping_keeps_a_high_lr_rnn_trainable(blocks):
    train_b, val_b = blocks
    s = GradientStudySettings(clip_steps=40, clip_lr=8.0, clip_grad=0.25, clip_block_size=64, clip_batch_size=16)
    res = clipping_experiment(RecurrentSettings(cell="rnn", n_embd=32, hidden_size=64), V, train_b, val_b, s)
    assert res.unclipped_diverged, res.loss_unclipped
    assert not res.clipped_diverged and res.clipped_trained, res.loss_clipped
    assert res.shows_clipping_helps
    assert res.max_grad_norm_unclipped > 100 * s.clip_grad  # the gradient exploded ...
    assert res.max_grad_norm_clipped_after_clip <= s.clip_grad * (1 + 1e-5)  # ... and clipping held the bound
    assert res.loss_clipped[-1] < math.log(V) - 0.5


@pytest.mark.parametrize(
    ("clip_lr", "clip_grad", "failing"),
    [
        # A gentle learning rate: plain SGD does not diverge, so there is no explosion for clipping to tame.
        (0.5, 0.25, {"unclipped_diverges"}),
        # The clip never engages (a threshold far above any gradient norm): the "clipped" run is the unclipped
        # one, diverges with it, and proves nothing about clipping.
        (8.0, 1e6, {"clipped_does_not_diverge", "clipped_trains", "clip_engaged"}),
    ],
    ids=["gentle_lr_nothing_explodes", "clip_never_engages"],
)
def test_clipping_claim_fails_on_a_measured_world_with_nothing_to_tame(blocks, clip_lr, clip_grad, failing):
    """Measured counterexample of `clipping_tames_exploding_gradients`: the real clipping experiment (the
    same RNN, data and loop as above) run where it cannot show clipping taming an explosion, judged on the
    manifest the `gradient_study` asset builds (its metrics and clip_grad)."""
    train_b, val_b = blocks
    s = GradientStudySettings(
        clip_steps=40, clip_lr=clip_lr, clip_grad=clip_grad, clip_block_size=64, clip_batch_size=16
    )
    res = clipping_experiment(RecurrentSettings(cell="rnn", n_embd=32, hidden_size=64), V, train_b, val_b, s)
    study = GradientStudyResult(rows=[], norms={}, clipping=res)
    v = claims.clipping_tames_exploding_gradients(M.GradientStudy(metrics=study.metrics(), clip_grad=s.clip_grad))
    assert v.judged and not v.passed
    assert {k for k, ok in v.checks.items() if not ok} == failing, (v.checks, v.figures)


def test_gradient_study_end_to_end(blocks, tmp_path):
    train_b, val_b = blocks
    models = {"rnn": rnn(), "lstm": rnn("lstm")}
    s = GradientStudySettings(seq_len=64, n_sequences=4, clip_steps=10)
    res = gradient_study(
        models,
        val_b,
        s,
        train_data=train_b,
        clip_model_config=RecurrentSettings(cell="rnn", n_embd=16, hidden_size=32),
        out_dir=tmp_path,
    )
    assert {(r["model"], r["variant"]) for r in res.rows} == {
        (m, v) for m in ("rnn", "lstm") for v in ("trained", "fresh", "contractive", "expansive")
    }
    factor = {(r["model"], r["variant"]): r["step_factor"] for r in res.rows}
    assert factor[("rnn", "contractive")] < 1 < factor[("rnn", "expansive")]
    assert all(len(c) == 64 for per in res.norms.values() for c in per.values())
    assert isinstance(res.figures["grad_norms"], Figure) and isinstance(res.figures["clipping"], Figure)
    assert len(res.clipping.loss_clipped) == 10
    assert "grad/rnn/expansive/step_factor" in res.metrics()
    with pytest.raises(ConfigError, match="seq_len=256 is beyond what the labels hold"):
        gradient_study(models, val_b, GradientStudySettings(seq_len=256), train_data=None)
