"""Ablations: parameter accounting from the real modules, permutation equivariance without positional
encoding, the √d-scaling probe, and the short ablation trainings on real text."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gensim.test.utils import datapath
from matplotlib.figure import Figure
from pydantic import ValidationError

from components.core import claims
from components.core import manifests as M
from components.core.data import TokenBlocks
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.studies.ablations import AblationSettings, residual_depth_study, run_ablations
from components.core.studies.transformer_probes import (
    parameter_accounting,
    permutation_equivariance,
    score_scaling_at_init,
)
from components.core.train_settings import TrainSettings


@pytest.fixture(scope="module")
def corpus():
    """Character-level blocks of real English text (gensim's Lee news corpus), [PAD]=0."""
    text = open(datapath("lee_background.cor"), encoding="utf-8").read()[:100_000]
    chars = sorted(set(text))
    ids = np.array([chars.index(c) + 1 for c in text], dtype=np.uint16)

    def blocks(a: np.ndarray, T: int = 32) -> TokenBlocks:
        n = (len(a) - 1) // T
        return TokenBlocks(a[: n * T].reshape(n, T), a[1 : n * T + 1].astype(np.int32).reshape(n, T))

    split = int(len(ids) * 0.9)
    return blocks(ids[:split]), blocks(ids[split:]), len(chars) + 1


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tie", [True, False])
def test_parameter_accounting_counts_every_tensor_once(bias, tie):
    L, C, V, T = 3, 64, 100, 32
    model = Transformer(
        TransformerSettings(
            n_layer=L, n_head=4, n_embd=C, block_size=T, bias=bias, tie_weights=tie, pos_encoding="learned"
        ),
        V,
    )
    acc = parameter_accounting(model)
    comp = acc["components"]
    assert acc["total"] == sum(comp.values()) == sum(p.numel() for p in model.parameters())
    b = 1 if bias else 0
    assert comp["token_embedding"] == V * C
    assert comp["positional"] == T * C
    assert comp["attention"] == L * (4 * C * C + b * 4 * C)  # Q, K, V and output projections
    assert comp["ffn"] == L * (8 * C * C + b * 5 * C)  # C→4C→C
    assert comp["norms"] == (2 * L + 1) * C * (1 + b)  # two per block + the final one
    assert comp["head"] == (0 if tie else V * C)
    assert acc["ffn_share"] == pytest.approx(2 / 3, abs=0.01) and acc["about_two_thirds"]
    assert acc["ffn_share_formula"] == pytest.approx(2 / 3)


def test_parameter_accounting_rope_and_wider_ffn():
    model = Transformer(TransformerSettings(n_layer=2, n_head=4, n_embd=32, pos_encoding="rope", ffn_mult=8), 50)
    acc = parameter_accounting(model)
    assert acc["components"]["positional"] == 0  # rotations have no parameters
    assert acc["ffn_share"] == pytest.approx(0.8, abs=0.01)  # 16d² of 20d²
    assert not acc["about_two_thirds"]


def spread(model: Transformer, std: float = 0.3) -> Transformer:
    """Larger random weights than GPT's 0.02 init. At that init q·k is tiny, attention is nearly uniform
    and RoPE's rotations barely show; equivariance (or its absence) holds for any weights, so test it
    where attention is selective, as after training."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
        model.wte.weight[0].zero_()
    return model.eval()


def outputs(model, ids, causal=False):
    return model(torch.tensor([ids]), causal=causal)[0][0, :, 1:]  # (T, V-1), without [PAD]'s -inf column


def test_without_positions_word_order_is_invisible():
    """The article's example: 我爱你 vs 你爱我. Without positional encoding (and without a causal mask)
    each character gets the same output vector in both sentences; with positions it does not."""
    vocab = {"我": 1, "爱": 2, "你": 3}
    s1 = [vocab[c] for c in "我爱你"]
    s2 = [vocab[c] for c in "你爱我"]
    for pos, same in (("none", True), ("learned", False), ("sinusoidal", False), ("rope", False)):
        torch.manual_seed(0)
        model = spread(
            Transformer(TransformerSettings(n_layer=2, n_head=2, n_embd=16, block_size=8, pos_encoding=pos), 4)
        )
        o1, o2 = outputs(model, s1), outputs(model, s2)
        for i, j in ((0, 2), (1, 1), (2, 0)):  # 我 at 0 in s1 and at 2 in s2, and so on
            assert torch.allclose(o1[i], o2[j], atol=1e-5) == same, (pos, i, j)


@pytest.mark.parametrize("pos", ["learned", "rope", "sinusoidal"])
def test_permutation_equivariance_measured(pos):
    torch.manual_seed(0)
    x = torch.randint(1, 40, (1, 16))
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=16)
    no_pe = permutation_equivariance(
        spread(Transformer(TransformerSettings(**cfg, pos_encoding="none"), 40)), x, trials=4
    )
    with_pe = permutation_equivariance(
        spread(Transformer(TransformerSettings(**cfg, pos_encoding=pos), 40)), x, trials=4
    )
    assert no_pe["equivariant"] and no_pe["max_rel_err"] < 1e-5
    assert not with_pe["equivariant"] and with_pe["max_rel_err"] > 1e-2
    # the causal mask alone already tells positions apart (t sees t+1 tokens): not equivariant either
    assert no_pe["causal_max_rel_err"] > 1e-2


def test_score_scaling_probe(corpus):
    _, val, vocab = corpus
    x, y = val.batch(np.arange(4))
    cfg = TransformerSettings(n_layer=2, n_head=2, n_embd=64, block_size=32)
    res = score_scaling_at_init(cfg, vocab, x, y, seed=0)
    # same init both ways: the unscaled scores are √d_head times larger (exactly in layer 0; layer 1's
    # input differs slightly, as layer 0's attention did)
    assert res["unscaled"]["score_std"] / res["scaled"]["score_std"] == pytest.approx(math.sqrt(32), rel=1e-2)
    assert res["unscaled"]["normalized_entropy"] < res["scaled"]["normalized_entropy"] <= 1.0
    assert res["scaled"]["grad_norm"] > 0 and res["unscaled"]["grad_norm"] > 0
    # unit-variance q, k: unscaled entropy collapses as d grows while the scaled one stays put
    uv = res["unit_variance"]
    ent_u = [u["entropy_unscaled"] for u in uv]
    ent_s = [u["entropy_scaled"] for u in uv]
    assert all(a > b for a, b in zip(ent_u, ent_u[1:]))
    assert max(ent_s) - min(ent_s) < 0.05
    assert ent_u[-1] < 0.1 and min(ent_s) > 0.8
    big = uv[-1]  # d = 1024: a saturated softmax passes back less gradient to the scores
    assert big["score_grad_rms_unscaled"] < big["score_grad_rms_scaled"]
    assert big["max_weight_unscaled"] > 0.9


def test_run_ablations_on_real_text(corpus, tmp_path):
    train_data, val_data, vocab = corpus
    logged = []
    res = run_ablations(
        TransformerSettings(n_layer=2, n_head=4, n_embd=32, block_size=32, pos_encoding="rope"),
        TrainSettings(
            max_steps=500, batch_size=16, lr=3e-3, warmup_steps=10, eval_interval=0, eval_batches=8, threads=1
        ),
        AblationSettings(
            ablation_steps=120,
            deep_n_layer=6,
            permutation_len=12,
            depths=[1, 4],
            depth_steps=10,
            depth_n_embd=16,
            depth_block_size=16,
        ),
        train_data,
        val_data,
        vocab,
        tmp_path,
        log_metrics=lambda m, step: logged.append(m),
    )
    rows = {r["run"]: r for r in res.table}
    assert list(rows) == ["full", "deep_residual", "no_pos", "no_scale", "no_residual", "hard_attention"]
    assert rows["hard_attention"]["baseline"] == "full" and rows["hard_attention"]["attn_entropy"] == 0.0  # one-hot
    assert all(r["steps"] == 120 for r in rows.values())  # ablation_steps overrides max_steps
    assert rows["no_residual"]["baseline"] == "deep_residual" and rows["no_pos"]["baseline"] == "full"
    assert rows["no_residual"]["n_layer"] == 6
    # a deep stack without residual connections trains worse than the same stack with them
    assert rows["no_residual"]["delta_val_loss"] > 0.1, res.markdown
    assert rows["no_pos"]["delta_val_loss"] == pytest.approx(rows["no_pos"]["val_loss"] - rows["full"]["val_loss"])
    assert res.permutation["no_pe"]["equivariant"] and not res.permutation["with_pe"]["equivariant"]
    assert res.accounting["about_two_thirds"]
    assert res.metrics["no_residual/delta_val_loss"] == rows["no_residual"]["delta_val_loss"]
    assert "no_pos/train/loss" in {k for m in logged for k in m}  # step metrics, prefixed by run
    assert res.table_path.is_file() and (tmp_path / "ablations.md").read_text().startswith("### Ablations")
    assert "| no_residual |" in res.markdown and "我爱你" in res.markdown
    assert all(isinstance(f, Figure) for f in res.figures.values())
    assert all((d / "checkpoint" / "model.safetensors").is_file() for d in res.run_dirs.values())
    # The residual study: every depth with and without residuals, the first layer's gradient measured.
    assert [(r["n_layer"], r["residual"]) for r in res.depth] == [(1, True), (1, False), (4, True), (4, False)]
    by = {(r["n_layer"], r["residual"]): r for r in res.depth}
    assert by[(4, False)]["first_layer_grad_norm_init"] < by[(4, True)]["first_layer_grad_norm_init"]
    assert "Depth with and without residual" in res.markdown


def test_residual_claim_fails_on_a_measured_depth_study_too_shallow_for_the_gradient_to_fade(corpus, tmp_path):
    """Measured counterexample of `residuals_let_depth_train`: the real residual depth study (the same
    models, loop and first-layer gradient probe `run_ablations` runs, as `transformer_ablations` puts
    them in its manifest) over depths 1 and 2, too shallow for the gradient to fade without residuals:
    the plain 2-layer stack passes its first layer as much gradient as the residual one, not a tenth."""
    train_data, val_data, vocab = corpus
    rows = residual_depth_study(
        TransformerSettings(n_layer=2, n_head=4, n_embd=32, block_size=32, pos_encoding="rope"),
        TrainSettings(
            max_steps=500, batch_size=16, lr=3e-3, warmup_steps=10, eval_interval=0, eval_batches=8, threads=1
        ),
        AblationSettings(depths=[1, 2], depth_steps=10, depth_n_embd=16, depth_block_size=16, workers=1),
        train_data,
        val_data,
        vocab,
        tmp_path,
    )
    assert [(r["n_layer"], r["residual"]) for r in rows] == [(1, True), (1, False), (2, True), (2, False)]
    v = claims.residuals_let_depth_train(M.TransformerAblations(depth=rows))
    assert v.judged and not v.passed
    assert not v.checks["without_residuals_gradient_fades_with_depth"], v.figures
    assert v.figures["nores_2_first_layer_grad_norm_init"] > 0.5 * v.figures["res_2_first_layer_grad_norm_init"]


def test_ablation_settings_validate():
    with pytest.raises(ValidationError, match=r"ablations: unknown \['no_ffn'\]"):
        AblationSettings(ablations=["no_pos", "no_ffn"])
    assert AblationSettings(ablations=["no_pos"]).ablations == ["no_pos"]


def test_ablations_side_by_side_equal_one_after_another(corpus, tmp_path):
    """workers: 2 trains the runs in two processes (one thread each); the same losses, depth rows and
    logged step metrics as one after another here."""
    train_data, val_data, vocab = corpus
    out = {}
    for w in (1, 2):
        logged = []
        res = run_ablations(
            TransformerSettings(n_layer=2, n_head=2, n_embd=16, block_size=16, pos_encoding="rope"),
            TrainSettings(
                max_steps=20,
                batch_size=8,
                lr=3e-3,
                warmup_steps=2,
                eval_interval=0,
                eval_batches=4,
                log_interval=5,
                threads=1,
            ),
            AblationSettings(
                ablations=["no_pos"],
                permutation_len=8,
                depths=[1, 2],
                depth_steps=5,
                depth_n_embd=16,
                depth_block_size=16,
                workers=w,
            ),
            train_data,
            val_data,
            vocab,
            tmp_path / str(w),
            log_metrics=lambda m, step, _l=logged: _l.append((step, m)),
        )
        out[w] = ([(r["run"], r["val_loss"], r["train_loss"]) for r in res.table], res.depth, logged)
    assert out[1][0] == out[2][0] and out[1][1] == out[2][1]
    timing = ("tokens_per_s", "step_ms")  # seconds differ between any two runs

    def points(logged):
        return sorted(((s, {k: v for k, v in m.items() if not k.endswith(timing)}) for s, m in logged), key=str)

    assert points(out[1][2]) == points(out[2][2]) and out[1][2]
