"""Looking inside a trained Transformer: what each head attends to, and FFN neurons as key-value
memories.

Heads (`head_statistics`, `classify_heads`, `head_ablation`). Over validation blocks, for each layer
and head, averaged over queries t ≥ 2 (query 0 can only see itself, and for query 1 the previous
token is the first): the attention share on the previous token (t − 1), on the first token
(position 0), on the token itself (t), the mean distance Σ_j w_tj·(t − j), and the entropy of the
weights (nats). A head is classified, first match wins, as previous-token (share on t − 1 ≥
`prev_threshold`), first-token "sink" (share on 0 ≥ `first_threshold`), self (share on t ≥
`self_threshold`), local (mean distance ≤ `local_distance`) or broad. Ablating a head zeroes its
output before the output projection, at every position; the loss increase per head is the heatmap.

FFN neurons as memories (`neuron_memories`). Neuron i of layer l reads the residual stream through
row i of c_fc (its "key") and, when it fires (GELU output a), writes a · column i of c_proj (its
"value") back. Its key is shown as the validation contexts where it fires most; its value as the
tokens that column promotes through the final LayerNorm's scale and the unembedding, W_U·(γ ⊙ w).
Selectivity = (max activation − mean) / std over every validation position: a neuron that fires
rarely and strongly ranks first.

Facts (`studies/facts.py`) are probed on a model of word-sized units, not here: on bytes, a "fact"
is one next letter. `known_words`, `made_up_name` and `entropy` serve its made-up entities.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
from matplotlib.figure import Figure

from ..data import Blocks, TokenBlocks
from ..device import resolve_device
from ..errors import ConfigError
from ..models.transformer import Transformer, require_transformer
from ..plots import plot_head_maps
from ..train_step import evaluate
from .heads import attention_over_blocks, classify_heads, head_ablation, head_statistics, heads_differ_test
from .inside_settings import InsideSettings

__all__ = [
    "Decode",
    "Encode",
    "HeadsResult",
    "attention_heads",
    "entropy",
    "ffn_memories",
    "known_words",
    "made_up_name",
    "marked",
    "neuron_hooks",
    "neuron_memories",
    "plot_head_ablation",
    "token_text",
    "value_vectors",
]

Decode = Callable[[list[int]], str]
Encode = Callable[[str], list[int]]


# ----------------------------------------------------------------------------------------------
# FFN neurons


@contextmanager
def neuron_hooks(
    model: Transformer, zero: dict[int, list[int]] | None = None, record: list | None = None
) -> Iterator[None]:
    """Zero FFN neurons {layer: [index, ...]} (at every position) and/or record each layer's GELU output (B, T, 4C)."""
    handles = []
    for layer, block in enumerate(model.blocks):

        def hook(mod, args, out, layer=layer):
            if zero and layer in zero:
                out = out.clone()
                out[..., zero[layer]] = 0
            if record is not None:
                record.append((layer, out.detach()))
            return out

        handles.append(block.mlp.gelu.register_forward_hook(hook))
    try:
        yield
    finally:
        for hnd in handles:
            hnd.remove()


def value_vectors(model: Transformer) -> list[torch.Tensor]:
    """Per layer (V, 4C): each neuron's output column mapped to the vocabulary through γ of ln_f and W_U."""
    if not isinstance(model.ln_f, nn.LayerNorm):
        raise ConfigError(
            "the neuron study needs a pre-LN Transformer (norm: pre), whose final LayerNorm reads the residual stream"
        )
    gamma = model.ln_f.weight.detach()  # (C,)
    W_U = model.lm_head.weight.detach()  # (V, C)
    out = []
    for block in model.blocks:
        w = block.mlp.c_proj.weight.detach()  # (C, 4C)
        w = w - w.mean(0, keepdim=True)  # the LayerNorm removes each vector's mean
        out.append(W_U @ (gamma[:, None] * w))  # (V, 4C)
    return out


@torch.no_grad()
def neuron_memories(model: Transformer, blocks: Blocks, s: InsideSettings, decode: Decode, device) -> list[dict]:
    n = min(blocks.n_blocks, s.stat_blocks)
    acts: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    model.eval()
    for start in range(0, n, s.batch_size):
        x, _ = blocks.batch(np.arange(start, min(start + s.batch_size, n)), device)
        rec: list = []
        with neuron_hooks(model, record=rec):
            model(x)
        for layer, a in rec:
            acts[layer].append(a.float().cpu())
    values = value_vectors(model)
    rows = []
    stacked: list[torch.Tensor] = []  # per layer (n, T, 4C)
    for layer, chunks in enumerate(acts):
        a = torch.cat(chunks)  # (n, T, 4C)
        flat = a.reshape(-1, a.shape[-1])  # (n·T, 4C)
        sel = (flat.max(0).values - flat.mean(0)) / flat.std(0).clamp(min=1e-6)
        for i in range(flat.shape[1]):
            rows.append(
                {
                    "layer": layer,
                    "neuron": i,
                    "selectivity": float(sel[i]),
                    "max_activation": float(flat[:, i].max()),
                    "mean_activation": float(flat[:, i].mean()),
                }
            )
        stacked.append(a)
    rows.sort(key=lambda r: -r["selectivity"])
    shown = []
    T = blocks.block_size
    for r in rows[: s.top_neurons]:
        a = stacked[r["layer"]][..., r["neuron"]].reshape(-1)
        top = torch.topk(a, s.top_contexts).indices.tolist()
        contexts = []
        for flat_idx in top:
            b, t = divmod(flat_idx, T)
            ids = [int(v) for v in blocks.x[b, max(0, t - s.context_tokens) : t + 1]]
            after = [int(v) for v in blocks.x[b, t + 1 : t + 4]]
            contexts.append(f"{marked(ids, decode, after)} ({a[flat_idx]:.2f})")
        promoted = torch.topk(values[r["layer"]][:, r["neuron"]], s.value_tokens + 1).indices.tolist()
        shown.append(
            {
                **r,
                "key_contexts": contexts,
                "value_tokens": [token_text(t, decode) for t in promoted if t != 0][: s.value_tokens],
            }
        )
    return shown


def marked(ids: list[int], decode: Decode, after: Sequence[int] = ()) -> str:
    """The text of `ids` with the last token's text in [[ ]]. A byte-level token that is only part of a
    character decodes to a replacement mark alone; then the mark takes in the tokens before it that
    start the character, or the tokens `after` it that finish it, so it shows the character."""
    after = list(after)
    for j in range(1, min(4, len(ids)) + 1):  # a UTF-8 character spans at most 4 byte tokens
        for k in range(0, min(3, len(after)) + 1):
            tail = decode(ids[-j:] + after[:k])
            if "\ufffd" not in tail:
                return f"{decode(ids[:-j])}[[{tail}]]"
    return f"{decode(ids[:-1])}[[{decode(ids[-1:])}]]"


def token_text(t: int, decode: Decode) -> str:
    """A token's text, or `<byte #id>` for a byte-level token that is no character alone."""
    text = decode([t])
    return f"<byte #{t}>" if "\ufffd" in text else text


# ----------------------------------------------------------------------------------------------
# Made-up entities (for studies/facts.py)

_SYLLABLES = ["bra", "zon", "kel", "vix", "dru", "mor", "qua", "tesh", "lun", "gor", "fen", "yst", "plo", "wek"]


def known_words(texts) -> set[str]:
    """The lowercased words (runs of letters) of an iterable of texts."""
    out: set[str] = set()
    for t in texts:
        out.update(w.lower() for w in re.findall(r"[^\W\d_]+", t))
    return out


def made_up_name(rng: np.random.Generator, known: set[str]) -> str:
    """A capitalised pseudo-word that is none of the `known` words ."""
    for _ in range(1000):
        name = "".join(rng.choice(_SYLLABLES, size=3)).capitalize()
        if name.lower() not in known:
            return name
    raise RuntimeError("could not make up a name absent from the corpus")


def entropy(p: torch.Tensor) -> float:
    return float(-(p * p.clamp(min=1e-30).log()).sum())


# ----------------------------------------------------------------------------------------------
# Figures and the study


def plot_head_ablation(inc: np.ndarray, kinds: list[dict]) -> Figure:
    L, H = inc.shape
    fig = Figure(figsize=(1.6 * H + 2, 1.1 * L + 1.5), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(inc, cmap="magma")
    for r in kinds:
        ax.text(
            r["head"],
            r["layer"],
            f"{inc[r['layer'], r['head']]:+.3f}\n{r['kind']}",
            ha="center",
            va="center",
            fontsize=8,
            color="cyan",
        )
    ax.set_xticks(range(H), [f"head {h}" for h in range(H)])
    ax.set_yticks(range(L), [f"layer {layer}" for layer in range(L)])
    ax.set_title("validation loss increase with one head zeroed (nats)")
    fig.colorbar(im, ax=ax)
    return fig


@dataclass
class HeadsResult:
    heads: list[dict]
    ablation: list[dict]
    base_loss: float
    one_head_loss: float | None
    differ: list[dict] = field(default_factory=list)  # per layer: costliest against cheapest head, held out
    figures: dict[str, Figure] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        out = {
            "heads/val_loss": self.base_loss,
            "heads/max_ablation_increase": max(r["loss_increase"] for r in self.ablation),
            "heads/max_row_sum_error": max(r["max_row_sum_error"] for r in self.heads),
        }
        for k in ("previous-token", "first-token sink", "self", "local", "broad"):
            out[f"heads/count_{k.replace(' ', '_')}"] = float(sum(r["kind"] == k for r in self.heads))
        if self.one_head_loss is not None:
            out["heads/one_head_val_loss"] = self.one_head_loss
            out["heads/one_head_minus_multi_head"] = self.one_head_loss - self.base_loss
        if self.differ:
            best = max(self.differ, key=lambda r: r["low"])
            out["heads/layers_whose_heads_differ"] = float(sum(r["low"] > 0 for r in self.differ))
            out["heads/largest_heldout_difference_low"] = best["low"]
        return out


def attention_heads(
    model: nn.Module,
    val: Blocks,
    s: InsideSettings,
    *,
    decode: Decode,
    encode: Encode,
    one_head: nn.Module | None = None,
) -> HeadsResult:
    device, _ = resolve_device(s.device)
    model = require_transformer(model, "the attention-heads study").to(device).eval()
    blocks = val.crop(min(val.block_size, model.config.block_size))
    n = min(blocks.n_blocks, s.stat_blocks)
    heads = classify_heads(head_statistics(attention_over_blocks(model, blocks, n, s.batch_size, device)), s)
    base, inc, per_block = head_ablation(model, blocks, n, s.batch_size, device)
    ablation = [
        {"layer": r["layer"], "head": r["head"], "kind": r["kind"], "loss_increase": float(inc[r["layer"], r["head"]])}
        for r in heads
    ]
    one_loss = None
    if one_head is not None:
        one_head = one_head.to(device).eval()
        sub = TokenBlocks(blocks.x[:n], blocks.y[:n])
        one_loss = evaluate(one_head, sub, batch_size=s.batch_size, max_batches=None, device=device)
    figures = {}
    seqs = [encode(t)[: s.map_tokens] for t in s.sentences] or [
        [int(v) for v in blocks.x[i, : s.map_tokens]] for i in range(min(s.map_sentences, blocks.n_blocks))
    ]
    for i, ids in enumerate(seqs):
        with torch.no_grad():
            w = [t.cpu() for t in model.attention_weights(torch.tensor([ids], device=device))]
        figures[f"attention_map_{i}"] = plot_head_maps(
            w, [decode([t]) for t in ids], f"attention weights (query rows → key columns): {decode(ids)[:80]!r}"
        )
    figures["head_ablation"] = plot_head_ablation(inc, heads)
    return HeadsResult(
        heads=heads,
        ablation=ablation,
        base_loss=base,
        one_head_loss=one_loss,
        differ=heads_differ_test(per_block),
        figures=figures,
    )


def ffn_memories(model: nn.Module, val: Blocks, s: InsideSettings, *, decode: Decode) -> list[dict]:
    """The most selective FFN neurons of the trained model, each with its keys (top contexts) and values."""
    device, _ = resolve_device(s.device)
    model = require_transformer(model, "the FFN-memories study").to(device).eval()
    blocks = val.crop(min(val.block_size, model.config.block_size))
    return neuron_memories(model, blocks, s, decode, device)
