"""Sparse attention: the blocked sliding window with global tokens and the same mask through
FlexAttention equal the reference under that boolean mask (forward, and gradients where the backend
has a backward); the Transformer trains with `attention: sliding_window`, its cached generation
equals the uncached one, and its attention weights respect the window."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from components.core.models.attention import (
    DENSE_BAND_MAX_T,
    allowed_keys,
    flex_window_attention,
    sliding_window_attention,
    window_mask,
)
from components.core.models.transformer import Transformer, TransformerSettings

V = 50


def qkv(T=70, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, T, 8, generator=g, dtype=torch.float64).requires_grad_(grad) for _ in range(3)]


def masked_reference(q, k, v, mask, scale):
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def test_window_mask_is_local_plus_global_and_causal():
    m = window_mask(10, 10, window=3, n_global=2)
    for i in range(10):
        seen = {j for j in range(10) if m[i, j]}
        assert seen == {j for j in range(i + 1) if i - j < 3 or j < 2}
    assert torch.equal(allowed_keys(10, "cpu", window=3, n_global=2), m)
    assert torch.equal(window_mask(4, 10, 3, 2), m[-4:])  # the last queries of a longer context


# T=70: one SDPA under the dense band (T <= DENSE_BAND_MAX_T); T=200 and 256: the first blocks one at a time, the
# regular blocks batched, the partial last block (200 = 12·16 + 8) alone; (70, 80) at T=200 has no regular block
@pytest.mark.parametrize("T", [70, 200, 256])
@pytest.mark.parametrize("window, n_global", [(16, 0), (16, 3), (7, 20), (70, 0), (70, 80), (32, 32)])
def test_blocked_sliding_window_equals_masked_reference_with_gradients(window, n_global, T):
    assert (T <= DENSE_BAND_MAX_T) == (T == 70)
    q, k, v = qkv(T)
    mask = window_mask(T, T, window, n_global)
    got = sliding_window_attention(q, k, v, window, 0.3, n_global)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    want = masked_reference(q2, k2, v2, mask, 0.3)
    torch.testing.assert_close(got, want)
    grad = torch.randn_like(got)
    got.backward(grad)
    want.backward(grad)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad, b.grad)


def _graph_nodes(t: torch.Tensor) -> int:
    seen, todo = set(), [t.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo.extend(f for f, _ in fn.next_functions)
    return len(seen)


def test_blocked_sliding_window_backward_does_not_grow_with_length():
    """The regular blocks are one batched call: the autograd graph (and so the backward's passes over
    the whole length) is the same size at 4x the length. Sliced block by block it grows with T/window,
    and every slice's gradient is a zero-filled tensor of the whole length: O(T²/window) work."""
    sizes = []
    for T in (512, 2048):
        q, k, v = qkv(T)
        sizes.append(_graph_nodes(sliding_window_attention(q, k, v, 16, 0.3, n_global=4)))
    assert sizes[0] == sizes[1] < 60, sizes


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_equals_masked_reference():
    q, k, v = qkv(T=128, grad=False)
    for window, n_global in ((16, 0), (16, 4)):
        mask = window_mask(128, 128, window, n_global)
        got = flex_window_attention(q, k, v, window, 0.3, n_global, compiled=False)  # eager: the mask semantics
        torch.testing.assert_close(got, masked_reference(q, k, v, mask, 0.3))


def test_flex_attention_has_no_backward_on_cpu():
    # What torch does on this machine, recorded as a test: a forward, but no backward on the CPU.
    q, k, v = qkv(T=128)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_window_attention(q, k, v, 16, 0.3, compiled=False)


def sw_model(**kw):
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=32, attention="sliding_window", window=8, n_global=2) | kw
    return Transformer(TransformerSettings(**cfg), V)


def test_sliding_window_model_trains_and_respects_the_window():
    m = sw_model()
    x = torch.randint(1, V, (4, 32), generator=torch.Generator().manual_seed(1))
    y = torch.randint(1, V, (4, 32), generator=torch.Generator().manual_seed(2))
    logits, loss = m(x, y)
    w = m.attention_weights(x)  # reference math with the window mask
    allowed = window_mask(32, 32, 8, 2)
    assert all(torch.all(layer[..., ~allowed] == 0) for layer in w)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    first = loss.item()
    for _ in range(30):
        _, loss = m(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 0.5


def test_sliding_window_model_equals_reference_impl_and_caches():
    m = sw_model().double().eval()
    x = torch.randint(1, V, (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = m(x)[0]
        ref = Transformer(TransformerSettings(**(m.config.model_dump() | {"param_budget": None})), V).double().eval()
        ref.load_state_dict(m.state_dict())
        for blk in ref.h:
            blk.attn.impl = "reference"  # the explicit path (QKᵀ, window mask, softmax) instead of the blocked one
        torch.testing.assert_close(full, ref(x)[0])
        # and the window matters: full causal attention gives other logits
        for blk in ref.h:
            blk.attn.window = None
        assert (ref(x)[0] - full)[..., 1:].abs().max() > 1e-3  # (column 0 is [PAD], -inf in both)
    prompt = x[:, :5]
    assert torch.equal(
        m.generate(prompt, 20, temperature=0, use_cache=True), m.generate(prompt, 20, temperature=0, use_cache=False)
    )


def test_window_settings_are_checked():
    with pytest.raises(ValidationError, match="window=64 is larger than block_size=32"):
        TransformerSettings(block_size=32, attention="sliding_window", window=64)
    with pytest.raises(ValidationError, match="n_global=32"):
        TransformerSettings(block_size=32, attention="sliding_window", window=8, n_global=32)
