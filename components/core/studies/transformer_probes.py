"""Probes of a Transformer that train nothing: the softmax entropy of its attention, whether
permuting its input permutes its output (`permutation_equivariance`), attention with and without
the 1/√d scaling at init (`score_scaling_at_init`), and its parameters per component
(`parameter_accounting`). Why each: `studies.ablations`, which runs them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..device import seed_everything
from ..lm import resolve_settings
from ..models.attention import allowed_keys
from ..models.sizing import count_parameters
from ..models.transformer import Transformer, TransformerSettings

# --------------------------------------------------------------------------------------------------
# Attention entropy


def _entropy_stats(weights: torch.Tensor, causal: bool = True) -> dict[str, float]:
    """weights (..., T, T) → mean entropy (nats), entropy normalised by log(#visible keys), mean max weight.

    Query 0 of a causal row sees one key only (entropy 0 of max 0), so it is left out.
    """
    w = weights.double()
    T = w.shape[-1]
    ent = -(w * torch.log(w.clamp_min(1e-300))).sum(-1)  # (..., T)
    n_keys = torch.arange(1, T + 1, dtype=torch.float64) if causal else torch.full((T,), float(T), dtype=torch.float64)
    rows = slice(1, None) if causal else slice(None)
    return {
        "entropy": float(ent[..., rows].mean()),
        "normalized_entropy": float((ent / n_keys.log().clamp_min(1e-12))[..., rows].mean()),
        "max_weight": float(w.amax(-1)[..., rows].mean()),
    }


@torch.no_grad()
def attention_entropy(model: Transformer, idx: torch.Tensor) -> dict[str, float]:
    """Softmax entropy of the model's attention on idx (B, T), averaged over layers, heads and queries.
    1.0 (normalised) is uniform attention, 0.0 one-hot (a saturated softmax)."""
    model.eval()
    weights = torch.stack(model.attention_weights(idx.to(next(model.parameters()).device)))  # (L, B, nh, T, T)
    return _entropy_stats(weights.cpu())


# --------------------------------------------------------------------------------------------------
# Permutation equivariance


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@torch.no_grad()
def permutation_equivariance(model: Transformer, idx: torch.Tensor, trials: int = 3, seed: int = 0) -> dict:
    """Does permuting the tokens of idx (1, T) permute the model's outputs? max |f(Px) − P f(x)| / max |f(x)|
    over `trials` permutations (the first is the reversal), with bidirectional attention (the exact
    property) and with the causal mask (which itself encodes order)."""
    model.eval()
    device = next(model.parameters()).device
    idx = idx.to(device)
    T = idx.shape[1]
    gen = torch.Generator().manual_seed(seed)
    perms = [torch.arange(T - 1, -1, -1)] + [torch.randperm(T, generator=gen) for _ in range(trials - 1)]

    def outputs(x: torch.Tensor, causal: bool) -> torch.Tensor:
        return model(x, causal=causal)[0][..., 1:].float()  # (1, T, V-1): [PAD]'s column is -inf by design

    errs = {True: [], False: []}
    for causal in (False, True):
        base = outputs(idx, causal)  # (1, T, V-1)
        for p in perms:
            p = p.to(device)
            errs[causal].append(_rel_err(outputs(idx[:, p], causal), base[:, p]))
    bidir = max(errs[False])
    return {
        "pos_encoding": model.config.pos_encoding,
        "tokens": idx[0].tolist(),
        "max_rel_err": bidir,
        "reversal_rel_err": errs[False][0],
        "causal_max_rel_err": max(errs[True]),
        "equivariant": bidir < 1e-4,
    }


# --------------------------------------------------------------------------------------------------
# √d scaling


def score_scaling_at_init(
    model_settings: TransformerSettings,
    vocab_size: int,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int = 0,
    head_dims: tuple[int, ...] = (16, 64, 256, 1024),
) -> dict:
    """Attention with and without 1/√d_head at init: softmax entropy, max weight, score std, gradient norms.

    On the model (same init both ways) and on unit-variance random q, k per head size — the setting of
    the original argument, where the unscaled score variance is d and the softmax saturates.
    """
    resolved = resolve_settings("transformer", model_settings, vocab_size)
    assert isinstance(resolved, TransformerSettings)  # the transformer family's settings
    out: dict = {"head_dim": resolved.head_dim}
    for key, scale in (("scaled", True), ("unscaled", False)):
        seed_everything(seed)
        model = Transformer(resolved.model_copy(update={"scale_scores": scale, "dropout": 0.0}), vocab_size)
        out[key] = _model_attention_probe(model, x, y)
    out["unit_variance"] = [unit_variance_probe(d, T=x.shape[1], seed=seed) for d in head_dims]
    return out


def _model_attention_probe(model: Transformer, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    scores: list[torch.Tensor] = []

    def grab(module, args, kwargs):  # the attention's input, to recompute its raw scores
        with torch.no_grad():
            a = module
            B, T, C = args[0].shape
            q, k, _ = a.c_attn(args[0]).split(a.n_embd, dim=2)  # (B, T, C) each
            q = q.view(B, T, a.n_head, a.head_dim).transpose(1, 2)  # (B, nh, T, hs)
            k = k.view(B, T, a.n_head, a.head_dim).transpose(1, 2)  # (B, nh, T, hs)
            rope = args[1] if len(args) > 1 else kwargs.get("rope")
            if rope is not None:
                q, k = rope(q, k)
            s = (q @ k.transpose(-2, -1)) * a.scale  # (B, nh, T, T)
            scores.append(s.masked_select(allowed_keys(T, s.device)))

    hooks = [b.attn.register_forward_pre_hook(grab, with_kwargs=True) for b in model.blocks]
    model.train()  # dropout is 0: train mode only so gradients flow as in training
    _, loss = model(x, y)
    for h in hooks:
        h.remove()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    qkv: list[torch.Tensor] = []
    for b in model.blocks:
        grad = b.attn.c_attn.weight.grad
        assert grad is not None  # the loss reaches every block's q, k and v
        qkv.append(grad)
    stats = attention_entropy(model, x)
    return {
        **stats,
        "score_std": float(torch.cat(scores).std()),
        "loss": loss.item(),
        "grad_norm": float(torch.nn.utils.get_total_norm(grads)),
        "qkv_grad_norm": float(torch.nn.utils.get_total_norm(qkv)),
    }


def unit_variance_probe(d: int, T: int, seed: int, fixed_scale: float | None = None) -> dict[str, float]:
    """Causal softmax over q·k of unit-variance q, k (d dims): entropy and the gradient reaching the scores.
    `fixed_scale`: the "scaled" variant multiplies by this constant instead of 1/√d (a scale that does not follow d)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g = (torch.randn(4, 1, T, d, generator=gen, dtype=torch.float64) for _ in range(4))  # (4, 1, T, d)
    g = g / math.sqrt(d)  # a read-out of O(1) variance whatever d, so only the softmax differs
    res: dict[str, float] = {"head_dim": d}
    for key, scale in (("scaled", 1.0 / math.sqrt(d) if fixed_scale is None else fixed_scale), ("unscaled", 1.0)):
        s = ((q @ k.transpose(-2, -1)) * scale).requires_grad_()  # (4, 1, T, T)
        w = F.softmax(s.masked_fill(~allowed_keys(T, "cpu"), float("-inf")), dim=-1)  # (4, 1, T, T)
        ((w @ v) * g).sum().backward()  # a random linear read-out of the attention output
        assert s.grad is not None
        st = _entropy_stats(w.detach())
        res[f"entropy_{key}"] = st["normalized_entropy"]
        res[f"max_weight_{key}"] = st["max_weight"]
        # RMS gradient per score entry: how much signal gets back through the softmax
        res[f"score_grad_rms_{key}"] = float(s.grad.masked_select(allowed_keys(T, "cpu")).pow(2).mean().sqrt())
    return res


# --------------------------------------------------------------------------------------------------
# Parameter accounting

COMPONENTS = ("token_embedding", "positional", "attention", "ffn", "norms", "head")


def _component(name: str) -> str:
    if name.startswith("wte."):
        return "token_embedding"
    if name.startswith("pos."):
        return "positional"
    if ".attn." in name:
        return "attention"
    if ".mlp." in name:
        return "ffn"
    if name.startswith("ln_f.") or ".ln_" in name:
        return "norms"
    if name.startswith("lm_head."):
        return "head"
    raise ValueError(f"parameter {name!r} belongs to no known Transformer component")


def parameter_accounting(model: Transformer) -> dict:
    """Parameters per component, counted from the model's own tensors (a tied matrix once, as the
    token embedding); the non-embedding count (`count_parameters(non_embedding=True)`: all but the
    token and learned position tables, what the language-model assets report as
    `params_non_embedding`), and the FFN share of the blocks' parameters (attention + FFN + norms)."""
    counts: dict[str, int] = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():  # named_parameters yields a shared tensor once
        counts[_component(name)] += p.numel()
    blocks = counts["attention"] + counts["ffn"] + counts["norms"]
    m = model.config.ffn_mult
    return {
        "components": counts,
        "total": sum(counts.values()),
        "non_embedding": count_parameters(model, non_embedding=True),
        "blocks": blocks,
        "ffn_share": counts["ffn"] / blocks,
        # per layer, matmul weights only: FFN 2·m·d², attention 4·d² → 2m / (2m + 4) = 2/3 for m = 4
        "ffn_share_formula": 2 * m / (2 * m + 4),
        "about_two_thirds": abs(counts["ffn"] / blocks - 2 / 3) < 0.05,
        "tied": model.config.tie_weights,
        "n_layer": model.config.n_layer,
        "n_embd": model.config.n_embd,
        "vocab_size": model.vocab_size,
    }
