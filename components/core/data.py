"""Next-token blocks as the training loop and evaluators see them.

X (inputs) and Y (targets) are int arrays of shape (n_blocks, block_size); Y is X shifted by one,
with -100 where the target is padding (ignored by the loss). PAD is token id 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import ConfigError

PAD_ID = 0
IGNORE_INDEX = -100


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
        if block_size > self.block_size:
            raise ConfigError(
                f"block_size={block_size} is larger than the labels hold ({self.block_size}); "
                "rebuild `labels` with a larger block_size or lower the model's block_size"
            )
        if block_size == self.block_size:
            return self
        n = self.block_size // block_size
        x = self.x[:, : n * block_size].reshape(-1, block_size)
        y = self.y[:, : n * block_size].reshape(-1, block_size)
        keep = (y != IGNORE_INDEX).any(axis=1)
        return TokenBlocks(np.ascontiguousarray(x[keep]), np.ascontiguousarray(y[keep]))

    def batch(self, idx: np.ndarray, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks `idx` as (x, y) int64 tensors on `device`."""
        x = torch.from_numpy(self.x[idx].astype(np.int64))
        y = torch.from_numpy(self.y[idx].astype(np.int64))
        if torch.device(device).type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)
