"""Tokenizers trained with Hugging Face `tokenizers`: byte-level BPE (default), character-level and
word-level. Special tokens are fixed: [PAD]=0 (its embedding is the zero vector and it is masked),
[UNK]=1, [BOS]=2, [EOS]=3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from .errors import PipelineInputError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
PAD, UNK, BOS, EOS = range(4)
BYTE_ALPHABET = 256


class TokenizerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["bpe", "char", "word"] = Field(
        "bpe", description="bpe: byte-level BPE (lossless); char: one token per character; word: lower-cased words."
    )
    vocab_size: int = Field(2048, description="Largest vocabulary, special tokens included.")
    min_count: int = Field(
        2, description="Least frequency for a merge (bpe), a character (char) or a word (word) to enter the vocabulary."
    )
    lowercase: bool = Field(True, description="Lower-case text first (word tokenizer only).")

    @model_validator(mode="after")
    def _check(self) -> "TokenizerSettings":
        least = len(SPECIAL_TOKENS) + (BYTE_ALPHABET if self.kind == "bpe" else 1)
        if self.vocab_size < least:
            raise ValueError(
                f"tokenizer.vocab_size={self.vocab_size} is too small for kind '{self.kind}': it must hold the "
                f"{len(SPECIAL_TOKENS)} special tokens" + (f" and the {BYTE_ALPHABET} byte symbols" if self.kind == "bpe" else "")
                + f" (at least {least})"
            )
        if self.min_count < 1:
            raise ValueError(f"tokenizer.min_count must be >= 1, got {self.min_count}")
        return self


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
            vocab_size=settings.vocab_size, min_frequency=settings.min_count, special_tokens=SPECIAL_TOKENS, show_progress=False
        )
    else:
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        norms = [normalizers.NFKC()] + ([normalizers.Lowercase()] if settings.lowercase else [])
        tok.normalizer = normalizers.Sequence(norms)
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        trainer = trainers.WordLevelTrainer(
            vocab_size=settings.vocab_size, min_frequency=settings.min_count, special_tokens=SPECIAL_TOKENS, show_progress=False
        )
    return tok, trainer


def train_tokenizer(texts: Iterable[str], settings: TokenizerSettings) -> Tokenizer:
    """Train on `texts` (the train split only). Special tokens get ids 0..3."""
    tok, trainer = _build(settings)
    tok.train_from_iterator(texts, trainer=trainer)
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


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.exists():
        raise PipelineInputError(f"tokenizer file not found: {path} (materialize `tokenizer` first)")
    return Tokenizer.from_file(str(path))


@dataclass
class TokenizerReport:
    vocab_size: int
    tokens: int
    bytes_per_token: float
    chars_per_token: float
    unk_rate: float

    def metrics(self) -> dict[str, float]:
        return {
            "vocab_size": self.vocab_size,
            "val_tokens": self.tokens,
            "bytes_per_token": self.bytes_per_token,
            "chars_per_token": self.chars_per_token,
            "unk_rate": self.unk_rate,
        }


def evaluate_tokenizer(tok: Tokenizer, texts: list[str]) -> TokenizerReport:
    """Compression and coverage on held-out text (the validation split)."""
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    n = sum(len(e.ids) for e in encodings)
    unk = sum(sum(1 for i in e.ids if i == UNK) for e in encodings)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_chars = sum(len(t) for t in texts)
    return TokenizerReport(
        vocab_size=tok.get_vocab_size(),
        tokens=n,
        bytes_per_token=n_bytes / max(n, 1),
        chars_per_token=n_chars / max(n, 1),
        unk_rate=unk / max(n, 1),
    )


def roundtrip_ok(tok: Tokenizer, text: str) -> bool:
    """Whether decode(encode(text)) gives back exactly `text` (true for byte-level BPE)."""
    return tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text


def word_level_from_vocab(words: list[str], lowercase: bool = True) -> Tokenizer:
    """A word-level tokenizer whose ids are exactly the rows of an embedding matrix over `words`
    (specials first), with the same normalizer and pre-tokenizer as kind='word'."""
    if words[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
        raise ValueError(f"the vocabulary must start with the special tokens {SPECIAL_TOKENS}")
    tok, _ = _build(TokenizerSettings(kind="word", vocab_size=max(len(words), len(SPECIAL_TOKENS) + 1), lowercase=lowercase))
    tok.model = models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok
