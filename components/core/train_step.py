"""One optimizer step of the training loop, the validation loss, and the state a resume restores.

`TrainState` holds what a resume restores (`snapshot` / `restore`); `optimizer_step` is one timed
update (the learning rate from `lr_at`, this rank's blocks from `batch_indices`); `log_point` the
metrics of a log point; `evaluate` the validation loss; `make_optimizer` builds the AdamW (or SGD)
with weight decay on tensors of >= 2 dimensions only. Split out of `components.core.training`, whose
`train` strings them together (the module doc there describes the loop).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn as nn
from torch.profiler import record_function

from .data import IGNORE_INDEX, Blocks
from .device import autocast_context, synchronize
from .errors import PipelineInputError
from .train_settings import Parallel, TrainSettings


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup to s.lr over warmup_steps, then cosine down to s.min_lr at lr_decay_steps."""
    decay_steps = s.lr_decay_steps or s.max_steps
    if step < s.warmup_steps:
        return s.lr * (step + 1) / (s.warmup_steps + 1)
    if step >= decay_steps:
        return s.min_lr
    progress = (step - s.warmup_steps) / max(1, decay_steps - s.warmup_steps)  # 0 -> 1
    return s.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (s.lr - s.min_lr)


def make_optimizer(model: nn.Module, s: TrainSettings, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if s.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=s.lr, momentum=s.beta1)
    # The fused kernel on the CPU too (torch >= 2.4): one pass over every tensor instead of a dozen
    # small ops per parameter, about 3 of a baby-GPT step's 66 ms here (benchmarks/train_profile.py).
    return torch.optim.AdamW(groups, lr=s.lr, betas=(s.beta1, s.beta2), fused=device.type in ("cuda", "cpu"))


def batch_indices(sampler: np.random.Generator, n_blocks: int, batch_size: int, parallel: Parallel) -> np.ndarray:
    """This rank's blocks of one global batch: batch_size indices drawn by the sampler (the same on
    every rank, whatever the world size), rank r taking slice r of batch_size / world_size. With one
    process: the whole draw."""
    idx = sampler.integers(0, n_blocks, size=batch_size)
    per_rank = batch_size // parallel.world_size
    return idx[parallel.rank * per_rank : (parallel.rank + 1) * per_rank]


def _grad_norm(params: list[torch.Tensor]) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())


def eval_targets(data: Blocks, batch_size: int, max_batches: int | None) -> int:
    """The number of targets `evaluate` averages over (the first max_batches * batch_size blocks; None = all)."""
    n = data.n_blocks if max_batches is None else min(data.n_blocks, batch_size * max_batches)
    return int((np.asarray(data.y[:n]) != IGNORE_INDEX).sum())


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Blocks,
    *,
    batch_size: int,
    max_batches: int | None,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
) -> float:
    """Mean loss over the non-ignored targets of the first `max_batches * batch_size` blocks."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    n = data.n_blocks if max_batches is None else min(data.n_blocks, batch_size * max_batches)
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    with autocast_context(device, dtype):  # one context: each weight is cast once, not once per batch
        for start in range(0, n, batch_size):
            x, y = data.batch(np.arange(start, min(start + batch_size, n)), device)
            n_targets = int((y != IGNORE_INDEX).sum())
            if n_targets == 0:
                continue
            _, loss = model(x, y)
            total += loss.double() * n_targets  # the model's loss is a mean over this batch's targets
            count += n_targets
    model.train(was_training)
    if count == 0:
        raise PipelineInputError(f"no targets to evaluate on ({data.n_blocks} blocks); rebuild the validation labels")
    return float(total / count)


@dataclass
class TrainState:
    """Everything a resumed run restores to continue exactly: the module (uncompiled, unwrapped), its
    optimizer and loss scaler, the batch sampler, the step, the logged history, the best validation
    loss, and the training losses summed since the last log point."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    sampler: np.random.Generator
    step: int = 0
    history: list[dict] = field(default_factory=list)
    best_val: float = float("inf")
    pending_loss_sum: float = 0.0
    pending_n: int = 0
    # The model's parameters, listed once: `model.parameters()` walks the module tree on every call,
    # about 0.5 ms of a baby-GPT step when the norm and the clip each ask for it.
    params: list[torch.Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.params = list(self.model.parameters())

    def snapshot(self, settings: TrainSettings, device: torch.device) -> dict:
        """The train_state.pt content besides step, identity and optimizer (which `save_checkpoint` adds)."""
        return {
            "history": self.history,
            "best_val_loss": self.best_val,
            "sampler_state": self.sampler.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state() if device.type == "cuda" else None,
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {},
            "pending": {"loss_sum": self.pending_loss_sum, "n": self.pending_n},
            "train_settings": settings.model_dump(),
        }

    def restore(self, ckpt: dict, device: torch.device) -> None:
        """Take over a loaded checkpoint's state (the weights and optimizer are already loaded)."""
        self.step, self.history, self.best_val = int(ckpt["step"]), list(ckpt["history"]), float(ckpt["best_val_loss"])
        self.sampler.bit_generator.state = ckpt["sampler_state"]
        torch.set_rng_state(ckpt["torch_rng"])
        if device.type == "cuda" and ckpt.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ckpt["cuda_rng"])
        if ckpt.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(ckpt["scaler"])
        self.pending_loss_sum, self.pending_n = float(ckpt["pending"]["loss_sum"]), int(ckpt["pending"]["n"])

    def take_pending_loss(self) -> float:
        """The mean training loss since the last log point; resets the sums."""
        mean = self.pending_loss_sum / self.pending_n
        self.pending_loss_sum, self.pending_n = 0.0, 0
        return mean


@dataclass
class StepStats:
    loss: float  # mean over the micro-batches
    lr: float
    grad_norm: torch.Tensor  # before clipping
    grad_norm_clipped: torch.Tensor | None  # after clipping, measured; None when not asked for
    seconds: float
    not_finite: str | None = None  # what was NaN/inf when the update was refused (divergence)


def optimizer_step(
    state: TrainState,
    model: nn.Module,
    data: Blocks,
    s: TrainSettings,
    *,
    device: torch.device,
    dtype: torch.dtype,
    parallel: Parallel,
    measure_clipped: bool,
) -> StepStats:
    """One timed optimizer step over s.grad_accum micro-batches (no logging, evaluation or checkpoint).

    `model` is what runs forward (possibly compiled or DDP-wrapped); `state.model` the raw module. A
    non-finite loss or gradient norm refuses the update (the weights stay finite, the step does not
    advance) and says so in `not_finite`.
    """
    synchronize(device)
    t0 = time.perf_counter()
    lr = lr_at(state.step, s)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=device)
    # The phases are named for torch.profiler (benchmarks/train_profile.py); unprofiled they cost ~1 µs.
    for _ in range(s.grad_accum):
        with record_function("phase/batch"):
            x, y = data.batch(
                batch_indices(state.sampler, data.n_blocks, s.batch_size, parallel), device
            )  # (B, T) each
        with record_function("phase/forward"), autocast_context(device, dtype):
            _, loss = model(x, y)
        loss_sum += loss.detach().float()
        with record_function("phase/backward"):
            state.scaler.scale(loss / s.grad_accum).backward()
    state.scaler.unscale_(state.optimizer)
    with record_function("phase/grad_norm"):
        grad_norm = _grad_norm(state.params)  # before clipping
    step_loss = float(loss_sum) / s.grad_accum  # one host sync per step: needed to stop on NaN
    # With float16 loss scaling an inf gradient is routine (the scaler skips that step); else it is divergence.
    bad_grad = not state.scaler.is_enabled() and not math.isfinite(float(grad_norm))
    if not math.isfinite(step_loss) or bad_grad:
        state.optimizer.zero_grad(set_to_none=True)  # the update is never applied: the weights stay finite
        what = f"loss {step_loss}" if not math.isfinite(step_loss) else f"gradient norm {float(grad_norm)}"
        return StepStats(step_loss, lr, grad_norm, None, 0.0, not_finite=what)
    if s.grad_clip > 0:
        with record_function("phase/clip"):
            torch.nn.utils.clip_grads_with_norm_(state.params, s.grad_clip, grad_norm)
    # Measured on the clipped gradients (not inferred), so a test can check the bound holds.
    clipped = _grad_norm(state.params) if measure_clipped else None
    with record_function("phase/optimizer"):
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.optimizer.zero_grad(set_to_none=True)
    synchronize(device)  # the optimizer step runs asynchronously on CUDA: count it in this step
    state.step += 1
    state.pending_loss_sum += step_loss
    state.pending_n += 1
    return StepStats(step_loss, lr, grad_norm, clipped, time.perf_counter() - t0)


def _mean_over_ranks(state: TrainState, st: StepStats, device: torch.device, parallel: Parallel) -> StepStats:
    """The step's loss averaged over the ranks (each rank's own is the mean over its slice), on every
    rank, and the pending log-interval sum with it."""
    loss = torch.tensor([st.loss], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(loss)  # a sum
    mean = float(loss) / parallel.world_size
    if not st.not_finite:  # an update refused did not add to the sums
        state.pending_loss_sum += mean - st.loss
    return replace(st, loss=mean)


def log_point(
    state: TrainState, st: StepStats, *, seconds: float, steps: int, tokens_per_step: int
) -> dict[str, float]:
    """The training metrics of a log point: the mean loss since the last one (resetting the sums), the
    lr and gradient norms of this step, and the throughput over the `steps` steps (`seconds`) since."""
    point = {
        "train/loss": state.take_pending_loss(),
        "lr": st.lr,
        "grad_norm": float(st.grad_norm),
        "tokens_per_s": steps * tokens_per_step / seconds,
        "step_ms": 1000 * seconds / steps,
    }
    if st.grad_norm_clipped is not None:
        point["grad_norm_clipped"] = float(st.grad_norm_clipped)
    return point
