import numpy as np
import pytest

import components.core.tokenizer as tokenizer_module
from components.core.tokenizer import (
    EOS,
    PAD,
    SPECIAL_TOKENS,
    TokenizerSettings,
    encode,
    evaluate_tokenizer,
    iter_token_ids,
    load_tokenizer,
    roundtrip_ok,
    text_chunks,
    train_tokenizer,
)

CHINESE = ["苹果公司发布了新手机，它的市值大涨。", "我爱你", "你爱我"]


@pytest.fixture(scope="module")
def bpe(wiki_texts):
    return train_tokenizer(wiki_texts[:60], TokenizerSettings(kind="bpe", vocab_size=1024))


def test_special_tokens_have_fixed_ids(bpe):
    assert [bpe.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert PAD == 0 and EOS == 3
    assert bpe.get_vocab_size() == 1024


def test_byte_level_bpe_roundtrips_english_and_chinese_exactly(bpe, wiki_texts):
    # Chinese never appears in the training text: byte-level BPE still encodes it losslessly.
    for text in CHINESE + [wiki_texts[70][:2000], "Tabs\tand  double  spaces\n\nand é, ß, 😀."]:
        assert roundtrip_ok(bpe, text), text
    assert bpe.token_to_id("[UNK]") not in bpe.encode(CHINESE[0], add_special_tokens=False).ids


def test_word_order_changes_the_sequence_not_the_multiset(bpe):
    a = bpe.encode("我爱你", add_special_tokens=False).ids
    b = bpe.encode("你爱我", add_special_tokens=False).ids
    assert a != b and sorted(a) == sorted(b)


def test_bpe_compresses_held_out_text(bpe, wiki_texts):
    report = evaluate_tokenizer(bpe, wiki_texts[80:90])
    assert report.unk_rate == 0.0
    assert 2.0 < report.bytes_per_token < 6  # 1024 merges learned on English prose (1.0 = no compression)


def test_char_and_word_kinds(wiki_texts, tmp_path):
    char = train_tokenizer(wiki_texts[:20], TokenizerSettings(kind="char", vocab_size=200))
    assert char.encode("abc", add_special_tokens=False).tokens == ["a", "b", "c"]
    assert char.decode(char.encode("a b\nc", add_special_tokens=False).ids) == "a b\nc"
    word = train_tokenizer(wiki_texts[:40], TokenizerSettings(kind="word", vocab_size=5000, min_count=2))
    assert word.encode("The Anarchism!", add_special_tokens=False).tokens == ["the", "anarchism", "!"]
    assert word.encode("qwzxv", add_special_tokens=False).tokens == ["[UNK]"]
    report = evaluate_tokenizer(word, wiki_texts[80:90])
    assert 0 < report.unk_rate < 0.3
    word.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).get_vocab() == word.get_vocab()


def test_vocab_smaller_than_special_tokens_is_rejected():
    with pytest.raises(ValueError, match="tokenizer.vocab_size=3 is too small.*4 special tokens"):
        TokenizerSettings(kind="word", vocab_size=3)
    with pytest.raises(ValueError, match="256 byte symbols"):
        TokenizerSettings(kind="bpe", vocab_size=200)
    with pytest.raises(ValueError, match="min_count"):
        TokenizerSettings(min_count=0)


TRICKY = [
    "Tabs\tand  double  spaces\n\n  and é, ß, 😀 -- it's 3.14!",
    "word   \n\t  next\u3000full-width space\xa0nbsp \x1cfile-sep\u2028line sep ΟΔΟΣ ΟΔΟΣ",
    "苹果公司发布了新手机。它的市值大涨！我们爱北京天安门；你好？世界" * 3,
    "no_spaces_at_all_" * 40,
]


def test_chunks_are_bounded_and_cut_where_tokens_do_not_change(wiki_texts):
    for text in TRICKY + wiki_texts[:3]:
        for max_chars in (5, 17, 64):
            pieces = list(text_chunks(text, max_chars))
            assert "".join(pieces) == text and all(len(p) <= max_chars for p in pieces)
    assert list(text_chunks("")) == [""]


@pytest.mark.parametrize("kind, vocab_size", [("bpe", 800), ("char", 300), ("word", 4000)])
def test_streamed_encoding_gives_the_tokens_of_whole_texts(wiki_texts, monkeypatch, kind, vocab_size):
    """Long texts are encoded in pieces cut at white space (or after Chinese sentence punctuation),
    which leaves every token as encoding the whole text gives it; training sees the same pieces."""
    texts = wiki_texts[:12] + TRICKY[:3]
    settings = TokenizerSettings(kind=kind, vocab_size=vocab_size, min_count=1)
    whole = train_tokenizer(texts, settings)
    whole_ids = [np.concatenate([ids for ids, _ in iter_token_ids(whole, [t])]) for t in texts]
    if kind != "word":  # no segmentation: exactly what `tokenizers` gives for the whole text
        assert [w.tolist() for w in whole_ids] == [e.ids for e in whole.encode_batch(texts, add_special_tokens=False)]
    monkeypatch.setattr(tokenizer_module, "MAX_CHUNK_CHARS", 40)
    monkeypatch.setattr(tokenizer_module, "BATCH_CHARS", 500)
    chunked = train_tokenizer(texts, settings)
    assert chunked.to_str() == whole.to_str()
    pieces = list(iter_token_ids(whole, texts))
    assert sum(last for _, last in pieces) == len(texts) and len(pieces) > 10 * len(texts)
    streamed, doc = [], []
    for ids, last in pieces:
        doc.append(ids)
        if last:
            streamed.append(np.concatenate(doc))
            doc = []
    for a, b in zip(whole_ids, streamed):
        np.testing.assert_array_equal(a, b)


def test_report_warns_about_a_small_vocabulary_and_many_unknowns(wiki_texts):
    word = train_tokenizer(wiki_texts[:3], TokenizerSettings(kind="word", vocab_size=50_000, min_count=3))
    report = evaluate_tokenizer(word, wiki_texts[80:84], requested_vocab_size=50_000)
    assert report.vocab_learned == word.get_vocab_size() < 25_000 and report.unk_rate > 0.05
    assert len(report.warnings) == 2
    assert "learned" in report.warnings[0] and "50000" in report.warnings[0]
    assert "[UNK]" in report.warnings[1]
    metrics = report.metrics()
    assert metrics["vocab_learned"] == report.vocab_learned and metrics["vocab_requested"] == 50_000
    assert metrics["unk_rate"] == report.unk_rate and all(isinstance(v, (int, float)) for v in metrics.values())


def test_report_of_a_healthy_tokenizer_has_no_warnings(bpe, wiki_texts):
    report = evaluate_tokenizer(bpe, wiki_texts[80:90], requested_vocab_size=1024)
    assert report.warnings == [] and report.vocab_learned == 1024 and report.unk_rate == 0.0
    assert report.tokens == sum(len(encode(bpe, t)) for t in wiki_texts[80:90])
