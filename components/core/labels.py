"""Self-supervised next-token labels.

Documents are tokenized, joined with [EOS] and packed into blocks of `block_size + 1` tokens taken
every `block_size` tokens, so every token of the stream is a target exactly once. Inputs X are
block[:-1], targets Y are block[1:]. The last block is padded: padded inputs are [PAD] (id 0) and
their targets are -100, which the loss ignores.

On disk: `{split}_x.npy` (uint16 when the vocabulary fits, else uint32), `{split}_y.npy` (int32,
-100 = ignore) and `meta.json` (block size, vocabulary size, the tokenizer's hash, counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator
from tokenizers import Tokenizer

from .artifacts import read_json, sha256_file, write_json
from .data import IGNORE_INDEX, PAD_ID, TokenBlocks
from .errors import ConfigError, PipelineInputError
from .tokenizer import EOS

SPLITS = ("train", "validation")


class LabelSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    block_size: int = Field(256, description="Context length: tokens per input block (the gradient study reaches back this far).")

    @field_validator("block_size")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"labels.block_size must be >= 2, got {v}")
        return v


def token_stream(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """All documents' ids, each followed by [EOS], as one int64 array."""
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    parts = []
    for e in encodings:
        parts.append(np.asarray(e.ids, dtype=np.int64))
        parts.append(np.array([EOS], dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def pack_blocks(stream: np.ndarray, block_size: int, vocab_size: int) -> TokenBlocks:
    """Blocks of block_size+1 tokens every block_size tokens; the tail block padded."""
    n_targets = len(stream) - 1
    n_blocks = -(-n_targets // block_size)
    padded = np.full(n_blocks * block_size + 1, PAD_ID, dtype=np.int64)
    padded[: len(stream)] = stream
    starts = np.arange(n_blocks)[:, None] * block_size
    blocks = padded[starts + np.arange(block_size + 1)[None, :]]  # (n_blocks, block_size + 1)
    x = blocks[:, :-1]
    y = blocks[:, 1:].copy()
    # A target is padding where its position lies beyond the stream's end.
    pos = starts + np.arange(1, block_size + 1)[None, :]
    y[pos >= len(stream)] = IGNORE_INDEX
    x_dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
    return TokenBlocks(x.astype(x_dtype), y.astype(np.int32))


@dataclass
class LabelsResult:
    path: Path
    meta: dict[str, Any]


def build_labels(
    texts_by_split: dict[str, list[str]], tokenizer_path: str | Path, settings: LabelSettings, out_dir: str | Path
) -> LabelsResult:
    tokenizer_path = Path(tokenizer_path)
    tok = Tokenizer.from_file(str(tokenizer_path))
    vocab_size = tok.get_vocab_size()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "block_size": settings.block_size,
        "vocab_size": vocab_size,
        "tokenizer_sha256": sha256_file(tokenizer_path),
        "pad_id": PAD_ID,
        "eos_id": EOS,
        "ignore_index": IGNORE_INDEX,
    }
    for split in SPLITS:
        stream = token_stream(tok, texts_by_split[split])
        if len(stream) - 1 < settings.block_size:
            raise ConfigError(
                f"labels.block_size={settings.block_size} is larger than the {split} split holds "
                f"({len(stream) - 1} next-token targets); lower labels.block_size or use a bigger corpus"
            )
        blocks = pack_blocks(stream, settings.block_size, vocab_size)
        np.save(out_dir / f"{split}_x.npy", blocks.x)
        np.save(out_dir / f"{split}_y.npy", blocks.y)
        meta[f"{split}_tokens"] = int(len(stream))
        meta[f"{split}_targets"] = blocks.n_targets
        meta[f"{split}_blocks"] = blocks.n_blocks
        meta["x_dtype"] = str(blocks.x.dtype)
    write_json(out_dir / "meta.json", meta)
    return LabelsResult(path=out_dir, meta=meta)


def load_labels(path: str | Path, mmap: bool = True) -> tuple[TokenBlocks, TokenBlocks, dict[str, Any]]:
    """(train, validation, meta) from a labels folder."""
    path = Path(path)
    if not (path / "meta.json").exists():
        raise PipelineInputError(f"labels folder {path} has no meta.json (materialize `labels` first)")
    mode = "r" if mmap else None
    splits = [TokenBlocks(np.load(path / f"{s}_x.npy", mmap_mode=mode), np.load(path / f"{s}_y.npy", mmap_mode=mode)) for s in SPLITS]
    return splits[0], splits[1], read_json(path / "meta.json")


def check_blocks(blocks: TokenBlocks) -> dict[str, Any]:
    """Prove over every block that Y is X shifted by one and no target crosses into padding.

    Y[:, :-1] must equal X[:, 1:] wherever the target is real; consecutive blocks must chain
    (block i's last target is block i+1's first input); a target is -100 exactly where the
    next input is padding, and padding only trails (once padded, always padded).
    """
    x = np.asarray(blocks.x, dtype=np.int64)
    y = np.asarray(blocks.y, dtype=np.int64)
    real = y != IGNORE_INDEX
    shift_ok = np.all((y[:, :-1] == x[:, 1:]) | ~real[:, :-1])
    # A real target never points at a pad token, and a pad input is always followed by ignored targets.
    no_pad_target = not np.any(real & (y == PAD_ID))
    pad_inputs_ignored = not np.any((x[:, 1:] == PAD_ID) & real[:, :-1])
    chain_ok = bool(np.all(y[:-1, -1][real[:-1, -1]] == x[1:, 0][real[:-1, -1]])) if len(x) > 1 else True
    trailing = bool(np.all(np.diff(real.reshape(-1).astype(np.int8)) <= 0))
    return {
        "blocks": int(x.shape[0]),
        "shift_ok": bool(shift_ok),
        "chain_ok": chain_ok,
        "no_target_in_padding": bool(no_pad_target and pad_inputs_ignored),
        "padding_only_trailing": trailing,
        "ok": bool(shift_ok and chain_ok and no_pad_target and pad_inputs_ignored and trailing),
    }
