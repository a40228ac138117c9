"""The Transformer LM: loss, [PAD], weight tying, norm/residual variants, training on real text
through the one driver (components.core.lm), sampling, safetensors round trip, parameter budgets,
FLOPs/MFU, settings."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gensim.test.utils import datapath
from matplotlib.figure import Figure
from safetensors import safe_open

from components.core.data import IGNORE_INDEX, PAD_ID, TokenBlocks
from components.core.device import estimate_mfu, peak_flops_for_name
from components.core.errors import ConfigError, PipelineInputError
from components.core.lm import SamplingSettings, build_model, load_lm, resolve_settings, save_lm, train_lm
from components.core.models import count_parameters, meta_parameter_count
from components.core.models.transformer import Transformer, TransformerSettings, size_for_budget
from components.core.train_settings import TrainSettings
from components.core.training import train


@pytest.fixture(scope="module")
def corpus():
    """Character-level blocks of real English text (gensim's Lee news corpus), [PAD]=0, last block padded."""
    text = open(datapath("lee_background.cor"), encoding="utf-8").read()[:120_000]
    chars = sorted(set(text))
    stoi = {c: i + 1 for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)

    def blocks(a: np.ndarray, T: int = 32) -> TokenBlocks:
        n = -(-(len(a) - 1) // T)  # ceil: the last block is padded
        x = np.zeros(n * T, dtype=np.uint16)
        y = np.full(n * T, IGNORE_INDEX, dtype=np.int32)
        x[: len(a) - 1], y[: len(a) - 1] = a[:-1], a[1:]
        return TokenBlocks(x.reshape(n, T), y.reshape(n, T))

    split = int(len(ids) * 0.9)
    decode = lambda ids_: "".join(chars[i - 1] if i > 0 else "" for i in ids_)  # noqa: E731
    encode = lambda s: [stoi[c] for c in s]  # noqa: E731
    return blocks(ids[:split]), blocks(ids[split:]), len(chars) + 1, decode, encode


TINY = dict(n_layer=2, n_head=4, n_embd=48, block_size=32)


def test_loss_is_cross_entropy_over_real_targets(corpus):
    train_data, _, vocab, *_ = corpus
    model = Transformer(TransformerSettings(**TINY), vocab)
    x, y = train_data.batch(np.arange(train_data.n_blocks - 3, train_data.n_blocks))  # includes the padded block
    assert (y == IGNORE_INDEX).any()
    logits, loss = model(x, y)
    assert logits.shape == (3, 32, vocab)
    logp = F.log_softmax(logits, dim=-1)
    keep = y != IGNORE_INDEX
    manual = -logp[keep].gather(1, y[keep][:, None]).mean()
    torch.testing.assert_close(loss, manual)
    assert model(x)[1] is None


def test_pad_row_stays_zero_and_pad_is_never_predicted(corpus, tmp_path):
    train_data, val_data, vocab, *_ = corpus
    model = Transformer(TransformerSettings(**TINY), vocab)
    assert model.lm_head.weight is model.wte.weight  # tied
    assert torch.all(model.wte.weight[PAD_ID] == 0)
    train(
        model,
        train_data,
        val_data,
        TrainSettings(max_steps=15, batch_size=8, eval_interval=0, threads=1, lr=1e-2),
        tmp_path,
    )
    assert torch.all(model.wte.weight[PAD_ID] == 0)  # tied and trained, still zero
    assert torch.all(model.wte.weight[1:].abs().sum(-1) > 0)
    logits = model(train_data.batch(np.arange(2))[0])[0]
    assert torch.all(torch.isneginf(logits[..., PAD_ID]))
    out = model.generate(torch.tensor([[5]]), 60, temperature=2.0)  # hot sampling, still no [PAD]
    assert (out != PAD_ID).all()


def test_weight_tying_shares_one_matrix():
    tied = Transformer(TransformerSettings(**TINY), 80)
    untied = Transformer(TransformerSettings(**TINY, tie_weights=False), 80)
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 80 * 48
    assert untied.lm_head.weight is not untied.wte.weight


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("residual", [True, False])
def test_norm_and_residual_variants_learn(corpus, norm, residual):
    train_data, *_, vocab, _, _ = corpus
    torch.manual_seed(0)
    model = Transformer(TransformerSettings(**TINY, norm=norm, residual=residual, dropout=0.1), vocab)
    assert isinstance(model.ln_f, torch.nn.LayerNorm) == (norm == "pre")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = train_data.batch(np.arange(16))
    losses = []
    for _ in range(25):  # overfit one batch: every variant must be able to
        loss = model(x, y)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 0.5


def test_trains_on_real_text_samples_and_reloads(corpus, tmp_path):
    train_data, val_data, vocab, decode, encode = corpus
    logged = []
    result = train_lm(
        "transformer",
        TransformerSettings(**TINY, pos_encoding="rope"),
        TrainSettings(
            max_steps=150, batch_size=16, eval_interval=75, eval_batches=10, threads=1, lr=3e-3, warmup_steps=10
        ),
        train_data,
        val_data,
        vocab,
        tmp_path,
        sampling=SamplingSettings(num_samples=2, sample_tokens=40, sample_prompt="The "),
        decode=decode,
        encode=encode,
        log_metrics=lambda m, step: logged.append((step, m)),
    )
    m = result.metrics
    # uniform over the characters is ln(vocab) ≈ 4.4 nats; a unigram model ≈ 3.0: it learned more than that
    assert m["val/loss"] < 2.75, m
    assert m["train/tokens_per_s_mean"] > 0 and m["params"] == count_parameters(Transformer(result.config, vocab))
    assert m["params_non_embedding"] == m["params"] - vocab * 48  # minus the (tied) token embedding
    assert m["flops_per_token"] == Transformer(result.config, vocab).flops_per_token(32)
    assert "mfu" not in m  # no GPU: no MFU
    assert result.family == "transformer" and result.resumed_from_step == 0
    assert any("val/loss" in pt for _, pt in logged)
    assert result.attention_backend["observed"] == "flash_cpu"
    assert len(result.samples) == 2 and all(s.startswith("The ") and len(s) == 44 for s in result.samples)
    assert isinstance(result.figures["loss_curve"], Figure) and isinstance(result.figures["attention_maps"], Figure)

    # the checkpoint is safetensors with the config in its header, and rebuilds the same model
    with safe_open(str(result.weights_path), framework="pt") as f:
        meta = f.metadata()
    assert meta["model_kind"] == "transformer"
    assert json.loads(meta["model_config"])["pos_encoding"] == "rope"
    model = load_lm(result.weights_path)
    x = val_data.batch(np.arange(4))[0]
    assert model(x, val_data.batch(np.arange(4))[1])[1].item() == pytest.approx(
        float(np.log(result.metrics["val/ppl"])), abs=1.0
    )
    again = load_lm(result.weights_path.parent)  # the checkpoint folder works too
    torch.testing.assert_close(again(x)[0], model(x)[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour of GPU settings")
def test_gpu_settings_on_a_machine_without_cuda(corpus, tmp_path):
    train_data, val_data, vocab, *_ = corpus
    no_samples = SamplingSettings(num_samples=0)
    with pytest.raises(ConfigError, match="device='cuda' but no CUDA GPU"):
        train_lm(
            "transformer",
            TransformerSettings(**TINY),
            TrainSettings(max_steps=1, device="cuda"),
            train_data,
            val_data,
            vocab,
            tmp_path / "a",
            sampling=no_samples,
        )
    res = train_lm(
        "transformer",
        TransformerSettings(**TINY, sdpa_backend="flash"),
        TrainSettings(max_steps=2, batch_size=4, threads=1, dtype="auto"),
        train_data,
        val_data,
        vocab,
        tmp_path / "b",
        sampling=no_samples,
    )
    assert any("no CUDA GPU found, training on the CPU" in w for w in res.warnings)  # fell back, and says so
    assert any("pinned on CUDA only" in w for w in res.warnings)
    # 'auto' on a CPU: bfloat16 where it multiplies bf16 in hardware (AMX), else float32.
    from components.core.device import cpu_has_native_bf16

    assert res.attention_backend["dtype"] == ("bfloat16" if cpu_has_native_bf16() else "float32") and res.samples == []


def test_auto_dtype_follows_the_hardware(monkeypatch):
    from components.core import device as dev

    cpu = torch.device("cpu")
    assert dev.resolve_dtype("float32", cpu) == torch.float32 and dev.resolve_dtype("bfloat16", cpu) == torch.bfloat16
    monkeypatch.setattr(dev, "cpu_has_native_bf16", lambda: True)
    assert dev.resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(dev, "cpu_has_native_bf16", lambda: False)
    assert dev.resolve_dtype("auto", cpu) == torch.float32
    with pytest.raises(ConfigError, match="float16' needs a CUDA device"):
        dev.resolve_dtype("float16", cpu)


def test_save_load_roundtrip_and_bad_files(tmp_path):
    torch.manual_seed(0)
    model = Transformer(TransformerSettings(**TINY, pos_encoding="sinusoidal", tie_weights=False, bias=True), 70)
    path = save_lm(model, tmp_path / "m.safetensors")
    assert path.read_bytes()[8:9] == b"{"  # a JSON header, no pickle
    loaded = load_lm(path)
    assert loaded.config == model.config
    x = torch.randint(1, 70, (2, 20))
    torch.testing.assert_close(loaded(x)[0], model(x)[0])
    with pytest.raises(PipelineInputError, match="no such weights file"):
        load_lm(tmp_path / "missing.safetensors")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(PipelineInputError, match="not a language-model checkpoint"):
        load_lm(tmp_path / "other.safetensors")


@pytest.mark.parametrize("budget", [300_000, 1_000_000, 3_000_000])
def test_size_for_budget_approaches_the_budget(budget):
    cfg = size_for_budget(TransformerSettings(n_layer=4, n_head=4), vocab_size=500, budget=budget)
    assert cfg.n_embd % 4 == 0
    n = meta_parameter_count(Transformer, cfg, 500)
    assert n == count_parameters(Transformer(cfg, 500))  # the meta-device count is the real one
    assert abs(n - budget) / budget < 0.05, (cfg.n_embd, n)
    for m in (cfg.n_embd // 8 - 1, cfg.n_embd // 8 + 1):  # no neighbouring width (step 8 for RoPE) is closer
        other = meta_parameter_count(Transformer, cfg.model_copy(update={"n_embd": 8 * m}), 500)
        assert abs(other - budget) >= abs(n - budget)
    # Sizing happens before building, once: the model refuses settings that still need it.
    pending = TransformerSettings(n_layer=4, n_head=4, param_budget=budget)
    with pytest.raises(ConfigError, match=f"param_budget={budget} is not resolved"):
        Transformer(pending, 500)
    resolved = resolve_settings("transformer", pending, 500)
    assert resolved.n_embd == cfg.n_embd and resolved.param_budget is None
    assert build_model("transformer", resolved, 500).config == resolved
    rope = size_for_budget(TransformerSettings(n_layer=4, n_head=4, pos_encoding="rope"), 500, budget)
    assert (rope.n_embd // 4) % 2 == 0  # RoPE needs an even head size
    with pytest.raises(ConfigError, match="param_budget=1000 is below the smallest"):
        size_for_budget(TransformerSettings(), 500, 1000)
    assert size_for_budget(TransformerSettings(), 500) == TransformerSettings()  # no budget: unchanged


def test_generate_greedy_topk_and_long_contexts():
    torch.manual_seed(0)
    model = Transformer(TransformerSettings(**TINY, pos_encoding="learned"), 60).eval()
    idx = torch.randint(1, 60, (2, 5))
    out = model.generate(idx, 50)  # 55 > block_size 32: the context is cropped to the last 32 tokens
    assert out.shape == (2, 55) and torch.equal(out[:, :5], idx)
    greedy = model.generate(idx, 10, temperature=0)
    torch.manual_seed(1)
    top1 = model.generate(idx, 10, temperature=1.3, top_k=1)  # top-1 sampling is greedy
    assert torch.equal(greedy, top1)
    torch.manual_seed(2)
    a = model.generate(idx, 10, top_k=5)
    torch.manual_seed(2)
    assert torch.equal(a, model.generate(idx, 10, top_k=5))


def test_flops_mfu_and_gpt2_small_size():
    model = Transformer(TransformerSettings(**TINY, pos_encoding="learned"), 60)
    L, H, Q, T = 2, 4, 12, 32
    N = count_parameters(model) - 32 * 48  # nanoGPT's count: minus the learned positional table
    assert model.flops_per_token() == 6 * N + 12 * L * H * Q * T
    assert estimate_mfu(model.flops_per_token(), 1e6, "cpu") is None
    assert peak_flops_for_name("NVIDIA H200") == 989e12
    assert peak_flops_for_name("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_for_name("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_for_name("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for_name("Some Future GPU") is None
    gpt2 = TransformerSettings(n_layer=12, n_head=12, n_embd=768, block_size=1024)
    assert 123e6 < meta_parameter_count(Transformer, gpt2, 50304) < 126e6  # "124M"


def test_settings_are_flat_and_mix_into_dagster_config():
    import dagster as dg

    for cls in (TransformerSettings, SamplingSettings):
        for name, f in cls.model_fields.items():
            assert f.description, f"{cls.__name__}.{name} has no description"
            assert not f.is_required(), f"{cls.__name__}.{name} has no default"

    class TransformerConfig(dg.Config, TransformerSettings):
        pass

    cfg = TransformerConfig(n_layer=3, pos_encoding="rope")
    assert cfg.n_layer == 3 and Transformer(TransformerSettings(**cfg.model_dump()), 30).config.pos_encoding == "rope"
    with pytest.raises(ValueError, match="n_embd=130 must be divisible"):
        TransformerConfig(n_embd=130)


def test_throughput_benchmark_runs_ours_and_nanogpt_side_by_side(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "throughput.json"
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/train_throughput.py",
            "--preset",
            "tiny",
            "--iters",
            "12",
            "--threads",
            "1",
            "--text",
            datapath("lee_background.cor"),
            "--max-chars",
            "60000",
            "--set",
            "pos_encoding=learned",
            "--out",
            str(out),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in ("tokens_per_s", "step_ms", "val_loss", "params", "device", "attention_backend", "mfu"):
        assert key in res, key
    assert res["device"] == "cpu" and res["mfu"] is None and res["attention_backend"] == "flash_cpu"
    assert res["iters"] == 12 and res["corpus"]["chars"] == 60000
    # same architecture and sizes: the reimplementation of nanoGPT has exactly our parameter count
    assert res["ours"]["params"] == res["nanogpt"]["params"]
    assert math.isfinite(res["nanogpt"]["val_loss"]) and res["ratio_tokens_per_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("pos_encoding", ["rope", "learned"])
def test_the_compiled_model_computes_what_the_eager_one_does(pos_encoding):
    # `train.compile: true` runs the same model through torch.compile; the eager RoPE kernel (a complex
    # view written through out=) does not trace, so the compiled path takes the plain formula. Same
    # loss and gradients either way.
    torch.manual_seed(0)
    cfg = TransformerSettings(n_layer=2, n_head=2, n_embd=16, block_size=12, pos_encoding=pos_encoding)
    eager = Transformer(cfg, vocab_size=13)
    compiled_twin = Transformer(cfg, vocab_size=13)
    compiled_twin.load_state_dict(eager.state_dict())
    x = torch.randint(1, 13, (3, 12))
    y = torch.randint(1, 13, (3, 12))
    loss_e = eager(x, y)[1]
    loss_e.backward()
    loss_c = torch.compile(compiled_twin)(x, y)[1]
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss_e, atol=1e-5, rtol=1e-5)
    for (name, a), b in zip(eager.named_parameters(), compiled_twin.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_training_profile_runs_each_side_in_its_own_process(tmp_path):
    # benchmarks/train_profile.py profiles ours and nanoGPT's loop each in a fresh process (`--only`) and
    # merges them; the groups add up to what the profiler saw in the forward and backward.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/train_profile.py",
            "--text",
            datapath("lee_background.cor"),
            "--steps",
            "2",
            "--warmup",
            "1",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["processes"] == "one per side" and res["compile"] is False and res["machine"]["torch_threads"] == 1
    for side in ("ours", "nanogpt"):
        r = res[side]
        assert r["steps"] == 2 and r["unprofiled_ms_per_step"] > 0
        groups = r["forward_backward_groups_ms_per_step"]
        assert groups["matmul / linear"] > 0 and groups["attention (SDPA)"] > 0
        fb = r["phases_ms_per_step"]["forward"] + r["phases_ms_per_step"]["backward"]
        assert sum(groups.values()) == pytest.approx(fb, abs=0.01)
