"""Self-supervised next-token labels.

Documents are tokenized, joined with [EOS] and packed into blocks of `block_size + 1` tokens taken
every `block_size` tokens, so every token of the stream is a target exactly once. Inputs X are
block[:-1], targets Y are block[1:]. The last block is padded: padded inputs are [PAD] (id 0) and
their targets are -100, which the loss ignores.

On disk: `{split}_x.npy` (uint16 when the vocabulary fits, else uint32), `{split}_y.npy` (int32,
-100 = ignore) and `meta.json` (block size, vocabulary size, the tokenizer's hash, counts).

`build_labels` streams: token ids are appended to a raw file as they are encoded, then the .npy
files are written from it a slice at a time, so memory stays bounded however long the corpus or a
document is. The arrays are those `pack_blocks(token_stream(...))` builds in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import Tokenizer

from .artifacts import read_json, sha256_file, write_json
from .data import IGNORE_INDEX, PAD_ID, Blocks, ShardedBlocks, TokenBlocks
from .errors import ConfigError, PipelineInputError
from .tokenizer import EOS, iter_token_ids, load_tokenizer

SPLITS = ("train", "validation")
WRITE_TOKENS = 1 << 22  # tokens per slice when writing the .npy files


class LabelSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    block_size: int = Field(
        default=256,
        ge=2,
        description="Context length: tokens per input block (the gradient study reaches back this far).",
    )


def x_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32)


def token_stream(tok: Tokenizer, texts: Iterable[str]) -> np.ndarray:
    """All documents' ids, each followed by [EOS], as one int64 array (in memory; `build_labels` streams)."""
    parts = []
    for ids, last in iter_token_ids(tok, texts):
        parts.append(ids.astype(np.int64))
        if last:
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
    return TokenBlocks(x.astype(x_dtype(vocab_size)), y.astype(np.int32))


def write_token_stream(tok: Tokenizer, texts: Iterable[str], path: Path, dtype: np.dtype) -> int:
    """Append every document's ids, each followed by [EOS], to the raw file `path`; returns the count."""
    n = 0
    eos = np.array([EOS], dtype=dtype).tobytes()
    with open(path, "wb") as fh:
        for ids, last in iter_token_ids(tok, texts):
            fh.write(ids.astype(dtype).tobytes())
            n += len(ids)
            if last:
                fh.write(eos)
                n += 1
    return n


def _open_npy(path: Path, dtype: np.dtype, shape: tuple[int, int]):
    fh = open(path, "wb")
    np.lib.format.write_array_header_1_0(
        fh, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )
    return fh


def write_blocks(stream_path: Path, n: int, dtype: np.dtype, block_size: int, x_path: Path, y_path: Path) -> int:
    """The blocks of `pack_blocks` for the n-token raw stream at `stream_path`, written to .npy
    files a slice at a time (as `np.save` writes them); returns the number of blocks.

    Flattened, X is the stream padded with [PAD] and Y the stream shifted by one padded with -100,
    both n_blocks * block_size long."""
    n_blocks = -(-(n - 1) // block_size)
    total = n_blocks * block_size
    itemsize = dtype.itemsize
    with (
        _open_npy(x_path, dtype, (n_blocks, block_size)) as xf,
        _open_npy(y_path, np.dtype(np.int32), (n_blocks, block_size)) as yf,
    ):
        for start in range(0, total, WRITE_TOKENS):
            end = min(start + WRITE_TOKENS, total)
            count = max(0, min(end + 1, n) - start)  # stream[start:end + 1] is what this slice of X and Y holds
            tokens = (
                np.fromfile(stream_path, dtype=dtype, count=count, offset=start * itemsize)
                if count
                else np.zeros(0, dtype)
            )
            x = np.full(end - start, PAD_ID, dtype=dtype)
            x[: min(count, end - start)] = tokens[: end - start]
            y = np.full(end - start, IGNORE_INDEX, dtype=np.int32)
            y[: max(count - 1, 0)] = tokens[1:]
            xf.write(x.tobytes())
            yf.write(y.tobytes())
    return n_blocks


@dataclass
class LabelsResult:
    path: Path
    meta: dict[str, Any]


def build_labels(
    texts_by_split: Mapping[str, Iterable[str]],
    tokenizer_path: str | Path,
    settings: LabelSettings,
    out_dir: str | Path,
    require_full_block: bool = True,
) -> LabelsResult:
    """Tokenize each split (streamed: `iter_token_ids`) and write its next-token blocks to `out_dir`.

    require_full_block: a split with fewer targets than `block_size` is an error (False for one
    shard of a corpus: it then makes one padded block)."""
    tokenizer_path = Path(tokenizer_path)
    tok = load_tokenizer(tokenizer_path)
    vocab_size = tok.get_vocab_size()
    dtype = x_dtype(vocab_size)
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
        stream_path = out_dir / f"{split}_tokens.bin"
        try:
            n = write_token_stream(tok, texts_by_split[split], stream_path, dtype)
            if require_full_block and n - 1 < settings.block_size:
                raise ConfigError(
                    f"labels.block_size={settings.block_size} is larger than the {split} split holds "
                    f"({n - 1} next-token targets); lower labels.block_size or use a bigger corpus"
                )
            n_blocks = write_blocks(
                stream_path, n, dtype, settings.block_size, out_dir / f"{split}_x.npy", out_dir / f"{split}_y.npy"
            )
        finally:
            stream_path.unlink(missing_ok=True)
        meta[f"{split}_tokens"] = n
        meta[f"{split}_targets"] = n - 1
        meta[f"{split}_blocks"] = n_blocks
        meta["x_dtype"] = str(dtype)
    write_json(out_dir / "meta.json", meta)
    return LabelsResult(path=out_dir, meta=meta)


def load_labels(path: str | Path, mmap: bool = True) -> tuple[Blocks, Blocks, dict[str, Any]]:
    """(train, validation, meta) from a labels folder: `build_labels`'s arrays, or, for the folder of
    sharded labels (`shards.combine_label_shards`), one memory-mapped view over every shard's arrays
    (`load_sharded_labels`)."""
    path = Path(path)
    if not (path / "meta.json").exists():
        raise PipelineInputError(f"labels folder {path} has no meta.json (materialize `labels` first)")
    meta = read_json(path / "meta.json")
    if "shards" in meta:
        return load_sharded_labels(path)
    mode = "r" if mmap else None
    splits = [
        TokenBlocks(np.load(path / f"{s}_x.npy", mmap_mode=mode), np.load(path / f"{s}_y.npy", mmap_mode=mode))
        for s in SPLITS
    ]
    return splits[0], splits[1], meta


def _open_shard_file(key: str, rec: dict[str, Any]) -> np.ndarray:
    p = Path(rec["path"])
    if not p.is_file():
        raise PipelineInputError(
            f"label shard '{key}': token file {p} is missing (deleted or pruned); re-materialize that partition"
        )
    size = p.stat().st_size
    if size != rec["bytes"]:
        raise PipelineInputError(
            f"label shard '{key}': token file {p} has {size} bytes, recorded {rec['bytes']}: it changed since it was "
            "written; re-materialize that partition"
        )
    try:
        return np.load(p, mmap_mode="r")
    except ValueError as e:
        raise PipelineInputError(f"label shard '{key}': token file {p} is not a readable .npy array ({e})") from e


def load_sharded_labels(path: str | Path) -> tuple[ShardedBlocks, ShardedBlocks, dict[str, Any]]:
    """(train, validation, meta) of a sharded labels folder: each split one `ShardedBlocks` view over
    every shard's memory-mapped .npy files, in key order, nothing concatenated in memory. A file
    that is missing, of another size than recorded or of another shape is an error naming it (the
    hashes are the caller's to check: the pipeline's IO manager does, by its size policy)."""
    path = Path(path)
    meta = read_json(path / "meta.json")
    views = []
    for split in SPLITS:
        arrays = []
        for shard in meta["shards"]:
            x = _open_shard_file(shard["key"], shard["files"][f"{split}_x"])
            y = _open_shard_file(shard["key"], shard["files"][f"{split}_y"])
            rows, width, targets = (
                int(shard[f"{split}_blocks"]),
                int(meta["block_size"]),
                max(0, int(shard[f"{split}_targets"])),
            )
            for a, name in ((x, "x"), (y, "y")):
                if a.shape != (rows, width):
                    raise PipelineInputError(
                        f"label shard '{shard['key']}': {shard['files'][f'{split}_{name}']['path']} has shape "
                        f"{a.shape}, "
                        f"recorded {(rows, width)}; re-materialize that partition"
                    )
            if not ((rows - 1) * width < targets <= rows * width if rows else targets == 0):
                raise PipelineInputError(
                    f"label shard '{shard['key']}': {path / 'meta.json'} records {targets} {split} targets, which "
                    f"{rows} blocks of {width} cannot hold with padding only in the last; rebuild the sharded labels"
                )
            arrays.append((x, y, targets))
        views.append(ShardedBlocks(arrays))
    return views[0], views[1], meta


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
