"""Data-parallel training of a language model in several processes, launched by torchrun.

    python -m components.core.distributed launch --nproc-per-node 2 spec.json   # torchrun + a failure report
    python -m components.core.distributed torchrun --nproc-per-node 2 -m components.core.distributed spec.json
                                                                                 # the same, plain

The spec (`WorkerSpec`, JSON or YAML) names the model family and its settings, the training
settings, the labels folder with the SHA-256 of each of its files (every rank checks them before
reading), the tokenizer hash the checkpoint records, the output folder and the strategy. Every rank
prepares the same model (`lm.prepare_lm`: same settings, same seed) and runs `training.train` with
its `Parallel(rank, world_size)`, the model wrapped by the strategy: `ddp`, DistributedDataParallel
(gloo on the CPU, NCCL on GPUs with one process per GPU, LOCAL_RANK's), or `fsdp`, FSDP2's
`fully_shard` (parameters, gradients and optimizer state sharded over the ranks; checkpoints gathered
into the unsharded format by `sharding.FullStateCheckpoints`). `train.batch_size` is the global batch: each
rank trains batch_size / world_size blocks of it, so a run means the same whatever the number of
processes.
Rank 0 writes out_dir/checkpoint (resumable in any world size that divides batch_size, or in one
process: see `training`), history.json and train_result.json (`read_train_result`). Sampling text and
drawing figures are left to whoever launched the ranks (`lm.finish_lm`), from the checkpoint.

`launch` is torchrun's own launcher (`torch.distributed.run`) called in this process: when a rank
fails, it stops the others and writes out_dir/launch_failure.json naming which rank died and how
(signal, exit code, or the exception a rank raised), then exits 1. Ranks and launcher stop within a
second when the process that started them dies, so no orphan trains on into a folder a rerun uses.

The launch is one machine's, and nothing it starts listens outside loopback: torchrun's own
`--standalone` (and `--master-addr`) rendezvous store binds every interface whatever host it is
given, an unauthenticated store reachable from the network. The launcher instead registers the
`loopback` rendezvous (`LoopbackRendezvous`): the one store the agent and the ranks share is served
on a socket this process binds to 127.0.0.1 on a free port. `torchrun` above is torch's launcher
with that rendezvous registered, for launches outside `launch`.

`LaunchSettings` is the one setting that chooses in-process or torchrun training; `world_size_problems`
refuses, before anything launches, a world size that does not fit the machine (more CPU processes
than cores, more GPU processes than GPUs) or the global batch.

What the orchestration adds (Dagster Pipes on rank 0, MLflow metrics) lives outside the core, in a
module that wraps `run_worker` (components/orchestration/ddp_worker.py).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import inspect
import json
import os
import signal
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .artifacts import read_json, sha256_file, write_json
from .checkpoint import CHECKPOINT_DIR, WEIGHTS_FILE, read_metadata
from .device import resolve_device
from .errors import ConfigError, PipelineInputError
from .labels import load_labels
from .lm import Family, build_model, prepare_lm, steps_for_budget
from .sharding import FullStateCheckpoints, local_parameters, shard_model
from .train_settings import Parallel, TrainSettings
from .training import TrainResult, train

Launcher = Literal["inprocess", "torchrun"]
Strategy = Literal["ddp", "fsdp"]
RESULT_FILE = "train_result.json"
FAILURE_FILE = "launch_failure.json"
WORKER_MODULE = "components.core.distributed"


class LaunchSettings(BaseModel):
    """How a training runs: in the calling process, or data-parallel under torchrun."""

    model_config = ConfigDict(extra="forbid")

    launcher: Launcher = Field(
        default="inprocess",
        description="inprocess: train in the step's own process; torchrun: data-parallel (DDP) in nproc_per_node "
        "processes (gloo on the CPU, NCCL on GPUs), batch_size being the global batch.",
    )
    nproc_per_node: int = Field(
        default=2,
        ge=1,
        description="Processes of a torchrun launch: at most the CPU cores (on the CPU) or the GPUs; must divide "
        "batch_size.",
    )
    strategy: Strategy = Field(
        default="ddp",  # by keyword: pyright takes a positional string default for a required field
        description="ddp: every rank holds the whole model (DistributedDataParallel); fsdp: parameters, gradients and "
        "optimizer state sharded over the ranks (FSDP2 fully_shard), for a model that does not fit one device.",
    )


class WorkerSpec(BaseModel):
    """What every rank trains, and on what (checked by hash before reading)."""

    model_config = ConfigDict(extra="forbid")

    family: Family
    model: dict[str, Any] = Field(default_factory=dict, description="The family's model settings.")
    train: TrainSettings
    labels: str = Field(description="The labels folder (train_x.npy ..., meta.json).")
    labels_sha256: dict[str, str] = Field(
        description="Labels file (a path relative to the labels folder, or absolute: the shards' files of sharded "
        "labels) -> "
        "its SHA-256; every one is checked."
    )
    tokenizer_sha256: str = Field(description="The tokenizer the labels were built with; recorded in the checkpoint.")
    out_dir: str = Field(description="checkpoint/, history.json, train_result.json go here.")
    strategy: Strategy = "ddp"


# ----------------------------------------------------------------------------------------------
# Settings and the machine


def cpu_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def world_size_problems(launch: LaunchSettings, train_settings: TrainSettings, where: str = "train") -> list[str]:
    """Why `launch` cannot run here, one line per problem naming the setting (none for inprocess)."""
    if launch.launcher != "torchrun":
        return []
    n = launch.nproc_per_node
    problems = []
    if train_settings.batch_size % n:
        problems.append(
            f"{where}.batch_size={train_settings.batch_size} is the global batch of a torchrun launch: it must be a "
            f"multiple of {where}.nproc_per_node={n}"
        )
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    on_gpu = train_settings.device == "cuda" or (train_settings.device == "auto" and gpus > 0)
    if on_gpu and n > gpus:
        problems.append(
            f"{where}.nproc_per_node={n} GPU processes do not fit this machine: it has {gpus} GPU(s); lower "
            f"{where}.nproc_per_node to at most {gpus}"
        )
    cores = cpu_cores()
    if not on_gpu and n > cores:
        problems.append(
            f"{where}.nproc_per_node={n} CPU processes do not fit this machine: it has {cores} CPU core(s); lower "
            f"{where}.nproc_per_node to at most {cores} (or set {where}.launcher: inprocess)"
        )
    return problems


def check_world_size(launch: LaunchSettings, train_settings: TrainSettings, where: str = "train") -> None:
    problems = world_size_problems(launch, train_settings, where)
    if problems:
        raise ConfigError("; ".join(problems) + "; nothing was launched")


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def launch_env(launch: LaunchSettings, train_settings: TrainSettings) -> dict[str, str]:
    """Environment for the launcher: on the CPU, each rank's threads share the cores (torchrun
    would set 1) and gloo talks over the loopback interface only (one machine); on GPUs NCCL's
    bootstrap sockets are on loopback too (the data moves between the GPUs of the one machine)."""
    env = {}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if train_settings.device == "cpu" or gpus == 0:
        threads = train_settings.threads or max(1, cpu_cores() // launch.nproc_per_node)
        env["OMP_NUM_THREADS"] = str(threads)
        if "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = "lo"
    elif "NCCL_SOCKET_IFNAME" not in os.environ:
        env["NCCL_SOCKET_IFNAME"] = "lo"
    return env


# ----------------------------------------------------------------------------------------------
# The spec and the result files


def load_spec(path: str | Path) -> WorkerSpec:
    path = Path(path)
    if not path.is_file():
        raise PipelineInputError(f"no worker spec at {path}")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
        return WorkerSpec(**data)
    except (ValidationError, ValueError, TypeError) as e:
        raise ConfigError(f"{path}: not a valid worker spec: {e}") from e


def write_spec(spec: WorkerSpec, path: str | Path) -> Path:
    return write_json(path, spec.model_dump(mode="json"))


def verify_labels(spec: WorkerSpec) -> None:
    """Every labels file the spec names has the recorded SHA-256, and the labels were built with the
    spec's tokenizer: a rank never trains on files that changed after the launch was prepared."""
    folder = Path(spec.labels)
    for name, expected in sorted(spec.labels_sha256.items()):
        f = folder / name
        if not f.is_file():
            raise PipelineInputError(
                f"labels file {f} is missing (the spec expects sha256 {expected[:12]}…); re-materialize `labels`"
            )
        got = sha256_file(f)
        if got != expected:
            raise PipelineInputError(
                f"labels file {f} has sha256 {got[:12]}… but the spec expects {expected[:12]}…: it changed after the "
                "launch was prepared; re-materialize `labels` and launch again"
            )
    meta_file = folder / "meta.json"
    recorded = read_json(meta_file).get("tokenizer_sha256", "") if meta_file.is_file() else ""
    if recorded != spec.tokenizer_sha256:
        raise PipelineInputError(
            f"the labels at {folder} were built with tokenizer {recorded[:12] or '(none)'}…, the spec says "
            f"{spec.tokenizer_sha256[:12]}…; re-materialize `labels`"
        )


def write_train_result(result: TrainResult, path: str | Path, **extra: Any) -> Path:
    return write_json(path, {**dataclasses.asdict(result), "checkpoint_dir": str(result.checkpoint_dir), **extra})


def read_train_result(path: str | Path) -> tuple[TrainResult, dict[str, Any]]:
    """(the TrainResult, the extra fields: world_size, backend, strategy, rank0_params) of a train_result.json."""
    data = read_json(path)
    names = {f.name for f in dataclasses.fields(TrainResult)}
    result = TrainResult(**{k: v for k, v in data.items() if k in names})
    result.checkpoint_dir = Path(result.checkpoint_dir)
    return result, {k: v for k, v in data.items() if k not in names}


# ----------------------------------------------------------------------------------------------
# One rank


PR_SET_PDEATHSIG = 1  # prctl(2)


def exit_with_parent(interval_s: float = 0.5) -> None:
    """Send this process SIGTERM as soon as its parent is gone (it was started by a launcher or a
    step that died): torchrun's agent then stops its ranks, and a rank just ends. A SIGTERM ignored
    by inheritance (a launcher started under `nohup`-like wrappers passes SIG_IGN down through exec)
    is set back to its default here, or neither this nor the launcher's own SIGTERM would end it.

    On Linux the kernel sends it (`PR_SET_PDEATHSIG`), which needs nothing of this process: a rank
    once hung in a C++ destructor that joined a gloo thread while holding the GIL, after its peer had
    exited, and the watch thread, which needs the GIL to run, never fired (CI: the rank outlived its
    killed launcher). Elsewhere, and as a second line, a thread polls the parent's pid."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            warnings.warn(
                f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}; only the watch thread ends this "
                "process with its parent (not while a native call holds the GIL)",
                RuntimeWarning,
                stacklevel=2,
            )
        if os.getppid() != parent:  # the parent died before the kernel was told
            os.kill(os.getpid(), signal.SIGTERM)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def rank_from_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) as torchrun sets them; one process without it."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def run_worker(
    spec: WorkerSpec,
    *,
    log_metrics: Callable[[dict[str, float], int], None] | None = None,
    progress: Callable[[dict[str, float], int, int, float], None] | None = None,
) -> TrainResult:
    """Train this rank's share (module doc). `log_metrics` and `progress` are called on rank 0 only."""
    import torch.distributed as dist

    rank, world, local_rank = rank_from_env()
    parallel = Parallel(rank, world)
    verify_labels(spec)
    train_data, val_data, meta = load_labels(spec.labels)
    if resolve_device(spec.train.device)[0].type == "cuda":
        torch.cuda.set_device(local_rank)  # "cuda" is this rank's GPU from here on
    prep = prepare_lm(
        spec.family,
        spec.model,
        spec.train,
        train_data,
        int(meta["vocab_size"]),
        model_meta={"tokenizer_sha256": spec.tokenizer_sha256},
    )
    device = prep.device
    model = prep.model.to(device)
    backend = backend_for(device)
    if world > 1:
        dist.init_process_group(backend)
        if spec.strategy == "fsdp":
            model = shard_model(model)
            rebuild = lambda: build_model(spec.family, prep.settings, int(meta["vocab_size"]))  # noqa: E731
            parallel = Parallel(rank, world, sharded=FullStateCheckpoints(rebuild, spec.train, rank))
        else:
            from torch.nn.parallel import DistributedDataParallel

            # Buffers (RoPE tables, masks) are constants: nothing to broadcast at every forward.
            no_buffer_sync: dict[str, Any] = (
                {"forward_sync_buffers": False}
                if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                else {"broadcast_buffers": False}  # torch < 2.13
            )
            model = DistributedDataParallel(
                model, device_ids=[local_rank] if device.type == "cuda" else None, **no_buffer_sync
            )
    try:
        result = train(
            model,
            train_data,
            val_data,
            steps_for_budget(prep, spec.train),
            spec.out_dir,
            log_metrics=log_metrics,
            progress=progress,
            model_meta=prep.header,
            step_callback=prep.step_callback,
            parallel=parallel,
        )
        if parallel.is_main:
            write_train_result(
                result,
                Path(spec.out_dir) / RESULT_FILE,
                world_size=world,
                backend=backend,
                strategy=spec.strategy if world > 1 else "single",
                rank0_params=local_parameters(model),
            )
        if world > 1:
            # Every rank's queued work is done before any rank tears its group down. Once under CI a
            # rank whose peer had already exited hung at this function's return, joining a gloo thread.
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()
    return result


# ----------------------------------------------------------------------------------------------
# The launcher


LOOPBACK_RDZV = "loopback"
RDZV_OPTIONS = {"--standalone", "--rdzv-backend", "--rdzv-endpoint", "--master-addr", "--master-port", "--nnodes"}


def _loopback_rendezvous_class():
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    class LoopbackRendezvous(StaticTCPRendezvous):
        """One machine's rendezvous whose store (shared by the agent and its ranks) listens on a socket
        bound to 127.0.0.1 on a free port, handed to the TCPStore as its listening socket: a store
        given only a host name would bind every interface."""

        def get_backend(self) -> str:
            return LOOPBACK_RDZV

        def next_rendezvous(self):
            from torch.distributed import TCPStore  # pyright: ignore[reportPrivateImportUsage]

            if not self._store:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.bind(("127.0.0.1", 0))
                listener.listen(128)
                self.master_addr, self.master_port = listener.getsockname()
                self._store = TCPStore(
                    self.master_addr,
                    self.master_port,
                    self.world_size,
                    True,
                    self.timeout,
                    multi_tenant=True,
                    master_listen_fd=listener.fileno(),
                )
                self._listener = listener  # open as long as the store serves on it
            return super().next_rendezvous()

    return LoopbackRendezvous


def _create_loopback_rendezvous(params: Any) -> Any:
    if params.max_nodes != 1:
        raise ConfigError(f"the {LOOPBACK_RDZV} rendezvous is one machine's: --nnodes=1, not {params.max_nodes}")
    timeout = int(params.config.get("timeout", 600))
    return _loopback_rendezvous_class()("127.0.0.1", 0, 0, 1, params.run_id, timeout)


def register_loopback_rendezvous() -> None:
    """Make `--rdzv-backend=loopback` known to torchrun in this process (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(LOOPBACK_RDZV, _create_loopback_rendezvous)


def torchrun_args(spec_path: str | Path, nproc_per_node: int, worker_module: str = WORKER_MODULE) -> list[str]:
    """torchrun's arguments: one machine, its rendezvous store on loopback (`LoopbackRendezvous`, which
    `register_loopback_rendezvous` must have made known), no restarts."""
    import uuid

    return [
        "--nnodes=1",
        f"--rdzv-backend={LOOPBACK_RDZV}",
        "--rdzv-endpoint=127.0.0.1:0",
        f"--rdzv-id={uuid.uuid4()}",
        f"--nproc-per-node={nproc_per_node}",
        "--max-restarts=0",
        "-m",
        worker_module,
        str(spec_path),
    ]


def failure_report(error: Any, out_dir: str | Path) -> dict[str, Any]:
    """What a torchrun ChildFailedError says, as a sentence and per rank: which rank failed and how
    (a signal, an exit code, the exception it raised), and the last checkpoint a rerun resumes from."""
    ranks = []
    for rank, f in sorted(error.failures.items()):
        signal_name = f.signal_name() if f.exitcode < 0 else None
        raised = f.message if f.exitcode > 0 and isinstance(f.message, str) and f.error_file_data.get("message") else ""
        how = (
            f"was killed by {signal_name}"
            if signal_name
            else f"exited with code {f.exitcode}" + (f": {raised}" if raised else "")
        )
        ranks.append(
            {"rank": rank, "pid": f.pid, "exitcode": f.exitcode, "signal": signal_name, "error": raised, "how": how}
        )

    # The cause first: a rank killed by another signal than the launcher's SIGTERM, or one that raised
    # anything but a lost connection to a peer that died.
    def secondary(r: dict) -> bool:
        return r["signal"] == "SIGTERM" or (r["signal"] is None and (not r["error"] or "Connection" in r["error"]))

    cause = sorted(ranks, key=lambda r: (secondary(r), r["rank"]))[0]
    ckpt = Path(out_dir) / CHECKPOINT_DIR
    step = read_metadata(ckpt).get("step") if (ckpt / WEIGHTS_FILE).is_file() else None
    parts = [f"rank {cause['rank']} (pid {cause['pid']}) {cause['how']}"]
    parts += [
        f"rank {r['rank']} was stopped by the launcher" if r["signal"] == "SIGTERM" else f"rank {r['rank']} {r['how']}"
        for r in ranks
        if r is not cause
    ]
    resume = (
        f"The last checkpoint (step {step}) is kept in {ckpt}; a rerun resumes from it."
        if step is not None
        else "No checkpoint was written yet; a rerun starts fresh."
    )
    message = f"data-parallel training failed: {'; then '.join(parts)}. {resume}"
    return {
        "message": message,
        "ranks": ranks,
        "cause_rank": cause["rank"],
        "checkpoint_step": int(step) if step else None,
    }


def launch(spec_path: str | Path, nproc_per_node: int, worker_module: str = WORKER_MODULE) -> int:
    """Run torchrun over `worker_module` (module doc); 0 on success, 1 after a rank failed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    spec = load_spec(spec_path)
    check_world_size(LaunchSettings(launcher="torchrun", nproc_per_node=nproc_per_node), spec.train)
    failure_file = Path(spec.out_dir) / FAILURE_FILE
    failure_file.unlink(missing_ok=True)
    for key, value in launch_env(
        LaunchSettings(launcher="torchrun", nproc_per_node=nproc_per_node), spec.train
    ).items():
        os.environ.setdefault(key, value)  # what the asset passes; the ranks inherit it
    exit_with_parent()
    register_loopback_rendezvous()
    try:
        run(parse_args(torchrun_args(spec_path, nproc_per_node, worker_module)))
    except ChildFailedError as e:
        report = failure_report(e, spec.out_dir)
        write_json(failure_file, report)
        print(report["message"], file=sys.stderr, flush=True)
        return 1
    return 0


def read_failure(out_dir: str | Path) -> dict[str, Any] | None:
    f = Path(out_dir) / FAILURE_FILE
    return read_json(f) if f.is_file() else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "torchrun":  # torch's launcher, with the loopback rendezvous known
        from torch.distributed.run import main as torchrun_main

        register_loopback_rendezvous()
        args = argv[1:]
        chosen = any(a.split("=")[0].replace("_", "-") in RDZV_OPTIONS for a in args)
        torchrun_main(args if chosen else torchrun_args("", 1)[:4] + args)  # unless told otherwise: loopback
        return 0
    if argv and argv[0] == "launch":
        ap = argparse.ArgumentParser(
            prog="python -m components.core.distributed launch", description="torchrun a worker spec"
        )
        ap.add_argument("--nproc-per-node", type=int, required=True)
        ap.add_argument("--worker", default=WORKER_MODULE, help="the module torchrun runs in every rank")
        ap.add_argument("spec")
        args = ap.parse_args(argv[1:])
        try:
            return launch(args.spec, args.nproc_per_node, args.worker)
        except (ConfigError, PipelineInputError) as e:  # refused before anything launched: the reason, no traceback
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
            return 2
    ap = argparse.ArgumentParser(
        prog="python -m components.core.distributed", description="one rank of a worker spec (under torchrun)"
    )
    ap.add_argument("spec")
    args = ap.parse_args(argv)
    worker_main(args.spec)
    return 0


def worker_main(spec_path: str | Path, **callbacks: Any) -> TrainResult | None:
    """A rank's entry point: stop with the launcher, record an exception for its failure report. None if the
    run ended in SystemExit(0) (torch's `record` returns None then)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    exit_with_parent()
    return record(lambda: run_worker(load_spec(spec_path), **callbacks))()


if __name__ == "__main__":
    sys.exit(main())
