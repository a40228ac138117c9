"""Where a training step's time goes: torch.profiler over steps of the shared loop's `optimizer_step`
(ours) and of the nanoGPT reference loop, on the same character data as benchmarks/train_throughput.py.

Ops are summed by self CPU time into groups (attention, RoPE and elementwise, norms, matmuls, the
loss, the gradient norm and clipping, the optimizer, batch assembly, the rest), with the top ops
and the Python time per step that no op accounts for (wall time minus the ops' self time).

    python benchmarks/train_profile.py --text ../shared/data/tinyshakespeare.txt \
        --out benchmarks/results/train_profile_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import emit  # noqa: E402
from train_throughput import PRESETS, NanoGPTRun, char_data, parse_overrides, wiki_sample_text, windows  # noqa: E402

from components.core.device import resolve_device, resolve_dtype  # noqa: E402
from components.core.models.transformer import Transformer, TransformerSettings  # noqa: E402
from components.core.train_settings import Parallel, TrainSettings  # noqa: E402
from components.core.train_step import TrainState, make_optimizer, optimizer_step  # noqa: E402

# Op groups inside the forward and backward phases (first match wins; names are torch's aten ops).
GROUPS = [
    # with --set compile=true: inductor's fused C++ kernels (named for what they fuse) and the wrappers
    ("compiled kernels (inductor)", ("cpp_fused",)),
    ("compiled graph calls", ("compiledfxgraph", "compiledfunction", "torch-compiled region", "dynamo")),
    ("attention (SDPA)", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("layer norm", ("layer_norm",)),
    ("loss (cross-entropy)", ("cross_entropy", "log_softmax", "nll_loss")),
    ("matmul / linear", ("addmm", "aten::mm", "cpu_mm_out", "bmm", "linear", "matmul")),
    ("gelu", ("gelu",)),
    ("embedding", ("embedding",)),
    ("dtype casts (autocast)", ("_to_copy",)),
    (
        "elementwise (RoPE, residual, masks, views)",
        (
            "mul",
            "add",
            "sub",
            "cat",
            "chunk",
            "neg",
            "masked_fill",
            "fill_",
            "slice",
            "split",
            "transpose",
            "view",
            "reshape",
            "clone",
            "copy",
            "expand",
            "contiguous",
            "where",
            "sum",
            "index",
            "select",
            "unsqueeze",
            "stack",
            "narrow",
            "permute",
            "empty",
            "zeros",
            "ones",
            "as_strided",
            "t",
            "detach",
            "alias",
            "arange",
        ),
    ),
]


def group_of(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k.lower() in low for k in keys):
            return group
    return "other"


def phase_of(ev) -> str:
    p = ev.cpu_parent
    while p is not None:
        if p.name.startswith("phase/"):
            return p.name.removeprefix("phase/")
        p = p.cpu_parent
    return "outside phases (lr, loss sync, bookkeeping)"


def summarize(prof, steps: int, wall_s: float) -> dict:
    """Self CPU time per step by loop phase, by op group within forward and backward, and the top ops;
    the wall time no op accounts for is Python (and profiler) overhead."""
    phases: dict[str, float] = {}
    groups: dict[str, float] = {}
    ops: dict[str, list] = {}
    for ev in prof.events():
        if ev.name.startswith("phase/") or ev.name == "step":
            continue
        us = ev.self_cpu_time_total
        ph = phase_of(ev)
        phases[ph] = phases.get(ph, 0.0) + us
        if ph in ("forward", "backward"):
            g = group_of(ev.name)
            groups[g] = groups.get(g, 0.0) + us
        o = ops.setdefault(ev.name, [0.0, 0])
        o[0] += us
        o[1] += 1
    total = sum(phases.values())
    top = sorted(ops.items(), key=lambda kv: -kv[1][0])[:25]
    ms = lambda us: round(us / 1000 / steps, 3)  # noqa: E731
    return {
        "steps": steps,
        "wall_ms_per_step": 1000 * wall_s / steps,
        "ops_ms_per_step": ms(total),
        "python_and_profiler_ms_per_step": round(1000 * wall_s / steps - total / 1000 / steps, 3),
        "phases_ms_per_step": {k: ms(v) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])},
        "forward_backward_groups_ms_per_step": {k: ms(v) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_ops": [{"op": k, "ms_per_step": ms(v[0]), "calls_per_step": v[1] / steps} for k, v in top],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a train setting of ours (e.g. optimizer=adamw)"
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument(
        "--only",
        choices=["ours", "nanogpt"],
        help="profile one side in this process (by default each side runs in a fresh process of its own: in one "
        "process the side profiled second ran its GELU and matmuls up to 3x slower under the profiler)",
    )
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.only is None:
        return _each_side_apart(argv if argv is not None else sys.argv[1:], args.out)
    torch.set_num_threads(args.threads)
    preset = PRESETS["baby_gpt"]
    text = Path(args.text).read_text(encoding="utf-8") if args.text else wiki_sample_text(1_115_394)
    data = char_data(text, args.text or "wiki sample")
    model_over, over = parse_overrides(args.set)  # JSON values: compile_options={"cpp_wrapper": true}
    if model_over:
        raise SystemExit(f"--set {sorted(model_over)}: the profile keeps the baby-GPT model; set train settings only")
    ts = TrainSettings(**{**preset["train"], **over}, eval_interval=0, eval_batches=1, threads=args.threads)
    device, _ = resolve_device("cpu")
    dtype = resolve_dtype(
        ts.dtype, device
    )  # ours as the pipeline trains ('auto': bf16 on a CPU with AMX); nanoGPT float32
    out: dict = {
        "benchmark": "train_profile",
        "threads": args.threads,
        "torch": torch.__version__,
        "dtype_ours": str(dtype),
        "loadavg_start": list(os.getloadavg()),
    }

    if args.only == "nanogpt":
        _profile_nanogpt(out, data, preset, ts, device, args)
        return emit(out, args.out)
    # ours: the loop's own step function on the pipeline's Transformer
    torch.manual_seed(0)
    model = Transformer(TransformerSettings(**preset["model"]), data.vocab_size).to(device).train()
    blocks = windows(data.train_ids, preset["model"]["block_size"], 8)
    state = TrainState(
        model=model,
        optimizer=make_optimizer(model, ts, device),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        sampler=np.random.default_rng(0),
    )

    fwd = model
    if ts.compile:  # each fused kernel named in the profile (a RECORD_FUNCTION in the generated code)
        fwd = torch.compile(model, options={**ts.compile_options, "cpp.enable_kernel_profile": True})
    out["compile"], out["compile_options"] = ts.compile, ts.compile_options

    def ours_step(log: bool) -> None:
        optimizer_step(state, fwd, blocks, ts, device=device, dtype=dtype, parallel=Parallel(), measure_clipped=log)

    for _ in range(args.warmup):
        ours_step(False)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            ours_step(False)
        wall = time.perf_counter() - t0
    out["ours"] = summarize(prof, args.steps, wall)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        ours_step(False)
    out["ours"]["unprofiled_ms_per_step"] = 1000 * (time.perf_counter() - t0) / args.steps
    out["loadavg_end"] = list(os.getloadavg())
    return emit(out, args.out)


def _each_side_apart(argv: list[str], out_path: str | None) -> dict:
    """Both sides, each profiled by this script in a fresh process (`--only`), merged into one result."""
    rest = [a for i, a in enumerate(argv) if a != "--out" and (i == 0 or argv[i - 1] != "--out")]
    rest = [a for a in rest if not a.startswith("--out=")]
    sides = {}
    for side in ("ours", "nanogpt"):
        proc = subprocess.run([sys.executable, __file__, *rest, "--only", side], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"train_profile --only {side} failed:\n{proc.stderr[-4000:]}")
        sides[side] = json.loads(proc.stdout)
    out = {
        **sides["ours"],
        "nanogpt": sides["nanogpt"]["nanogpt"],
        "loadavg_end": sides["nanogpt"]["loadavg_end"],
        "processes": "one per side",
    }
    return emit(out, out_path)


def _profile_nanogpt(out: dict, data, preset: dict, ts: TrainSettings, device, args) -> None:
    nano = NanoGPTRun(data, preset["model"], ts, device, torch.float32, False)
    nano.steps(args.warmup)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        nano.steps(args.steps)
        wall = time.perf_counter() - t0
    out["nanogpt"] = summarize(prof, args.steps, wall)
    t0 = time.perf_counter()
    nano.steps(args.steps)
    out["nanogpt"]["unprofiled_ms_per_step"] = 1000 * (time.perf_counter() - t0) / args.steps
    out["loadavg_end"] = list(os.getloadavg())


if __name__ == "__main__":
    main()
