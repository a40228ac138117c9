"""FSDP2 on the ranks of a data-parallel training (`distributed`, strategy `fsdp`): the model sharded
(`shard_model`), the parameters a rank holds (`local_parameters`), and checkpoints of a sharded model in
the format of an unsharded one (`FullStateCheckpoints`), so a run resumes under DDP, FSDP or in one
process alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from .errors import ConfigError
from .train_settings import TrainSettings

__all__ = ["FullStateCheckpoints", "local_parameters", "shard_model"]


def local_parameters(model: torch.nn.Module) -> int:
    """Parameters this rank holds: all of them under DDP, its shards under FSDP."""
    return sum(_local_numel(p) for p in model.parameters())


def _local_numel(p: torch.Tensor) -> int:
    to_local = getattr(p, "to_local", None)  # a DTensor (FSDP2): this rank's shard
    return to_local().numel() if to_local is not None else p.numel()


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: each Transformer block (`model.h`) its own shard group, then the rest (embeddings, head,
    recurrent layers) at the root; parameters become DTensors sharded over the ranks, in place."""
    from torch.distributed.fsdp import fully_shard

    for block in getattr(model, "h", []):
        fully_shard(block)
    fully_shard(model)
    return model


class FullStateCheckpoints:
    """Checkpoints of an FSDP2-sharded model in the format of an unsharded one, so they resume under
    DDP, FSDP or in one process alike: saving gathers the full weights and optimizer state (every
    rank takes part) into an unsharded copy of the model on rank 0's CPU, written by
    `checkpoint.save_checkpoint`; loading reads the files into such a copy on every rank with
    `checkpoint.load_checkpoint` (identity checks included) and hands each rank its shards."""

    def __init__(self, build: Callable[[], torch.nn.Module], settings: TrainSettings, rank: int):
        self.build, self.settings, self.rank = build, settings, rank

    def _copy(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        from .train_step import make_optimizer

        with torch.random.fork_rng(devices=[]):  # building draws initial weights: leave training's RNG as it was
            model = self.build()
        return model, make_optimizer(model, self.settings, torch.device("cpu"))

    def save_checkpoint(self, ckpt_dir, model, *, step, optimizer, train_state=None, model_meta=None):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

        from .checkpoint import save_checkpoint

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)  # only rank 0 receives the tensors
        model_sd, optim_sd = get_state_dict(model, optimizer, options=full)
        if self.rank == 0:
            copy, copy_optimizer = self._copy()
            set_state_dict(
                copy,
                copy_optimizer,
                model_state_dict=model_sd,
                optim_state_dict=optim_sd,
                options=StateDictOptions(full_state_dict=True),
            )
            save_checkpoint(
                ckpt_dir, copy, step=step, optimizer=copy_optimizer, train_state=train_state, model_meta=model_meta
            )
        return Path(ckpt_dir)

    def load_checkpoint(self, ckpt_dir, model, optimizer=None, *, expected_meta=None):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

        from .checkpoint import load_checkpoint

        if optimizer is None:
            raise ConfigError("a sharded checkpoint loads the weights and the optimizer state together: pass both")
        copy, copy_optimizer = self._copy()
        state = load_checkpoint(ckpt_dir, copy, copy_optimizer, expected_meta=expected_meta)
        full = StateDictOptions(full_state_dict=True)
        model_sd, optim_sd = get_state_dict(copy, copy_optimizer, options=full)
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=full)
        return state
