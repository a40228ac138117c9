"""Looking inside a trained Transformer: what each head attends to, FFN neurons as key-value memories,
and where confident predictions about things the model never saw come from.

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

Fact probe (`find_fact_prompts`, `attribute_neurons`, `ablate_neurons`). Prompts from validation
text whose next token the model predicts correctly with probability ≥ `min_confidence` (the answer a
word of three letters or more). Attribution of neuron (l, i) to the answer's logit is its direct
effect: a_li · W_U[answer] · (γ ⊙ (w_li − mean(w_li))) / σ, with σ the final residual's standard
deviation at the prompt's last position (the final LayerNorm linearised there; exact for the
direct path, which ignores what later layers do with the neuron's output). The top-k neurons by
attribution are zeroed (at every position) and the answer's probability compared with zeroing k
random neurons of the same layers.

Confidence without knowledge (`made_up_variant`, `confidence_gap`). Each fact prompt's last
capitalised word (an entity) is replaced, everywhere in the prompt, by a made-up name that the
corpus never contains; the model's top-1 probability and entropy on both, and the fact
neurons' activation on both, are reported as measured, whatever they show.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field

from ..data import IGNORE_INDEX, TokenBlocks
from ..device import DeviceSetting, resolve_device
from ..errors import ConfigError
from ..plots import plot_head_maps
from ..training import evaluate

# The heads' measures (heads), re-exported: tests, pipelines and the memory study import them from here.
from .heads import (
    attention_over_blocks,
    classify_heads,
    head_ablation,
    head_statistics,
    heads_differ_test,
    heads_zeroed,
)

__all__ = [
    "Decode", "Encode", "HeadsResult", "InsideSettings", "MemoriesResult", "ablate_neurons", "attention_heads",
    "attention_over_blocks", "attribute_neurons", "classify_heads", "confidence_gap", "entropy", "fact_probe",
    "ffn_memories", "find_fact_prompts", "head_ablation", "head_statistics", "heads_zeroed", "heldout_test",
    "known_words", "last_position", "made_up_name", "made_up_variant", "marked", "neuron_hooks", "neuron_memories",
    "plot_fact_probe", "plot_head_ablation", "token_text", "value_vectors",
]

Decode = Callable[[list[int]], str]
Encode = Callable[[str], list[int]]


class InsideSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sentences: list[str] = Field(
        [], description="Sentences whose attention maps are drawn (empty: the start of the first validation blocks)."
    )
    map_sentences: int = Field(2, ge=1, description="Validation excerpts drawn when `sentences` is empty.")
    map_tokens: int = Field(20, ge=2, description="Tokens per attention map (readable at that size).")
    stat_blocks: int = Field(
        128,
        ge=1,
        description="Validation blocks for head statistics, head ablation, neuron activations and fact prompts.",
    )
    prev_threshold: float = Field(
        0.4, gt=0, le=1, description="Previous-token head: at least this share of attention on t − 1."
    )
    first_threshold: float = Field(0.4, gt=0, le=1, description="Sink head: at least this share on the first position.")
    self_threshold: float = Field(
        0.4, gt=0, le=1, description="Self head: at least this share on the query's own position."
    )
    local_distance: float = Field(
        4.0, gt=0, description="Local head: mean attention distance at most this many tokens."
    )
    top_neurons: int = Field(6, ge=1, description="Most selective FFN neurons shown with their keys and values.")
    top_contexts: int = Field(4, ge=1, description="Top-activating contexts shown per neuron.")
    context_tokens: int = Field(8, ge=1, description="Tokens of context shown before each activating token.")
    value_tokens: int = Field(5, ge=1, description="Tokens each shown neuron's output promotes most.")
    n_facts: int = Field(
        16, ge=1, description="Fact prompts probed (confident, correct next-word predictions from validation)."
    )
    fact_context: int = Field(
        48, ge=2, description="Tokens of each fact prompt (48 bytes are about 9 words; a BPE token is 3–4 bytes)."
    )
    min_confidence: float = Field(0.15, gt=0, lt=1, description="A fact prompt's answer probability at least this.")
    ablate_k: int = Field(
        8, ge=1, description="Neurons zeroed per fact prompt (top by attribution, and as many random ones)."
    )
    random_draws: int = Field(5, ge=1, description="Random draws of k neurons for the control.")
    batch_size: int = Field(16, ge=1, description="Blocks per forward pass.")
    seed: int = Field(0, description="Seed of the random neuron draws and the made-up names.")
    device: DeviceSetting = Field("auto", description="Where to run: 'auto' = CUDA if present, else CPU.")


# ----------------------------------------------------------------------------------------------
# FFN neurons


@contextmanager
def neuron_hooks(
    model: nn.Module, zero: dict[int, list[int]] | None = None, record: list | None = None
) -> Iterator[None]:
    """Zero FFN neurons {layer: [index, ...]} (at every position) and/or record each layer's GELU output (B, T, 4C)."""
    handles = []
    for layer, block in enumerate(model.h):
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


def value_vectors(model: nn.Module) -> list[torch.Tensor]:
    """Per layer (V, 4C): each neuron's output column mapped to the vocabulary through γ of ln_f and W_U."""
    if not isinstance(model.ln_f, nn.LayerNorm):
        raise ConfigError(
            "the neuron study needs a pre-LN Transformer (norm: pre), whose final LayerNorm reads the residual stream"
        )
    gamma = model.ln_f.weight.detach()  # (C,)
    W_U = model.lm_head.weight.detach()  # (V, C)
    out = []
    for block in model.h:
        w = block.mlp.c_proj.weight.detach()  # (C, 4C)
        w = w - w.mean(0, keepdim=True)  # the LayerNorm removes each vector's mean
        out.append(W_U @ (gamma[:, None] * w))  # (V, 4C)
    return out


@torch.no_grad()
def neuron_memories(model: nn.Module, blocks: TokenBlocks, s: InsideSettings, decode: Decode, device) -> list[dict]:
    n = min(blocks.n_blocks, s.stat_blocks)
    acts: list[list[torch.Tensor]] = [[] for _ in model.h]
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
        acts[layer] = a
    rows.sort(key=lambda r: -r["selectivity"])
    shown = []
    T = blocks.block_size
    for r in rows[: s.top_neurons]:
        a = acts[r["layer"]][..., r["neuron"]].reshape(-1)
        top = torch.topk(a, s.top_contexts).indices.tolist()
        contexts = []
        for flat_idx in top:
            b, t = divmod(flat_idx, T)
            ids = [int(v) for v in blocks.x[b, max(0, t - s.context_tokens):t + 1]]
            after = [int(v) for v in blocks.x[b, t + 1:t + 4]]
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


def marked(ids: list[int], decode: Decode, after: list[int] = ()) -> str:
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


def _is_word(prompt_text: str, answer_text: str) -> bool:
    """A word's worth of answer: a token holding three letters, or (over bytes or characters) the first
    letter of a word, the prompt ending in white space."""
    if re.search(r"[A-Za-z]{3,}", answer_text):
        return True
    return re.fullmatch(r"[A-Za-z]", answer_text) is not None and prompt_text[-1:].isspace()


@torch.no_grad()
def find_fact_prompts(model: nn.Module, blocks: TokenBlocks, s: InsideSettings, decode: Decode, device) -> list[dict]:
    """Confident, correct next-word predictions in validation blocks: {prompt ids, answer, probability}."""
    n = min(blocks.n_blocks, s.stat_blocks)
    cands = []
    model.eval()
    for start in range(0, n, s.batch_size):
        idx = np.arange(start, min(start + s.batch_size, n))
        x, y = blocks.batch(idx, device)
        probs = F.softmax(model(x)[0].float(), -1)  # (B, T, V)
        p, top = probs.max(-1)  # (B, T)
        ok = (top == y) & (y != IGNORE_INDEX) & (p >= s.min_confidence)
        ok[:, : s.fact_context - 1] = False  # a full prompt before the answer
        for b, t in ok.nonzero().tolist():
            cands.append((float(p[b, t]), int(idx[b]), t, int(y[b, t])))
    cands.sort(reverse=True)
    facts, by_answer = [], {}
    for p, b, t, ans in cands:
        prompt = [int(v) for v in blocks.x[b, t - s.fact_context + 1:t + 1]]
        if ans in by_answer:  # a second, different prompt of the same answer: the held-out prompt of that fact
            f = by_answer[ans]
            if "heldout_prompt" not in f and prompt != f["prompt"]:
                f.update(heldout_prompt=prompt, heldout_probability=p, heldout_text=decode(prompt))
            continue
        if len(facts) == s.n_facts or not _is_word(decode(prompt), decode([ans])):
            continue
        f = {
            "prompt": prompt,
            "answer": ans,
            "probability": p,
            "prompt_text": decode(prompt),
            "answer_text": decode([ans]),
        }
        facts.append(f)
        by_answer[ans] = f
    return facts


@torch.no_grad()
def last_position(
    model: nn.Module, prompt: list[int], device, zero: dict[int, list[int]] | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Next-token probabilities (V,) after the prompt and each layer's neuron activations there (4C,)."""
    x = torch.tensor([prompt], device=device)
    rec: list = []
    with neuron_hooks(model, zero=zero, record=rec):
        logits = model(x)[0][0, -1].float()
    return F.softmax(logits, -1), [a[0, -1].float() for _, a in sorted(rec, key=lambda r: r[0])]


@torch.no_grad()
def attribute_neurons(model: nn.Module, prompt: list[int], answer: int, device) -> torch.Tensor:
    """(n_layer, 4C) direct effect of each neuron on the answer's logit at the prompt's last position."""
    x = torch.tensor([prompt], device=device)
    rec: list = []
    resid: list = []
    handle = model.ln_f.register_forward_pre_hook(lambda mod, args: resid.append(args[0][0, -1].detach()))
    try:
        with neuron_hooks(model, record=rec):
            model(x)
    finally:
        handle.remove()
    r = resid[0].float()
    sigma = torch.sqrt(r.var(unbiased=False) + model.ln_f.eps)
    acts = torch.stack([a[0, -1].float() for _, a in sorted(rec, key=lambda t: t[0])])  # (L, 4C)
    direct = torch.stack([v[answer] for v in value_vectors(model)]).float() / sigma  # (L, 4C)
    return acts * direct


def _as_zero_map(neurons: list[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for layer, i in neurons:
        out.setdefault(layer, []).append(i)
    return out


def ablate_neurons(model: nn.Module, prompt: list[int], answer: int, neurons: list[tuple[int, int]], device) -> float:
    """The answer's probability with `neurons` [(layer, index), ...] zeroed."""
    return float(last_position(model, prompt, device, zero=_as_zero_map(neurons))[0][answer])


def fact_probe(model: nn.Module, facts: list[dict], s: InsideSettings, device) -> list[dict]:
    rng = np.random.default_rng(s.seed)
    width = model.h[0].mlp.c_fc.out_features
    rows = []
    for f in facts:
        attr = attribute_neurons(model, f["prompt"], f["answer"], device)  # (L, 4C)
        top = torch.topk(attr.reshape(-1), s.ablate_k).indices.tolist()
        neurons = [divmod(i, width) for i in top]
        p0 = float(last_position(model, f["prompt"], device)[0][f["answer"]])
        p_top = ablate_neurons(model, f["prompt"], f["answer"], neurons, device)
        chosen = set(neurons)
        p_rand = []
        for _ in range(s.random_draws):
            draw = []
            for layer, _i in neurons:  # as many per layer as the top-k hold
                while True:
                    j = int(rng.integers(width))
                    if (layer, j) not in chosen and (layer, j) not in draw:
                        break
                draw.append((layer, j))
            p_rand.append(ablate_neurons(model, f["prompt"], f["answer"], draw, device))
        row = {
            "prompt_text": f["prompt_text"], "answer_text": f["answer_text"], "p_answer": p0, "p_top_k_zeroed": p_top,
            "p_random_k_zeroed": float(np.mean(p_rand)), "top_neurons": [f"L{layer}.{i}" for layer, i in neurons],
            "top_attribution": float(attr.reshape(-1)[top[0]]), "_neurons": neurons,
        }
        if "heldout_prompt" in f:
            row.update(
                heldout_test(model, f["heldout_prompt"], f["answer"], neurons, s, rng, device),
                heldout_text=f["heldout_text"],
            )
        rows.append(row)
    return rows


def heldout_test(model: nn.Module, prompt: list[int], answer: int, neurons: list[tuple[int, int]], s: InsideSettings,
                 rng: np.random.Generator, device) -> dict:
    """The neurons selected on one prompt, zeroed on another prompt of the same answer (held out: the
    selection never saw it), against random neurons of the same layers matched in activation there
    (each drawn among the 10 neurons nearest in |activation| rank on either side of the one it replaces,
    further out where those are all taken)."""
    p0, acts = last_position(model, prompt, device)
    p_top = ablate_neurons(model, prompt, answer, neurons, device)
    chosen = set(neurons)
    ranks = {layer: torch.argsort(a.abs(), descending=True).tolist() for layer, a in enumerate(acts)}
    pos = {layer: {n: r for r, n in enumerate(order)} for layer, order in ranks.items()}
    p_rand = []
    for _ in range(s.random_draws):
        draw: list[tuple[int, int]] = []
        for layer, i in neurons:
            r, width, near = pos[layer][i], 10, []
            while not near:  # widened when the chosen neurons fill the ranks around r (at the top of a layer)
                near = [n for n in ranks[layer][max(0, r - width) : r + width + 1]
                        if (layer, n) not in chosen and (layer, n) not in draw]
                width *= 2
            draw.append((layer, int(rng.choice(near))))
        p_rand.append(ablate_neurons(model, prompt, answer, draw, device))
    return {
        "heldout_p_answer": float(p0[answer]),
        "heldout_p_top_k_zeroed": p_top,
        "heldout_p_matched_random_zeroed": float(np.mean(p_rand)),
    }


# ----------------------------------------------------------------------------------------------
# Confidence without knowledge

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


def made_up_variant(prompt_text: str, rng: np.random.Generator, known: set[str]) -> tuple[str, str, str] | None:
    """(variant text, entity replaced, made-up name): the prompt's last capitalised word replaced
    everywhere by a made-up name; None when the prompt has no capitalised word."""
    words = re.findall(r"\b[A-Z][a-z]{2,}\b", prompt_text)
    if not words:
        return None
    entity = words[-1]
    name = made_up_name(rng, known)
    return re.sub(rf"\b{re.escape(entity)}\b", name, prompt_text), entity, name


def entropy(p: torch.Tensor) -> float:
    return float(-(p * p.clamp(min=1e-30).log()).sum())


def confidence_gap(
    model: nn.Module, probe: list[dict], s: InsideSettings, encode: Encode, known: set[str], device
) -> list[dict]:
    rng = np.random.default_rng(s.seed)
    bs = model.config.block_size
    rows = []
    for f in probe:
        v = made_up_variant(f["prompt_text"], rng, known)
        if v is None:
            continue
        text, entity, name = v
        real_ids = encode(f["prompt_text"])[-bs:]
        fake_ids = encode(text)[-bs:]
        p_real, a_real = last_position(model, real_ids, device)
        p_fake, a_fake = last_position(model, fake_ids, device)
        fact_real = float(np.mean([a_real[layer][i].item() for layer, i in f["_neurons"]]))
        fact_fake = float(np.mean([a_fake[layer][i].item() for layer, i in f["_neurons"]]))
        rows.append({
            "entity": entity, "made_up": name, "variant_text": text,
            "top1_p_real": float(p_real.max()), "top1_p_made_up": float(p_fake.max()),
            "entropy_real": entropy(p_real), "entropy_made_up": entropy(p_fake),
            "fact_neurons_activation_real": fact_real, "fact_neurons_activation_made_up": fact_fake,
        })
    return rows


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


def plot_fact_probe(probe: list[dict], gap: list[dict]) -> Figure:
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    x = np.arange(len(probe))
    ax.bar(x - 0.27, [r["p_answer"] for r in probe], 0.27, label="model")
    ax.bar(x, [r["p_random_k_zeroed"] for r in probe], 0.27, label="k random neurons zeroed")
    ax.bar(x + 0.27, [r["p_top_k_zeroed"] for r in probe], 0.27, label="top-k attributed zeroed")
    ax.set_xticks(x, [r["answer_text"].strip()[:10] for r in probe], rotation=60, fontsize=8)
    ax.set_ylabel("probability of the answer")
    ax.set_title("fact probe: zeroing the neurons that write the answer")
    ax.legend(fontsize=8)
    if gap:
        ax2.scatter([r["top1_p_real"] for r in gap], [r["top1_p_made_up"] for r in gap])
        ax2.plot([0, 1], [0, 1], "k:", lw=0.8)
        ax2.set_xlabel("top-1 probability, real entity")
        ax2.set_ylabel("top-1 probability, made-up entity")
    ax2.set_title("confidence with and without knowledge")
    for a in (ax, ax2):
        a.grid(True, alpha=0.3)
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


def attention_heads(model: nn.Module, val: TokenBlocks, s: InsideSettings, *, decode: Decode, encode: Encode,
                    one_head: nn.Module | None = None) -> HeadsResult:
    device, _ = resolve_device(s.device)
    model = model.to(device).eval()
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
    return HeadsResult(heads=heads, ablation=ablation, base_loss=base, one_head_loss=one_loss,
                       differ=heads_differ_test(per_block), figures=figures)


@dataclass
class MemoriesResult:
    neurons: list[dict]
    probe: list[dict]
    gap: list[dict]
    figures: dict[str, Figure] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"ffn/fact_prompts": float(len(self.probe)), "ffn/made_up_pairs": float(len(self.gap))}
        if self.probe:
            out["ffn/p_answer_mean"] = float(np.mean([r["p_answer"] for r in self.probe]))
            out["ffn/p_top_k_zeroed_mean"] = float(np.mean([r["p_top_k_zeroed"] for r in self.probe]))
            out["ffn/p_random_k_zeroed_mean"] = float(np.mean([r["p_random_k_zeroed"] for r in self.probe]))
            held = [r for r in self.probe if "heldout_p_top_k_zeroed" in r]
            out["ffn/heldout_facts"] = float(len(held))
            if held:
                # per fact: how much more the selected neurons lower the held-out answer than matched random ones
                d = np.array([r["heldout_p_matched_random_zeroed"] - r["heldout_p_top_k_zeroed"] for r in held])
                boots = np.random.default_rng(0).choice(d, (1000, len(d))).mean(1)
                out.update(
                    {
                        "ffn/heldout_p_answer_mean": float(np.mean([r["heldout_p_answer"] for r in held])),
                        "ffn/heldout_p_top_k_zeroed_mean": float(np.mean([r["heldout_p_top_k_zeroed"] for r in held])),
                        "ffn/heldout_p_matched_random_zeroed_mean": float(
                            np.mean([r["heldout_p_matched_random_zeroed"] for r in held])
                        ),
                        "ffn/heldout_extra_drop_mean": float(d.mean()),
                        "ffn/heldout_extra_drop_lo": float(np.percentile(boots, 2.5)),
                        "ffn/heldout_extra_drop_hi": float(np.percentile(boots, 97.5)),
                    }
                )
        if self.gap:
            for k in (
                "top1_p_real",
                "top1_p_made_up",
                "entropy_real",
                "entropy_made_up",
                "fact_neurons_activation_real",
                "fact_neurons_activation_made_up",
            ):
                out[f"ffn/{k}_mean"] = float(np.mean([r[k] for r in self.gap]))
        return out


def ffn_memories(
    model: nn.Module, val: TokenBlocks, s: InsideSettings, *, decode: Decode, encode: Encode, known: set[str]
) -> MemoriesResult:
    """`known`: every word of the corpus (lowercased; `known_words`), which a made-up name must not be."""
    device, _ = resolve_device(s.device)
    model = model.to(device).eval()
    blocks = val.crop(min(val.block_size, model.config.block_size))
    neurons = neuron_memories(model, blocks, s, decode, device)
    facts = find_fact_prompts(model, blocks, s, decode, device)
    probe = fact_probe(model, facts, s, device)
    gap = confidence_gap(model, probe, s, encode, known, device)
    figures = {"fact_probe": plot_fact_probe(probe, gap)}
    for r in probe:
        r["_neurons"] = [list(n) for n in r["_neurons"]]
    return MemoriesResult(neurons=neurons, probe=probe, gap=gap, figures=figures)
