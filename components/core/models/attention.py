"""Multi-head causal self-attention, two interchangeable implementations.

- `reference`: the textbook computation, written out: scores = QKᵀ·scale → causal mask → softmax → ×V.
  It materialises the (T, T) weights, so it can return them (plots, tests) and costs O(T²) memory.
- `fused`: `torch.nn.functional.scaled_dot_product_attention` (SDPA). On CUDA it dispatches to
  FlashAttention / cuDNN / memory-efficient kernels, on CPU to a fused flash kernel; none of them
  materialise the (T, T) weights. The causal path passes `is_causal=True` and never builds a mask
  tensor, which keeps the memory advantage. On CUDA the kernel can be pinned with
  `torch.nn.attention.sdpa_kernel` (setting `sdpa_backend`), and `sdpa_probe.detect_sdpa_backend` verifies
  which kernel actually runs, so "FlashAttention" is observed, not assumed.

Sparse attention. `sliding_window_attention` is local attention: each query sees the last `window`
keys, plus the first `n_global` positions, which every later query sees (Longformer/BigBird-style
global tokens; causally, a global query sees everything before it anyway). It runs one block of
`window` queries at a time, so memory grows as N·(window + n_global), not N². The model trains with
it under `attention: sliding_window`. `flex_window_attention` is the same mask through PyTorch's
FlexAttention (`BlockMask`, compiled): on CUDA forward and backward; on the CPU torch 2.13 runs the
forward only (compiled through inductor's CPU template; eager it materialises the scores) and
refuses the backward ("FlexAttention does not support backward on CPU"). All of them equal the
reference under `allowed_keys(..., window, n_global)`.

Top-k attention (evaluation only). `reference_attention(..., top_k=k)` keeps each query's k highest
scores among the keys it may see and renormalises the softmax over them (top-1 is "ordering one
dish": the single best key's value, no blend). `top_k_attention(model, k)` switches every attention
module of a model to it for the duration of a `with` block (the training path never takes it).

Generation. `KVCache` keeps each layer's keys and values of the positions seen so far, so a new
token costs one query against the cached keys instead of recomputing the whole context: the new
queries of a step see every cached key and, among themselves, the causal triangle.

Padding. PAD (id 0) only ever sits at the *end* of a block (the labels pad the last, short block).
Under the causal mask a real token at position t only attends to positions <= t, all of them real, so
trailing padding can never leak into real positions, and pad targets are -100 (ignored by the loss).
The causal path therefore needs no padding mask. For inputs with padding elsewhere both paths also
accept an explicit `key_padding_mask` (B, T), True = real token; it builds a (B, 1, T, T) mask, so it
is for tests and analysis, not the training hot path.
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager, nullcontext
from typing import Iterator, Literal, get_args

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import ConfigError
from .positional import RotaryEmbedding

AttentionImpl = Literal["fused", "reference", "sliding_window"]
ATTENTION_IMPLS = get_args(AttentionImpl)
SdpaKernel = Literal["flash", "efficient", "cudnn", "math"]
SdpaBackend = Literal["auto", SdpaKernel]  # "auto" lets torch's dispatcher choose
SDPA_BACKENDS: dict[str, SDPBackend] = dict(
    zip(
        get_args(SdpaKernel),
        (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH),
        strict=True,
    )
)


def window_mask(n_query: int, n_key: int, window: int, n_global: int = 0, device=None) -> torch.Tensor:
    """(n_query, n_key) bool: the queries are the last n_query of n_key positions; query i sees key j
    when j <= i and (i - j < window or j < n_global)."""
    qi = torch.arange(n_key - n_query, n_key, device=device)[:, None]  # absolute query positions
    kj = torch.arange(n_key, device=device)[None, :]
    return (kj <= qi) & ((qi - kj < window) | (kj < n_global))


def allowed_keys(
    T: int,
    device,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    window: int | None = None,
    n_global: int = 0,
) -> torch.Tensor:
    """Boolean mask of the keys each query may attend to: (T, T), or (B, 1, T, T) with a padding mask.
    `window` (causal only) keeps the last `window` keys and the first `n_global` positions."""
    allowed = torch.ones(T, T, dtype=torch.bool, device=device)  # (T, T)
    if causal:
        allowed = (
            allowed.tril() if window is None else window_mask(T, T, window, n_global, device)
        )  # query t sees keys 0..t
    if key_padding_mask is not None:
        allowed = allowed[None, None] & key_padding_mask[:, None, None, :].bool()  # (B, 1, T, T)
        # A query always sees itself, so a row of only padding (a pad query) stays finite instead of
        # NaN; its output is ignored anyway (its target is -100).
        allowed = allowed | torch.eye(T, dtype=torch.bool, device=device)
    return allowed


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
    window: int | None = None,
    n_global: int = 0,
    top_k: int | None = None,
    hard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit attention; returns (output (B, nh, T, hs), weights (B, nh, T, T)). `top_k`: each query
    keeps only its k highest-scoring allowed keys (evaluation-time; see `keep_top_k`). `hard`: each
    query's weights are one-hot on its top-scoring key in the forward pass, and the softmax's in the
    backward pass (straight-through), so the scores still learn."""
    T = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, T) raw scores
    if causal or key_padding_mask is not None:
        att = att.masked_fill(~allowed_keys(T, q.device, causal, key_padding_mask, window, n_global), float("-inf"))
    if top_k is not None:
        att = keep_top_k(att, top_k)
    att = F.softmax(att, dim=-1)  # (B, nh, T, T) each query's weights sum to 1
    if hard:  # forward: one-hot on the argmax; backward: d(soft) (the detached difference carries no gradient)
        one_hot = torch.zeros_like(att).scatter_(-1, att.argmax(-1, keepdim=True), 1.0)
        att = att + (one_hot - att).detach()
    weights = att
    if dropout is not None:
        att = dropout(att)
    return att @ v, weights  # (B, nh, T, hs), (B, nh, T, T)


def keep_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Scores (..., T_q, T_k) with each query's all but k highest set to -inf, so a softmax afterwards
    renormalises over the kept keys. Masked (-inf) keys are never kept over allowed ones; a query with
    fewer than k allowed keys keeps them all. Ties at the k-th score are broken by position (exactly k kept)."""
    if k < 1:
        raise ConfigError(f"top_k={k} must be at least 1")
    if k >= scores.shape[-1]:
        return scores
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, scores.topk(k, dim=-1).indices, True)
    return scores.masked_fill(~keep, float("-inf"))


@contextmanager
def top_k_attention(model: nn.Module, k: int | None) -> Iterator[None]:
    """Every `CausalSelfAttention` of `model` attends to each query's top-k keys only (renormalised)
    inside the block; k None restores full softmax. For evaluation: the KV-cache path ignores it."""
    mods = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    if not mods:
        raise ConfigError(f"{type(model).__name__} has no attention modules to restrict to top-k keys")
    before = [m.top_k for m in mods]
    for m in mods:
        m.top_k = k
    try:
        yield
    finally:
        for m, b in zip(mods, before):
            m.top_k = b


def float32_on_cpu(attention):
    """torch's CPU SDPA kernels are slow in bfloat16 (the flash kernel's backward ~8× its float32 time at
    head size 32, torch 2.13; the masked path likewise): under CPU bf16 autocast the projections around
    attention run in bf16 and `attention(q, k, v, ...)` itself in float32, its output cast back."""

    @functools.wraps(attention)
    def wrapper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if q.dtype == torch.bfloat16 and q.device.type == "cpu":
            with torch.autocast("cpu", enabled=False):
                return attention(q.float(), k.float(), v.float(), *args, **kwargs).to(q.dtype)
        return attention(q, k, v, *args, **kwargs)

    return wrapper


@float32_on_cpu
def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """SDPA; returns the output (B, nh, T, hs). `backend` pins the kernel on CUDA ("auto" lets torch pick)."""
    pin = sdpa_kernel(SDPA_BACKENDS[backend]) if backend != "auto" and q.is_cuda else nullcontext()
    with pin:
        if key_padding_mask is None:
            # No mask tensor at all: the kernel applies causality itself (O(T) memory, not O(T²)).
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)
        mask = allowed_keys(q.shape[-2], q.device, causal, key_padding_mask)  # (B, 1, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


# Sequences up to this length take one SDPA call under the dense band mask (at most 16 k mask entries).
# Forward + backward on one thread, against the per-block loop: 3.2× faster at T = 32, window 4 (the
# memory tasks); 1.13× at T = 128, window 16 (transformer_window_lm); slower from T = 256 (0.87× at
# window 16, 0.47× at T = 512, window 64).
DENSE_BAND_MAX_T = 128


@float32_on_cpu
def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    scale: float,
    n_global: int = 0,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Causal local attention: query t sees keys (t - window, t] and the first `n_global` positions.
    Computed in blocks of `window` queries, each against at most n_global + 2·window keys, so time and
    memory are O(T·(window + n_global)) instead of O(T²). Every block far enough from the start has the
    same mask (all global keys, then the previous block and its own), so those blocks are one batched
    SDPA call over views of q, k and v; only the first blocks (where the window reaches back over the
    global tokens or before position 0) and a last partial block are computed one at a time. Slicing
    each block out of q, k and v instead would cost O(T) per block in the backward pass (each slice's
    gradient is a zero-filled tensor of the whole length): O(T²/window) in all. Up to DENSE_BAND_MAX_T
    positions it is one SDPA call under the whole T×T band mask instead: there the per-block calls cost
    more than the masked-out scores. Returns (B, nh, T, hs)."""
    T = q.shape[-2]
    if T <= DENSE_BAND_MAX_T:
        allowed = window_mask(T, T, window, n_global, device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, scale=scale)
    w, g = window, n_global
    n_full = T // w
    b0 = 1 + -(-g // w)  # the first block whose previous block starts at or after the global tokens
    if b0 >= n_full:  # no regular block: every block one at a time
        out = _window_blocks(q, k, v, range(0, T, w), w, scale, g, dropout_p)
        assert out is not None  # T > DENSE_BAND_MAX_T > 0: at least one block
        return out
    B, nh, _, hs = q.shape
    nr = n_full - b0  # regular blocks, batched
    s0, e0 = b0 * w, n_full * w
    qb = q[..., s0:e0, :].reshape(B, nh * nr, w, hs)
    kb = k[..., s0 - w : e0, :].reshape(B, nh, nr + 1, w, hs)
    vb = v[..., s0 - w : e0, :].reshape(B, nh, nr + 1, w, hs)
    parts_k, parts_v = [kb[:, :, :-1], kb[:, :, 1:]], [vb[:, :, :-1], vb[:, :, 1:]]  # previous block, own block
    if g:
        parts_k.insert(0, k[..., None, :g, :].expand(B, nh, nr, g, hs))
        parts_v.insert(0, v[..., None, :g, :].expand(B, nh, nr, g, hs))
    ks = torch.cat(parts_k, dim=-2).reshape(B, nh * nr, g + 2 * w, hs)
    vs = torch.cat(parts_v, dim=-2).reshape(B, nh * nr, g + 2 * w, hs)
    ii = torch.arange(w, device=q.device)[:, None]
    jj = torch.arange(w, device=q.device)[None, :]
    allowed = torch.cat(  # (w, g + 2w): every global key; previous block: (q - key) < window; own block: causal
        [torch.ones(w, g, dtype=torch.bool, device=q.device), jj > ii, jj <= ii], dim=1
    )
    mid = F.scaled_dot_product_attention(qb, ks, vs, attn_mask=allowed, dropout_p=dropout_p, scale=scale)
    head = _window_blocks(q, k, v, range(0, s0, w), w, scale, g, dropout_p)
    tail = _window_blocks(q, k, v, range(e0, T, w), w, scale, g, dropout_p)
    return torch.cat([t for t in (head, mid.reshape(B, nh, nr * w, hs), tail) if t is not None], dim=-2)


def _window_blocks(q, k, v, starts, window, scale, n_global, dropout_p) -> torch.Tensor | None:
    """sliding_window_attention's blocks that start at `starts`, one SDPA call each (B, nh, Σ block, hs)."""
    T = q.shape[-2]
    outs = []
    for s in starts:
        e = min(s + window, T)
        k0 = max(0, s - window + 1)  # the oldest key any query of this block sees through the window
        g = min(n_global, k0)  # global keys that lie before the window's keys
        qi = torch.arange(s, e, device=q.device)[:, None]  # (bq, 1) absolute query positions
        kj = torch.cat([torch.arange(g, device=q.device), torch.arange(k0, e, device=q.device)])[None, :]  # (1, bk)
        allowed = (kj <= qi) & ((qi - kj < window) | (kj < n_global))  # (bq, bk)
        ks, vs = k[..., k0:e, :], v[..., k0:e, :]
        if g:
            ks, vs = torch.cat([k[..., :g, :], ks], dim=-2), torch.cat([v[..., :g, :], vs], dim=-2)
        outs.append(
            F.scaled_dot_product_attention(q[..., s:e, :], ks, vs, attn_mask=allowed, dropout_p=dropout_p, scale=scale)
        )
    return torch.cat(outs, dim=-2) if outs else None


_FLEX = {}


def flex_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    scale: float,
    n_global: int = 0,
    *,
    compiled: bool = True,
) -> torch.Tensor:
    """The sliding-window (+ global tokens) mask through FlexAttention: a `BlockMask` built once per
    (N, window, n_global, device) skips the key blocks the mask rules out. The mask is built compiled
    (`_compile=True`: block by block, never the dense N×N mask and its index tensors, over 100 GB
    at N = 131072), and `flex_attention` is wrapped by torch.compile once per process (each new N is
    one recompile of that wrapper). `compiled=False` runs FlexAttention's eager reference (it
    materialises the scores: for tests). (B, nh, T, hs)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    T = q.shape[-2]
    key = (T, window, n_global, str(q.device))
    if key not in _FLEX:

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & ((q_idx - kv_idx < window) | (kv_idx < n_global))

        _FLEX[key] = create_block_mask(mask_mod, None, None, T, T, device=q.device, _compile=True)
    fn = flex_attention
    if compiled:
        if "compiled" not in _FLEX:
            _FLEX["compiled"] = torch.compile(flex_attention, dynamic=False)
        fn = _FLEX["compiled"]
    return fn(q, k, v, block_mask=_FLEX[key], scale=scale)


class KVCache:
    """Per layer, the keys and values (B, nh, t, hs) of the t positions generated so far."""

    def __init__(self, n_layer: int):
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[-2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys and values (B, nh, T, hs); return the layer's whole (B, nh, t+T, hs)."""
        prev_k, prev_v = self.k[layer], self.v[layer]
        if prev_k is not None and prev_v is not None:  # set together, so both or neither
            k, v = torch.cat([prev_k, k], dim=-2), torch.cat([prev_v, v], dim=-2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    def fork(self) -> "KVCache":
        """A cache that starts from this one's positions; growing it leaves this one as it is."""
        other = KVCache(len(self.k))
        other.k, other.v = list(self.k), list(self.v)
        return other

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v) if t is not None)


@float32_on_cpu
def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    impl: str,
    backend: str = "auto",
    window: int | None = None,
    n_global: int = 0,
) -> torch.Tensor:
    """T new queries (B, nh, T, hs) against t ≥ T keys whose last T are the queries' own positions:
    query i sees keys 0 … t-T+i (within the window and the global positions when `window` is set).
    One new query without a window needs no mask (it sees every key)."""
    T, t = q.shape[-2], k.shape[-2]
    mask = None
    if window is not None:
        mask = window_mask(T, t, window, n_global, q.device)  # (T, t)
    elif T > 1:
        mask = window_mask(T, t, t, 0, q.device)  # (T, t) causal
    if impl == "reference":
        att = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, t)
        if mask is not None:
            att = att.masked_fill(~mask, float("-inf"))
        return F.softmax(att, dim=-1) @ v  # (B, nh, T, hs)
    # A pinned kernel only without a mask tensor (FlashAttention takes none); with one, torch chooses.
    pin = sdpa_kernel(SDPA_BACKENDS[backend]) if backend != "auto" and q.is_cuda and mask is None else nullcontext()
    with pin:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # (B, nh, T, hs)


class CausalSelfAttention(nn.Module):
    """Q, K, V projections → per-head attention → concatenated heads → output projection."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        impl: str = "fused",
        scale_scores: bool = True,
        sdpa_backend: str = "auto",
        window: int = 256,
        n_global: int = 0,
        hard: bool = False,
    ):
        super().__init__()
        if n_embd % n_head:
            raise ConfigError(f"n_embd={n_embd} must be divisible by n_head={n_head}")
        if impl not in ATTENTION_IMPLS:
            raise ConfigError(f"attention={impl!r} is unknown; use one of {', '.join(ATTENTION_IMPLS)}")
        if sdpa_backend != "auto" and sdpa_backend not in SDPA_BACKENDS:
            raise ConfigError(
                f"sdpa_backend={sdpa_backend!r} is unknown; use auto or one of {', '.join(SDPA_BACKENDS)}"
            )
        self.n_head, self.n_embd, self.head_dim = n_head, n_embd, n_embd // n_head
        self.impl, self.sdpa_backend, self.dropout = impl, sdpa_backend, dropout
        # Local attention (impl sliding_window): the last `window` keys and the first `n_global` positions.
        self.window, self.n_global = (window, n_global) if impl == "sliding_window" else (None, 0)
        # 1/√d_head keeps the scores' variance ~1 whatever the head size; the ablation turns it off.
        self.scale = 1.0 / math.sqrt(self.head_dim) if scale_scores else 1.0
        self.top_k: int | None = None  # evaluation-time top-k keys per query (`top_k_attention`); None = full softmax
        self.hard = hard  # one-hot weights on the top key, trained straight-through (reference path only)
        # Q, K and V for all heads in one matmul (one (C, 3C) weight = three (C, C) projections).
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        rope: RotaryEmbedding | None = None,
        *,
        causal: bool = True,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        layer: int = 0,
        offset: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(output (B, T, C), weights (B, nh, T, T) or None). `need_weights` uses the reference math.

        With `cache`, x holds the new positions offset … offset+T-1 (offset = the cache's length before
        this step): their keys and values are appended to layer `layer` of the cache and the queries
        attend to every cached position (causally among themselves)."""
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, self.head_dim)  # q, k, v side by side, per head
        if rope is not None:
            q, k, v = rope.split_qkv(qkv, offset)  # (B, nh, T, hs) each, queries and keys rotated by position
        else:
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, nh, T, hs) each

        weights = None
        if cache is not None:
            if self.hard:
                raise ConfigError("hard_attention has no KV-cache path: generate with use_cache=False")
            k, v = cache.update(layer, k, v)  # (B, nh, offset+T, hs)
            y = cached_attention(
                q,
                k,
                v,
                scale=self.scale,
                impl=self.impl,
                backend=self.sdpa_backend,
                window=self.window,
                n_global=self.n_global,
            )
        elif (
            self.impl == "sliding_window"
            and causal
            and key_padding_mask is None
            and not need_weights
            and self.top_k is None
            and not self.hard
        ):
            assert self.window is not None  # set whenever impl is sliding_window
            y = sliding_window_attention(
                q, k, v, self.window, self.scale, self.n_global, dropout_p=self.dropout if self.training else 0.0
            )  # (B, nh, T, hs)
        elif self.impl == "reference" or need_weights or self.window is not None or self.top_k is not None or self.hard:
            y, weights = reference_attention(
                q,
                k,
                v,
                scale=self.scale,
                causal=causal,
                key_padding_mask=key_padding_mask,
                dropout=self.attn_dropout if self.training else None,
                window=self.window,
                n_global=self.n_global,
                top_k=self.top_k,
                hard=self.hard,
            )  # (B, nh, T, hs)
        else:
            y = fused_attention(
                q,
                k,
                v,
                scale=self.scale,
                causal=causal,
                key_padding_mask=key_padding_mask,
                dropout_p=self.dropout if self.training else 0.0,
                backend=self.sdpa_backend,
            )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C) heads side by side
        return self.resid_dropout(self.c_proj(y)), weights  # (B, T, C)
