"""The article's own examples through a real tokenizer and models: 我爱你 / 你爱我 scores equal up to the
permutation without positional encoding and not with it, 今天 天气 真 不错 as jieba words shifted into
labels, one query's attention as a mix, and the LSTM's gates from its own equations."""

from __future__ import annotations

import pytest
import torch

from components.core.models.recurrent import RecurrentLM, RecurrentSettings
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.studies.examples import ExamplesSettings, article_examples, shifted_pairs, word_order
from components.core.tokenizer import TokenizerSettings, train_tokenizer

TEXT = [
    "Apple announced a new phone and its market value rose. The history of the city begins in the second century. "
    "我爱你，你爱我。"
] * 20


@pytest.fixture(scope="module")
def codec():
    tok = train_tokenizer(TEXT, TokenizerSettings(kind="bpe", vocab_size=300, min_count=2))
    return (
        tok.get_vocab_size(),
        (lambda s: tok.encode(s, add_special_tokens=False).ids),
        (lambda ids: tok.decode(ids, skip_special_tokens=False)),
    )


@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_word_order_scores_are_a_permutation_without_position_and_differ_with_it(codec, pos):
    vocab, enc, dec = codec
    torch.manual_seed(0)
    model = Transformer(TransformerSettings(n_layer=1, n_head=2, n_embd=32, block_size=32, pos_encoding=pos), vocab)
    w = word_order(model, enc, dec)
    assert "".join(w["tokens_a"]) == "我爱你" and "".join(w["tokens_b"]) == "你爱我"
    assert w["without_position"]["rel_diff_from_permuted"] < 1e-5
    assert w["with_position"]["rel_diff_from_permuted"] > 1e-2


def test_the_article_examples_end_to_end(codec):
    vocab, enc, dec = codec
    torch.manual_seed(0)
    tf = Transformer(TransformerSettings(n_layer=2, n_head=2, n_embd=32, block_size=64, pos_encoding="rope"), vocab)
    lstm = RecurrentLM(RecurrentSettings(cell="lstm", n_embd=16, hidden_size=24), vocab)
    r = article_examples(tf, lstm, enc, dec, ExamplesSettings())
    assert [(p["input (X)"], p["label (Y)"]) for p in shifted_pairs()] == [
        ("今天", "天气"),
        ("天气", "真"),
        ("真", "不错"),
        ("不错", "[EOS]"),
    ]
    assert sum(x["weight"] for x in r.attention_mix) == pytest.approx(1.0, abs=1e-5)
    assert r.attention_mix[0]["weight"] < 1.0 and len(r.attention_mix) == 10  # the query and every word before it
    assert len(r.lstm_gates) == len(enc(ExamplesSettings().gate_sentence))
    assert all(0 < g[k] < 1 for g in r.lstm_gates for k in ("forget", "input", "output"))
    assert {"word_order_wo_ai_ni", "shifted_pairs_jintian_tianqi", "attention_mix", "lstm_gates"} == set(r.texts)
    with pytest.raises(ValueError, match="query word"):
        article_examples(tf, lstm, enc, dec, ExamplesSettings(mix_query="absent"))
