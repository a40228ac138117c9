"""The article's own examples, run through this run's tokenizer and trained models.

- 我爱你 / 你爱我 (`word_order`): the two sentences through the real tokenizer; the trained
  Transformer's first-layer attention scores (q·k/√d, head 0) on each, with its positional encoding
  and with it switched off. Without it the second sentence's scores are the first's with rows and
  columns permuted (attention sees a bag of tokens); with it they differ. Where the tokenizer does
  not split the two sentences into the same tokens in another order (a merge across characters),
  the second sentence is built as the first's tokens permuted character by character and the
  result says so.
- 今天 天气 真 不错 (`shifted_pairs`): the sentence cut into words by jieba through a word-level
  tokenizer, and the input/label pairs the labels stage makes of it (Y is X shifted by one).
- the juice (`attention_mix`): for one query, the trained Transformer's attention over the words of
  a sentence (heads of the last layer averaged, sub-word tokens summed into their word): a weighted
  mix, against the one-hot "pick one" the article contrasts it with. The model reads English, so the
  sentence is English, of the article's shape.
- the LSTM's gates (`lstm_gates`): forget, input and output gate activations and the memory cell's
  size, token by token, of the trained LSTM's first layer on a real sentence, computed with the
  cell's equations from its weights (PyTorch's gate order i, f, g, o).

These are observations (tables for the report), not verdicts; the order-symmetry verdict is the
claim `position_breaks_order_symmetry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn
from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from ..models.recurrent import RecurrentLM
from ..models.transformer import Transformer, require_transformer

ZH_A, ZH_B = "我爱你", "你爱我"
SHIFT_SENTENCE = "今天 天气 真 不错"  # as the article writes it; jieba cuts each run of Han characters
SHIFT_CONTEXT = ["今天 天气 真 不错", "今天 天气 很 好", "我 爱 你", "你 爱 我", "天气 真 好，今天 不错"]


class ExamplesSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mix_sentence: str = Field(
        default="Apple announced a new phone and its market value rose",
        description="Sentence of the attention-mix example.",
    )
    mix_query: str = Field(
        default="rose", description="The word whose attention over the sentence is shown (its last token is the query)."
    )
    gate_sentence: str = Field(
        default="The history of the city begins in the second century",
        description="Sentence the LSTM's gates are read on.",
    )


@dataclass
class ExamplesResult:
    word_order: dict
    shifted_pairs: list[dict]
    attention_mix: list[dict]
    lstm_gates: list[dict]
    metrics: dict[str, float]
    texts: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# 我爱你 / 你爱我


@torch.no_grad()
def first_layer_scores(model: Transformer, ids: list[int], use_position: bool) -> torch.Tensor:
    """The first layer's raw attention scores q·k·scale (nh, T, T), before mask and softmax, with the
    model's positional encoding (learned/sinusoidal added to the input, or RoPE on q and k) or without."""
    model.eval()
    device = next(model.parameters()).device
    idx = torch.tensor([ids], device=device)
    x = model.wte(idx).float()  # (1, T, C)
    T = x.shape[1]
    if use_position and model.pos is not None:
        x = x + model.pos(T).float()
    block = model.blocks[0]
    h = block.ln_1(x) if block.pre_norm else x
    a = block.attn
    qkv = a.c_attn(h).view(1, T, 3, a.n_head, a.head_dim)
    if use_position and model.rope is not None:
        qkv = model.rope.rotate_qkv(qkv, 0)
    q, k, _ = (t.transpose(1, 2) for t in qkv.unbind(2))  # (1, nh, T, hs)
    return (q @ k.transpose(-2, -1))[0] * a.scale  # (nh, T, T)


def _char_tokens(encode: Callable[[str], list[int]], text: str) -> list[list[int]]:
    return [encode(ch) for ch in text]


def word_order(
    model: Transformer,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    a: str = ZH_A,
    b: str = ZH_B,
) -> dict:
    chars_a = _char_tokens(encode, a)
    ids_a, ids_b = encode(a), encode(b)
    spans, start = {}, 0
    for ch, t in zip(a, chars_a):
        spans[ch] = list(range(start, start + len(t)))
        start += len(t)
    perm = [i for ch in b for i in spans.get(ch, [])]
    same_tokens = (
        ids_a == [i for t in chars_a for i in t] and len(perm) == len(ids_a) and [ids_a[i] for i in perm] == ids_b
    )
    structural = not same_tokens
    if structural:  # the tokenizer merged across characters: permute the first sentence's tokens by character
        ids_b = [ids_a[i] for i in perm] if len(perm) == len(ids_a) else ids_a[::-1]
        perm = perm if len(perm) == len(ids_a) else list(range(len(ids_a)))[::-1]
    p = torch.tensor(perm)
    out: dict[str, Any] = {
        "a": a,
        "b": b,
        "tokens_a": [decode([i]) for i in ids_a],
        "tokens_b": [decode([i]) for i in ids_b],
        "ids_a": ids_a,
        "ids_b": ids_b,
        "permutation": perm,
        "structural": structural,
    }
    for use, name in ((False, "without_position"), (True, "with_position")):
        sa, sb = first_layer_scores(model, ids_a, use), first_layer_scores(model, ids_b, use)
        diff = float((sb - sa[:, p][:, :, p]).abs().max() / sa.abs().max().clamp_min(1e-12))
        out[name] = {"scores_a": sa[0].tolist(), "scores_b": sb[0].tolist(), "rel_diff_from_permuted": diff}
    return out


def _matrix_md(title: str, labels: list[str], m: list[list[float]]) -> str:
    head = "| " + title + " | " + " | ".join(repr(t)[1:-1] or "∅" for t in labels) + " |"
    rows = [head, "|---|" + "---:|" * len(labels)]
    rows += [
        "| " + (repr(labels[i])[1:-1] or "∅") + " | " + " | ".join(f"{v:.2f}" for v in row) + " |"
        for i, row in enumerate(m)
    ]
    return "\n".join(rows)


def word_order_markdown(w: dict) -> str:
    parts = [
        f"{w['a']} → tokens {w['tokens_a']}; {w['b']} → tokens {w['tokens_b']} (ids {w['ids_a']} / {w['ids_b']}).",
        (
            "The tokenizer merges across characters, so the second sentence here is the first's tokens permuted "
            "character by "
            "character (the structural version)."
            if w["structural"]
            else f"The second sentence's tokens are the first's in another order (permutation {w['permutation']})."
        ),
        "",
        f"First layer, head 0, raw scores q·k/√d. **Without positional encoding** the scores of {w['b']} equal those "
        f"of {w['a']} with rows "
        f"and columns permuted (relative difference {w['without_position']['rel_diff_from_permuted']:.2g}); **with "
        f"it** they differ "
        f"(relative difference {w['with_position']['rel_diff_from_permuted']:.2g}).",
    ]
    for name, label in (
        ("without_position", "without positional encoding"),
        ("with_position", "with positional encoding"),
    ):
        parts += [
            "",
            f"**{label}**",
            "",
            _matrix_md(w["a"], w["tokens_a"], w[name]["scores_a"]),
            "",
            _matrix_md(w["b"], w["tokens_b"], w[name]["scores_b"]),
        ]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------------
# 今天 天气 真 不错


def shifted_pairs(sentence: str = SHIFT_SENTENCE, context: list[str] = SHIFT_CONTEXT) -> list[dict]:
    """The sentence through a word-level tokenizer (jieba for Han text) trained on a few sentences,
    packed into one block by the labels stage's own code: position, input token, label token."""
    from ..labels import pack_blocks, token_stream
    from ..tokenizer import TokenizerSettings, train_tokenizer

    tok = train_tokenizer(context, TokenizerSettings(kind="word", vocab_size=64, min_count=1))
    stream = token_stream(tok, [sentence])  # ids, then [EOS]
    blocks = pack_blocks(stream, len(stream) - 1, tok.get_vocab_size())
    word = tok.id_to_token
    return [
        {"position": t, "input (X)": word(int(x)), "label (Y)": word(int(y)) if y >= 0 else "(ignored)"}
        for t, (x, y) in enumerate(zip(blocks.x[0], blocks.y[0]))
    ]


# --------------------------------------------------------------------------------------------------
# The juice: one query's attention over a sentence


@torch.no_grad()
def attention_mix(model: Transformer, encode: Callable[[str], list[int]], sentence: str, query: str) -> list[dict]:
    """Last layer, heads averaged: the query word's (its last token's) attention over the words before
    it and itself, sub-word tokens summed into their word; sorted by weight."""
    words = sentence.split()
    if query not in words:
        raise ValueError(f"the query word {query!r} is not in the sentence {sentence!r}")
    ids, owner = [], []
    for i, w in enumerate(words):
        t = encode(w if i == 0 else " " + w)
        ids += t
        owner += [i] * len(t)
    q = max(j for j, o in enumerate(owner) if o == words.index(query))
    device = next(model.parameters()).device
    w = model.attention_weights(torch.tensor([ids], device=device))[-1][0].float().mean(0)[q]  # (T,)
    per_word: dict[int, float] = {}
    for j, o in enumerate(owner[: q + 1]):
        per_word[o] = per_word.get(o, 0.0) + float(w[j])
    rows = [{"word": words[o], "position": o, "weight": v} for o, v in per_word.items()]
    return sorted(rows, key=lambda r: -r["weight"])


# --------------------------------------------------------------------------------------------------
# The LSTM's gates on a real sentence


@torch.no_grad()
def lstm_gates(
    model: RecurrentLM, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], sentence: str
) -> list[dict]:
    """Per token: the first layer's mean input, forget and output gate and the memory cell's mean |c|,
    from the cell's equations on the trained weights (i, f, g, o = split of W_ih·x + b_ih + W_hh·h + b_hh)."""
    model.eval()
    rnn = model.rnn
    ids = encode(sentence)
    device = next(model.parameters()).device
    x = model.wte(torch.tensor([ids], device=device)).float()[0]  # (T, E)
    H = model.config.hidden_size
    w_ih, w_hh = rnn.get_parameter("weight_ih_l0").float(), rnn.get_parameter("weight_hh_l0").float()
    b = (rnn.get_parameter("bias_ih_l0") + rnn.get_parameter("bias_hh_l0")).float()
    h, c = torch.zeros(H, device=device), torch.zeros(H, device=device)
    rows = []
    for t, tok in enumerate(ids):
        z = w_ih @ x[t] + w_hh @ h + b
        i, f, g, o = (
            torch.sigmoid(z[:H]),
            torch.sigmoid(z[H : 2 * H]),
            torch.tanh(z[2 * H : 3 * H]),
            torch.sigmoid(z[3 * H :]),
        )
        c = f * c + i * g
        h = o * torch.tanh(c)
        rows.append(
            {
                "position": t,
                "token": decode([tok]),
                "forget": float(f.mean()),
                "input": float(i.mean()),
                "output": float(o.mean()),
                "cell_abs_mean": float(c.abs().mean()),
                "forget_above_0.9": float((f > 0.9).float().mean()),
            }
        )
    return rows


# --------------------------------------------------------------------------------------------------


def _table(rows: list[dict], fmt: str = "{:.3f}") -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += [
        "| " + " | ".join(fmt.format(r[c]) if isinstance(r[c], float) else str(r[c]) for c in cols) + " |" for r in rows
    ]
    return "\n".join(out)


def article_examples(
    transformer: nn.Module,
    lstm: nn.Module | None,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    settings: ExamplesSettings,
) -> ExamplesResult:
    transformer = require_transformer(transformer, "the article's examples")
    if lstm is not None and not isinstance(lstm, RecurrentLM):
        raise ConfigError(f"the LSTM's gates need a recurrent LM, not a {type(lstm).__name__}")
    wo = word_order(transformer, encode, decode)
    pairs = shifted_pairs()
    mix = attention_mix(transformer, encode, settings.mix_sentence, settings.mix_query)
    gates = (
        lstm_gates(lstm, encode, decode, settings.gate_sentence)
        if lstm is not None and lstm.config.cell == "lstm"
        else []
    )
    weights = [r["weight"] for r in mix]
    metrics = {
        "word_order/no_pe_rel_diff": wo["without_position"]["rel_diff_from_permuted"],
        "word_order/with_pe_rel_diff": wo["with_position"]["rel_diff_from_permuted"],
        "mix/top1_weight": weights[0],
        "mix/top3_weight": float(sum(weights[:3])),
        "mix/words": float(len(weights)),
    }
    if gates:
        metrics.update(
            {
                "gates/forget_mean": float(np.mean([r["forget"] for r in gates])),
                "gates/input_mean": float(np.mean([r["input"] for r in gates])),
                "gates/output_mean": float(np.mean([r["output"] for r in gates])),
            }
        )
    texts = {
        "word_order_wo_ai_ni": word_order_markdown(wo),
        "shifted_pairs_jintian_tianqi": "The word-level tokenizer (jieba for Han text) and the labels stage's shift: "
        "each input "
        "token's label is the next token.\n\n" + _table(pairs),
        "attention_mix": f"Query {settings.mix_query!r} in “{settings.mix_sentence}” (last layer, heads averaged): a "
        f"weighted mix — "
        f"the top word takes {weights[0]:.2f}, the top three {sum(weights[:3]):.2f} — where picking one would put 1.0 "
        "on a single word.\n\n" + _table(mix),
    }
    if gates:
        texts["lstm_gates"] = (
            f"The trained LSTM's first layer on “{settings.gate_sentence}”: mean gate activations per token "
            "(forget near 1 keeps the memory cell, input near 0 keeps new input out).\n\n" + _table(gates)
        )
    return ExamplesResult(wo, pairs, mix, gates, metrics, texts)
