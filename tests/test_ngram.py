"""The count ladder: modified Kneser–Ney computed by hand, its normalisation, what its context may see, the
order chosen on held-out data, and the claim every language model is judged by."""

import dataclasses
import math

import numpy as np
import pytest
from pydantic import ValidationError

from components.core.errors import ConfigError
from components.core.labels import pack_blocks
from components.core.manifests import NgramRung
from components.core.studies.ngram import (
    MIN_DISCOUNT,
    CountLadder,
    KneserNey,
    NgramSettings,
    block_contexts,
    ladder_position,
    modified_discounts,
    ngram_baseline,
    train_stream,
)

V = 4  # ids 0..3; 0 is [PAD] and never occurs


def test_modified_discounts_from_counts_of_counts():
    # n1..n4 = 10, 5, 3, 2: Y = 10 / 20 = 1/2; D1 = 1 - 2·Y·5/10 = 1/2, D2 = 2 - 3·Y·3/5 = 1.1, D3+ = 3 - 4·Y·2/3.
    counts = np.array([1] * 10 + [2] * 5 + [3] * 3 + [4] * 2 + [9])
    assert modified_discounts(counts) == pytest.approx((0.5, 1.1, 3 - 4 / 3))
    # Where a count of counts an estimate needs is zero it falls back to Y, and every discount stays within
    # [MIN_DISCOUNT, its count]: n1 = 2, n2 = 4, n3 = 0 gives Y = 0.2, D1 = 1 - 2·Y·4/2 = 0.2, D2 = D3+ = Y.
    assert modified_discounts(np.array([1, 1, 2, 2, 2, 2])) == pytest.approx((0.2, 0.2, 0.2))
    # n1 = 2, n2 = 1, n3 = 5: D2 = 2 - 3·(1/2)·5/1 < 0 is raised to MIN_DISCOUNT.
    assert modified_discounts(np.array([1, 1, 2] + [3] * 5)) == pytest.approx((0.5, MIN_DISCOUNT, 0.5))


def test_bigram_loss_computed_by_hand():
    # Training stream 1 2 1 2 1 3 2 1 1. Bigram counts: (1,2)×2 (2,1)×3 (1,3)×1 (3,2)×1 (1,1)×1: n1 = 3, n2 = 1,
    # n3 = 1, n4 = 0, so Y = 3/5, D1 = 1 - 2·Y·1/3 = 3/5, D2 = 2 - 3·Y·1/1 = 1/5, D3+ = Y (n4 = 0).
    # Continuation counts (distinct left neighbours): 1 ← {2, 1} = 2, 2 ← {1, 3} = 2, 3 ← {1} = 1; A = 5;
    # n1 = 1, n2 = 2: Y = 1/5, D1 = 1 - 2·Y·2/1 = 1/5, D2 = D3+ = Y (n3 = 0); γ = 1/5 + 1/5 + 1/5 = 3/5;
    # p1(w) = (max(a − D(a), 0) + (3/5)/4) / 5: p1(1) = p1(2) = (9/5 + 3/20)/5 = 39/100,
    # p1(3) = (4/5 + 3/20)/5 = 19/100.
    # Context 1: successors 2 (a = 2), 3 (1), 1 (1): A = 4, γ = 1/5 + 3/5 + 3/5 = 7/5;
    # context 2: successor 1 (a = 3): A = 3, γ = 3/5; context 3: successor 2 (a = 1): A = 1, γ = 3/5.
    p_2_after_1 = (2 - 1 / 5 + 7 / 5 * 39 / 100) / 4
    p_1_after_2 = (3 - 3 / 5 + 3 / 5 * 39 / 100) / 3
    p_3_after_1 = (1 - 3 / 5 + 7 / 5 * 19 / 100) / 4
    p_2_after_3 = (1 - 3 / 5 + 3 / 5 * 39 / 100) / 1
    expected = -(math.log(p_2_after_1) + math.log(p_1_after_2) + math.log(p_3_after_1) + math.log(p_2_after_3)) / 4

    stream = np.array([1, 2, 1, 2, 1, 3, 2, 1, 1])
    train = pack_blocks(stream, 3, V)
    assert train_stream(train.x, train.y).tolist() == stream.tolist()
    val = pack_blocks(np.array([1, 2, 1, 3, 2]), 4, V)  # targets 2 1 3 2 after 1 2 1 3
    model = KneserNey.fit(stream, 2, V)
    assert model.loss(val) == pytest.approx(expected, abs=1e-12)
    assert sum(model.discounts, []) == pytest.approx([1 / 5, 1 / 5, 1 / 5, 3 / 5, 1 / 5, 3 / 5])

    # Padded targets are not scored: the same stream in blocks of 3 leaves two padded targets, the same four scored.
    padded = pack_blocks(np.array([1, 2, 1, 3, 2]), 3, V)
    assert (padded.y == -100).sum() == 2
    assert model.loss(padded) == pytest.approx(expected, abs=1e-12)


def test_every_distribution_sums_to_one_unseen_contexts_and_tokens_included():
    rng = np.random.default_rng(0)
    stream = rng.integers(1, 40, size=3000)
    ladder = CountLadder.fit(stream, 4, 50)  # ids 40..49 never seen
    for ctx in ([1, 2, 5, 7], [-1, -1, -1, 7], [-1, 1, 45, 46], [3, 1, 2, 3]):
        c = np.tile(np.array(ctx, dtype=np.int64), (50, 1))
        for p in ladder.probs(c, np.arange(50)):
            assert p.sum() == pytest.approx(1.0, abs=1e-12) and (p > 0).all()


def test_one_pass_over_the_ladder_equals_each_order_counted_alone():
    rng = np.random.default_rng(1)
    stream = rng.integers(1, 9, size=4000) * (rng.random(4000) < 0.7) + 1
    val = pack_blocks(rng.integers(1, 10, size=900), 32, 12)
    together = CountLadder.fit(stream, 5, 12).losses(val)
    alone = [KneserNey.fit(stream, k, 12).loss(val) for k in range(1, 6)]
    assert together == pytest.approx(alone, abs=1e-12)


def _chain(order: int, n: int, *, seed: int, sample_seed: int, k: int = 6) -> np.ndarray:
    """n tokens (ids 1..k) of a random Markov chain of `order`: the next token depends on the last `order`."""
    P = np.random.default_rng(seed).dirichlet([0.3] * k, size=k**order)
    rng = np.random.default_rng(sample_seed)
    s = list(rng.integers(1, k + 1, size=order))
    for _ in range(n):
        ctx = 0
        for t in s[-order:]:
            ctx = ctx * k + t - 1
        s.append(1 + rng.choice(k, p=P[ctx]))
    return np.array(s)


@pytest.mark.parametrize("true_order", [1, 2, 3])
def test_the_order_is_chosen_on_held_out_training_data(true_order):
    # A Markov chain of order m is an (m + 1)-gram: held-out data chooses that order; higher ones only overfit.
    train = pack_blocks(_chain(true_order, 30000, seed=true_order, sample_seed=0), 64, 8)
    val = pack_blocks(_chain(true_order, 4000, seed=true_order, sample_seed=1), 64, 8)
    r = ngram_baseline(train, val, 8, NgramSettings(max_order=6, block_size=64))
    assert [row.order for row in r.rows] == [1, 2, 3, 4, 5, 6]
    assert r.chosen_order == true_order + 1 and r.chosen.model == f"kn_{true_order + 1}gram"
    held = [row.heldout_loss for row in r.rows]
    assert held[true_order] == min(held) and held[true_order + 1] > held[true_order]
    assert r.n_heldout_targets == pytest.approx(0.1 * r.n_train_tokens, rel=0.01)

    # The choice never looks at the validation split: on validation text of another kind (independent tokens,
    # where lower orders do best) the ladder's validation losses change and the chosen order does not.
    noise = pack_blocks(np.random.default_rng(2).integers(1, 7, size=4000), 64, 8)
    other = ngram_baseline(train, noise, 8, NgramSettings(max_order=6, block_size=64))
    assert other.chosen_order == r.chosen_order
    assert min(other.rows, key=lambda row: row.val_loss).order < other.chosen_order


def test_the_trigram_sees_two_tokens_back_and_never_before_its_block():
    # After 1 the next token is 2 or 3 depending on the token two back: a bigram cannot tell, a trigram can.
    stream = np.array([2, 1, 3, 1] * 200)
    train = pack_blocks(stream, 16, V)
    val = pack_blocks(np.array([2, 1, 3, 1] * 8), 16, V)
    res = {r.order: r.val_loss for r in ngram_baseline(train, val, V, NgramSettings(max_order=3, block_size=16)).rows}
    # Half the targets (those after 1) carry one bit for the bigram: about ln 2 / 2 per target.
    assert res[3] < 0.1 and res[2] > math.log(2) / 2 - 0.05

    # The counterexample: in blocks of one token no target has two tokens of context in its block, so the
    # trigram cannot use what it learned and scores exactly as its own lower orders do.
    tiny = ngram_baseline(train, val, V, NgramSettings(max_order=3, block_size=1)).rows[2].val_loss
    model = KneserNey.fit(train_stream(train.x, train.y), 3, V)
    x, y = val.crop(1).x.astype(np.int64), val.crop(1).y.astype(np.int64)
    ctx = block_contexts(x, 2)[y != -100]
    assert (ctx[:, 0] == -1).all()
    assert tiny == pytest.approx(-np.log(model.prob(ctx, y[y != -100])).mean()) and tiny > res[3] + 0.5


def test_bad_settings_are_named():
    train = pack_blocks(np.array([1, 2, 1, 2] * 10), 2, V)
    with pytest.raises(ValidationError, match="max_order"):
        NgramSettings(max_order=0)
    with pytest.raises(ConfigError, match="max_order"):
        ngram_baseline(train, train, V, NgramSettings.model_construct(max_order=0, heldout_fraction=0.1, block_size=2))
    with pytest.raises(ConfigError, match="block_size"):
        ngram_baseline(train, train, V, NgramSettings(max_order=2, block_size=8))
    # An order whose keys do not fit an int64 over the stream's distinct tokens: 4,999 ids and the spare code make
    # 5,000 codes a position, 5,000^5 < 2^63 <= 5,000^6.
    wide = pack_blocks(np.arange(1, 5000), 16, 5000)
    with pytest.raises(ConfigError, match=r"ngram_baseline.max_order=6 .* highest order that fits is 5"):
        ngram_baseline(wide, wide, 5000, NgramSettings(max_order=6, block_size=16))
    assert ngram_baseline(wide, wide, 5000, NgramSettings(max_order=5, block_size=16)).rows[-1].order == 5
    # Unset, the ladder goes to 8 or to the highest order the key holds, whichever is lower.
    assert ngram_baseline(wide, wide, 5000, NgramSettings(block_size=16)).rows[-1].order == 5
    assert ngram_baseline(train, train, V, NgramSettings(block_size=2)).rows[-1].order == 8


def test_ladder_position_in_words():
    rungs = [
        NgramRung(order=k, model=f"kn_{k}gram", heldout_loss=v, val_loss=v, val_ppl=math.exp(v))
        for k, v in [(1, 3.2), (2, 2.5), (4, 1.8), (5, 1.6), (8, 1.47)]
    ]
    assert ladder_position(1.7, rungs) == "between the 5-gram (1.600) and the 4-gram (1.800)"
    assert ladder_position(1.4, rungs).startswith("below every rung (best: the 8-gram")
    assert ladder_position(2.6, rungs) == "between the bigram (2.500) and the unigram (3.200)"
    assert ladder_position(3.3, rungs).startswith("above every rung")


# --- the claim every language model is judged by ----------------------------------------------------
# Period 8: 1 2 1 3 1 2 1 4. After "2 1" comes 3 or 4 by what stood four tokens back: a trigram cannot
# tell, a Transformer that sees the block can.


def _periodic(n_periods: int, block: int):
    return pack_blocks(np.array([1, 2, 1, 3, 1, 2, 1, 4] * n_periods), block, 6)


def _manifest(model, val, block, base):
    from components.core.train_step import eval_targets, evaluate

    loss = evaluate(model, val, batch_size=16, max_batches=None, device="cpu")
    from components.core import manifests as M

    return M.LanguageModel(
        name="lm",
        family="transformer",
        weights="",
        vocab_size=6,
        metrics={"val/loss": loss, "val/targets": eval_targets(val, 16, None), "context_length": block},
        train_settings={"block_size": block},
        tokenizer_sha256="tok",
        baseline=M.NgramReference(
            val_loss=base.chosen.val_loss,
            model=base.chosen.model,
            block_size=base.block_size,
            n_targets=base.n_targets,
            tokenizer_sha256="tok",
            ladder=base.rows,
        ),
    )


def test_beating_the_count_model_passes_for_a_trained_model_and_fails_untrained_or_on_other_targets(tmp_path):
    import torch

    from components.core import claims as C
    from components.core.device import seed_everything
    from components.core.models.transformer import Transformer, TransformerSettings
    from components.core.train_settings import TrainSettings
    from components.core.training import train

    block = 16
    tr, va = _periodic(256, block), _periodic(32, block)
    # A ladder up to the trigram, which cannot see four tokens back: the count model here is the trigram.
    base = ngram_baseline(tr, va, 6, NgramSettings(max_order=3, block_size=block))
    assert base.chosen_order == 3
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seed_everything(0)
        settings = TransformerSettings(n_layer=2, n_head=2, n_embd=32, block_size=block, pos_encoding="rope")
        untrained = Transformer(settings, 6)
        v = C.language_models_beat_the_count_model(_manifest(untrained, va, block, base))
        assert not v.passed and v.checks["same_targets"] and not v.checks["below_count_model"]
        assert v.figures["margin"] < 0

        model = Transformer(settings, 6)
        s = TrainSettings(
            max_steps=120, batch_size=16, lr=1e-2, min_lr=1e-3, warmup_steps=5, eval_interval=0, log_interval=10, seed=0
        )
        train(model, tr, va, s, tmp_path / "lm")
        trained = _manifest(model, va, block, base)
    finally:
        torch.set_num_threads(threads)
    v = C.language_models_beat_the_count_model(trained)
    assert v.passed, v
    assert v.figures["on_the_ladder"].startswith("below every rung")
    # The same model judged against a baseline scored on other targets (a subset) fails: the comparison says nothing.
    other = dataclasses.replace(
        trained, baseline=dataclasses.replace(trained.baseline, n_targets=trained.baseline.n_targets - 16)
    )
    v = C.language_models_beat_the_count_model(other)
    assert not v.passed and not v.checks["same_targets"] and v.checks["below_count_model"]
    # ... and so does one counted at another context length than the model trained on.
    shorter = dataclasses.replace(trained, baseline=dataclasses.replace(trained.baseline, block_size=block // 2))
    v = C.language_models_beat_the_count_model(shorter)
    assert not v.passed and not v.checks["same_block_size"] and v.checks["below_count_model"]
    # Without a baseline on its labels the claim is not measured, and says so.
    assert C.language_models_beat_the_count_model(dataclasses.replace(trained, baseline=None)).note
