"""Independent trainings side by side in worker processes, one torch thread each.

On these 2-core machines two small models trained at once with one thread each finish sooner than
one after the other with two threads each (a 4-layer, 128-wide Transformer step: 116 ms at 2 threads,
182 ms per model with two at once at 1 thread: 1.27× the work per second). Workers are forked (quick
to start; a job's arguments and result still travel pickled) when each uses one thread, and set that
thread count before any torch op, since a forked child must not use an OpenMP pool it inherited; with
more threads they are spawned. A worker is killed when its parent
dies (Linux), so a killed step leaves no training behind."""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Sequence


def die_with_parent() -> None:
    """In a worker: be killed when the process that started it dies (Linux)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start_worker(threads: int) -> None:
    """A worker's first act: its torch threads, before any torch op. A forked child that runs an op with the
    OpenMP pool it inherited (the parent's, whose threads do not exist in the child) can hang."""
    import torch

    from .heap import keep_freed_memory

    die_with_parent()
    keep_freed_memory()  # a spawned worker's own setting (a forked one inherits its parent's)
    torch.set_num_threads(threads)


def weights_out(model) -> dict[str, Any]:
    """A model's weights as numpy arrays, to return from a worker. Jobs and results cross as pickles, and
    a torch tensor crosses through shared memory handed over by a file-descriptor server thread; a pool
    forked while that thread runs can hang its child, so tensors stay inside the processes."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def weights_in(model, arrays: dict[str, Any]) -> None:
    """Load what weights_out returned into a model of the same shape."""
    import torch

    model.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})


def one_thread_each(train_settings, workers: int):
    """The TrainSettings a job trains with beside others: `threads: 1` when `workers` > 1, since the training
    loop sets its own thread count (which would undo the worker's one thread), else unchanged."""
    return train_settings.model_copy(update={"threads": 1}) if workers > 1 else train_settings


def cpu_workers(workers: int, device_setting: str) -> int:
    """`workers` where the trainings run on the CPU, else 1: a GPU is one device (and a forked child
    must not touch a CUDA context its parent made)."""
    from .device import resolve_device

    return workers if resolve_device(device_setting)[0].type == "cpu" else 1


def run_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], workers: int, threads: int = 1) -> list[Any]:
    """fn(*job) for every job, in order: in `workers` processes when more than one is asked for, the
    machine has the cores and this process may start children (a daemon process may not); else here,
    one after the other. `fn` sets its own torch threads (`threads` only chooses fork or spawn). Pass and
    return numpy arrays, not tensors (weights_out)."""
    workers = min(workers, len(jobs), os.cpu_count() or 1)
    if workers <= 1 or mp.current_process().daemon:
        return [fn(*job) for job in jobs]
    ctx = mp.get_context("fork" if threads == 1 and "fork" in mp.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker, initargs=(threads,)) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        return [f.result() for f in futures]
