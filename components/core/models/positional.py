"""Positional encodings for the Transformer.

Self-attention is a weighted sum over a *set* of tokens: without positions, "我爱你" and "你爱我"
look the same to it. Three ways to tell the model where a token sits, plus "none" for the ablation:

- sinusoidal: fixed sin/cos waves of geometric wavelengths added to the token embeddings
  (Vaswani et al. 2017). No parameters; works for any length.
- learned: one trained vector per position added to the token embeddings (GPT-2). A table of
  `block_size` rows, so a longer context is an error.
- rope: rotary embeddings (Su et al. 2021). Instead of adding to the embeddings, rotate every
  (query, key) pair of channels by an angle proportional to the position, so the score q·k depends
  on the *relative* offset of the two tokens. Applied inside attention, per head.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn as nn

from ..errors import ConfigError

PositionalEncoding = Literal["sinusoidal", "learned", "rope", "none"]
POSITIONAL_ENCODINGS = get_args(PositionalEncoding)


def sinusoidal_table(n_pos: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / base^(2i/dim)), PE[pos, 2i+1] = cos(same)."""
    half = (dim + 1) // 2
    inv_freq = torch.exp(-math.log(base) * torch.arange(half, dtype=torch.float32) * 2 / dim)  # (half,)
    angles = torch.arange(n_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (n_pos, half)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (n_pos, 2*half) interleaved sin, cos
    return table[:, :dim]  # (n_pos, dim); drops the last cos column when dim is odd


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed table, added to the token embeddings. A non-persistent buffer: never saved, rebuilt on load."""

    def __init__(self, n_embd: int, block_size: int, base: float = 10000.0):
        super().__init__()
        self.n_embd, self.base = n_embd, base
        self.register_buffer("table", sinusoidal_table(block_size, n_embd, base), persistent=False)

    def forward(self, T: int, offset: int = 0) -> torch.Tensor:
        """Rows offset … offset+T-1 (a KV-cached generation step starts at the cache's length)."""
        if offset + T > self.table.shape[0]:
            # The formula extends to any length, so a longer context just grows the table.
            self.table = sinusoidal_table(offset + T, self.n_embd, self.base).to(self.table.device)
        return self.table[offset : offset + T]  # (T, C)


class LearnedPositionalEncoding(nn.Module):
    """One trained vector per position (GPT-2's `wpe`), added to the token embeddings."""

    def __init__(self, n_embd: int, block_size: int):
        super().__init__()
        self.block_size = block_size
        self.wpe = nn.Embedding(block_size, n_embd)

    def forward(self, T: int, offset: int = 0) -> torch.Tensor:
        if offset + T > self.block_size:
            raise ConfigError(
                f"sequence length {offset + T} is longer than the learned positional table "
                f"(block_size={self.block_size} rows); "
                "raise the model's `block_size` or feed shorter blocks (the learned encoding cannot extrapolate)"
            )
        pos = torch.arange(offset, offset + T, device=self.wpe.weight.device)  # (T,)
        return self.wpe(pos)  # (T, C)


def _rope_cache(n_pos: int, head_dim: int, base: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)  # (hs/2,)
    angles = torch.arange(n_pos, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]  # (n_pos, hs/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each channel pair (x[2i], x[2i+1]) by the position's angle (the interleaved layout of
    RoFormer, GPT-J and LLaMA): the reference formula the fused training path is tested against."""
    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)  # (B, nh, T, hs/2) each
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)  # (B, nh, T, hs)


# Which channels a rotation pairs is part of what the weights mean: recorded with every checkpoint of
# a rotary model and checked when one is loaded (`Transformer.weight_layout`). "interleaved" pairs
# (2i, 2i+1); weights written before this key existed paired (i, i + hs/2) and are refused.
ROPE_LAYOUT = "interleaved"

# The rotation as one complex multiplication per pair: float32 and float64 have complex twins.
_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys; holds only a cos/sin cache (no parameters, never saved)."""

    def __init__(self, head_dim: int, block_size: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ConfigError(f"rotary embeddings need an even head size, got n_embd/n_head={head_dim}")
        self.head_dim, self.base = head_dim, base
        cos, sin = _rope_cache(block_size, head_dim, base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _extend(self, n_pos: int) -> None:
        if n_pos > self.cos.shape[0]:
            # Rotations are defined for any position, so extend the cache rather than fail.
            self.cos, self.sin = _rope_cache(n_pos, self.head_dim, self.base, self.cos.device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, nh, T, hs) at positions offset … offset+T-1, rotated."""
        T = q.shape[-2]
        self._extend(offset + T)
        # Cast to q's dtype: under bf16 autocast q, k are bf16 and SDPA needs q, k, v of one dtype.
        cos, sin = self.cos[offset : offset + T].to(q.dtype), self.sin[offset : offset + T].to(q.dtype)  # (T, hs/2)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # (B, nh, T, hs) each

    def rotation_tables(self, offset: int, T: int, dtype: torch.dtype, device: torch.device) -> tuple:
        """(rotation, inverse rotation) at positions offset … offset+T-1, each shaped (T, 1, 1, hs/2) to
        broadcast over (B, T, 2, nh, hs/2) pairs: cos + i·sin as a complex tensor, of `dtype`'s complex
        twin, or complex64 for bfloat16 and float16 (which have none: `rotate_pairs_into` rotates those in
        float32). Cached for the last (offset, T, dtype, device)."""
        self._extend(offset + T)
        key = (offset, T, dtype, device)
        if getattr(self, "_tables_key", None) != key:
            cos, sin = (t[offset : offset + T, None, None, :] for t in (self.cos, self.sin))  # (T, 1, 1, hs/2)
            if cos.dtype not in _COMPLEX:  # a model cast whole to bfloat16 or float16 casts these buffers too
                cos, sin = cos.float(), sin.float()
            rot = torch.complex(cos, sin).to(_COMPLEX.get(dtype, torch.complex64))
            self._tables_cache = (rot, rot.conj().resolve_conj())
            self._tables_key = key
        return self._tables_cache

    def rotate_qkv(self, qkv: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Queries and keys rotated in the projection's own layout, values passed through: qkv
        (B, T, 3, nh, hs) → the same numbers as `forward` for q and k."""
        return torch.stack([t.transpose(1, 2) for t in self.split_qkv(qkv, offset)], 2)

    def split_qkv(self, qkv: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The projection qkv (B, T, 3, nh, hs) → q, k rotated and v, each (B, nh, T, hs): the training
        step's hot path. `_RotateSplit` rotates queries and keys together in one complex multiplication
        (float32, float64) written straight into one new tensor, copies the values beside them, and its
        backward (the inverse rotation) writes the projection's gradient likewise: no slice of the
        projection whose backward would zero-fill and copy it."""
        if torch.compiler.is_compiling():
            # Under torch.compile the plain formula: inductor fuses it into one kernel by itself, and
            # a complex view written through `out=` does not trace.
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, nh, T, hs) each
            return (*self(q, k, offset), v)
        return _RotateSplit.apply(qkv, *self.rotation_tables(offset, qkv.shape[1], qkv.dtype, qkv.device))


def channel_pairs(t: torch.Tensor) -> torch.Tensor:
    """(..., hs) → (..., hs/2, 2): channel pairs (2i, 2i+1), each rotated by one angle, as a view."""
    return t.unflatten(-1, (t.shape[-1] // 2, 2))


def _complex_view(t: torch.Tensor) -> torch.Tensor | None:
    """`t`'s channel pairs as complex numbers without a copy, or None where its strides forbid it."""
    p = channel_pairs(t)
    if p.stride(-1) != 1 or p.storage_offset() % 2 or any(s % 2 for s in p.stride()[:-1]):
        return None
    return torch.view_as_complex(p)


def rotate_pairs_into(out: torch.Tensor, x: torch.Tensor, rot: torch.Tensor) -> None:
    """out = x with each channel pair rotated by `rot` (from `rotation_tables`, broadcast over x's leading
    dimensions); out is a view of this module's own buffer (even strides: a complex view always
    exists), x may have any strides (copied first where its pairs cannot be viewed as complex).
    (a + ib)(cos + i sin): the whole rotation in one pass. bfloat16 and float16 have no complex type:
    their pairs are rotated in a float32 copy and rounded once into `out` (three contiguous passes,
    about 4× faster on a CPU than the four strided passes over the pairs' halves in bfloat16, and
    rounded once instead of twice)."""
    if x.dtype in _COMPLEX:
        xc = _complex_view(x)
        torch.mul(
            xc if xc is not None else torch.view_as_complex(channel_pairs(x.contiguous())),
            rot,
            out=torch.view_as_complex(channel_pairs(out)),
        )
        return
    wide = x.to(torch.float32, memory_format=torch.contiguous_format)
    torch.view_as_complex(channel_pairs(wide)).mul_(rot)
    out.copy_(wide)


class _RotateSplit(torch.autograd.Function):
    """RoPE on the projection layout, split into (B, nh, T, hs) views of one new tensor. The rotation
    is linear, so the backward saves no tensor: the gradient is the inverse rotation (the angle
    negated) of the incoming one."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, rot, rot_inv):
        ctx.rot_inv = rot_inv
        out = torch.empty_like(qkv, memory_format=torch.contiguous_format)  # (B, T, 3, nh, hs)
        rotate_pairs_into(out[:, :, :2], qkv[:, :, :2], rot)  # queries and keys
        out[:, :, 2] = qkv[:, :, 2]  # values
        return tuple(t.transpose(1, 2) for t in out.unbind(2))  # (B, nh, T, hs) each

    @staticmethod
    def backward(ctx, *grads):
        g0 = next(g for g in grads if g is not None)
        B, nh, T, hs = g0.shape
        out = g0.new_empty(B, T, 3, nh, hs)
        inv = ctx.rot_inv[:, 0]  # (T, 1, hs/2): the table for one of q, k (B, T, nh, hs/2)
        for i, g in enumerate(grads):
            if g is None:
                out[:, :, i] = 0
            elif i < 2:
                rotate_pairs_into(out[:, :, i], g.transpose(1, 2), inv)
            else:
                out[:, :, i] = g.transpose(1, 2)
        return out, None, None


def build_positional(
    kind: str, n_embd: int, n_head: int, block_size: int, base: float = 10000.0
) -> tuple[nn.Module | None, RotaryEmbedding | None]:
    """(additive encoding or None, rotary embedding or None) for a positional-encoding name."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(n_embd, block_size, base), None
    if kind == "learned":
        return LearnedPositionalEncoding(n_embd, block_size), None
    if kind == "rope":
        return None, RotaryEmbedding(n_embd // n_head, block_size, base)
    if kind == "none":
        return None, None
    raise ConfigError(f"pos_encoding={kind!r} is unknown; use one of {', '.join(POSITIONAL_ENCODINGS)}")
