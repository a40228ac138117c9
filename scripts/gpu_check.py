"""One prepared GPU check (H200-class, bf16) that fits a lent GPU machine's time and brings its results back.

    python3 scripts/gpu_check.py --out "$OUT/gpu_check.json"                   # needs CUDA; log beside it
    python3 scripts/gpu_check.py --dry-run --out /tmp/gpu_check/gpu_check.json  # CPU, tiny, about a minute

It runs on the machine's own Python, which has torch, triton, numpy, safetensors and tokenizers but
neither pydantic nor bitsandbytes, and installs nothing: without pydantic the core's settings
classes are built by scripts/pydantic_lite.py; bitsandbytes comes from a carried, pruned copy in
.gpu_carry/site (scripts/gpu_carry.sh) or its sections say why they are skipped. Nothing is written
outside --out's folder: the JSON summary and the log (`<out>.log`, unbuffered, everything printed).

Time: a hard deadline of its own (--deadline-s, default 420 s = 7 min), and a budget per section,
checked before the section starts (a section that no longer fits is skipped, saying so) and enforced
while it runs (an alarm stops a section at its budget, and the run at the deadline). Every row is
written as it is measured: the JSON is rewritten atomically after each one, so a deadline, a SIGTERM
(the handler writes what exists, then exits 143) or a crash leaves every row measured so far.

Sections, cheap first (each records its own error instead of stopping the others):

0. preflight     versions (python, torch, CUDA, triton, numpy, safetensors, tokenizers, pydantic,
                 bitsandbytes), the project's modules imported, one tiny kernel compiled on CUDA
                 (torch.compile → inductor → Triton) and checked against eager; about 20 s.
1. sdpa          which SDPA kernels run causal attention at the training shape (bf16), the dispatcher's
                 own choice, and the kernel observed by the profiler with flash pinned.
2. bnb           bitsandbytes Linear8bitLt (INT8) and Linear4bit (NF4, fp16 compute) forward vs the
                 fp16 layer: relative error, weight bytes, allocated bytes, time.
3. bnb_generate  the pipeline's quantization path (components.core.studies.quant_measure.cuda_bnb_check)
                 on a GPT-2-medium-sized Transformer: GPU bytes of the weights, peak memory while
                 generating, generation tokens/s (greedy, batch 1) and the max-abs logit difference from
                 FP32. Like for like: INT8 and NF4 keep everything unquantized in float16 and NF4
                 computes in float16, as the fp16 variant; only the fp32 reference is float32.
4. matmul_peak   measured dense bf16 matmul TFLOP/s (8192³), the ceiling MFU is also reported against.
5. train         GPT-2 small (124M) through the pipeline's own optimizer step (bf16 autocast, fused
                 AdamW, torch.compile, FlashAttention pinned); peak memory reset first; no evaluation
                 and no checkpoint. Tokens/s, and MFU against the datasheet peak and the measured one.
6. sweep         causal attention alone, forward+backward: reference (explicit QKᵀ·softmax·V), fused
                 (SDPA, flash pinned) and the blocked sliding window, N doubling until out of memory,
                 the time cap or the budget: ms and peak memory per point.
7. flex          the sliding window through compiled FlexAttention at a few N only (each N one compile;
                 the BlockMask built compiled, never a dense N×N mask).
8. ddp           multi-GPU data parallelism through the pipeline's torchrun worker; skipped, saying so,
                 on a machine with one GPU.

--dry-run runs the same functions on the CPU at tiny sizes (float32, no compile), so the test suite
exercises this script; CUDA-only measurements are recorded as skipped with a reason.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

START = time.monotonic()  # the deadline counts from here, torch's import included

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".gpu_carry" / "site"  # scripts/gpu_carry.sh: a pruned bitsandbytes (+ packaging)
for p in (ROOT, ROOT / "benchmarks", ROOT / "scripts"):
    sys.path.insert(0, str(p))
if CARRY.is_dir():
    sys.path.append(str(CARRY))  # after site-packages: an installed bitsandbytes wins

MFU_GOAL = 0.45
GRACE_S = 10.0  # a section may run this long past its budget before the alarm stops it
HARD_GRACE_S = 20.0  # after the deadline's stop, this long to unwind before the process exits anyway

FULL = {
    "model": dict(
        n_layer=12,
        n_head=12,
        n_embd=768,
        block_size=1024,
        dropout=0.0,
        bias=False,
        pos_encoding="learned",
        attention="fused",
        sdpa_backend="flash",
    ),
    "vocab_size": 50304,  # GPT-2's 50257 padded to a multiple of 64, as nanoGPT does
    "batch_size": 32,
    "steps": 50,
    "log_interval": 10,
    "device": "cuda",
    "dtype": "bfloat16",
    "compile": True,
    "matmul_n": 8192,
    "sweep": dict(heads=12, head_dim=64, n_start=1024, n_max=1 << 18, reps=3, time_cap_s=5.0, window=512, n_global=16),
    "flex": dict(ns=[8192, 32768, 131072], min_point_s=40.0),
    "bnb": dict(in_features=4096, out_features=4096, tokens=4096, reps=20),
    "bnb_generate": dict(
        n_layer=24,
        n_embd=1024,
        n_head=16,
        vocab_size=32000,
        block_size=1024,
        prompt_tokens=32,
        gen_tokens=64,
        repeats=3,
    ),
    "quant_dtype": "float16",
    "ddp": dict(batch_size_per_process=16, warmup=10, steps=30, log_interval=10, compile=False),
    # seconds each section may take (checked before it starts, enforced while it runs); in this order
    "budgets": {
        "sdpa": 20,
        "bnb": 30,
        "bnb_generate": 70,
        "matmul_peak": 15,
        "train": 130,
        "sweep": 70,
        "flex": 100,
        "ddp": 120,
    },
    # the least time a section needs to start at all (a smaller part of its budget is still worth it)
    "min_s": {"train": 75, "sweep": 20, "flex": 45, "bnb_generate": 30},
}
DRY = {
    "model": dict(
        n_layer=2,
        n_head=2,
        n_embd=64,
        block_size=128,
        dropout=0.0,
        bias=False,
        pos_encoding="learned",
        attention="fused",
        sdpa_backend="flash",
    ),
    "vocab_size": 512,
    "batch_size": 4,
    "steps": 6,
    "log_interval": 2,
    "device": "cpu",
    "dtype": "float32",
    "compile": False,
    "matmul_n": 256,
    "sweep": dict(heads=2, head_dim=32, n_start=64, n_max=512, reps=2, time_cap_s=20.0, window=32, n_global=2),
    "flex": dict(ns=[256], min_point_s=5.0),
    "bnb": dict(in_features=256, out_features=512, tokens=64, reps=3),
    "bnb_generate": dict(
        n_layer=1, n_embd=64, n_head=2, vocab_size=300, block_size=32, prompt_tokens=4, gen_tokens=3, repeats=1
    ),
    "quant_dtype": "float32",  # the CPU has no fast float16: the dry run checks the path, not the speed
    "ddp": dict(batch_size_per_process=4, warmup=2, steps=4, log_interval=2, compile=False),
    "budgets": {
        "sdpa": 30,
        "bnb": 30,
        "bnb_generate": 60,
        "matmul_peak": 15,
        "train": 60,
        "sweep": 90,
        "flex": 30,
        "ddp": 150,
    },
    "min_s": {"train": 5, "sweep": 8, "bnb_generate": 10},
}
SECTIONS = ("sdpa", "bnb", "bnb_generate", "matmul_peak", "train", "sweep", "flex", "ddp")
# The project's modules, imported by the preflight (after pydantic's stand-in is in place when needed).
PROJECT = {
    "components.core.data": ["TokenBlocks"],
    "components.core.device": ["autocast_context", "median_seconds", "peak_flops", "synchronize"],
    "components.core.models.sizing": ["count_parameters"],
    "components.core.models.sdpa_probe": ["SDPA_OPS", "detect_sdpa_backend"],
    "components.core.models.transformer": ["Transformer", "TransformerSettings"],
    "components.core.studies.attention_cost": [
        "attention_sweep",
        "doubling",
        "fit_rows",
        "memory_accounting",
        "ratio_by_n",
    ],
    "components.core.train_settings": ["Parallel", "TrainSettings"],
    "components.core.train_step": ["TrainState", "make_optimizer", "optimizer_step"],
    "components.core.studies.quant_measure": ["cuda_bnb_check"],
}


class Stop(BaseException):
    """Raised by the alarm: a section's budget or the run's deadline is spent. A BaseException, so a
    section's own `except Exception` does not swallow it."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class Tee(io.TextIOBase):
    """stdout/stderr also into the log, flushed on every write (unbuffered: a killed run keeps its log)."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, s: str) -> int:
        for f in (self.stream, self.log):
            try:
                f.write(s)
                f.flush()
            except RuntimeError:
                # A signal handler writing while the main thread is inside this file's write (a "reentrant
                # call"): past the buffer, straight to the file (every write is flushed, so little waits).
                try:
                    os.write(f.fileno(), s.encode("utf-8", "replace"))
                except (OSError, ValueError):
                    pass
            except (OSError, ValueError):
                pass
        return len(s)

    def flush(self) -> None:
        for f in (self.stream, self.log):
            try:
                f.flush()
            except (OSError, ValueError, RuntimeError):
                pass

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return False


def say(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Check:
    """The summary, its file, the clock: sections run through `run`, rows land through `add`."""

    def __init__(self, out: Path | None, deadline_s: float, summary: dict):
        self.out, self.deadline_s, self.summary = out, deadline_s, summary
        self.t0 = START
        self.current: str | None = None
        self.section_end = float("inf")
        self.budget = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        """Seconds to the run's deadline."""
        return self.deadline_s - self.elapsed()

    def section_left(self) -> float:
        """Seconds left to the running section (its budget, or the deadline if sooner)."""
        return min(self.left(), self.section_end - self.elapsed())

    def save(self) -> None:
        """Rewrite the JSON atomically (a reader, or a kill, never sees half a file)."""
        if self.out is None:
            return
        self.summary["elapsed_s"] = round(self.elapsed(), 1)
        self.summary["headline"] = headline(self.summary)
        text = json.dumps(self.summary, indent=2, default=str) + "\n"
        tmp = self.out.with_name(f".{self.out.name}.partial")
        tmp.write_text(text)
        os.replace(tmp, self.out)

    def add(self, path: tuple[str, ...], row: dict) -> None:
        """Append one measured row under summary[path...] and save at once."""
        node = self.summary
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node.setdefault(path[-1], []).append(row)
        self.save()

    def run(self, name: str, fn, *args) -> None:
        budget = float(CFG["budgets"][name])
        needed = min(float(CFG["min_s"].get(name, budget)), budget)
        left = self.left()
        if left < needed:
            self.summary[name] = {
                "skipped": f"needs {needed:.0f} s to start; {left:.0f} s left of the {self.deadline_s:.0f} s deadline"
            }
            say(f"{name}: skipped ({self.summary[name]['skipped']})")
            self.save()
            return
        self.summary[name] = {"budget_s": round(min(budget, left), 1)}
        self.current, self.budget = name, min(budget, left)
        self.section_end = self.elapsed() + self.budget
        signal.setitimer(signal.ITIMER_REAL, max(0.1, min(self.budget + GRACE_S, left)))
        say(f"{name}: start (budget {self.budget:.0f} s, {left:.0f} s to the deadline)")
        t0 = time.perf_counter()
        try:
            result = fn(*args)
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.summary[name].update(result or {})
        except Stop as e:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.summary[name]["error"] = f"stopped: {e.what}"
            if self.left() <= 0:
                raise
        except Exception as e:  # noqa: BLE001 - one failing section must not hide the others
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.summary[name].update({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)})
        finally:
            self.summary[name]["section_s"] = round(time.perf_counter() - t0, 2)
            self.current, self.section_end = None, float("inf")
            err = self.summary[name].get("error")
            say(f"{name}: {time.perf_counter() - t0:.1f} s{' — ' + str(err) if err else ''}")
            self.save()

    # -- signals

    def on_alarm(self, signum, frame) -> None:
        if self.left() <= -HARD_GRACE_S + 1:  # the deadline's Stop was not honoured in time: write and leave
            self.finish(f"deadline ({self.deadline_s:.0f} s) passed and the run did not unwind", code=3)
        if self.left() <= 0:
            signal.setitimer(signal.ITIMER_REAL, HARD_GRACE_S)
            raise Stop(f"the run's deadline of {self.deadline_s:.0f} s")
        raise Stop(f"the section's budget of {self.budget:.0f} s (+{GRACE_S:.0f} s grace)")

    def on_term(self, signum, frame) -> None:
        if self.current:
            self.summary.setdefault(self.current, {})["error"] = f"interrupted by {signal.Signals(signum).name}"
        self.finish(f"{signal.Signals(signum).name} after {self.elapsed():.0f} s", code=128 + signum)

    def finish(self, why: str, code: int) -> None:
        self.summary["stopped"] = why
        say(f"stopped: {why}; writing what exists")
        try:
            self.save()
        finally:
            sys.stderr.flush()
            os._exit(code)


CFG: dict = {}


def headline(summary: dict) -> dict:
    pre, train, sweep = summary.get("preflight", {}), summary.get("train", {}), summary.get("sweep", {})
    fused_rows = sweep.get("fused", {}).get("rows", [])
    return {
        "gpu": pre.get("gpu"),
        "tokens_per_s": train.get("tokens_per_s"),
        "mfu_datasheet_peak": train.get("mfu_datasheet_peak"),
        "mfu_measured_peak": train.get("mfu_measured_peak"),
        "matmul_tflops_measured": summary.get("matmul_peak", {}).get("tflops"),
        "sdpa_observed": summary.get("sdpa", {}).get("observed"),
        "flash_verified": summary.get("sdpa", {}).get("flash_verified"),
        "longest_n_reference": sweep.get("reference", {}).get("longest_n"),
        "longest_n_fused": sweep.get("fused", {}).get("longest_n"),
        "longest_n_flex": summary.get("flex", {}).get("longest_n"),
        "fused_best_fraction_of_matmul_peak": max(
            (r.get("fraction_of_matmul_peak", 0) for r in fused_rows), default=None
        ),
        "gen_tokens_per_s": {
            v: r.get("gen_tokens_per_s") for v, r in summary.get("bnb_generate", {}).get("variants", {}).items()
        },
        "ddp_processes": summary.get("ddp", {}).get("processes"),
        "ddp_scaling_efficiency": summary.get("ddp", {}).get("scaling_efficiency"),
        "skipped": [k for k in ("preflight", *SECTIONS) if summary.get(k, {}).get("skipped")],
        "errors": [k for k in ("preflight", *SECTIONS) if summary.get(k, {}).get("error")],
    }


# --------------------------------------------------------------------------------------------------
# 0. preflight


def _version(module: str) -> str:
    try:
        m = importlib.import_module(module)
        return getattr(m, "__version__", None) or getattr(m, "VERSION", "?")
    except Exception as e:  # noqa: BLE001
        return f"unavailable: {type(e).__name__}: {e}"


def preflight(device: torch.device) -> dict:
    """Versions, the project's imports, and one tiny compiled kernel on CUDA (Triton and the compiler work)."""
    t0 = time.perf_counter()
    info: dict = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
    }
    for mod in ("numpy", "triton", "safetensors", "tokenizers"):
        info[mod] = _version(mod)
    try:
        import pydantic

        info["pydantic"] = pydantic.VERSION
    except ImportError:
        import pydantic_lite

        sys.modules["pydantic"] = pydantic_lite
        info["pydantic"] = "absent: the core's settings classes are built by scripts/pydantic_lite.py"
    if device.type == "cuda":
        torch.cuda.init()  # torch's CUDA libraries loaded first: bitsandbytes' library links against them
    try:
        import bitsandbytes

        info["bitsandbytes"] = bitsandbytes.__version__
        info["bitsandbytes_from"] = str(Path(bitsandbytes.__file__).parent)
    except Exception as e:  # noqa: BLE001
        info["bitsandbytes"] = (
            f"unavailable ({type(e).__name__}: {e}); carry it: bash scripts/gpu_carry.sh, "
            "then run with .gpu_carry carried"
        )
    say(
        " ".join(
            f"{k}={info[k]}" for k in ("python", "torch", "cuda_version", "triton", "numpy", "pydantic", "bitsandbytes")
        )
    )
    for module, names in PROJECT.items():
        m = importlib.import_module(module)
        for n in names:
            globals()[n] = getattr(m, n)
    info["project_imports"] = "ok"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            {
                "gpu": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
                "sm_count": props.multi_processor_count,
                "bf16_supported": torch.cuda.is_bf16_supported(),
                "peak_bf16_tflops_datasheet": (peak_flops(device) or 0) / 1e12 or None,
                "cudnn": torch.backends.cudnn.version(),
            }
        )
        t1 = time.perf_counter()
        x = torch.randn(4096, device=device)
        f = torch.compile(lambda t: torch.nn.functional.gelu(t) * 2.0 + 1.0)
        y = f(x)
        torch.cuda.synchronize(device)
        ok = torch.allclose(y, torch.nn.functional.gelu(x) * 2.0 + 1.0, atol=1e-5)
        info["compile_check"] = {
            "ok": bool(ok),
            "seconds": round(time.perf_counter() - t1, 2),
            "what": "torch.compile → inductor → Triton, gelu(x)·2+1 on 4096 floats vs eager",
        }
        if not ok:
            raise RuntimeError("the compiled tiny kernel differs from eager")
    else:
        info["gpu"] = None
        info["compile_check"] = {"skipped": "dry run on the CPU: the compile check is the Triton kernel on CUDA"}
    info["preflight_s"] = round(time.perf_counter() - t0, 2)
    say(f"preflight: {info.get('gpu') or 'cpu'}, compile check {info['compile_check']}, {info['preflight_s']} s")
    return info


# --------------------------------------------------------------------------------------------------
# 1. SDPA backend at the training shape


def sdpa_info(cfg: dict, device: torch.device, dtype: torch.dtype) -> dict:
    m = cfg["model"]
    shape = (cfg["batch_size"], m["n_head"], m["block_size"], m["n_embd"] // m["n_head"])
    requested = m["sdpa_backend"] if device.type == "cuda" else "auto"
    report = detect_sdpa_backend(device, dtype, shape, requested=requested)
    report["flash_verified"] = report["observed"] == "flash"
    if device.type != "cuda":
        report["note"] = "dry run: pinning applies on CUDA only; on the CPU torch's fused flash kernel is expected"
    return report


# --------------------------------------------------------------------------------------------------
# 2. bitsandbytes INT8 / NF4


def _weight_bytes(layer) -> int:
    w = layer.weight
    n = w.numel() * w.element_size()
    scb = getattr(w, "SCB", None)  # INT8 row scales
    if scb is not None:
        n += scb.numel() * scb.element_size()
    qs = getattr(w, "quant_state", None)  # NF4 block absmax (possibly itself quantized)
    if qs is not None:
        for t in (
            getattr(qs, "absmax", None),
            getattr(getattr(qs, "state2", None), "absmax", None),
            getattr(qs, "code", None),
        ):
            if isinstance(t, torch.Tensor):
                n += t.numel() * t.element_size()
    if layer.bias is not None:
        n += layer.bias.numel() * layer.bias.element_size()
    return n


def bnb_importable() -> str | None:
    """None when bitsandbytes imports, else why not (the sections that need it are skipped with it)."""
    try:
        import bitsandbytes  # noqa: F401

        return None
    except Exception as e:  # noqa: BLE001
        return (
            f"bitsandbytes is not importable ({type(e).__name__}: {e}); carry it: bash scripts/gpu_carry.sh, "
            "run with .gpu_carry carried"
        )


def bnb_check(ck: Check, cfg: dict, device: torch.device) -> dict:
    why = bnb_importable()
    if why:
        return {"skipped": why}
    import bitsandbytes as bnb

    b = cfg["bnb"]
    half = torch.float16
    torch.manual_seed(0)
    dense = torch.nn.Linear(b["in_features"], b["out_features"], bias=True).to(half)
    x = torch.randn(b["tokens"], b["in_features"], dtype=half, device=device)

    def build(kind: str) -> torch.nn.Module:
        if kind == "fp16":
            return torch.nn.Linear(b["in_features"], b["out_features"], bias=True).to(half)
        if kind == "int8":  # LLM.int8(): int8 weights, outlier features (> threshold) kept in fp16
            return bnb.nn.Linear8bitLt(
                b["in_features"], b["out_features"], bias=True, has_fp16_weights=False, threshold=6.0
            )
        return bnb.nn.Linear4bit(b["in_features"], b["out_features"], bias=True, compute_dtype=half, quant_type="nf4")

    out = {
        "in_features": b["in_features"],
        "out_features": b["out_features"],
        "tokens": b["tokens"],
        "device": str(device),
    }
    ref = None
    for kind in ("fp16", "int8", "nf4"):
        try:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                before = torch.cuda.memory_allocated(device)
            layer = build(kind)
            layer.load_state_dict(dense.state_dict())
            layer = layer.to(device)  # bitsandbytes quantizes the weights on this move
            allocated = torch.cuda.memory_allocated(device) - before if device.type == "cuda" else None
            with torch.no_grad():
                y = layer(x)
                synchronize(device)
                t0 = time.perf_counter()
                for _ in range(b["reps"]):
                    y = layer(x)
                synchronize(device)
            ms = 1000 * (time.perf_counter() - t0) / b["reps"]
            y = y.float()
            if ref is None:
                ref = y
            ck.summary["bnb"][kind] = out[kind] = {
                "weight_dtype": str(layer.weight.dtype).removeprefix("torch."),
                "weight_bytes": _weight_bytes(layer),
                "allocated_bytes": allocated,
                "forward_ms": ms,
                "rel_error_vs_fp16": float((y - ref).norm() / ref.norm()),
            }
            del layer
            ck.save()
        except Exception as e:  # noqa: BLE001 - record and go on with the next kind
            out[kind] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    if "weight_bytes" in out.get("fp16", {}):
        for kind in ("int8", "nf4"):
            if "weight_bytes" in out.get(kind, {}):
                out[kind]["bytes_ratio_vs_fp16"] = out[kind]["weight_bytes"] / out["fp16"]["weight_bytes"]
    if device.type != "cuda":
        out["note"] = "dry run: bitsandbytes' CPU path; the CUDA INT8/NF4 kernels run only on a GPU"
    return out


# --------------------------------------------------------------------------------------------------
# 3. generation at every precision, through the pipeline's quantization path


def bnb_generate_check(ck: Check, cfg: dict, device: torch.device) -> dict:
    why = bnb_importable()
    variants = ("fp16", "bf16") if why else ("fp16", "bf16", "int8", "nf4")
    q = cfg["quant_dtype"]

    def saved(name: str, row: dict) -> None:
        ck.summary["bnb_generate"].setdefault("variants", {})[name] = row
        say(f"bnb_generate {name}: {row}")
        ck.save()

    out = cuda_bnb_check(
        device, **cfg["bnb_generate"], variants=variants, keep_dtype=q, compute_dtype=q, on_variant=saved
    )
    out["like_for_like"] = (
        f"fp32 is the reference only (logit differences). fp16 casts every tensor to float16; bf16 to bfloat16; int8 "
        f"and "
        f"nf4 keep what is not quantized (embeddings, tied head, norms, biases) in {q}, and nf4 computes its matmuls "
        f"in "
        f"{q} (LLM.int8 computes in float16). Logits are compared in float32."
    )
    if why:
        out["int8_nf4_skipped"] = why
    return out


# --------------------------------------------------------------------------------------------------
# 4. the measured matmul peak


def matmul_peak(cfg: dict, device: torch.device, dtype: torch.dtype) -> dict:
    """Dense matmul throughput (n×n @ n×n, median of 10 after 3 warm-up), the ceiling that MFU and the
    fused attention kernel are also compared with."""
    n = cfg["matmul_n"]
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    s = median_seconds(lambda: a @ b, device, warmup=3, repeats=10)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "ms": 1000 * s, "tflops": 2 * n**3 / s / 1e12}


# --------------------------------------------------------------------------------------------------
# 5. GPT-2 small training through the pipeline's optimizer step


def observed_kernels(
    model: Transformer, x: torch.Tensor, y: torch.Tensor, device: torch.device, dtype: torch.dtype
) -> dict:
    """SDPA aten ops and attention CUDA kernels seen in one forward+backward of the model (eager)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        with autocast_context(device, dtype):
            _, loss = model(x, y)
        loss.backward()
        synchronize(device)
    keys = {e.key for e in prof.key_averages()}
    model.zero_grad(set_to_none=True)
    return {
        "sdpa_ops": sorted(SDPA_OPS[k] for k in keys if k in SDPA_OPS),
        "attention_kernels": sorted(
            k
            for k in keys
            if any(s in k.lower() for s in ("flash", "fmha", "attention_kernel", "cudnn"))
            and not k.startswith("aten::")
        )[:12],
    }


def train_check(ck: Check, cfg: dict, device: torch.device, dtype: torch.dtype, compile_ok: bool) -> dict:
    m = cfg["model"]
    settings = TransformerSettings(**m)
    torch.manual_seed(0)
    model = Transformer(settings, cfg["vocab_size"])
    T, B = settings.block_size, cfg["batch_size"]
    # Random tokens: throughput does not depend on the text; enough blocks that batches differ.
    rng = np.random.default_rng(0)
    n_blocks = max(4 * B, 256)
    x = rng.integers(1, cfg["vocab_size"], size=(n_blocks, T + 1), dtype=np.int64).astype(np.uint16)
    data = TokenBlocks(np.ascontiguousarray(x[:, :-1]), np.ascontiguousarray(x[:, 1:].astype(np.int32)))
    use_compile = cfg["compile"] and compile_ok
    ts = TrainSettings(
        max_steps=cfg["steps"],
        batch_size=B,
        lr=6e-4,
        min_lr=6e-5,
        warmup_steps=5,
        weight_decay=0.1,
        beta2=0.95,
        grad_clip=1.0,
        eval_interval=0,
        eval_batches=1,
        log_interval=cfg["log_interval"],
        device=cfg["device"],
        dtype=cfg["dtype"],
        compile=use_compile,
        seed=0,
    )
    model.to(device).train()
    # The loop's own pieces (optimizer, state, step), without its evaluation and checkpoints: this
    # measures throughput; a final validation would recompile and a GPT-2 checkpoint is ~1.5 GB.
    state = TrainState(
        model=model,
        optimizer=make_optimizer(model, ts, device),
        scaler=torch.amp.GradScaler(device.type, enabled=False),
        sampler=np.random.default_rng(0),
    )
    run_model = torch.compile(model) if use_compile else model
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    res: dict = {
        "params": count_parameters(model),
        "params_non_embedding": count_parameters(model, non_embedding=True),
        "config": settings.model_dump(),
        "vocab_size": cfg["vocab_size"],
        "batch_size": B,
        "block_size": T,
        "tokens_per_step": B * T,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "compile": use_compile,
        "fused_adamw": device.type == "cuda",
    }
    if cfg["compile"] and not compile_ok:
        res["compile_note"] = "the preflight's compile check failed: trained without torch.compile"
    ck.summary["train"].update(res)

    def step() -> object:
        return optimizer_step(
            state, run_model, data, ts, device=device, dtype=dtype, parallel=Parallel(), measure_clipped=False
        )

    t0 = time.perf_counter()
    first = step()  # compiles when asked: timed apart
    res["first_step_s"] = ck.summary["train"]["first_step_s"] = round(time.perf_counter() - t0, 2)
    say(f"train: first step (compile included) {res['first_step_s']} s, loss {first.loss:.3f}")
    interval, losses, stopped = [], [], None
    while state.step < ts.max_steps:
        if ck.section_left() < 3 * (statistics.median(interval) if interval else 1.0) + 2:
            stopped = f"section budget: stopped after {state.step} steps"
            break
        st = step()
        interval.append(st.seconds)
        losses.append(st.loss)
        if state.step % ts.log_interval == 0 or state.step == ts.max_steps:
            secs = sum(interval)
            row = {
                "step": state.step,
                "train_loss": statistics.fmean(losses),
                "step_ms": 1000 * secs / len(interval),
                "tokens_per_s": len(interval) * B * T / secs,
            }
            ck.add(("train", "rows"), row)
            say(f"train: {row}")
            interval, losses = [], []
    rows = ck.summary["train"].get("rows", [])
    steady = statistics.median(r["tokens_per_s"] for r in rows) if rows else None
    flops_tok = model.flops_per_token(T)
    measured = ck.summary.get("matmul_peak", {}).get("tflops")
    datasheet = peak_flops(device)
    res.update(
        {
            "steps": state.step,
            "stopped": stopped or f"max_steps={ts.max_steps} reached",
            "tokens_per_s": steady,  # median over the log intervals after the first step (compile excluded)
            "step_ms": 1000 * B * T / steady if steady else None,
            "flops_per_token": flops_tok,
            "achieved_tflops": flops_tok * steady / 1e12 if steady else None,
            "peak_tflops_datasheet": datasheet / 1e12 if datasheet else None,
            "peak_tflops_measured": measured,
            "mfu_datasheet_peak": flops_tok * steady / datasheet if steady and datasheet else None,
            "mfu_measured_peak": flops_tok * steady / (measured * 1e12)
            if steady and measured and device.type == "cuda"
            else None,
            "mfu_goal": MFU_GOAL,
            "final_train_loss": state.history[-1]["train/loss"]
            if state.history
            else (rows[-1]["train_loss"] if rows else None),
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        }
    )
    res["mfu_goal_met"] = None if res["mfu_datasheet_peak"] is None else res["mfu_datasheet_peak"] >= MFU_GOAL
    del run_model, state
    xb, yb = data.batch(np.arange(min(B, 4)), device)
    kernels = observed_kernels(model, xb, yb, device, dtype)
    res["observed_in_model"] = kernels
    res["flash_in_model"] = "flash" in kernels["sdpa_ops"] if device.type == "cuda" else None
    return res


# --------------------------------------------------------------------------------------------------
# 6. attention sweep: reference vs fused vs window, N doubling, each point saved as measured


def attention_flops(n: int, heads: int, head_dim: int, batch: int = 1, backward: bool = True) -> float:
    """Causal attention FLOPs as FlashAttention's papers count them: forward 4·B·H·N²·D halved by the
    causal mask; forward+backward 3.5× the forward (the backward does 2.5× the forward's matmuls)."""
    fwd = 4 * batch * heads * n * n * head_dim / 2
    return fwd * 3.5 if backward else fwd


def _point(ck: Check, section: str, impl: str, n: int, sw: dict, device: torch.device, dtype: torch.dtype) -> dict:
    t0 = time.perf_counter()
    r = attention_sweep(
        [n],
        [impl],
        batch=1,
        n_head=sw["heads"],
        head_dim=sw["head_dim"],
        device=device,
        dtype=dtype,
        repeats=sw["reps"],
        warmup=1,
        backward=True,
        window=sw["window"],
        n_global=sw["n_global"],
        sdpa_backend="flash" if device.type == "cuda" else "auto",
        time_cap_s=sw["time_cap_s"],
    )[0]
    r["wall_s"] = round(time.perf_counter() - t0, 2)
    if impl == "fused" and "ms" in r:
        r["tflops"] = attention_flops(n, sw["heads"], sw["head_dim"]) / (r["ms"] / 1000) / 1e12
        peak = ck.summary.get("matmul_peak", {}).get("tflops")
        if peak:
            r["fraction_of_matmul_peak"] = r["tflops"] / peak
    ck.add((section, impl, "rows"), r)
    say(f"{section} {impl} N={n}: {r.get('ms', r.get('error'))} ms, {r.get('peak_mib', '-')} MiB, {r['wall_s']} s")
    return r


def _sweep_impl(
    ck: Check,
    section: str,
    impl: str,
    ns: list[int],
    sw: dict,
    device,
    dtype,
    min_point_s: float = 2.0,
    growth: float = 4.0,
) -> None:
    """Points in increasing N, each saved as measured; stops at a failure, the time cap, or when the
    next point (about `growth` × the last one's wall time) no longer fits the section's budget."""
    last_wall, stopped = 0.0, f"the last N ({ns[-1]}) reached"
    for n in ns:
        need = max(min_point_s, growth * last_wall)
        if ck.section_left() < need:
            stopped = f"section budget: N={n} would need about {need:.0f} s, {ck.section_left():.0f} s left"
            break
        r = _point(ck, section, impl, n, sw, device, dtype)
        last_wall = r["wall_s"]
        if "error" in r:
            stopped = f"failed at N={n}: {r['error']}"
            break
        if "stop" in r:
            stopped = r["stop"]
            break
    node = ck.summary[section].setdefault(impl, {})
    ok = [r for r in node.get("rows", []) if "error" not in r]
    node.update({"longest_n": ok[-1]["n"] if ok else None, "stopped": stopped})
    ck.save()


def sweep_check(ck: Check, cfg: dict, device: torch.device, dtype: torch.dtype) -> dict:
    sw = cfg["sweep"]
    ck.summary["sweep"].update(
        {
            "heads": sw["heads"],
            "head_dim": sw["head_dim"],
            "batch": 1,
            "dtype": str(dtype).removeprefix("torch."),
            "pass": "forward+backward",
            "fused_backend": "flash (pinned)" if device.type == "cuda" else "auto (cpu)",
            "window_tokens": sw["window"],
            "n_global": sw["n_global"],
            "peak_memory": memory_accounting(device),
            "matmul_tflops_measured": ck.summary.get("matmul_peak", {}).get("tflops"),
        }
    )
    ns = doubling(sw["n_start"], sw["n_max"])
    impls = ("fused", "reference", "window")  # the fused kernel first: it goes furthest and is the headline
    for impl in impls:
        _sweep_impl(ck, "sweep", impl, ns, sw, device, dtype)
    rows = [{"impl": impl, **r} for impl in impls for r in ck.summary["sweep"][impl].get("rows", [])]
    return {
        "fits": fit_rows([{"pass": "forward_backward", **r} for r in rows], sw["n_start"] * 8),
        "speedup": ratio_by_n(rows, "ms", "reference", "fused"),
        "memory_ratio": ratio_by_n(rows, "peak_bytes", "reference", "fused"),
    }


# --------------------------------------------------------------------------------------------------
# 7. FlexAttention at a few N


def flex_check(ck: Check, cfg: dict, device: torch.device, dtype: torch.dtype, compile_ok: bool) -> dict:
    if device.type != "cuda":
        return {
            "skipped": "CUDA only: on the CPU FlexAttention has no backward (and each N compiles for tens of seconds)"
        }
    if not compile_ok:
        return {"skipped": "the preflight's compile check failed; FlexAttention needs the compiler"}
    sw, fx = cfg["sweep"], cfg["flex"]
    ck.summary["flex"].update(
        {
            "ns": fx["ns"],
            "window_tokens": sw["window"],
            "n_global": sw["n_global"],
            "dtype": str(dtype).removeprefix("torch."),
            "note": "each N is one compile (wall_s includes it); the BlockMask is built compiled (no dense N×N mask)",
        }
    )
    # A point's wall time is mostly its compile, not the N² work: the next one costs about as much.
    _sweep_impl(ck, "flex", "flex", list(fx["ns"]), sw, device, dtype, min_point_s=fx["min_point_s"], growth=1.5)
    node = ck.summary["flex"].pop("flex")
    return {"rows": node.get("rows", []), "longest_n": node["longest_n"], "stopped": node["stopped"]}


# --------------------------------------------------------------------------------------------------
# 8. multi-GPU data parallelism


def ddp_check(cfg: dict, device: torch.device) -> dict:
    """1 process against N (every GPU; 2 gloo processes in the dry run) at the same batch per process,
    through the pipeline's worker under torchrun."""
    from ddp_throughput import make_spec, measure, write_random_labels

    n = torch.cuda.device_count() if device.type == "cuda" else 2
    if device.type == "cuda" and n < 2:
        return {"skipped": f"needs 2 or more GPUs; this machine has {n}", "gpus": n}
    d = cfg["ddp"]
    m = cfg["model"]
    window = (d["warmup"], d["warmup"] + d["steps"])
    per = d["batch_size_per_process"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        labels = write_random_labels(tmp / "labels", cfg["vocab_size"], m["block_size"], max(64 * per, 256))

        def case(nproc: int, profile: bool) -> dict:
            train = dict(
                max_steps=window[1] + d["log_interval"],
                batch_size=per * nproc,
                lr=6e-4,
                min_lr=6e-5,
                warmup_steps=5,
                grad_clip=1.0,
                eval_interval=0,
                eval_batches=1,
                log_interval=d["log_interval"],
                device=cfg["device"],
                dtype=cfg["dtype"],
                compile=d["compile"],
                seed=0,
                threads=1 if device.type == "cpu" else 0,
            )
            spec = make_spec(labels, "transformer", m, train, tmp / f"run{nproc}")
            return measure(spec, nproc, 1, window, profile=profile)

        one = case(1, False)
        many = case(n, True)
    prof = many.get("profile", {})
    return {
        "processes": n,
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "batch_size_per_process": per,
        "block_size": m["block_size"],
        "tokens_per_s_1": one["tokens_per_s"],
        "tokens_per_s_n": many["tokens_per_s"],
        "speedup": many["tokens_per_s"] / one["tokens_per_s"],
        "scaling_efficiency": many["tokens_per_s"] / (n * one["tokens_per_s"]),
        "step_ms_1": one["step_ms"],
        "step_ms_n": many["step_ms"],
        "allreduce_ms_per_step": prof.get("allreduce_ms_per_step"),
        "allreduce_share_of_step": prof.get("allreduce_share_of_step"),
        "allreduce_timed_as": prof.get("allreduce_timed_as"),
        "params": many["params"],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out",
        required=True,
        help="the JSON summary's path (the log goes beside it, same name .log); on a lent GPU put it under $OUT",
    )
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes (what the tests run)")
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=420.0,
        help="hard deadline of the whole check, seconds (default 420 = 7 min)",
    )
    ap.add_argument("--steps", type=int, help="training steps (default 50; dry run 6)")
    ap.add_argument("--batch-size", type=int, help="training batch size (default 32; dry run 4)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile in train (faster start, lower MFU)")
    ap.add_argument(
        "--sdpa-backend",
        choices=["flash", "cudnn", "efficient", "auto"],
        help="the fused kernel the train and sdpa sections pin (default flash, the pipeline's GPU setting)",
    )
    ap.add_argument("--skip", default="", help=f"comma-separated sections to skip: {','.join(SECTIONS)}")
    ap.add_argument(
        "--budget", default="", help="comma-separated NAME=SECONDS overriding sections' budgets, e.g. train=90,flex=60"
    )
    ap.add_argument("--only", default="", help="comma-separated sections to run (the preflight always runs)")
    args = ap.parse_args(argv)

    cfg = json.loads(json.dumps(DRY if args.dry_run else FULL))
    if args.steps:
        cfg["steps"] = args.steps
    if args.batch_size:
        cfg["batch_size"] = args.batch_size
    if args.no_compile:
        cfg["compile"] = False
    if args.sdpa_backend:
        cfg["model"]["sdpa_backend"] = args.sdpa_backend
    for item in filter(None, (x.strip() for x in args.budget.split(","))):
        name, _, secs = item.partition("=")
        if name not in SECTIONS or not secs.replace(".", "", 1).isdigit():
            raise SystemExit(
                f"gpu_check: --budget wants NAME=SECONDS with NAME one of {', '.join(SECTIONS)}; got {item!r}"
            )
        cfg["budgets"][name] = float(secs)
    CFG.clear()
    CFG.update(cfg)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit(
            "gpu_check: no CUDA GPU here; run it on the GPU machine, or use --dry-run for the CPU smoke run"
        )
    unknown = {s.strip() for s in (args.skip + "," + args.only).split(",") if s.strip()} - set(SECTIONS)
    if unknown:
        raise SystemExit(f"gpu_check: unknown section(s) {sorted(unknown)}; sections are {', '.join(SECTIONS)}")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = open(out.with_suffix(".log"), "w", buffering=1, encoding="utf-8")
    sys.stdout, sys.stderr = Tee(sys.__stdout__, log), Tee(sys.__stderr__, log)
    summary: dict = {
        "check": "gpu_check",
        "dry_run": args.dry_run,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "deadline_s": args.deadline_s,
        "argv": sys.argv[1:] if argv is None else argv,
        "settings": cfg,
    }
    ck = Check(out, args.deadline_s, summary)
    signal.signal(signal.SIGTERM, ck.on_term)
    signal.signal(signal.SIGINT, ck.on_term)
    signal.signal(signal.SIGALRM, ck.on_alarm)
    say(f"writing {out} and {out.with_suffix('.log')}; deadline {args.deadline_s:.0f} s")
    ck.save()

    device = torch.device(cfg["device"])
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[cfg["dtype"]]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as nanoGPT: fp32 matmuls outside autocast use TF32
        torch.backends.cudnn.allow_tf32 = True
    compile_ok = False
    try:
        signal.setitimer(signal.ITIMER_REAL, max(1.0, min(120.0, ck.left())))  # the preflight must not eat the run
        summary["preflight"] = preflight(device)
        compile_ok = summary["preflight"]["compile_check"].get("ok", False)
    except (Exception, Stop) as e:  # noqa: BLE001 - recorded; without the project's imports nothing else can run
        summary["preflight"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        ck.save()
    if "project_imports" not in summary["preflight"]:
        ck.finish("the preflight failed before the project's modules were imported", code=2)

    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    runs = {
        "sdpa": (sdpa_info, cfg, device, dtype),
        "bnb": (bnb_check, ck, cfg, device),
        "bnb_generate": (bnb_generate_check, ck, cfg, device),
        "matmul_peak": (matmul_peak, cfg, device, dtype),
        "train": (train_check, ck, cfg, device, dtype, compile_ok),
        "sweep": (sweep_check, ck, cfg, device, dtype),
        "flex": (flex_check, ck, cfg, device, dtype, compile_ok),
        "ddp": (ddp_check, cfg, device),
    }
    try:
        for name in SECTIONS:
            if name in skip or (only and name not in only):
                summary[name] = {"skipped": "--skip" if name in skip else "not in --only"}
                continue
            fn, *fargs = runs[name]
            ck.run(name, fn, *fargs)
    except Stop as e:
        summary["stopped"] = e.what
    summary["wall_s"] = round(ck.elapsed(), 1)
    signal.setitimer(signal.ITIMER_REAL, 0)
    ck.save()
    print(json.dumps(summary, indent=2, default=str), file=sys.__stdout__, flush=True)
    say(f"done in {summary['wall_s']} s: {out}")
    if "stopped" in summary:
        sys.exit(3)
    return summary


if __name__ == "__main__":
    main()
