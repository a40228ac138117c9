import numpy as np
import pytest

import components.core.labels as labels_module
import components.core.tokenizer as tokenizer_module
from components.core.corpus import CorpusSettings, build_corpus, load_corpus
from components.core.data import IGNORE_INDEX, PAD_ID, TokenBlocks
from components.core.errors import ConfigError
from components.core.labels import LabelSettings, build_labels, check_blocks, load_labels, pack_blocks, token_stream
from components.core.tokenizer import EOS, TokenizerSettings, train_tokenizer


def test_pack_blocks_shifts_and_pads():
    stream = np.arange(10, 21)  # 11 tokens -> 10 targets
    b = pack_blocks(stream, block_size=4, vocab_size=100)
    assert b.x.dtype == np.uint16 and b.y.dtype == np.int32
    assert b.x.tolist() == [[10, 11, 12, 13], [14, 15, 16, 17], [18, 19, 20, 0]]
    assert b.y.tolist() == [[11, 12, 13, 14], [15, 16, 17, 18], [19, 20, IGNORE_INDEX, IGNORE_INDEX]]
    assert b.n_targets == 10  # every target of the stream exactly once
    assert check_blocks(b)["ok"]
    assert pack_blocks(stream, 4, vocab_size=70_000).x.dtype == np.uint32


def test_check_blocks_catches_broken_labels():
    good = pack_blocks(np.arange(1, 40), block_size=8, vocab_size=100)
    y = good.y.copy()
    y[1, 3] += 1  # a target that is not the next input
    assert not check_blocks(TokenBlocks(good.x, y))["shift_ok"]
    y = good.y.copy()
    y[-1, -1] = 5  # a real target pointing into padding
    assert not check_blocks(TokenBlocks(good.x, y))["ok"]
    x = good.x.copy()
    x[2, 0] = 99  # blocks no longer chain
    assert not check_blocks(TokenBlocks(x, good.y))["chain_ok"]


def test_build_labels_on_real_text(tmp_path, wiki_texts):
    tok = train_tokenizer(wiki_texts[:30], TokenizerSettings(vocab_size=600))
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = {"train": wiki_texts[:30], "validation": wiki_texts[30:34]}
    build_labels(texts, tmp_path / "tokenizer.json", LabelSettings(block_size=64), tmp_path / "labels")
    train, val, meta = load_labels(tmp_path / "labels")
    assert meta["vocab_size"] == 600 and meta["block_size"] == 64 and len(meta["tokenizer_sha256"]) == 64
    assert train.block_size == 64 and val.n_targets == meta["validation_tokens"] - 1
    # Documents are joined with [EOS]: one per document.
    assert int((train.x == EOS).sum() + (train.y[-1, -1] == EOS)) == 30
    assert check_blocks(train)["ok"] and check_blocks(val)["ok"]
    # Decoding the first block gives back the start of the first document.
    assert tok.decode(train.x[0].tolist()) == wiki_texts[0][: len(tok.decode(train.x[0].tolist()))]
    assert (val.x[-1] == PAD_ID).any() or val.n_targets % 64 == 0


def test_block_size_larger_than_validation_split(tmp_path, wiki_texts):
    tok = train_tokenizer(wiki_texts[:10], TokenizerSettings(vocab_size=300))
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = {"train": wiki_texts[:10], "validation": ["a short validation document"]}
    with pytest.raises(ConfigError, match=r"labels.block_size=512 is larger than the validation split holds"):
        build_labels(texts, tmp_path / "tokenizer.json", LabelSettings(block_size=512), tmp_path / "labels")


def test_crop_keeps_the_shift():
    b = pack_blocks(np.arange(1, 50), block_size=16, vocab_size=100)
    c = b.crop(4)
    assert c.block_size == 4 and check_blocks(c)["shift_ok"]
    with pytest.raises(ConfigError, match="block_size=32 is larger than the labels hold"):
        b.crop(32)


@pytest.mark.parametrize("block_size", [37, 64])
def test_streamed_labels_are_the_in_memory_packing_byte_for_byte(tmp_path, monkeypatch, block_size):
    """build_labels writes ids to disk as they are encoded and packs them a slice at a time; the
    files are those np.save writes for pack_blocks(token_stream(...)), also when the documents are
    cut into pieces and the slices do not line up with the blocks."""
    result = build_corpus(CorpusSettings(max_documents=24, validation_fraction=0.25), tmp_path / "corpus")
    dd = load_corpus(result.path)
    tok = train_tokenizer(dd["train"]["text"], TokenizerSettings(vocab_size=700))
    tok.save(str(tmp_path / "tokenizer.json"))
    reference = tmp_path / "reference"
    reference.mkdir()
    for split in ("train", "validation"):
        encodings = tok.encode_batch(list(dd[split]["text"]), add_special_tokens=False)  # whole documents at once
        stream = np.concatenate([np.r_[e.ids, EOS] for e in encodings])
        np.testing.assert_array_equal(stream, token_stream(tok, dd[split]["text"]))
        blocks = pack_blocks(stream, block_size, tok.get_vocab_size())
        np.save(reference / f"{split}_x.npy", blocks.x)
        np.save(reference / f"{split}_y.npy", blocks.y)
    monkeypatch.setattr(tokenizer_module, "MAX_CHUNK_CHARS", 300)
    monkeypatch.setattr(tokenizer_module, "BATCH_CHARS", 5000)
    monkeypatch.setattr(labels_module, "WRITE_TOKENS", 1000)
    texts = {
        split: dd[split]["text"] for split in ("train", "validation")
    }  # datasets columns, as the asset passes them
    build_labels(texts, tmp_path / "tokenizer.json", LabelSettings(block_size=block_size), tmp_path / "labels")
    for name in ("train_x.npy", "train_y.npy", "validation_x.npy", "validation_y.npy"):
        assert (tmp_path / "labels" / name).read_bytes() == (reference / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "labels").iterdir()) == [
        "meta.json",
        "train_x.npy",
        "train_y.npy",
        "validation_x.npy",
        "validation_y.npy",
    ]
    train, val, meta = load_labels(tmp_path / "labels")
    assert meta["train_targets"] == train.n_targets and meta["validation_blocks"] == val.n_blocks
    assert check_blocks(train)["ok"] and check_blocks(val)["ok"]


def test_block_size_must_be_at_least_two():
    with pytest.raises(ValueError, match="block_size"):
        LabelSettings(block_size=1)
