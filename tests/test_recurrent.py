"""Recurrent language models: the explicit LSTM against nn.LSTM, the contract, sizing, generation,
learning on real data, gate logging and the cost measurement."""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import ValidationError

from components.core.data import IGNORE_INDEX, PAD_ID, TokenBlocks
from components.core.device import seed_everything
from components.core.errors import ConfigError
from components.core.labels import pack_blocks, token_stream
from components.core.lm import lstm_gate_callback
from components.core.models import count_parameters, meta_parameter_count
from components.core.models.recurrent import ExplicitLSTM, RecurrentLM, RecurrentSettings, size_for_budget
from components.core.studies.recurrent_cost import RecurrentCostSettings, fit_cost, linear_fit, recurrent_cost
from components.core.tokenizer import TokenizerSettings, train_tokenizer
from components.core.train_settings import TrainSettings
from components.core.training import train

pytestmark = pytest.mark.usefixtures("one_thread")


def test_explicit_lstm_equals_nn_lstm_forward_and_gradients():
    torch.manual_seed(0)
    ref = nn.LSTM(6, 5, num_layers=2, batch_first=True).double()
    mine = ExplicitLSTM(6, 5, num_layers=2).double()
    # Same parameter names and shapes: one state dict serves both.
    assert [(k, v.shape) for k, v in mine.state_dict().items()] == [(k, v.shape) for k, v in ref.state_dict().items()]
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(3, 7, 6, dtype=torch.float64)
    h0, c0 = torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(2, 3, 5, dtype=torch.float64)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    out_r, (h_r, c_r) = ref(xs[0], (h0, c0))
    out_m, (h_m, c_m) = mine(xs[1], (h0, c0))
    torch.testing.assert_close(out_m, out_r)
    torch.testing.assert_close(h_m, h_r)
    torch.testing.assert_close(c_m, c_r)
    # Gradients w.r.t. the input and every weight, through outputs and final states.
    g = torch.randn_like(out_r)
    ((out_r * g).sum() + h_r.sum() + 2 * c_r.sum()).backward()
    ((out_m * g).sum() + h_m.sum() + 2 * c_m.sum()).backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad)
    for (name, p_r), (_, p_m) in zip(ref.named_parameters(), mine.named_parameters()):
        torch.testing.assert_close(p_m.grad, p_r.grad, msg=name)


def test_lstm_impls_share_weights_and_give_the_same_loss():
    seed_everything(0)
    cfg = RecurrentSettings(cell="lstm", n_embd=8, hidden_size=12, n_layer=2)
    a = RecurrentLM(cfg, 50)
    b = RecurrentLM(cfg.model_copy(update={"lstm_impl": "explicit"}), 50)
    b.load_state_dict(a.state_dict())
    idx = torch.randint(1, 50, (4, 9))
    la, lb = a(idx, idx)[1], b(idx, idx)[1]
    torch.testing.assert_close(la, lb)
    # Mean gate activations are recorded by the explicit cell in training mode.
    stats = b.pop_gate_stats()
    assert set(stats) == {"lstm/gate_input", "lstm/gate_forget", "lstm/gate_output"}
    assert all(0.0 < v < 1.0 for v in stats.values())
    assert b.pop_gate_stats() == {}  # read and reset
    assert a.pop_gate_stats() == {}  # nn.LSTM has no gates to read


def test_contract_ignores_padding_targets():
    seed_everything(0)
    m = RecurrentLM(RecurrentSettings(cell="rnn", n_embd=8, hidden_size=8), 30)
    idx = torch.randint(1, 30, (2, 6))
    logits, loss = m(idx)
    assert logits.shape == (2, 6, 30) and loss is None
    targets = torch.randint(1, 30, (2, 6))
    targets[1, 3:] = IGNORE_INDEX
    _, loss = m(idx, targets)
    keep = targets != IGNORE_INDEX
    want = F.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(loss, want)
    assert torch.count_nonzero(m.wte.weight[PAD_ID]) == 0  # PAD's embedding row is zero
    with pytest.raises(ValidationError, match="lstm_impl"):
        RecurrentSettings(cell="rnn", lstm_impl="explicit")
    with pytest.raises(ValidationError, match="hidden_size"):
        RecurrentSettings(hidden_size=0)


def formula_params(cfg: RecurrentSettings, V: int) -> int:
    """The parameter count of the module doc's table."""
    E, H, L, G = cfg.n_embd, cfg.hidden_size, cfg.n_layer, 4 if cfg.cell == "lstm" else 1
    layers = sum(G * H * (E if k == 0 else H) + G * H * H + 2 * G * H for k in range(L))
    head = (H * E if H != E else 0) if cfg.tie_weights else H * V
    return V * E + layers + head


@pytest.mark.parametrize("cell", ["rnn", "lstm"])
@pytest.mark.parametrize("tie,layers", [(False, 1), (True, 2), (False, 3)])
def test_parameter_count_formula_is_exact(cell, tie, layers):
    for E, H in [(16, 16), (16, 24)]:
        cfg = RecurrentSettings(cell=cell, n_embd=E, hidden_size=H, n_layer=layers, tie_weights=tie)
        assert (
            count_parameters(RecurrentLM(cfg, 97))
            == formula_params(cfg, 97)
            == meta_parameter_count(RecurrentLM, cfg, 97)
        )
        model = RecurrentLM(cfg, 97)
        assert count_parameters(model, non_embedding=True) == formula_params(cfg, 97) - 97 * E
        assert model.flops_per_token() == 6 * (
            formula_params(cfg, 97) - (0 if tie else 97 * E)
        )  # a lookup is no matmul


def test_size_for_budget_is_closest():
    vocab = 512
    for cell in ("rnn", "lstm"):
        cfg = RecurrentSettings(cell=cell, n_embd=64, hidden_size=128, param_budget=400_000)
        sized = size_for_budget(cfg, vocab)
        assert sized.param_budget is None  # resolved
        n = count_parameters(RecurrentLM(sized, vocab))
        assert abs(sized.hidden_size - 2 * sized.n_embd) <= 1  # ratio kept (up to rounding n_embd)
        for h in (sized.hidden_size - 1, sized.hidden_size + 1):  # no neighbouring width is closer
            other = sized.model_copy(update={"hidden_size": h, "n_embd": max(1, round(h / 2))})
            assert abs(count_parameters(RecurrentLM(other, vocab)) - 400_000) >= abs(n - 400_000)
        assert abs(n - 400_000) / 400_000 < 0.01
        with pytest.raises(ConfigError, match="param_budget=400000 is not resolved"):
            RecurrentLM(cfg, vocab)  # sizing is explicit, before building
    # Same budget, different cells: the LSTM gets a narrower state for the same count.
    rnn = size_for_budget(RecurrentSettings(cell="rnn", param_budget=400_000), vocab)
    lstm = size_for_budget(RecurrentSettings(cell="lstm", param_budget=400_000), vocab)
    assert lstm.hidden_size < rnn.hidden_size
    with pytest.raises(ConfigError, match="param_budget=100"):
        size_for_budget(RecurrentSettings(param_budget=100), vocab)
    assert size_for_budget(RecurrentSettings(), vocab) == RecurrentSettings()


@pytest.mark.parametrize(
    "cfg",
    [
        RecurrentSettings(cell="rnn", n_embd=8, hidden_size=12, n_layer=2),
        RecurrentSettings(cell="lstm", n_embd=8, hidden_size=12, n_layer=2, tie_weights=True),
        RecurrentSettings(cell="lstm", lstm_impl="explicit", n_embd=8, hidden_size=12),
    ],
)
def test_stepwise_state_carry_equals_the_full_forward(cfg):
    seed_everything(0)
    m = RecurrentLM(cfg, 40).eval()
    idx = torch.randint(1, 40, (3, 10))
    with torch.no_grad():
        full, _ = m(idx)  # (B, T, V)
        state = None
        for t in range(10):
            logits, state = m.step(idx[:, t], state)
            torch.testing.assert_close(logits, full[:, t])
    out = m.generate(idx[:, :4], max_new_tokens=6, temperature=0)
    assert out.shape == (3, 10) and torch.equal(out[:, :4], idx[:, :4])
    # Greedy: each new token is the argmax of the full forward over everything before it.
    with torch.no_grad():
        logits, _ = m(out[:, :-1])
    assert torch.equal(out[:, 4:], logits[:, 3:].argmax(-1))
    sampled = m.generate(idx[:, :4], 5, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (3, 9) and int(sampled.max()) < 40


@pytest.fixture(scope="module")
def blocks(wiki_texts):
    tok = train_tokenizer(wiki_texts[:20], TokenizerSettings(vocab_size=512))
    return pack_blocks(token_stream(tok, wiki_texts[:12]), 32, 512), pack_blocks(
        token_stream(tok, wiki_texts[20:23]), 32, 512
    )


def counting_blocks(n, T, vocab, seed):
    """Sequences that count up in a random stride (1-3) from a random start, modulo the vocabulary:
    the next token follows from the last two, which a recurrent model can learn almost exactly."""
    rng = np.random.default_rng(seed)
    start, stride = rng.integers(1, vocab, size=n), rng.integers(1, 4, size=n)
    seq = (start[:, None] - 1 + stride[:, None] * np.arange(T + 1)[None]) % (vocab - 1) + 1
    return TokenBlocks(seq[:, :-1].astype(np.uint16), seq[:, 1:].astype(np.int32))


@pytest.mark.parametrize("cell", ["rnn", "lstm"])
def test_both_models_learn_a_pattern_and_real_text(tmp_path, cell, blocks):
    # A learnable rule: loss falls from chance (ln 32 = 3.47) to near zero.
    seed_everything(0)
    m = RecurrentLM(RecurrentSettings(cell=cell, n_embd=32, hidden_size=64), 32)
    s = TrainSettings(
        max_steps=60, batch_size=16, lr=1e-2, warmup_steps=5, eval_interval=0, log_interval=10, device="cpu"
    )
    r = train(m, counting_blocks(256, 32, 32, 0), counting_blocks(32, 32, 32, 1), s, tmp_path / "pattern")
    assert r.val_loss < 0.5, r.history
    # Real Wikipedia text: clearly below chance (ln 512 = 6.24) after a few dozen steps.
    train_b, val_b = blocks
    seed_everything(0)
    m = RecurrentLM(RecurrentSettings(cell=cell, n_embd=32, hidden_size=64), 512)
    r = train(m, train_b, val_b, s.model_copy(update={"max_steps": 40, "lr": 2e-2}), tmp_path / "text")
    assert r.val_loss < math.log(512) - 0.7, r.history


def test_explicit_lstm_logs_mean_gates_over_training(tmp_path, blocks):
    train_b, val_b = blocks
    seed_everything(0)
    m = RecurrentLM(RecurrentSettings(cell="lstm", lstm_impl="explicit", n_embd=16, hidden_size=16, block_size=16), 512)
    logged = []
    s = TrainSettings(max_steps=6, batch_size=4, eval_interval=0, log_interval=2, device="cpu")
    r = train(
        m, train_b, val_b, s, tmp_path, step_callback=lstm_gate_callback, log_metrics=lambda d, i: logged.append(d)
    )
    gates = [h for h in r.history if "lstm/gate_forget" in h]
    assert [h["step"] for h in gates] == [2, 4, 6]
    assert all(0 < h[k] < 1 for h in gates for k in ("lstm/gate_input", "lstm/gate_forget", "lstm/gate_output"))
    assert all("lstm/gate_forget" in d for d in logged if "train/loss" in d)


def test_recurrent_cost_rows_and_fits():
    models = {
        "rnn": RecurrentSettings(cell="rnn", n_embd=8, hidden_size=16),
        "lstm": RecurrentSettings(cell="lstm", n_embd=8, hidden_size=16),
    }
    s = RecurrentCostSettings(seq_lens=[8, 16, 32], batch_size=2, repeats=1, warmup=0, gen_tokens=4, device="cpu")
    res = recurrent_cost(models, s, vocab_size=64)
    assert [(r["model"], r["seq_len"]) for r in res.rows] == [(m, t) for m in ("rnn", "lstm") for t in (8, 16, 32)]
    for r in res.rows:
        assert r["train_step_ms"] > 0 and r["ms_per_generated_token"] > 0 and r["prefill_ms"] > 0
        assert r["tokens_per_s"] == pytest.approx(2 * r["seq_len"] / (r["train_step_ms"] / 1000))
    assert set(res.fits) == {"rnn", "lstm"} and "recurrent_cost" in res.figures
    assert set(res.metrics()) >= {"cost/rnn/train_ms_per_token", "cost/lstm/train_r2"}
    # The fit itself, on numbers with a known answer.
    f = linear_fit([64, 128, 256], [1.0 + 0.5 * 64, 1.0 + 0.5 * 128, 1.0 + 0.5 * 256])
    assert f["slope"] == pytest.approx(0.5) and f["intercept"] == pytest.approx(1.0) and f["r2"] == pytest.approx(1.0)
    rows = [
        {"model": "m", "seq_len": t, "train_step_ms": 2.0 * t, "ms_per_generated_token": 0.3} for t in (64, 128, 256)
    ]
    fit = fit_cost(rows)["m"]
    assert fit["train_ms_per_token"] == pytest.approx(2.0) and fit["gen_slope_ms_per_context_token"] == pytest.approx(
        0.0, abs=1e-12
    )
