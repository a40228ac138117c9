"""KV cache: cached generation reproduces the uncached logits for every positional encoding and both
attention paths (prefill in one chunk, then one token at a time, or several tokens per step), and
greedy generation is token-for-token the same with and without the cache, also past block_size."""

from __future__ import annotations

import pytest
import torch

from components.core.export import cache_kind
from components.core.models.attention import KVCache
from components.core.models.transformer import Transformer, TransformerSettings

V = 50


def model(pos: str, impl: str, block_size: int = 16) -> Transformer:
    torch.manual_seed(0)
    m = Transformer(
        TransformerSettings(n_layer=2, n_head=4, n_embd=32, block_size=block_size, attention=impl, pos_encoding=pos), V
    )
    return m.double().eval()


def tokens(T: int, B: int = 2, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, V, (B, T), generator=g)


@pytest.mark.parametrize("impl", ["reference", "fused"])
@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "none"])
def test_cached_logits_equal_uncached(pos, impl):
    m = model(pos, impl)
    x = tokens(16)
    with torch.no_grad():
        full = m(x)[0]  # (B, 16, V)
        cache = KVCache(len(m.h))
        # prefill 5, then 1, 1, 4 (several new positions at once: causal among themselves), then 1 … 1
        chunks, start = [5, 1, 1, 4] + [1] * 5, 0
        pieces = []
        for n in chunks:
            pieces.append(m(x[:, start : start + n], cache=cache)[0])
            start += n
            assert cache.length == start
        cached = torch.cat(pieces, dim=1)
    assert start == 16
    torch.testing.assert_close(cached, full, atol=1e-10, rtol=1e-10)
    # the cache holds keys and values of every layer: 2 layers × (k, v) × B·nh·T·hs float64
    assert cache.nbytes() == 2 * 2 * (2 * 4 * 16 * 8) * 8


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "none"])
def test_greedy_generation_same_with_and_without_cache(pos):
    m = model(pos, "fused", block_size=12)
    prompt = tokens(5, B=3, seed=7)
    # 20 new tokens run past block_size 12: the cache serves the first 7, then the window slides
    with_cache = m.generate(prompt, 20, temperature=0, use_cache=True)
    without = m.generate(prompt, 20, temperature=0, use_cache=False)
    assert with_cache.shape == (3, 25)
    assert torch.equal(with_cache, without)


def test_sampled_generation_same_with_and_without_cache():
    m = model("rope", "reference")
    prompt = tokens(3, seed=2)
    torch.manual_seed(11)
    a = m.generate(prompt, 10, temperature=1.0, top_k=10, use_cache=True)
    torch.manual_seed(11)
    b = m.generate(prompt, 10, temperature=1.0, top_k=10, use_cache=False)
    assert torch.equal(a, b)


def test_a_prompt_longer_than_the_block_skips_the_cache():
    m = model("learned", "fused", block_size=8)
    prompt = tokens(11, seed=4)  # longer than the learned table: only the last 8 are seen
    out = m.generate(prompt, 3, temperature=0, use_cache=True)
    assert torch.equal(out, m.generate(prompt, 3, temperature=0, use_cache=False))


def test_export_reports_the_kv_cache():
    assert cache_kind(model("rope", "fused")) == "kv"
