"""Inside the Transformer: head statistics on hand-built attention patterns, attribution and ablation
on a model with a planted fact neuron (studies/facts.py's measures), made-up names, activation-matched
draws, and both studies end to end on a small model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from components.core.data import TokenBlocks
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.studies.facts import answer_logprobs, attribute, knowledge, matched_draw, zeroed_knowledge
from components.core.studies.heads import classify_heads, head_statistics, heads_zeroed
from components.core.studies.inside import attention_heads, ffn_memories, known_words, made_up_name
from components.core.studies.inside_settings import InsideSettings

V, T = 20, 12


def pattern(kind: str) -> torch.Tensor:
    """(T, T) causal attention weights of one idealised head."""
    w = torch.zeros(T, T)
    for t in range(T):
        if kind == "prev":
            w[t, max(t - 1, 0)] = 1
        elif kind == "first":
            w[t, 0] = 1
        elif kind == "self":
            w[t, t] = 1
        elif kind == "local":  # the last three tokens, equally
            w[t, max(0, t - 2) : t + 1] = 1
        else:  # uniform over everything before
            w[t, : t + 1] = 1
        w[t] /= w[t].sum()
    return w


def test_head_statistics_and_classes_on_hand_built_patterns():
    kinds = ["prev", "first", "self", "local", "uniform"]
    weights = [torch.stack([pattern(k) for k in kinds])[None].repeat(3, 1, 1, 1)]  # one layer, (B=3, 5 heads, T, T)
    stats = head_statistics(weights)
    by = {r["head"]: r for r in classify_heads(stats, InsideSettings(local_distance=2.0))}
    assert [by[h]["kind"] for h in range(5)] == ["previous-token", "first-token sink", "self", "local", "broad"]
    assert (
        by[0]["prev_token_share"] == pytest.approx(1)
        and by[0]["mean_distance"] == pytest.approx(1)
        and by[0]["entropy"] == pytest.approx(0)
    )
    assert by[1]["first_token_share"] == pytest.approx(1)
    assert by[1]["mean_distance"] == pytest.approx(np.mean(np.arange(2, T)))  # query t looks t tokens back
    assert by[3]["mean_distance"] == pytest.approx(1) and by[3]["entropy"] == pytest.approx(np.log(3))
    q = np.arange(2, T)
    assert by[4]["entropy"] == pytest.approx(np.mean(np.log(q + 1))) and by[4]["mean_distance"] == pytest.approx(
        np.mean(q / 2)
    )
    assert max(r["max_row_sum_error"] for r in stats) < 1e-6  # float32 rows


def planted(trigger=5, answer=11, neuron=7) -> Transformer:
    """One layer, attention silenced, every FFN neuron off but one that fires on `trigger` and writes `answer`."""
    torch.manual_seed(0)
    m = Transformer(
        TransformerSettings(n_layer=1, n_head=2, n_embd=32, block_size=T, pos_encoding="none", attention="reference"), V
    ).eval()
    with torch.no_grad():
        m.wte.weight.normal_()  # token vectors of norm ~√C (tied: also the unembedding), [PAD] zero
        m.wte.weight[0].zero_()
        blk = m.h[0]
        blk.attn.c_attn.weight.zero_()
        blk.attn.c_proj.weight.zero_()
        blk.mlp.c_fc.weight.zero_()
        blk.mlp.c_proj.weight.zero_()
        x = m.wte.weight[trigger]
        key = blk.ln_2(x[None])[0]
        blk.mlp.c_fc.weight[neuron] = 3 * key / key.norm()
        blk.mlp.c_proj.weight[:, neuron] = m.wte.weight[answer] / m.wte.weight[answer].norm()
    return m


def test_attribution_finds_the_planted_neuron_and_zeroing_it_removes_the_fact():
    m = planted()
    with torch.no_grad():
        _, acts = answer_logprobs(m, [[3, t] for t in range(1, V)], [11], "cpu")
    silent = [t for t in range(1, V) if t != 5 and acts[0][t - 1, 1, 7] < 0.1][:2]
    prompts = [[3, 5]] + [[3, t] for t in silent]  # the subject 5 (the trigger) against two the neuron ignores
    with torch.no_grad():
        lp, acts = answer_logprobs(m, prompts, [11], "cpu")
    assert lp[0] > np.log(0.5) and acts[0][0, 1, 7] > 10 and float(knowledge(lp)) > 2
    attr = attribute(m, [prompts], [11], "cpu")  # (1, 128)
    assert int(attr.reshape(-1).argmax()) == 7 and attr[0, 7] > 10 * attr[0, torch.arange(128) != 7].abs().max()
    with torch.no_grad():
        off = float(knowledge(answer_logprobs(m, prompts, [11], "cpu", zero={0: [7]})[0]))
        other = float(knowledge(answer_logprobs(m, prompts, [11], "cpu", zero={0: [3]})[0]))
    assert off < float(knowledge(lp)) - 5  # the fact is gone: its subject no longer raises the answer
    assert other == pytest.approx(float(knowledge(lp)), abs=1e-4)  # another neuron: nothing changes
    # The zeronings the study runs as one batch give what each gives alone.
    assert zeroed_knowledge(m, prompts, [11], "cpu", [[(0, 7)], [(0, 3)], []]) == pytest.approx(
        [off, other, float(knowledge(lp))], abs=1e-5
    )


def test_zeroing_a_head_changes_only_through_that_head():
    torch.manual_seed(0)
    m = Transformer(TransformerSettings(n_layer=1, n_head=2, n_embd=16, block_size=T, attention="reference"), V).eval()
    x = torch.randint(1, V, (2, T))
    with torch.no_grad():
        base = m(x)[0]
        with heads_zeroed(m, [(0, 0), (0, 1)]):
            silent = m(x)[0]
        m.h[0].attn.c_proj.weight.zero_()
        assert torch.allclose(silent, m(x)[0], atol=1e-6)  # both heads zeroed = no attention output
    assert not torch.allclose(base, silent)


def test_made_up_names_are_absent_from_the_corpus():
    known = known_words(["Paris is the capital of France.", "Berlin, Germany"])
    assert {"paris", "france", "berlin", "capital"} <= known
    rng = np.random.default_rng(0)
    names = {made_up_name(rng, known) for _ in range(20)}
    assert all(n[0].isupper() and n.lower() not in known for n in names) and len(names) > 10


def word_decode(ids):
    return "".join(f" w{chr(97 + i % 26)}{chr(97 + i // 26)}x" for i in ids)


def word_encode(text):
    return [ord(w[1]) - 97 + 26 * (ord(w[2]) - 97) for w in text.split() if len(w) == 4 and w.startswith("w")]


def test_both_studies_end_to_end_on_a_trained_small_model():
    # A model trained on a repeating sequence: its neurons fire on particular tokens.
    torch.manual_seed(0)
    m = Transformer(TransformerSettings(n_layer=2, n_head=2, n_embd=32, block_size=16), V)
    seq = np.tile(np.arange(1, V), 40)
    x = np.stack([seq[i : i + 16] for i in range(0, 600, 7)]).astype(np.uint16)
    y = np.stack([seq[i + 1 : i + 17] for i in range(0, 600, 7)]).astype(np.int32)
    blocks = TokenBlocks(x, y)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(60):
        _, loss = m(*blocks.batch(np.arange(32)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    s = InsideSettings(
        stat_blocks=16,
        map_sentences=1,
        map_tokens=8,
        top_neurons=3,
        device="cpu",
    )
    one = Transformer(TransformerSettings(n_layer=2, n_head=1, n_embd=32, block_size=16), V)
    heads = attention_heads(m, blocks, s, decode=word_decode, encode=word_encode, one_head=one)
    assert len(heads.heads) == 4 and {r["kind"] for r in heads.heads} <= {
        "previous-token",
        "first-token sink",
        "self",
        "local",
        "broad",
    }
    assert (
        heads.metrics()["heads/max_row_sum_error"] < 1e-5 and heads.one_head_loss > heads.base_loss
    )  # the untrained twin is worse
    assert set(heads.figures) == {"attention_map_0", "head_ablation"}
    neurons = ffn_memories(m, blocks, s, decode=word_decode)
    assert len(neurons) == 3 and all(len(n["key_contexts"]) == 4 and "[[" in n["key_contexts"][0] for n in neurons)
    assert neurons[0]["selectivity"] >= neurons[-1]["selectivity"] and all(n["value_tokens"] for n in neurons)


def test_marked_context_shows_whole_characters_of_byte_level_tokens():
    from tokenizers import ByteLevelBPETokenizer

    from components.core.studies.inside import marked

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["plain english words only"] * 20, vocab_size=300, min_frequency=1)
    ids = tok.encode("the λ").ids  # λ is two bytes, two tokens here
    decode = tok.decode
    assert "\ufffd" in decode(ids[-1:])  # the last byte alone is no character
    assert marked(ids, decode) == "the [[λ]]" and marked(ids[:3], decode) == "th[[e]]"
    assert marked(ids[:-1], decode, after=ids[-1:]) == "the [[λ]]"  # the token that starts λ, finished by the next


def test_matched_neurons_are_found_when_the_chosen_ones_fill_the_top_ranks():
    """The chosen neurons are often a layer's most active ones; the activation-matched draw then looks
    further out instead of failing on an empty neighbourhood."""
    torch.manual_seed(0)
    acts = [torch.randn(5, 64), torch.randn(5, 64)]  # (T, 4C) per layer
    order = torch.argsort(acts[0].abs().mean(0), descending=True).tolist()
    top = [(0, i) for i in order[:11]] + [(1, 0)]  # ranks 0…10 of layer 0
    draw = matched_draw(acts, top, np.random.default_rng(0))
    assert len(draw) == len(set(draw)) == 12 and not set(draw) & set(top)
    assert [layer for layer, _ in draw] == [layer for layer, _ in top]  # as many per layer
    assert all(order.index(i) <= 31 for layer, i in draw if layer == 0)  # near the ranks they replace
