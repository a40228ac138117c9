"""Data-parallel training throughput: 2 DDP processes (gloo, one thread each) against 1 process, on
the default transformer_lm settings (pipelines/defs/transformer_lm/defs.yaml: 4 layers, width 128,
context 128, global batch 16) and real labels (the Wikipedia sample through a 2048-token BPE).

Every case runs the pipeline's own worker (`components.core.distributed.run_worker`: the training
loop, DDP-wrapped under torchrun for 2 processes) in a fresh process, and times rank 0's log points:
tokens/s = global tokens per step × steps / wall seconds between two log points, so the loss
all-reduce, logging and Python around the step count too (evaluation and checkpoints fall outside the
window). Cases, repeated and interleaved so a change of load hits them alike:

    one_process_2_threads   what `launcher: inprocess` does on this 2-core machine
    one_process_1_thread    the per-core rate (the ideal for 2 processes is twice it)
    ddp_2_processes         `launcher: torchrun, nproc_per_node: 2` (4 blocks per rank and step)

Then one profiled 2-process run: torch.profiler on rank 0 over the same window gives the time of
the all-reduce ops (the gradient buckets and the loss scalar; gloo runs them in its own threads,
overlapping the backward pass) and of the loop's phases, per step, and their share of the step.

    python benchmarks/ddp_throughput.py --out benchmarks/results/ddp_cpu.json

A quiet machine runs only this: the 1-minute load average stays near the 2 busy threads of a case,
and rank 0 gets the CPU time it asks for (`cpu_utilisation` near 1). Load above cores + 0.75 at any
case, or a case's utilisation below 0.8, marks the result `machine_loaded` (with the figures recorded).
`measure` and `write_random_labels` are reused by scripts/gpu_check.py for its multi-GPU line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from result_file import emit  # noqa: E402

from components.core.artifacts import sha256_file, write_json  # noqa: E402
from components.core.distributed import (  # noqa: E402
    LaunchSettings,
    WorkerSpec,
    cpu_cores,
    launch_env,
    load_spec,
    rank_from_env,
    run_worker,
    torchrun_args,
    write_spec,
)
from components.core.train_settings import TrainSettings  # noqa: E402

COMM_PREFIXES = ("gloo:", "nccl:")  # the process group's collective spans (torch.profiler names)


# --------------------------------------------------------------------------------------------------
# Labels and settings


def default_transformer() -> tuple[dict, dict]:
    """(model, training) settings of the transformer_lm asset as declared."""
    attrs = yaml.safe_load((ROOT / "pipelines" / "defs" / "transformer_lm" / "defs.yaml").read_text())["attributes"]
    return attrs["architecture"], attrs["training"]


def wiki_labels(folder: Path, block_size: int, vocab_size: int = 2048) -> tuple[Path, str]:
    """The default corpus (every article of the Wikipedia sample) through a BPE: a labels folder."""
    from components.core.corpus import default_wiki_dump, iter_wiki_articles
    from components.core.labels import LabelSettings, build_labels
    from components.core.tokenizer import TokenizerSettings, train_tokenizer

    texts = [d["text"] for d in iter_wiki_articles(default_wiki_dump())]
    n_val = max(1, len(texts) // 10)
    tok = train_tokenizer(texts[n_val:], TokenizerSettings(vocab_size=vocab_size))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    result = build_labels(
        {"train": texts[n_val:], "validation": texts[:n_val]},
        folder / "tokenizer.json",
        LabelSettings(block_size=block_size),
        folder / "labels",
    )
    return result.path, result.meta["tokenizer_sha256"]


def write_random_labels(folder: Path, vocab_size: int, block_size: int, n_blocks: int) -> tuple[Path, str]:
    """A labels folder of random tokens (throughput does not depend on the text), as `labels` lays it out."""
    from components.core.labels import x_dtype

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    meta = {"block_size": block_size, "vocab_size": vocab_size, "tokenizer_sha256": "random" * 8}
    for split, n in (("train", n_blocks), ("validation", max(4, n_blocks // 8))):
        ids = rng.integers(1, vocab_size, size=(n, block_size + 1))
        np.save(folder / f"{split}_x.npy", ids[:, :-1].astype(x_dtype(vocab_size)))
        np.save(folder / f"{split}_y.npy", ids[:, 1:].astype(np.int32))
    write_json(folder / "meta.json", meta)
    return folder, meta["tokenizer_sha256"]


def make_spec(
    labels: tuple[Path, str], family: str, model: dict, train: dict, out_dir: Path, strategy: str = "ddp"
) -> WorkerSpec:
    folder, tok_sha = labels
    return WorkerSpec(
        family=family,
        model=model,
        train=TrainSettings(**train),
        labels=str(folder),
        strategy=strategy,
        labels_sha256={p.name: sha256_file(p) for p in sorted(Path(folder).iterdir())},
        tokenizer_sha256=tok_sha,
        out_dir=str(out_dir),
    )


# --------------------------------------------------------------------------------------------------
# One case (this script, run as a rank: `--rank SPEC TIMES`)


def comm_summary(prof, steps: int, wall_s: float) -> dict:
    """Per step: the all-reduce ops' time (CPU spans of gloo/nccl; NCCL kernels' device time), the
    main thread's time in the loop's phases and in DDP's forward, and the all-reduce share of a step."""
    comm, kernels, phases, calls = 0.0, 0.0, {}, 0
    for ev in prof.events():
        name = ev.name
        if name.startswith(COMM_PREFIXES):
            comm += ev.cpu_time_total
            calls += 1
        elif "nccl" in name.lower() and getattr(ev, "device_time_total", 0):
            kernels += ev.device_time_total
        elif name.startswith("phase/") or name in ("DistributedDataParallel.forward", "c10d::allreduce_"):
            phases[name] = phases.get(name, 0.0) + ev.cpu_time_total
    step_ms = 1000 * wall_s / steps
    comm_ms = (kernels or comm) / 1000 / steps
    return {
        "profiled_steps": steps,
        "step_ms": round(step_ms, 3),
        "allreduce_ms_per_step": round(comm_ms, 3),
        "allreduce_calls_per_step": calls / steps,
        "allreduce_share_of_step": round(comm_ms / step_ms, 4),
        "allreduce_timed_as": "NCCL kernels (device time)"
        if kernels
        else "gloo spans in its own threads (CPU wall time)",
        "main_thread_ms_per_step": {
            k: round(v / 1000 / steps, 3) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])
        },
    }


def rank_main(spec_path: str, times_path: str, window: tuple[int, int], profile: bool) -> None:
    """One rank of a case: train with the worker; rank 0 records the wall time at every log point."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    spec = load_spec(spec_path)
    rank = rank_from_env()[0]
    points: dict[int, tuple[float, float]] = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = torch_profile(activities=activities) if profile and rank == 0 else None

    def progress(point: dict, step: int, max_steps: int, eta_s: float) -> None:
        points[step] = (time.perf_counter(), time.process_time())
        if prof is not None and step == window[0]:
            prof.start()
        if prof is not None and step == window[1]:
            prof.stop()

    result = run_worker(spec, progress=progress)
    if rank != 0:
        return
    (t0, c0), (t1, c1) = points[window[0]], points[window[1]]
    steps = window[1] - window[0]
    point = next(h for h in result.history if "tokens_per_s" in h)
    tokens = round(point["tokens_per_s"] * point["step_ms"] / 1000) * steps  # the loop's global tokens per step
    out = {
        "tokens_per_s": tokens / (t1 - t0),
        "step_ms": 1000 * (t1 - t0) / steps,
        "loop_tokens_per_s_mean": result.tokens_per_s,
        "final_train_loss": result.train_loss,
        "params": result.params,
        "device": result.device,
        # CPU seconds this process got per wall second and thread: near 1 when nothing else competed
        "cpu_utilisation": (c1 - c0) / ((t1 - t0) * torch.get_num_threads()),
    }
    if prof is not None:
        out["profile"] = comm_summary(prof, steps, t1 - t0)
    Path(times_path).write_text(json.dumps(out))


# --------------------------------------------------------------------------------------------------
# Cases as processes


def measure(
    spec: WorkerSpec, nproc: int, threads: int, window: tuple[int, int], profile: bool = False, timeout_s: float = 900
) -> dict:
    """Run one case in fresh processes (torchrun when nproc > 1) and return rank 0's timings."""
    spec_path = write_spec(spec, Path(spec.out_dir).with_suffix(".spec.json"))
    times = Path(spec.out_dir).with_suffix(".times.json")
    rank_args = [__file__, "--rank", str(spec_path), str(times), f"--window={window[0]},{window[1]}"] + (
        ["--profile"] if profile else []
    )
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if nproc > 1:
        env.update(launch_env(LaunchSettings(launcher="torchrun", nproc_per_node=nproc), spec.train))
        env["OMP_NUM_THREADS"] = str(threads)
        args = torchrun_args("", nproc)[:-3] + rank_args  # torchrun's options, then this script as the rank program
        cmd = [
            sys.executable,
            "-m",
            "components.core.distributed",
            "torchrun",
            *args,
        ]  # torchrun, its store on loopback
    else:
        cmd = [sys.executable, *rank_args]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"case nproc={nproc} threads={threads} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(times.read_text())
    out.update(
        {
            "processes": nproc,
            "threads_per_process": threads,
            "loadavg_1min_before": load_before,
            "loadavg_1min_after": os.getloadavg()[0],
        }
    )
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60, help="timed steps per case")
    ap.add_argument("--warmup", type=int, default=10, help="steps before the timed window")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--rank", nargs=2, metavar=("SPEC", "TIMES"), help=argparse.SUPPRESS)
    ap.add_argument("--window", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        rank_main(*args.rank, tuple(int(v) for v in args.window.split(",")), args.profile)
        return {}

    import torch

    cores = cpu_cores()
    model, train = default_transformer()
    window = (args.warmup, args.warmup + args.steps)
    # The timed window ends before the last step, whose evaluation and checkpoint it must not count.
    train = {
        **train,
        "max_steps": window[1] + 10,
        "log_interval": 10 if args.steps % 10 == 0 and args.warmup % 10 == 0 else 1,
        "eval_interval": 0,
        "checkpoint_interval": 0,
        "device": "cpu",
    }
    cases = {"one_process_2_threads": (1, 2), "one_process_1_thread": (1, 1), "ddp_2_processes": (2, 1)}
    out: dict = {
        "benchmark": "ddp_throughput",
        "torch": torch.__version__,
        "cpu_cores": cores,
        "loadavg_start": list(os.getloadavg()),
        "model": model,
        "train": train,
        "timed_window_steps": list(window),
        "repeats": args.repeats,
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        labels = wiki_labels(tmp / "data", block_size=model["block_size"])
        runs: dict[str, list[dict]] = {k: [] for k in cases}
        n = 0
        for r in range(args.repeats):
            for name, (nproc, threads) in cases.items():
                n += 1
                res = measure(
                    make_spec(labels, "transformer", model, {**train, "threads": threads}, tmp / f"run{n}"),
                    nproc,
                    threads,
                    window,
                )
                runs[name].append(res)
                print(
                    f"[ddp_throughput] {name} #{r + 1}: {res['tokens_per_s']:.0f} tokens/s, load "
                    f"{res['loadavg_1min_after']:.2f}",
                    file=sys.stderr,
                )
        n += 1
        profiled = measure(
            make_spec(labels, "transformer", model, {**train, "threads": 1}, tmp / f"run{n}"),
            2,
            1,
            window,
            profile=True,
        )
    for name, rs in runs.items():
        out[name] = {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
            "step_ms": statistics.median(r["step_ms"] for r in rs),
            "runs": rs,
        }
    base, core, ddp = (out[k]["tokens_per_s"] for k in cases)
    out["ddp_vs_one_process_2_threads"] = round(ddp / base, 3)
    out["ddp_scaling_efficiency_vs_2x_one_thread"] = round(ddp / (2 * core), 3)
    out["ddp_profile"] = profiled["profile"]
    out["ddp_profile"]["tokens_per_s_profiled"] = profiled["tokens_per_s"]
    loads = [r["loadavg_1min_after"] for rs in runs.values() for r in rs] + [
        r["loadavg_1min_before"] for rs in runs.values() for r in rs
    ]
    out["loadavg_end"] = list(os.getloadavg())
    out["loadavg_max_seen"] = max(loads)
    utils = [r["cpu_utilisation"] for rs in runs.values() for r in rs]
    out["cpu_utilisation_min"] = min(utils)
    reasons = []
    if max(loads) > cores + 0.75:
        reasons.append(f"the 1-minute load average reached {max(loads):.2f} on {cores} cores")
    if min(utils) < 0.8:
        reasons.append(f"a case got {min(utils):.2f} of the CPU time its threads asked for")
    out["machine_loaded"] = bool(reasons)
    if reasons:
        out["warning"] = (
            "machine was loaded (other work shared the cores): "
            + "; ".join(reasons)
            + " — the figures may not hold on a quiet machine"
        )
        print(f"[ddp_throughput] WARNING {out['warning']}", file=sys.stderr)
    return emit(out, args.out)


if __name__ == "__main__":
    main()
