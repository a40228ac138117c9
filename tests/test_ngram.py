"""The Kneser–Ney baseline: a loss computed by hand, its normalisation, and what its context may see."""

import dataclasses
import math

import numpy as np
import pytest

from components.core.errors import ConfigError
from components.core.labels import pack_blocks
from components.core.studies.ngram import KneserNey, NgramSettings, block_contexts, ngram_baseline, train_stream

V = 4  # ids 0..3; 0 is [PAD] and never occurs


def test_bigram_loss_computed_by_hand():
    # Training stream 1 2 1 2 1 3 2. Bigram counts: (1,2)×2 (2,1)×2 (1,3)×1 (3,2)×1
    # → n1 = 2, n2 = 2, D2 = 2/(2+4) = 1/3.
    # Continuation counts (distinct left neighbours): 2 ← {1, 3} = 2, 1 ← {2} = 1, 3 ← {1} = 1; A1 = 4, T1 = 3,
    # n1 = 2, n2 = 1 → D1 = 2/(2+2) = 1/2; p1(w) = (max(a − 1/2, 0) + (1/2)·3/4) / 4:
    # p1(2) = 15/32, p1(1) = p1(3) = 7/32.
    # Context 1: c = 3, T = 2; context 2: c = 2, T = 1; context 3: c = 1, T = 1.
    p_2_after_1 = (2 - 1 / 3 + (1 / 3) * 2 * 15 / 32) / 3  # 95/144
    p_1_after_2 = (2 - 1 / 3 + (1 / 3) * 1 * 7 / 32) / 2  # 167/192
    p_3_after_1 = (1 - 1 / 3 + (1 / 3) * 2 * 7 / 32) / 3  # 39/144
    p_2_after_3 = (1 - 1 / 3 + (1 / 3) * 1 * 15 / 32) / 1  # 79/96
    assert p_2_after_1 == pytest.approx(95 / 144) and p_1_after_2 == pytest.approx(167 / 192)
    assert p_3_after_1 == pytest.approx(39 / 144) and p_2_after_3 == pytest.approx(79 / 96)
    expected = -(math.log(95 / 144) + math.log(167 / 192) + math.log(39 / 144) + math.log(79 / 96)) / 4

    train = pack_blocks(np.array([1, 2, 1, 2, 1, 3, 2]), 3, V)
    assert train_stream(train.x, train.y).tolist() == [1, 2, 1, 2, 1, 3, 2]
    val = pack_blocks(np.array([1, 2, 1, 3, 2]), 4, V)  # targets 2 1 3 2 after 1 2 1 3
    result = ngram_baseline(train, val, V, NgramSettings(orders=[2], block_size=4))
    assert result.n_targets == 4 and result.n_train_tokens == 7
    assert result.rows[0]["val_loss"] == pytest.approx(expected, abs=1e-12)
    assert result.rows[0]["discounts"] == pytest.approx([1 / 2, 1 / 3])

    # Padded targets are not scored: the same stream in blocks of 3 leaves two padded targets, the same four scored.
    padded = pack_blocks(np.array([1, 2, 1, 3, 2]), 3, V)
    assert (padded.y == -100).sum() == 2
    assert ngram_baseline(train, padded, V, NgramSettings(orders=[2], block_size=3)).rows[0][
        "val_loss"
    ] == pytest.approx(expected, abs=1e-12)


def test_every_distribution_sums_to_one_unseen_contexts_and_tokens_included():
    rng = np.random.default_rng(0)
    stream = rng.integers(1, 40, size=3000)
    for order in (1, 2, 3):
        model = KneserNey.fit(stream, order, 50)  # ids 40..49 never seen
        for ctx in ([5, 7], [-1, 7], [45, 46], [1, 2]):
            c = np.tile(np.array(ctx[-(order - 1):] if order > 1 else [], dtype=np.int64), (50, 1))
            p = model.prob(c, np.arange(50))
            assert p.sum() == pytest.approx(1.0, abs=1e-12) and (p > 0).all()


def test_the_trigram_sees_two_tokens_back_and_never_before_its_block():
    # After 1 the next token is 2 or 3 depending on the token two back: a bigram cannot tell, a trigram can.
    stream = np.array([2, 1, 3, 1] * 200)
    train = pack_blocks(stream, 16, V)
    val = pack_blocks(np.array([2, 1, 3, 1] * 8), 16, V)
    res = {
        r["order"]: r["val_loss"]
        for r in ngram_baseline(train, val, V, NgramSettings(orders=[2, 3], block_size=16)).rows
    }
    # Half the targets (those after 1) carry one bit for the bigram: about ln 2 / 2 per target.
    assert res[3] < 0.1 and res[2] > math.log(2) / 2 - 0.05

    # The counterexample: in blocks of one token no target has two tokens of context in its block, so the
    # trigram cannot use what it learned and scores exactly as its own lower orders do.
    tiny = ngram_baseline(train, val, V, NgramSettings(orders=[3], block_size=1)).rows[0]["val_loss"]
    model = KneserNey.fit(train_stream(train.x, train.y), 3, V)
    x, y = val.crop(1).x.astype(np.int64), val.crop(1).y.astype(np.int64)
    ctx = block_contexts(x, 2)[y != -100]
    assert (ctx[:, 0] == -1).all()
    assert tiny == pytest.approx(-np.log(model.prob(ctx, y[y != -100])).mean()) and tiny > res[3] + 0.5


def test_bad_settings_are_named():
    train = pack_blocks(np.array([1, 2, 1, 2]), 2, V)
    with pytest.raises(ConfigError, match="orders"):
        ngram_baseline(train, train, V, NgramSettings(orders=[], block_size=2))
    with pytest.raises(ConfigError, match="block_size"):
        ngram_baseline(train, train, V, NgramSettings(orders=[2], block_size=8))


# --- the claim every language model is judged by ----------------------------------------------------
# Period 8: 1 2 1 3 1 2 1 4. After "2 1" comes 3 or 4 by what stood four tokens back: a trigram cannot
# tell, a Transformer that sees the block can.


def _periodic(n_periods: int, block: int):
    return pack_blocks(np.array([1, 2, 1, 3, 1, 2, 1, 4] * n_periods), block, 6)


def _manifest(model, val, block, base):
    from components.core.training import eval_targets, evaluate

    loss = evaluate(model, val, batch_size=16, max_batches=None, device="cpu")
    from components.core import manifests as M

    return M.LanguageModel(
        name="lm", family="transformer", weights="", vocab_size=6,
        metrics={"val/loss": loss, "val/targets": eval_targets(val, 16, None), "context_length": block},
        train_settings={"block_size": block},
        tokenizer_sha256="tok",
        baseline=M.NgramReference(
            val_loss=base.best["val_loss"],
            model=base.best["model"],
            block_size=base.block_size,
            n_targets=base.n_targets,
            tokenizer_sha256="tok",
        ),
    )


def test_beats_ngram_baseline_passes_for_a_trained_model_and_fails_untrained_or_on_other_targets(tmp_path):
    import torch

    from components.core import claims as C
    from components.core.device import seed_everything
    from components.core.models.transformer import Transformer, TransformerSettings
    from components.core.training import TrainSettings, train

    block = 16
    tr, va = _periodic(256, block), _periodic(32, block)
    base = ngram_baseline(tr, va, 6, NgramSettings(orders=[2, 3], block_size=block))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seed_everything(0)
        settings = TransformerSettings(n_layer=2, n_head=2, n_embd=32, block_size=block, pos_encoding="rope")
        untrained = Transformer(settings, 6)
        v = C.beats_ngram_baseline(_manifest(untrained, va, block, base))
        assert not v.passed and v.checks["same_targets"] and not v.checks["below_ngram"] and v.figures["margin"] < 0

        model = Transformer(settings, 6)
        s = TrainSettings(
            max_steps=120, batch_size=16, lr=1e-2, min_lr=1e-3, warmup_steps=5, eval_interval=0, log_interval=10, seed=0
        )
        train(model, tr, va, s, tmp_path / "lm")
        trained = _manifest(model, va, block, base)
    finally:
        torch.set_num_threads(threads)
    v = C.beats_ngram_baseline(trained)
    assert v.passed, v
    # The same model judged against a baseline scored on other targets (a subset) fails: the comparison says nothing.
    other = dataclasses.replace(
        trained, baseline=dataclasses.replace(trained.baseline, n_targets=trained.baseline.n_targets - 16)
    )
    v = C.beats_ngram_baseline(other)
    assert not v.passed and not v.checks["same_targets"] and v.checks["below_ngram"]
    # ... and so does one counted at another context length than the model trained on.
    shorter = dataclasses.replace(trained, baseline=dataclasses.replace(trained.baseline, block_size=block // 2))
    v = C.beats_ngram_baseline(shorter)
    assert not v.passed and not v.checks["same_block_size"] and v.checks["below_ngram"]
    # Without a baseline on its labels the claim is not measured, and says so.
    assert C.beats_ngram_baseline(dataclasses.replace(trained, baseline=None)).note
