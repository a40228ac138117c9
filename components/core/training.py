"""The one training loop every language model of the pipeline goes through (RNN, LSTM, Transformer).

Model contract: `model(idx, targets=None) -> (logits, loss)`, the loss a cross-entropy over the
targets with -100 ignored. A model should expose `model.config` (a pydantic settings object) and may
expose `model.model_kind` (a string) and `model.vocab_size`; they go into the checkpoint metadata and
a resume refuses a checkpoint whose kind, config, vocabulary size or tokenizer hash differ.

The loop (nanoGPT-like):
    AdamW (fused on CUDA), linear warmup then cosine decay to min_lr, gradient accumulation,
    global grad-norm clipping (grad_clip=0 turns it off), bf16 autocast where the hardware multiplies
    bf16 natively (CUDA; a CPU with AMX: `device.resolve_dtype`), periodic
    evaluation on the first validation blocks, tokens/s, and checkpoints from which a resumed run
    continues *exactly* as if it had never stopped (same weights, optimizer moments, batch sampler
    and dropout RNG state, and the partial log-interval sums).

In parts: `TrainState` holds what a resume restores (`snapshot` / `restore`); `optimizer_step` is
one timed update; `log_point` the metrics of a log point; `evaluate` the validation loss (those in
`components.core.train_step`); `save_checkpoint` / `load_checkpoint` the files
(`components.core.checkpoint`); `train` strings them together on the logging, evaluation and
checkpoint schedule (`_setup`, `_run_loop`, `_result`). Plots are drawn by the caller from
`TrainResult.history` (`components.core.plots.plot_history`).

Data parallelism. `train(..., parallel=Parallel(rank, world_size))`: `batch_size` is the global
batch. Every rank holds the same sampler state and draws the same batch_size block indices, of
which rank r trains on slice r (batch_size / world_size blocks; batch_size must divide); only the
main rank (0) logs, reports progress and writes checkpoints and history.json. With world_size > 1
the caller initialises torch.distributed and passes the model wrapped in DistributedDataParallel
(which averages the gradients in backward; `components.core.distributed` is that caller, under
torchrun), and each step's loss is averaged over the ranks, so the logged losses, the divergence
check and the checkpointed state are the same on every rank and do not depend on world_size.
Hence a checkpoint resumes into any world size that divides batch_size: the same blocks in the
same order, the same schedule and optimizer state; the numbers agree with an uninterrupted run up
to float summation order (gradients averaged over ranks of per-rank means: equal to the one-process
mean when every block holds the same number of targets), and with dropout > 0 the masks drawn
differ (the same distribution, not the same numbers). Nothing here imports torch.distributed for
world_size 1.

Weight decay goes to every tensor with >= 2 dimensions (matmul weights and embeddings, as in
nanoGPT) and not to biases or norm gains, which only shift or scale and do not overfit.

Metric names (shared across models so they line up in MLflow): train/loss, val/loss, val/ppl,
tokens_per_s and step_ms (over the interval since the previous log point), grad_norm (before
clipping), grad_norm_clipped (after), lr. The run's own figures have their own names
(`TrainResult.metrics`): train/tokens_per_s_mean, train/step_ms_mean (mean step time after the first
step), val/best_loss, wall_s, params, steps.

Files under `out_dir`:
    checkpoint/model.safetensors   weights + metadata (model_kind, model_config, tokenizer_sha256, step, ...)
    checkpoint/train_state.pt      optimizer, step, the model identity, sampler and torch RNG states,
                                   history (torch.save; loaded with weights_only=True). A restore
                                   refuses a pair whose step or identity disagree.
    checkpoint/sha256.json         the SHA-256 of both files, written with them: a restore refuses
                                   (CheckpointCorruptError, naming the file) any file whose bytes
                                   changed since, before anything is loaded.
    history.json                   the logged points of the (last) run
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, cast

import numpy as np
import torch
import torch.nn as nn

from .artifacts import write_json
from .checkpoint import CHECKPOINT_DIR, STATE_FILE, _Unsharded, model_metadata
from .data import Blocks, context_length, tokens_per_step
from .device import resolve_device, resolve_dtype
from .errors import ConfigError, PipelineInputError
from .heap import keep_freed_memory
from .models.sizing import count_parameters
from .train_settings import Parallel, TrainSettings
from .train_step import (
    StepStats,
    TrainState,
    _mean_over_ranks,
    eval_targets,
    evaluate,
    log_point,
    make_optimizer,
    optimizer_step,
)

# Training settings that change the trajectory: a resume with different values is allowed (e.g. to
# fine-tune at a lower lr) but no longer reproduces an uninterrupted run, so it is warned about.
_TRAJECTORY_FIELDS = (
    "batch_size",
    "lr",
    "min_lr",
    "warmup_steps",
    "lr_decay_steps",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "grad_accum",
    "seed",
    "dtype",
    "optimizer",
)


class TrainingDivergedError(RuntimeError):
    """The loss (or the gradient norm) became NaN or infinite. The last good checkpoint is kept."""

    def __init__(self, message: str, *, step: int, loss: float, checkpoint_dir: Path | None, history: list[dict]):
        super().__init__(message)
        self.step, self.loss, self.checkpoint_dir, self.history = step, loss, checkpoint_dir, history


@dataclass
class TrainResult:
    steps: int
    train_loss: float
    val_loss: float
    val_ppl: float
    best_val_loss: float
    tokens_per_s: float
    step_ms: float
    wall_s: float
    params: int
    device: str
    dtype: str
    warnings: list[str]
    history: list[dict]  # one dict per log/eval point: step, train/loss, val/loss, val/ppl, lr, grad_norm, ...
    checkpoint_dir: Path
    resumed_from: int = 0  # the step a resume started at (0 = fresh run)
    val_targets: int = (
        0  # how many validation targets val_loss is the mean over (all of them unless eval_batches is set)
    )
    train_s: float = float("nan")  # seconds of optimizer steps in this call (evaluation and checkpoints left out)

    def metrics(self) -> dict[str, float]:
        """Headline numbers under the shared metric names."""
        return {
            "train/loss": self.train_loss,
            "val/loss": self.val_loss,
            "val/ppl": self.val_ppl,
            "val/best_loss": self.best_val_loss,
            "train/tokens_per_s_mean": self.tokens_per_s,  # the run's figure; `tokens_per_s` is the per-interval series
            "train/step_ms_mean": self.step_ms,  # likewise; `step_ms` is the per-interval series
            "wall_s": self.wall_s,
            "params": float(self.params),
            "steps": float(self.steps),
            "val/targets": float(self.val_targets),
            "train/seconds": self.train_s,
        }


# ----------------------------------------------------------------------------------------------
# Data checks


def _non_empty_blocks(data: Blocks, name: str) -> Blocks:
    """Drop blocks with no target at all (their mean loss would be 0/0); refuse empty splits."""
    kept = data.drop_empty()
    if kept.n_blocks == 0:
        raise PipelineInputError(
            f"the {name} split has no targets ({data.n_blocks} blocks, all padding); rebuild the labels"
        )
    return kept


def _check_vocab(model: nn.Module, data: Blocks, name: str) -> None:
    vocab = getattr(model, "vocab_size", None)
    if vocab is None or data.n_blocks == 0:
        return
    top = data.max_token_id()
    if top >= vocab:
        raise PipelineInputError(
            f"the {name} labels hold token id {top} but the model's vocabulary has {vocab} ids: the labels come "
            "from a different tokenizer; rebuild the labels with the model's tokenizer (or the model for these labels)"
        )


# ----------------------------------------------------------------------------------------------
# The loop: `train` = `_setup` (device, data, fresh or resumed state) + `_run_loop` + `_result`


@dataclass
class _Run:
    """What `train` sets up once and its loop and result share."""

    s: TrainSettings
    model: nn.Module  # what runs forward (possibly compiled or DDP-wrapped)
    raw_model: nn.Module  # the uncompiled, unwrapped module: checkpoints and callbacks see this one
    state: TrainState
    train_data: Blocks
    val_data: Blocks
    device: torch.device
    dtype: torch.dtype
    out_dir: Path
    ckpt_dir: Path
    tokens_per_step: int  # over all ranks
    notes: list[str]
    resumed_from: int
    last_good: int | None  # the step of the newest checkpoint of this run
    step_times: list[float] = field(default_factory=list)

    def validate(self) -> float:
        s = self.s
        return evaluate(
            self.model,
            self.val_data,
            batch_size=s.eval_batch,
            max_batches=s.eval_batches,
            device=self.device,
            dtype=self.dtype,
        )


def _raw_module(model: nn.Module, s: TrainSettings, parallel: Parallel) -> nn.Module:
    """The module under any DDP wrapper, after checking the data-parallel setup."""
    if parallel.world_size == 1:
        return model
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise ConfigError(f"world_size={parallel.world_size} needs torch.distributed initialised in every rank first")
    if s.batch_size % parallel.world_size:
        raise ConfigError(
            f"train.batch_size={s.batch_size} (the global batch) must be a multiple of the world size "
            f"{parallel.world_size}"
        )
    return model if parallel.sharded else cast(nn.Module, model.module)  # FSDP2 shards in place; DDP wraps


def _fit_data(
    raw_model: nn.Module, train_data: Blocks, val_data: Blocks, s: TrainSettings
) -> tuple[Blocks, Blocks, int]:
    """The model's vocabulary must cover the labels, and the context must fit in them: (train, val, block_size)."""
    _check_vocab(raw_model, train_data, "train")
    _check_vocab(raw_model, val_data, "validation")
    model_block = getattr(getattr(raw_model, "config", None), "block_size", None)
    block_size = context_length(model_block, train_data.block_size)
    train_data = _non_empty_blocks(train_data.crop(block_size), "train")
    val_data = _non_empty_blocks(val_data.crop(min(block_size, val_data.block_size)), "validation")
    return train_data, val_data, block_size


def _setup(
    model: nn.Module,
    train_data: Blocks,
    val_data: Blocks,
    s: TrainSettings,
    out_dir: Path,
    *,
    resume: bool,
    model_meta: dict | None,
    parallel: Parallel,
) -> _Run:
    """Device and dtype, the data checked and cropped, and a fresh state or the exact state of the checkpoint."""
    ckpt_dir = out_dir / CHECKPOINT_DIR
    notes: list[str] = []
    keep_freed_memory()  # each step frees what the next allocates: kept, not faulted in again (heap.py)
    if s.threads > 0:
        torch.set_num_threads(s.threads)
    device, warn = resolve_device(s.device)
    if warn:
        notes.append(warn)
    dtype = resolve_dtype(s.dtype, device)
    raw_model = _raw_module(model, s, parallel)
    train_data, val_data, block_size = _fit_data(raw_model, train_data, val_data, s)

    model.to(device)
    # Fresh state, or the exact state of the checkpoint.
    state = TrainState(
        model=raw_model,  # checkpoints and callbacks see the uncompiled, unwrapped module
        optimizer=make_optimizer(raw_model, s, device),
        scaler=torch.amp.GradScaler(device.type, enabled=dtype == torch.float16),
        sampler=np.random.default_rng(s.seed),
    )
    torch.manual_seed(s.seed)
    meta = model_metadata(raw_model, model_meta)
    resumed_from = 0
    if resume and (ckpt_dir / STATE_FILE).is_file():
        ckpt = (parallel.sharded or _Unsharded).load_checkpoint(
            ckpt_dir, raw_model, state.optimizer, expected_meta=meta
        )
        state.restore(ckpt, device)
        resumed_from = state.step
        old = ckpt.get("train_settings", {})
        changed = [k for k in _TRAJECTORY_FIELDS if k in old and old[k] != getattr(s, k)]
        if changed:
            notes.append(f"resumed with changed settings {changed}: the run will differ from an uninterrupted one")
    elif not resume and ckpt_dir.exists():
        notes.append(f"resume=False: starting fresh, the checkpoint in {ckpt_dir} will be replaced")

    if s.compile:
        model = cast(nn.Module, torch.compile(model, options=dict(s.compile_options) or None))  # an OptimizedModule
    return _Run(
        s=s,
        model=model,
        raw_model=raw_model,
        state=state,
        train_data=train_data,
        val_data=val_data,
        device=device,
        dtype=dtype,
        out_dir=out_dir,
        ckpt_dir=ckpt_dir,
        tokens_per_step=tokens_per_step(s.batch_size, block_size, s.grad_accum),
        notes=notes,
        resumed_from=resumed_from,
        last_good=state.step if resumed_from else None,
    )


def _divergence_message(run: _Run, st: StepStats) -> str:
    s, last_good = run.s, run.last_good
    kept = f"The last good checkpoint (step {last_good}) is kept in {run.ckpt_dir}. " if last_good is not None else ""
    return (
        f"training diverged at step {run.state.step + 1}: {st.not_finite} is not finite. "
        f"{kept or 'No checkpoint was written yet. '}"
        f"Lower lr (now {s.lr}), keep grad_clip > 0 (now {s.grad_clip}) or train in float32."
    )


def _run_loop(
    run: _Run,
    *,
    stop_at: int,
    log_metrics: Callable[[dict[str, float], int], None] | None,
    progress: Callable[[dict[str, float], int, int, float], None] | None,
    model_meta: dict | None,
    step_callback: Callable[[int, nn.Module], dict[str, float] | None] | None,
    parallel: Parallel,
) -> tuple[str | None, StepStats | None]:
    """Optimizer steps up to `stop_at`, logging, evaluating and checkpointing on schedule; returns
    (the divergence message or None, the last step's stats)."""
    s, state, device = run.s, run.state, run.device
    interval_time, interval_steps = 0.0, 0  # since the last log point, in this call
    st: StepStats | None = None
    while state.step < stop_at:
        will_log = (state.step + 1) % s.log_interval == 0 or state.step + 1 == s.max_steps
        st = optimizer_step(
            state,
            run.model,
            run.train_data,
            s,
            device=device,
            dtype=run.dtype,
            parallel=parallel,
            measure_clipped=will_log,
        )
        if parallel.world_size > 1:
            st = _mean_over_ranks(state, st, device, parallel)
        if st.not_finite:
            return _divergence_message(run, st), st
        run.step_times.append(st.seconds)
        interval_time += st.seconds
        interval_steps += 1

        # ---- bookkeeping (untimed) ----
        point: dict[str, float] = {}
        is_last = state.step == s.max_steps
        if state.step % s.log_interval == 0 or is_last:
            point.update(
                log_point(state, st, seconds=interval_time, steps=interval_steps, tokens_per_step=run.tokens_per_step)
            )
            interval_time, interval_steps = 0.0, 0
            if step_callback is not None:
                point.update(step_callback(state.step, run.raw_model) or {})
        is_eval = (s.eval_interval > 0 and state.step % s.eval_interval == 0) or is_last
        if is_eval:
            val_loss = run.validate()
            state.best_val = min(state.best_val, val_loss)
            point.update({"val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 700.0))})
        if point:
            state.history.append({"step": state.step, **point})
            if parallel.is_main and log_metrics is not None:
                log_metrics(point, state.step)
            if parallel.is_main and progress is not None:
                eta = (s.max_steps - state.step) * float(np.mean(run.step_times))
                progress(point, state.step, s.max_steps, eta)
        checkpoint_due = (
            (s.checkpoint_interval > 0 and state.step % s.checkpoint_interval == 0)
            or (s.checkpoint_interval == 0 and is_eval)
            or is_last
            or state.step == stop_at
        )
        if checkpoint_due and (parallel.is_main or parallel.sharded):
            (parallel.sharded or _Unsharded).save_checkpoint(
                run.ckpt_dir,
                run.raw_model,
                step=state.step,
                optimizer=state.optimizer,
                train_state=state.snapshot(s, device),
                model_meta=model_meta,
            )
            run.last_good = state.step
    return None, st


def _result(run: _Run, parallel: Parallel, t_start: float) -> TrainResult:
    """history.json (main rank), a final validation unless the last point has one, and the run's figures."""
    s, state = run.s, run.state
    history = state.history
    if parallel.is_main:
        write_json(run.out_dir / "history.json", history)
    train_pts = [h for h in history if "train/loss" in h]
    val_pts = [h for h in history if "val/loss" in h]
    if not val_pts or val_pts[-1]["step"] != state.step:  # e.g. a resume of a finished run, or an interruption
        val_loss = run.validate()
        state.best_val = min(state.best_val, val_loss)
    else:
        val_loss = val_pts[-1]["val/loss"]
    timed = run.step_times[1:] or run.step_times  # the first step pays for allocation / compilation
    step_ms = 1000 * float(np.mean(timed)) if timed else float("nan")
    return TrainResult(
        steps=state.step,
        train_loss=train_pts[-1]["train/loss"] if train_pts else float("nan"),
        val_loss=val_loss,
        val_ppl=math.exp(min(val_loss, 700.0)),
        best_val_loss=state.best_val,
        tokens_per_s=run.tokens_per_step / (step_ms / 1000) if timed else float("nan"),
        step_ms=step_ms,
        wall_s=time.perf_counter() - t_start,
        params=count_parameters(run.raw_model),
        device=str(run.device),
        dtype=str(run.dtype).removeprefix("torch."),
        warnings=run.notes,
        history=history,
        checkpoint_dir=run.ckpt_dir,
        resumed_from=run.resumed_from,
        val_targets=eval_targets(run.val_data, s.eval_batch, s.eval_batches),
        train_s=float(np.sum(run.step_times)),
    )


def train(
    model: nn.Module,
    train_data: Blocks,
    val_data: Blocks,
    settings: TrainSettings,
    out_dir: str | Path,
    *,
    log_metrics: Callable[[dict[str, float], int], None] | None = None,
    progress: Callable[[dict[str, float], int, int, float], None] | None = None,
    resume: bool = True,
    stop_after_steps: int | None = None,
    model_meta: dict | None = None,
    step_callback: Callable[[int, nn.Module], dict[str, float] | None] | None = None,
    raise_on_divergence: bool = True,
    parallel: Parallel = Parallel(),
) -> TrainResult:
    """Train `model` in place for settings.max_steps optimizer steps; checkpoints go to out_dir/checkpoint.

    log_metrics(point, step): the metrics of every log/eval point (main rank only).
    progress(point, step, max_steps, eta_s): the same points with the steps left and the estimated
        seconds to go (from this call's mean step time), for a progress line (main rank only).
    resume: continue from out_dir/checkpoint when it exists (refusing another model's checkpoint).
    stop_after_steps: stop after this many steps of *this call*, writing a checkpoint first — an
        interruption on purpose, to prove that a resume continues exactly.
    model_meta: extra checkpoint metadata; `tokenizer_sha256` in it is checked on resume.
    step_callback(step, model): called at every log point; the metrics it returns are logged too.
    raise_on_divergence: False returns the result up to the last finite step instead of raising
        (for experiments that expect divergence); result.warnings then says where it diverged.
    parallel: this process's data-parallel rank (module doc); world_size > 1 needs torch.distributed
        initialised and `model` wrapped in DistributedDataParallel.
    """
    t_start = time.perf_counter()
    s = settings
    run = _setup(model, train_data, val_data, s, Path(out_dir), resume=resume, model_meta=model_meta, parallel=parallel)
    state = run.state
    stop_at = s.max_steps if stop_after_steps is None else min(s.max_steps, state.step + stop_after_steps)
    run.model.train()
    diverged, st = _run_loop(
        run,
        stop_at=stop_at,
        log_metrics=log_metrics,
        progress=progress,
        model_meta=model_meta,
        step_callback=step_callback,
        parallel=parallel,
    )
    if diverged:
        assert st is not None  # divergence is read off a step's stats
        if raise_on_divergence:
            raise TrainingDivergedError(
                diverged,
                step=state.step + 1,
                loss=st.loss,
                checkpoint_dir=run.ckpt_dir if run.last_good is not None else None,
                history=state.history,
            )
        run.notes.append(diverged)
    return _result(run, parallel, t_start)
