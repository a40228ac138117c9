"""Next-token blocks as the training loop and evaluators see them.

X (inputs) and Y (targets) are int arrays of shape (n_blocks, block_size); Y is X shifted by one,
with -100 where the target is padding (ignored by the loss). PAD is token id 0.

Two types implement the same interface (`n_blocks`, `block_size`, `n_targets`, `crop`, `batch`,
`drop_empty`, `max_token_id`, and `x` / `y` indexed as arrays): `TokenBlocks` holds one pair of
arrays (in memory or memory-mapped); `ShardedBlocks` is one view over many shards' memory-mapped
arrays, which it indexes across without concatenating them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Union

import numpy as np
import torch

from .errors import ConfigError, PipelineInputError

PAD_ID = 0
IGNORE_INDEX = -100
SCAN_ROWS = 1 << 12  # rows per read when a whole shard is scanned (max_token_id)


def context_problems(model_block: int | None, labels_block: int, where: str = "") -> list[str]:
    """What is wrong with a model's context length against the labels' blocks (see `context_length`)."""
    if model_block is not None and model_block > labels_block:
        return [
            f"{where}model.block_size={model_block} exceeds labels.block_size={labels_block}: the labels' blocks are "
            f"shorter; lower model.block_size or rebuild `labels` with a larger block_size"
        ]
    return []


def tokens_per_step(batch_size: int, block_size: int, grad_accum: int | None = 1) -> int:
    """Tokens one optimizer step trains on: blocks per micro-batch × block length × micro-batches."""
    return int(batch_size) * int(block_size) * int(grad_accum or 1)


def context_length(model_block: int | None, labels_block: int, where: str = "") -> int:
    """The context a language model trains and is evaluated on: the one rule, for every caller.

    One setting owns it: the model's `block_size` (a Transformer's positions; a recurrent model's
    truncated-backpropagation length, where None trains on the labels' whole blocks). The labels'
    `block_size` is how long the stored blocks are, so the model's may not exceed it: an error naming
    both (`where` prefixes the field name, e.g. `ops.rnn_lm.config.`)."""
    problems = context_problems(model_block, labels_block, where)
    if problems:
        raise ConfigError("; ".join(problems))
    return labels_block if model_block is None else model_block


def _check_crop(block_size: int, have: int) -> None:
    if block_size > have:
        raise ConfigError(
            f"block_size={block_size} is larger than the labels hold ({have}); "
            "rebuild `labels` with a larger block_size or lower the model's block_size"
        )


def _to_device(x: np.ndarray, y: np.ndarray, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    xt = torch.from_numpy(x.astype(np.int64))
    yt = torch.from_numpy(y.astype(np.int64))
    if torch.device(device).type == "cuda":
        return xt.pin_memory().to(device, non_blocking=True), yt.pin_memory().to(device, non_blocking=True)
    return xt.to(device), yt.to(device)


@dataclass
class TokenBlocks:
    x: np.ndarray  # (n_blocks, block_size) uint16/uint32 token ids, PAD = 0
    y: np.ndarray  # (n_blocks, block_size) int32 targets, IGNORE_INDEX where padded

    def __post_init__(self) -> None:
        if self.x.shape != self.y.shape or self.x.ndim != 2:
            raise ValueError(f"x {self.x.shape} and y {self.y.shape} must be equal 2-D shapes")

    @property
    def n_blocks(self) -> int:
        return int(self.x.shape[0])

    @property
    def block_size(self) -> int:
        return int(self.x.shape[1])

    @property
    def n_targets(self) -> int:
        return int((self.y != IGNORE_INDEX).sum())

    def crop(self, block_size: int) -> "TokenBlocks":
        """Blocks of a shorter context (a model with block_size <= the labels' block_size)."""
        _check_crop(block_size, self.block_size)
        if block_size == self.block_size:
            return self
        n = self.block_size // block_size
        x = self.x[:, : n * block_size].reshape(-1, block_size)
        y = self.y[:, : n * block_size].reshape(-1, block_size)
        keep = (y != IGNORE_INDEX).any(axis=1)
        return TokenBlocks(np.ascontiguousarray(x[keep]), np.ascontiguousarray(y[keep]))

    def batch(self, idx: np.ndarray, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks `idx` as (x, y) int64 tensors on `device`."""
        return _to_device(self.x[idx], self.y[idx], device)

    def drop_empty(self) -> "TokenBlocks":
        """The blocks that hold at least one target (self when every block does)."""
        keep = (self.y != IGNORE_INDEX).any(axis=1)
        if keep.all():
            return self
        return TokenBlocks(np.ascontiguousarray(self.x[keep]), np.ascontiguousarray(self.y[keep]))

    def max_token_id(self) -> int:
        """The largest token id among inputs and targets (-1 without blocks)."""
        return max(int(self.x.max()), int(self.y.max())) if self.n_blocks else -1


def split_tail(blocks: TokenBlocks, fraction: float, what: str = "training blocks") -> tuple[TokenBlocks, TokenBlocks]:
    """(head, tail): the last `fraction` of `blocks` held out, in stream order (blocks are packed from the
    token stream in order, so the tail is the stream's last stretch). For choices made on data the
    claims do not judge: the tune job scores its trials on the training split's tail, never on the
    validation split."""
    n = blocks.n_blocks
    held = max(1, int(round(n * fraction)))
    if not 0 < fraction < 1 or n - held < 1:
        raise PipelineInputError(f"cannot hold out {fraction:.0%} of {n} {what}: too few to keep any for training")
    cut = n - held
    return TokenBlocks(blocks.x[:cut], blocks.y[:cut]), TokenBlocks(blocks.x[cut:], blocks.y[cut:])


class _Column:
    """`ShardedBlocks.x` / `.y`: indexed like an (n_blocks, block_size) array (an int, a slice, an
    int or bool array of blocks, optionally with a column index); reads only the blocks asked for."""

    def __init__(self, view: "ShardedBlocks", which: int) -> None:
        self._view, self._which = view, which

    @property
    def shape(self) -> tuple[int, int]:
        return (self._view.n_blocks, self._view.block_size)

    ndim = 2

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def dtype(self) -> np.dtype:
        return self._view._dtypes[self._which]

    def __len__(self) -> int:
        return self._view.n_blocks

    def __getitem__(self, key: Any) -> np.ndarray:
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        n = self._view.n_blocks
        if isinstance(rows, (int, np.integer)):
            i = int(rows) + (n if rows < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"block {rows} out of range for {n} blocks")
            return self._view._gather(np.array([i]), self._which)[0][cols]
        if isinstance(rows, slice):
            ids = np.arange(*rows.indices(n))
        else:
            ids = np.asarray(rows)
            if ids.dtype == bool:
                if ids.shape != (n,):
                    raise IndexError(f"boolean index of shape {ids.shape} for {n} blocks")
                ids = np.flatnonzero(ids)
            ids = np.where(ids < 0, ids + n, ids)
        return self._view._gather(ids, self._which)[:, cols]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """Every block, in memory (for small splits; training reads batches)."""
        a = self[:]
        return a.astype(dtype) if dtype is not None else a


class ShardedBlocks:
    """Many shards' blocks seen as one sequence of blocks, shard after shard, read through their
    memory maps: a batch reads only its own blocks, and nothing is concatenated in memory.

    shards: per shard, its X and Y arrays of shape (n_i, B) (as `build_labels` writes them,
    `np.load(..., mmap_mode="r")`) and its number of real targets (None: counted from its last
    row). A shard's padding only trails it, so only its last row holds padding.

    `crop(T)` gives the view of a shorter context as `TokenBlocks.crop` does: each row cut into
    pieces of T tokens (column offsets `cols`), pieces without a target left out. Nothing is read
    for it: a piece holds a target exactly when it starts before the shard's last real target.
    """

    def __init__(
        self,
        shards: Sequence[tuple[np.ndarray, np.ndarray, int | None]],
        cols: Sequence[int] | np.ndarray | None = None,
        width: int | None = None,
    ) -> None:
        if not shards:
            raise ValueError("ShardedBlocks needs at least one shard")
        full = int(shards[0][0].shape[1])
        self._full, self._width = full, int(width or full)
        self._cols = np.asarray([0] if cols is None else cols, dtype=np.int64)
        self._shards: list[tuple[np.ndarray, np.ndarray, int]] = []
        counts, targets = [], 0
        for i, (x, y, real) in enumerate(shards):
            if x.shape != y.shape or x.ndim != 2 or x.shape[1] != full:
                raise ValueError(f"shard {i}: x {x.shape} and y {y.shape} must be equal 2-D shapes of width {full}")
            rows = int(x.shape[0])
            if real is None:
                real = (rows - 1) * full + int(np.count_nonzero(np.asarray(y[-1]) != IGNORE_INDEX)) if rows else 0
            if not ((rows - 1) * full < real <= rows * full if rows else real == 0):
                raise ValueError(
                    f"shard {i}: {real} targets do not fit {rows} blocks of {full} with padding only in the last"
                )
            if rows == 0:
                continue
            last = real - (rows - 1) * full  # real targets in the last row
            kept_last = self._cols < last
            counts.append((rows - 1) * len(self._cols) + int(kept_last.sum()))
            targets += (rows - 1) * len(self._cols) * self._width + int(
                np.minimum(self._width, last - self._cols[kept_last]).sum()
            )
            self._shards.append((x, y, int(real)))
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._targets = targets
        self._dtypes = (
            np.result_type(*[s[0].dtype for s in self._shards] or [np.uint16]),
            np.result_type(*[s[1].dtype for s in self._shards] or [np.int32]),
        )
        self.x, self.y = _Column(self, 0), _Column(self, 1)

    @property
    def n_blocks(self) -> int:
        return int(self._starts[-1])

    @property
    def block_size(self) -> int:
        return self._width

    @property
    def n_targets(self) -> int:
        return self._targets

    @property
    def n_shards(self) -> int:
        return len(self._shards)

    def crop(self, block_size: int) -> "ShardedBlocks":
        """The view of a shorter context (a model with block_size <= the labels' block_size)."""
        _check_crop(block_size, self.block_size)
        if block_size == self.block_size:
            return self
        pieces = np.arange(self.block_size // block_size) * block_size
        cols = (self._cols[:, None] + pieces[None, :]).reshape(-1)
        return ShardedBlocks(self._shards, cols=cols, width=block_size)

    def _gather(self, idx: np.ndarray, which: int) -> np.ndarray:
        """Blocks `idx` of X (which=0) or Y (1) as one (len(idx), block_size) array."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        n = self.n_blocks
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"block index out of range for {n} blocks")
        shard = np.searchsorted(self._starts, idx, side="right") - 1
        rows, piece = np.divmod(idx - self._starts[shard], len(self._cols))
        out = np.empty((len(idx), self._width), dtype=self._dtypes[which])
        span = np.arange(self._width)
        whole = self._width == self._full
        for s in np.unique(shard):
            sel = np.flatnonzero(shard == s)
            a = self._shards[s][which]
            out[sel] = a[rows[sel]] if whole else a[rows[sel][:, None], self._cols[piece[sel]][:, None] + span]
        return out

    def batch(self, idx: np.ndarray, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks `idx` as (x, y) int64 tensors on `device`."""
        return _to_device(self._gather(idx, 0), self._gather(idx, 1), device)

    def drop_empty(self) -> "ShardedBlocks":
        """Self: a view never holds a block without a target (see the class doc)."""
        return self

    def max_token_id(self) -> int:
        """The largest token id among inputs and targets, every shard's arrays read a slice at a time
        (from the file itself when memory-mapped: a scan leaves no pages mapped in this process)."""
        return max(_scan_max(a) for x, y, _ in self._shards for a in (x, y))


def _scan_max(a: np.ndarray) -> int:
    step = SCAN_ROWS * int(a.shape[1])
    if isinstance(a, np.memmap) and a.filename is not None and a.flags.c_contiguous:
        top, left = -1, a.size
        with open(a.filename, "rb") as fh:
            fh.seek(a.offset)
            while left:
                chunk = np.fromfile(fh, dtype=a.dtype, count=min(left, step))
                if not len(chunk):
                    raise ValueError(f"{a.filename} is shorter than its header says")
                top, left = max(top, int(chunk.max())), left - len(chunk)
        return top
    return max((int(a[i : i + SCAN_ROWS].max()) for i in range(0, a.shape[0], SCAN_ROWS)), default=-1)


Blocks = Union[TokenBlocks, ShardedBlocks]
