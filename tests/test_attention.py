"""Attention: the fused (SDPA) and reference paths agree, weights are a causal distribution, padding
is masked, the SDPA kernel is observed, positional encodings behave, bad settings are refused; the
sliding window is local attention; the cost sweep's memory accounting counts known allocations."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from torch.profiler import ProfilerActivity, profile

from components.core.data import PAD_ID
from components.core.errors import ConfigError
from components.core.models.attention import (
    CausalSelfAttention,
    allowed_keys,
    keep_top_k,
    reference_attention,
    sliding_window_attention,
    top_k_attention,
)
from components.core.models.positional import RotaryEmbedding, apply_rotary, sinusoidal_table
from components.core.models.sdpa_probe import detect_sdpa_backend
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.studies.attention_cost import attention_sweep, peak_memory_bytes, ratio_by_n

V = 50  # vocabulary size of the small models here


def attention_pair(n_embd=32, n_head=4, scale_scores=True, dtype=torch.float64):
    torch.manual_seed(0)
    ref = CausalSelfAttention(n_embd, n_head, impl="reference", scale_scores=scale_scores, bias=True).to(dtype)
    fused = CausalSelfAttention(n_embd, n_head, impl="fused", scale_scores=scale_scores, bias=True).to(dtype)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


def model_pair(**kw):
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, **kw)
    torch.manual_seed(0)
    ref = Transformer(TransformerSettings(attention="reference", **cfg), V)
    fused = Transformer(TransformerSettings(attention="fused", **cfg), V)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


def tokens(B=3, T=16, seed=1):
    return torch.randint(1, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("scale_scores", [True, False])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_fused_matches_reference_forward_and_gradients(scale_scores, dtype, tol):
    ref, fused = attention_pair(scale_scores=scale_scores, dtype=dtype)
    x = torch.randn(2, 24, 32, dtype=dtype, generator=torch.Generator().manual_seed(2))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, w = ref(x1)
    y_fused, w_none = fused(x2)
    assert w is not None and w_none is None  # only the reference path materialises the weights
    torch.testing.assert_close(y_fused, y_ref, atol=tol, rtol=tol)
    g = torch.randn_like(y_ref)
    (y_ref * g).sum().backward()
    (y_fused * g).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, atol=tol, rtol=tol)
    for (name, p_ref), p_fused in zip(ref.named_parameters(), fused.parameters()):
        torch.testing.assert_close(p_fused.grad, p_ref.grad, atol=tol, rtol=tol, msg=name)


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "none"])
def test_whole_model_fused_matches_reference(pos):
    ref, fused = model_pair(pos_encoding=pos)
    x, y = tokens(), tokens(seed=3)
    logits_r, loss_r = ref(x, y)
    logits_f, loss_f = fused(x, y)
    torch.testing.assert_close(logits_f, logits_r, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(loss_f, loss_r, atol=1e-6, rtol=1e-6)
    loss_r.backward()
    loss_f.backward()
    for (name, p_r), p_f in zip(ref.named_parameters(), fused.parameters()):
        torch.testing.assert_close(p_f.grad, p_r.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_weights_are_causal_distributions():
    model = Transformer(TransformerSettings(n_layer=2, n_head=4, n_embd=32, block_size=16), V)
    weights = model.attention_weights(tokens())  # per layer (B, nh, T, T)
    assert len(weights) == 2
    for w in weights:
        assert w.shape == (3, 4, 16, 16)
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 16))  # each query's weights sum to 1
        future = torch.ones(16, 16, dtype=torch.bool).triu(1)
        assert torch.all(w[..., future] == 0)  # no weight on any later position
        assert torch.all(w[..., ~future] > 0)  # and some on every visible one


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_future_tokens_do_not_change_past_outputs(impl):
    model = Transformer(TransformerSettings(n_layer=2, n_head=4, n_embd=32, block_size=16, attention=impl), V).eval()
    x = tokens()
    x2 = x.clone()
    x2[:, 9:] = tokens(seed=7)[:, 9:]  # rewrite the future after position 8
    out, out2 = model(x)[0], model(x2)[0]
    torch.testing.assert_close(out2[:, :9], out[:, :9], atol=1e-6, rtol=1e-6)
    assert (out2[:, 9:, 1:] - out[:, 9:, 1:]).abs().max() > 1e-3  # ... which does change what follows


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_trailing_padding_never_reaches_real_positions(impl):
    """PAD only trails a block: whatever sits in the padded positions, real positions' outputs and the
    loss over real targets (pad targets are -100) stay the same."""
    model = Transformer(TransformerSettings(n_layer=2, n_head=4, n_embd=32, block_size=16, attention=impl), V).eval()
    n_real = 10
    x = tokens(B=2)
    x[:, n_real:] = PAD_ID
    y = torch.roll(x, -1, dims=1)
    y[:, n_real - 1 :] = -100
    logits, loss = model(x, y)
    x_junk = x.clone()
    x_junk[:, n_real:] = tokens(B=2, seed=9)[:, n_real:]  # anything at all in the padded slots
    logits_j, loss_j = model(x_junk, y)
    torch.testing.assert_close(logits_j[:, :n_real], logits[:, :n_real], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(loss_j, loss)


def test_explicit_key_padding_mask_fused_agrees_and_masks():
    """Padding anywhere (here in the middle and at the start): with a key-padding mask both paths agree,
    padded keys get zero weight, and the padded tokens' content cannot change real outputs."""
    ref, fused = model_pair(pos_encoding="rope")
    x = tokens(B=2)
    real = torch.ones_like(x, dtype=torch.bool)
    real[0, 5:8] = False
    real[1, 0:3] = False
    x = x.masked_fill(~real, PAD_ID)
    out_r = ref(x, key_padding_mask=real)[0]
    out_f = fused(x, key_padding_mask=real)[0]
    torch.testing.assert_close(out_f, out_r, atol=2e-5, rtol=1e-5)
    # weights on padded keys are exactly zero for every real query
    weights = torch.stack(ref.attention_weights(x, key_padding_mask=real))  # (L, B, nh, T, T)
    pad_keys = ~real[None, :, None, None, :].expand_as(weights)
    real_queries = real[None, :, None, :, None].expand_as(weights)
    diag = torch.eye(16, dtype=torch.bool).expand_as(weights)
    assert torch.all(weights[pad_keys & real_queries & ~diag] == 0)
    x_junk = torch.where(real, x, tokens(B=2, seed=11))
    out_j = fused(x_junk, key_padding_mask=real)[0]
    torch.testing.assert_close(out_j[real], out_f[real], atol=1e-5, rtol=1e-5)


def test_fused_causal_path_builds_no_mask_tensor():
    """The fused path passes is_causal=True: no (T, T) mask is built (no tril/ones op), unlike the reference."""
    x = torch.randn(1, 64, 32)

    def ops(module):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            module(x)
        return {e.key for e in prof.key_averages()}

    ref, fused = attention_pair(dtype=torch.float32)
    fused_ops, ref_ops = ops(fused), ops(ref)
    assert "aten::tril" in ref_ops and "aten::softmax" in ref_ops
    assert "aten::tril" not in fused_ops and "aten::softmax" not in fused_ops
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in fused_ops


def test_detect_sdpa_backend_observes_the_cpu_flash_kernel():
    report = detect_sdpa_backend("cpu", torch.float32, (2, 4, 64, 16))
    assert report["observed"] == "flash_cpu"
    assert report["available"]["flash"] and report["available"]["math"]
    assert not report["available"]["efficient"] and not report["available"]["cudnn"]  # CUDA-only kernels
    pinned = detect_sdpa_backend("cpu", torch.float32, (2, 4, 64, 16), requested="math")
    assert pinned["observed"] == "math"
    impossible = detect_sdpa_backend("cpu", torch.float32, (2, 4, 64, 16), requested="efficient")
    assert impossible["observed"] is None and "efficient" in impossible["error"]


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValidationError, match=r"n_embd=130 must be divisible by n_head=4"):
        TransformerSettings(n_embd=130, n_head=4)
    with pytest.raises(ValidationError, match=r"attention='flash' is unknown; use one of: fused, reference"):
        TransformerSettings(attention="flash")
    with pytest.raises(ValidationError, match=r"pos_encoding='alibi' is unknown"):
        TransformerSettings(pos_encoding="alibi")
    with pytest.raises(ValidationError, match=r"rope.*even head size"):
        TransformerSettings(pos_encoding="rope", n_embd=12, n_head=4)
    with pytest.raises(ValidationError, match="extra"):
        TransformerSettings(n_layers=3)  # a typo is not silently ignored
    with pytest.raises(ConfigError, match="attention='sparse'"):
        CausalSelfAttention(32, 4, impl="sparse")


def test_context_longer_than_learned_table_is_an_error_but_not_for_formula_encodings():
    cfg = dict(n_layer=1, n_head=2, n_embd=16, block_size=8)
    x = tokens(B=1, T=12)
    with pytest.raises(ConfigError, match=r"longer than the learned positional table \(block_size=8"):
        Transformer(TransformerSettings(pos_encoding="learned", **cfg), V)(x)
    for pos in ("sinusoidal", "rope", "none"):  # defined for any position
        model = Transformer(TransformerSettings(pos_encoding=pos, **cfg), V)
        assert model(x)[0].shape == (1, 12, V)


def test_sinusoidal_table_matches_the_formula():
    table = sinusoidal_table(50, 16)
    for pos, i in [(0, 0), (7, 3), (49, 7)]:
        angle = pos / 10000 ** (2 * i / 16)
        assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
        assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(head_dim=8, block_size=32)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=g), torch.randn(8, generator=g)
    seq_q = q.expand(1, 1, 32, 8)
    seq_k = k.expand(1, 1, 32, 8)
    rq, rk = rope(seq_q, seq_k)  # the same q and k placed at every position
    scores = rq[0, 0] @ rk[0, 0].T  # (32, 32): score of q at m with k at n
    for offset in (0, 3, 11):
        diag = torch.diagonal(scores, offset=-offset)  # all pairs with m - n = offset
        torch.testing.assert_close(diag, diag[0].expand_as(diag), atol=1e-5, rtol=1e-5)
    assert abs(scores[5, 5] - scores[9, 5]) > 1e-4  # different offsets, different scores
    # and rotation preserves length (it is a rotation)
    torch.testing.assert_close(rq.norm(dim=-1), seq_q.norm(dim=-1))
    assert apply_rotary(seq_q, rope.cos[:32] * 0 + 1, rope.sin[:32] * 0).equal(seq_q)  # angle 0 = identity


@pytest.mark.parametrize("offset", [0, 5, 40])
def test_rope_on_the_projection_layout_equals_the_per_tensor_rotation(offset):
    # The training path rotates q and k inside the (B, T, 3, nh, hs) projection in one pass; the
    # values pass through untouched. Same numbers as rotating q and k apart (also past the cache).
    rope = RotaryEmbedding(head_dim=8, block_size=32)
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(2, 12, 3, 4, 8, generator=g)  # (B, T, 3, nh, hs)
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, nh, T, hs)
    want_q, want_k = rope(q, k, offset)
    got_q, got_k, got_v = (t.transpose(1, 2) for t in rope.rotate_qkv(qkv, offset).unbind(2))
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)
    assert torch.equal(got_v, v)


def test_rope_on_the_projection_layout_has_the_rotations_gradient():
    # rotate_qkv's hand-written backward (the inverse rotation) equals autograd through the
    # per-tensor rotation, and gradcheck agrees in float64.
    rope = RotaryEmbedding(head_dim=8, block_size=32)
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(2, 12, 3, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 12, 3, 4, 8, generator=g, dtype=torch.float64)
    rope.rotate_qkv(qkv, 3).backward(upstream)
    got = qkv.grad
    ref = qkv.detach().clone().requires_grad_()
    q, k, v = (t.transpose(1, 2) for t in ref.unbind(2))
    rq, rk = rope(q, k, 3)
    want_out = torch.stack([t.transpose(1, 2) for t in (rq, rk, v)], 2)
    want_out.backward(upstream)
    torch.testing.assert_close(got, ref.grad)
    assert torch.autograd.gradcheck(lambda x: rope.rotate_qkv(x, 3), (qkv.detach().clone().requires_grad_(),))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rope_without_a_complex_type_rotates_the_same_pairs(dtype):
    # bfloat16 and float16 have no complex twin: their pairs are rotated in float32 and rounded once,
    # so the result is the float32 rotation of the same low-precision numbers, rounded: the same
    # pairs, forward and backward, to the last bit.
    rope = RotaryEmbedding(head_dim=8, block_size=32)
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(2, 12, 3, 4, 8, generator=g, requires_grad=True)
    upstream = torch.randn(2, 12, 3, 4, 8, generator=g).to(dtype)
    low = qkv.detach().to(dtype).requires_grad_()
    wide = low.detach().float().requires_grad_()
    want, got = rope.rotate_qkv(wide, 5), rope.rotate_qkv(low, 5)
    assert got.dtype == dtype
    assert torch.equal(got, want.detach().to(dtype))
    torch.testing.assert_close(got.float(), rope.rotate_qkv(qkv, 5).detach(), atol=2e-2, rtol=2e-2)
    want.backward(upstream.float())
    got.backward(upstream)
    assert low.grad is not None and wide.grad is not None
    assert low.grad.dtype == dtype and torch.equal(low.grad, wide.grad.to(dtype))
    assert (got.float() - want.detach()).abs().max() > 0  # the low-precision path really ran


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_rope_model_cast_whole_to_low_precision_runs_its_training_path(dtype):
    # quantized_models evaluates the model cast whole to bfloat16 (and float16 on a GPU): its rotary
    # tables are then cast too, and the rotation must still run, close to the float32 model's.
    cfg = TransformerSettings(n_layer=1, n_head=2, n_embd=16, block_size=8, pos_encoding="rope")
    torch.manual_seed(0)
    model = Transformer(cfg, vocab_size=11)
    idx = torch.randint(1, 11, (2, 8))
    want, _ = model(idx)
    low = Transformer(cfg, vocab_size=11).to(dtype)
    low.load_state_dict(model.state_dict())
    assert low.rope is not None and low.rope.cos.dtype == dtype
    got, _ = low(idx)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=0.05)


def test_weights_of_another_rope_pairing_are_refused(tmp_path):
    # Which channels RoPE pairs is part of what the weights mean, not of their shapes: weights written
    # without the current pairing recorded load without a shape error and would give wrong numbers.
    from safetensors.torch import save_file

    from components.core.checkpoint import (
        CheckpointMismatchError,
        load_model_weights,
        load_weights_into,
        save_checkpoint,
    )

    cfg = TransformerSettings(n_layer=1, n_head=2, n_embd=16, block_size=8)
    save_checkpoint(tmp_path / "ckpt", Transformer(cfg, vocab_size=11), step=0)
    load_weights_into(Transformer(cfg, vocab_size=11), tmp_path / "ckpt")  # the current layout loads
    tensors, meta = load_model_weights(tmp_path / "ckpt")
    assert meta["rope_layout"] == "interleaved"
    del meta["rope_layout"]
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata=meta)
    with pytest.raises(CheckpointMismatchError, match="rope_layout=.*not recorded.*retrain"):
        load_weights_into(Transformer(cfg, vocab_size=11), tmp_path / "old.safetensors")
    # a model without rotary positions records no pairing and loads as before
    learned = TransformerSettings(n_layer=1, n_head=2, n_embd=16, block_size=8, pos_encoding="learned")
    save_checkpoint(tmp_path / "learned", Transformer(learned, vocab_size=11), step=0)
    load_weights_into(Transformer(learned, vocab_size=11), tmp_path / "learned")


def test_sliding_window_is_local_causal_attention():
    """Each query sees exactly the last `window` keys: the reference math with that band as the mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 50, 8, generator=g, dtype=torch.float64) for _ in range(3))
    W = 7
    got = sliding_window_attention(q, k, v, W, scale=0.3)
    band = allowed_keys(50, "cpu") & ~allowed_keys(50, "cpu").tril(-W)  # keys t-W+1 .. t
    scores = (q @ k.transpose(-2, -1) * 0.3).masked_fill(~band, float("-inf"))
    torch.testing.assert_close(got, torch.softmax(scores, -1) @ v)
    full = reference_attention(q, k, v, scale=0.3)[0]
    torch.testing.assert_close(
        sliding_window_attention(q, k, v, 50, scale=0.3), full
    )  # a window of T is full attention


def test_cpu_peak_memory_counts_known_allocations():
    MiB = 2**20

    def allocate():
        a = torch.empty(MiB // 4)  # 1 MiB of float32
        b = torch.empty(MiB // 2)  # 2 MiB: 3 MiB alive
        del a  # 2 MiB alive
        c = torch.empty(MiB)  # 4 MiB: 6 MiB alive, the peak
        return b, c

    assert peak_memory_bytes(allocate, "cpu") == 6 * MiB
    before = torch.empty(MiB)  # allocated before the measured call: not counted, even when freed in it
    assert peak_memory_bytes(lambda: torch.empty(MiB // 4), "cpu") == MiB
    del before


def test_attention_sweep_measures_time_and_memory_per_implementation():
    B, H, D = 1, 2, 16
    rows = attention_sweep(
        [64, 256], ("reference", "fused", "window"), batch=B, n_head=H, head_dim=D, repeats=1, warmup=0, window=32
    )
    assert [(r["impl"], r["n"]) for r in rows] == [(i, n) for i in ("reference", "fused", "window") for n in (64, 256)]
    assert all(r["ms"] > 0 and r["peak_mib"] == r["peak_bytes"] / 2**20 for r in rows)
    peak = {(r["impl"], r["n"]): r["peak_bytes"] for r in rows}
    # forward+backward of the reference holds the (N, N) scores and their softmax: at least 2·B·H·N²·4 bytes
    assert peak[("reference", 256)] >= 2 * B * H * 256 * 256 * 4
    assert peak[("fused", 256)] < B * H * 256 * 256 * 4  # never materialised
    ratio = ratio_by_n(rows, "peak_bytes", "reference", "fused")
    assert ratio["256"] > ratio["64"] > 1  # quadratic against linear: the gap grows with N
    # A ceiling stops an implementation after the first point over it, and says why.
    capped = attention_sweep(
        [64, 128, 256], ("reference",), n_head=H, head_dim=D, repeats=1, warmup=0, memory_ceiling_bytes=1
    )
    assert len(capped) == 1 and "memory ceiling" in capped[0]["stop"]
    with pytest.raises(ValueError, match="unknown attention implementation"):
        attention_sweep([64], ("sparse",), n_head=H, head_dim=D)


def test_bf16_autocast_on_the_cpu_runs_attention_in_float32():
    """Under CPU bf16 autocast the projections run in bfloat16 and SDPA in float32 (the CPU flash kernel is
    slow in bf16): the kernel sees float32 inputs, the output is bf16 and equals float32 attention of the
    same bf16 q, k, v, rounded."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from components.core.models.attention import fused_attention

    class KernelDtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "scaled_dot_product" in func.name():
                self.seen.append((func.name(), args[0].dtype))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with KernelDtypes() as mode:
        out = fused_attention(q, k, v, scale=8**-0.5)
        out.float().sum().backward()
    assert mode.seen and {dt for _, dt in mode.seen} == {torch.float32}, mode.seen  # forward and backward kernels
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True, scale=8**-0.5
    )
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected.to(torch.bfloat16))
    assert q.grad is not None and q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad).all()

    # The whole model under autocast: bf16 matmuls, float32 attention, a loss close to float32's.
    model = Transformer(TransformerSettings(n_layer=2, n_head=2, n_embd=32, block_size=16), V)
    idx = torch.randint(1, V, (2, 16))
    _, loss32 = model(idx, idx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss16 = model(idx, idx)
    assert logits.dtype == torch.bfloat16 and abs(loss16.item() - loss32.item()) < 0.05


def test_top_k_attention_keeps_k_keys_per_query_renormalised():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    full, w_full = reference_attention(q, k, v, scale=8**-0.5)
    for kk in (1, 2, 4):
        y, w = reference_attention(q, k, v, scale=8**-0.5, top_k=kk)
        kept = (w > 0).sum(-1)  # (B, nh, T)
        # Query t sees t + 1 keys: it keeps min(k, t + 1) of them, the highest-weighted under full softmax.
        assert torch.equal(kept, torch.arange(12).clamp(max=kk - 1).add(1).expand_as(kept))
        torch.testing.assert_close(w.sum(-1), torch.ones_like(kept, dtype=w.dtype))
        top = w_full.topk(kk, dim=-1).indices
        assert torch.equal(torch.gather(w, -1, top).gt(0).sum(-1), kept)  # the kept keys are full softmax's top ones
        assert bool((w.tril() == w).all())  # still causal
    y1, w1 = reference_attention(q, k, v, scale=8**-0.5, top_k=1)
    # Top-1 is "ordering one dish": each query's output is exactly the value of its best-scoring key.
    best = w_full.argmax(-1, keepdim=True)
    torch.testing.assert_close(y1, torch.gather(v, -2, best.expand(-1, -1, -1, 8)))
    # k at least the number of keys is full softmax.
    y12, _ = reference_attention(q, k, v, scale=8**-0.5, top_k=12)
    torch.testing.assert_close(y12, full)
    with pytest.raises(ConfigError, match="top_k=0"):
        keep_top_k(torch.zeros(2, 2), 0)


def test_top_k_attention_switches_a_model_for_a_block_only():
    ref, fused = model_pair()
    x = tokens()
    base, _ = fused(x)
    with top_k_attention(fused, 2):
        restricted, _ = fused(x)
        weights = fused.attention_weights(x)
    with top_k_attention(ref, 2):
        ref_restricted, _ = ref(x)
    assert not torch.allclose(restricted, base)  # top-2 of up to 16 keys changes the prediction
    torch.testing.assert_close(restricted, ref_restricted, atol=1e-5, rtol=1e-5)  # same on either implementation
    assert all(int((w > 0).sum(-1).max()) == 2 for w in weights)
    after, _ = fused(x)
    torch.testing.assert_close(after, base, atol=0, rtol=0)  # restored: the fused path again
    assert all(m.top_k is None for m in fused.modules() if isinstance(m, CausalSelfAttention))
