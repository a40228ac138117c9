"""Tokenizers trained with Hugging Face `tokenizers`: byte-level BPE (default), character-level and
word-level. Special tokens are fixed: [PAD]=0 (its embedding is the zero vector and it is masked),
[UNK]=1, [BOS]=2, [EOS]=3.

Text reaches a tokenizer in bounded pieces, so that memory does not grow with the length of a
document: `text_chunks` cuts a long text only where the cut cannot change the tokens (see there).

Chinese has no spaces between words, so the word-level tokenizer would see a whole clause as one
word. For kind 'word', runs of Han characters are first cut into words by jieba and the words
joined with spaces (`segment_chinese`); the rest of the text is left as it is. A custom Python
pre-tokenizer cannot be saved in `tokenizer.json`, so the segmentation happens in our encode path
(`encode`, `iter_token_ids`, training) instead, and whether it applies is read from the tokenizer
itself: a word-level model behind the Whitespace pre-tokenizer is kind 'word'. `tokenizer.json`
thus stays a plain, loadable `tokenizers` file; a tool that loads it directly gets the same ids for
text without Han characters, and for Chinese must segment first (as `segment_chinese` does).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from .corpus import iter_texts
from .errors import PipelineInputError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
PAD, UNK, BOS, EOS = range(4)
BYTE_ALPHABET = 256

MAX_CHUNK_CHARS = (
    1 << 13
)  # longest piece of text handed to the tokenizer at once (small pieces also spread evenly over threads)
BATCH_CHARS = 1 << 21  # characters per encode/train batch (pieces of several documents)
MIN_VOCAB_FILL = 0.5  # warn when the tokenizer learned fewer than this share of the vocabulary asked for
MAX_UNK_RATE = 0.05  # warn when more than this share of validation tokens are [UNK]


class TokenizerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["bpe", "char", "word"] = Field(
        default="bpe",
        description="bpe: byte-level BPE (lossless); char: one token per character; word: lower-cased words, "
        "Chinese segmented into words by jieba.",
    )
    vocab_size: int = Field(default=2048, description="Largest vocabulary, special tokens included.")
    min_count: int = Field(
        default=2,
        ge=1,
        description="Least frequency for a merge (bpe), a character (char) or a word (word) to enter the vocabulary.",
    )
    lowercase: bool = Field(default=True, description="Lower-case text first (word tokenizer only).")

    @model_validator(mode="after")
    def _check(self) -> "TokenizerSettings":
        least = len(SPECIAL_TOKENS) + (BYTE_ALPHABET if self.kind == "bpe" else 1)
        if self.vocab_size < least:
            raise ValueError(
                f"tokenizer.vocab_size={self.vocab_size} is too small for kind '{self.kind}': it must hold the "
                f"{len(SPECIAL_TOKENS)} special tokens"
                + (f" and the {BYTE_ALPHABET} byte symbols" if self.kind == "bpe" else "")
                + f" (at least {least})"
            )
        return self


# --- bounded pieces of text -----------------------------------------------------------------------

# Unicode White_Space, which `\s` means in the tokenizers' regexes (Python's `\s` adds \x1c-\x1f).
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# A safe cut goes before a white-space character that precedes a non-space, or between Chinese
# punctuation and a letter or digit.
_SAFE_CUT = re.compile(rf"[{_WS}](?=[^{_WS}])|(?<=[。！？；，、：])(?=[^\W_])")


def _last_safe_cut(text: str, lo: int, hi: int) -> int:
    """The last safe cut in text[lo:hi + 1], searched backwards in growing windows; `hi` if none."""
    span = 4096
    while True:
        start = max(lo, hi - span)
        last = None
        for last in _SAFE_CUT.finditer(text, start, hi + 1):  # noqa: B007 (the loop keeps the last match)
            pass
        if last is not None:
            return last.start()
        if start == lo:
            return hi
        span *= 16


def text_chunks(text: str, max_chars: int = MAX_CHUNK_CHARS) -> Iterator[str]:
    """`text` in pieces of at most `max_chars` characters whose tokens, joined, are the tokens of `text`.

    A piece ends just before a white-space character that is followed by a non-space, so the next
    piece starts with " word" (or "\\nword"): byte-level BPE's GPT-2 split keeps a space with the
    word after it and a run of spaces minus its last one apart, the word-level and character-level
    splits break at white space anyway, so every kind gives the same tokens. In text without white
    space (Chinese) a piece may also end after 。！？；，、： before a letter or digit, which BPE,
    jieba and the word-level split all treat as a boundary. Only a stretch of more than `max_chars` characters with
    neither is
    cut where it reaches the limit, which may change the tokens at that one cut.
    """
    start = 0
    while len(text) - start > max_chars:
        end = _last_safe_cut(text, start + 1, start + max_chars)
        yield text[start:end]
        start = end
    yield text[start:]


# --- Chinese word segmentation --------------------------------------------------------------------

_HAN_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]+")


@lru_cache(maxsize=1)
def _jieba():
    import jieba

    jieba.setLogLevel(logging.WARNING)  # it logs the loading of its dictionary at DEBUG
    segmenter = jieba.Tokenizer()
    segmenter.initialize()
    return segmenter


def segment_chinese(text: str) -> str:
    """Every run of Han characters cut into words by jieba (its default dictionary and HMM, so the
    same text always gives the same words), the words separated by spaces; other text unchanged."""
    if not _HAN_RUN.search(text):
        return text
    cut = _jieba().cut
    return _HAN_RUN.sub(lambda m: " " + " ".join(cut(m.group())) + " ", text)


def segments_chinese(tok: Tokenizer) -> bool:
    """Whether `tok` is word-level (kind 'word'), whose input is segmented by `segment_chinese`."""
    return isinstance(tok.model, models.WordLevel) and isinstance(tok.pre_tokenizer, pre_tokenizers.Whitespace)


def _pieces(texts: Iterable[str], segment: bool) -> Iterator[tuple[str, bool]]:
    """(piece, whether it ends its document) for every bounded piece of every text."""
    for text in iter_texts(texts):
        chunks = text_chunks(text, MAX_CHUNK_CHARS)
        piece = next(chunks)
        for following in chunks:
            yield (segment_chinese(piece) if segment else piece), False
            piece = following
        yield (segment_chinese(piece) if segment else piece), True


def _batches(pieces: Iterator[tuple[str, bool]]) -> Iterator[list[tuple[str, bool]]]:
    batch, chars = [], 0
    for piece in pieces:
        batch.append(piece)
        chars += len(piece[0])
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def iter_token_ids(tok: Tokenizer, texts: Iterable[str]) -> Iterator[tuple[np.ndarray, bool]]:
    """(uint32 ids of one piece, whether the piece ends its document) over `texts`, without special
    tokens: documents are cut by `text_chunks` and encoded about BATCH_CHARS characters at a time,
    so memory stays bounded however long a document is."""
    segment = segments_chinese(tok)
    for batch in _batches(_pieces(texts, segment)):
        encodings = tok.encode_batch([piece for piece, _ in batch], add_special_tokens=False)
        for (_, last), e in zip(batch, encodings):
            yield np.asarray(e.ids, dtype=np.uint32), last


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of `text` without special tokens, as the labels hold them (Chinese segmented for kind 'word')."""
    return [i for ids, _ in iter_token_ids(tok, [text]) for i in ids.tolist()]


# Between two of these, a space is one `segment_chinese` put there (Chinese is written without them).
_CJK = r"\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef\U00020000-\U0003134f"
_SPACE_IN_CJK = re.compile(rf"(?<=[{_CJK}])\s+(?=[{_CJK}])")


def decode(tok: Tokenizer, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
    """Text of token ids, as it was written: for a tokenizer whose input is segmented by jieba
    (`segments_chinese`), the spaces the segmentation put between Han words (and CJK punctuation)
    are removed again; other tokenizers decode as they do."""
    text = tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
    return _SPACE_IN_CJK.sub("", text) if segments_chinese(tok) else text


# --- training -------------------------------------------------------------------------------------


def _build(settings: TokenizerSettings) -> tuple[Tokenizer, Any]:
    if settings.kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=settings.vocab_size,
            min_frequency=settings.min_count,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    elif settings.kind == "char":
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        trainer = trainers.WordLevelTrainer(
            vocab_size=settings.vocab_size,
            min_frequency=settings.min_count,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
        )
    else:
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        norms = [normalizers.NFKC()] + ([normalizers.Lowercase()] if settings.lowercase else [])
        tok.normalizer = normalizers.Sequence(norms)
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        trainer = trainers.WordLevelTrainer(
            vocab_size=settings.vocab_size,
            min_frequency=settings.min_count,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
        )
    return tok, trainer


def train_tokenizer(texts: Iterable[str], settings: TokenizerSettings) -> Tokenizer:
    """Train on `texts` (the train split only), streamed in bounded pieces. Special tokens get ids 0..3."""
    tok, trainer = _build(settings)
    pieces = _pieces(texts, settings.kind == "word")
    tok.train_from_iterator(([piece for piece, _ in batch] for batch in _batches(pieces)), trainer=trainer)
    vocab = tok.get_vocab()
    for i, name in enumerate(SPECIAL_TOKENS):
        if vocab.get(name) != i:  # the whole pipeline relies on PAD being 0
            raise RuntimeError(f"special token {name} got id {vocab.get(name)}, expected {i}")
    if tok.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise PipelineInputError(
            f"the tokenizer learned no tokens beyond the special ones: the training text is empty or every "
            f"token is below tokenizer.min_count={settings.min_count}"
        )
    return tok


@lru_cache(maxsize=8)
def _tokenizer_of(content: str) -> Tokenizer:
    return Tokenizer.from_str(content)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer saved at `path` (a tokenizer.json or its folder). One object per file content
    and process, shared by its callers (who only encode and decode with it): `tokenizers` keeps
    about a megabyte of every Tokenizer that has encoded text even after it is dropped, so a
    process that tokenizes shard after shard must not build a new one per shard."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.exists():
        raise PipelineInputError(f"tokenizer file not found: {path} (materialize `tokenizer` first)")
    return _tokenizer_of(path.read_text(encoding="utf-8"))


# --- evaluation -----------------------------------------------------------------------------------


@dataclass
class TokenizerReport:
    vocab_learned: int  # tokens in the vocabulary, special tokens included
    vocab_requested: Optional[int]  # tokenizer.vocab_size, when given
    tokens: int
    bytes_per_token: float
    chars_per_token: float
    unk_rate: float
    warnings: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        out = {
            "vocab_learned": self.vocab_learned,
            "val_tokens": self.tokens,
            "bytes_per_token": self.bytes_per_token,
            "chars_per_token": self.chars_per_token,
            "unk_rate": self.unk_rate,
        }
        if self.vocab_requested is not None:
            out["vocab_requested"] = self.vocab_requested
        return out


def evaluate_tokenizer(
    tok: Tokenizer, texts: Iterable[str], requested_vocab_size: Optional[int] = None
) -> TokenizerReport:
    """Compression and coverage on held-out text (the validation split), streamed.

    `warnings` flags a vocabulary under MIN_VOCAB_FILL of `requested_vocab_size` (the corpus is too
    small or min_count too high for it) and an [UNK] rate over MAX_UNK_RATE."""
    n_bytes = n_chars = 0

    def counted() -> Iterator[str]:
        nonlocal n_bytes, n_chars
        for text in iter_texts(texts):
            n_bytes += len(text.encode("utf-8"))
            n_chars += len(text)
            yield text

    n = unk = 0
    for ids, _ in iter_token_ids(tok, counted()):
        n += len(ids)
        unk += int(np.count_nonzero(ids == UNK))
    learned, unk_rate = tok.get_vocab_size(), unk / max(n, 1)
    warnings = []
    if requested_vocab_size and learned < MIN_VOCAB_FILL * requested_vocab_size:
        warnings.append(
            f"the tokenizer learned {learned} tokens of the {requested_vocab_size} asked for (tokenizer.vocab_size): "
            f"the "
            "training text holds too few distinct tokens of tokenizer.min_count or more; lower tokenizer.vocab_size or "
            "tokenizer.min_count, or use a larger corpus"
        )
    if unk_rate > MAX_UNK_RATE:
        warnings.append(
            f"{unk_rate:.1%} of the validation tokens are [UNK] (more than {MAX_UNK_RATE:.0%}): the vocabulary misses "
            f"much "
            "of the held-out text; raise tokenizer.vocab_size, lower tokenizer.min_count or use kind 'bpe' (no [UNK])"
        )
    return TokenizerReport(
        vocab_learned=learned,
        vocab_requested=requested_vocab_size,
        tokens=n,
        bytes_per_token=n_bytes / max(n, 1),
        chars_per_token=n_chars / max(n, 1),
        unk_rate=unk_rate,
        warnings=warnings,
    )


def roundtrip_ok(tok: Tokenizer, text: str) -> bool:
    """Whether decode(encode(text)) gives back exactly `text` (true for byte-level BPE)."""
    return tok.decode(encode(tok, text), skip_special_tokens=False) == text


def word_level_from_vocab(words: list[str], lowercase: bool = True) -> Tokenizer:
    """A word-level tokenizer whose ids are exactly the rows of an embedding matrix over `words`
    (specials first), with the same normalizer and pre-tokenizer as kind='word'."""
    if words[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
        raise ValueError(f"the vocabulary must start with the special tokens {SPECIAL_TOKENS}")
    tok, _ = _build(
        TokenizerSettings(kind="word", vocab_size=max(len(words), len(SPECIAL_TOKENS) + 1), lowercase=lowercase)
    )
    tok.model = models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok
