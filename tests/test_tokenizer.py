import pytest

from components.core.tokenizer import (
    EOS,
    PAD,
    SPECIAL_TOKENS,
    TokenizerSettings,
    evaluate_tokenizer,
    load_tokenizer,
    roundtrip_ok,
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
