"""Where and in what precision the core runs: device and dtype settings, autocast, seeding, timing,
and the GPUs' peak FLOP/s for model-FLOPs utilisation (MFU). The one place for each of these."""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import time
from typing import Callable, Literal, get_args

import numpy as np
import torch

from .errors import ConfigError

DeviceSetting = Literal["auto", "cpu", "cuda"]
DtypeSetting = Literal["auto", "float32", "bfloat16", "float16"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) — call before building a model for a reproducible init."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(setting: str) -> tuple[torch.device, str | None]:
    """'cuda' | 'cpu' | 'auto' -> (device, warning or None)."""
    if setting == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device='cuda' but no CUDA GPU is available; set device='auto' or device='cpu'")
        return torch.device("cuda"), None
    if setting == "cpu":
        return torch.device("cpu"), None
    if setting == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda"), None
        return torch.device("cpu"), "device='auto': no CUDA GPU found, training on the CPU"
    raise ConfigError(f"device={setting!r} is unknown; use one of: {', '.join(get_args(DeviceSetting))}")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (Intel AMX-BF16 tiles, Sapphire Rapids
    and later): there bf16 matmuls run 4–6× faster than float32 (768×128×384: 56 vs 219 µs on 2 cores,
    torch 2.13). Without AMX, bf16 on the CPU is emulated and no faster."""
    try:
        return bool(torch.cpu._is_amx_tile_supported()) and torch.backends.mkldnn.is_available()
    except (AttributeError, RuntimeError):  # a torch without the probe
        return False


def resolve_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The autocast dtype: 'auto' = bfloat16 where the hardware multiplies it natively (a GPU that
    supports it; a CPU with AMX-BF16), else float32. Weights and optimizer state stay float32."""
    if setting == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if device.type == "cpu" and cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    if setting == "float16" and device.type != "cuda":
        raise ConfigError("dtype='float16' needs a CUDA device; use dtype='bfloat16' or 'float32' on the CPU")
    if setting not in DTYPES:
        raise ConfigError(f"dtype={setting!r} is unknown; use one of: {', '.join(get_args(DtypeSetting))}")
    return DTYPES[setting]


def autocast_context(device: torch.device, dtype: torch.dtype):
    """Mixed precision for `dtype` on `device`; float32 runs as is."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a timer measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def quiet_profiler() -> None:
    """Keep torch.profiler's backend (kineto) from printing "USDT: ... profiler_start" / "profiler_stop" on
    stderr for every profile: its tracing-probe markers, nothing to act on (the attention_cost asset profiles
    every measured pass). Call before a profile: kineto reads KINETO_LOG_LEVEL when first used in a process.
    6 is above its highest level (USDT, 5), the only value that hides them, so it hides kineto's own error
    lines too. A KINETO_LOG_LEVEL set by the user wins."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def median_seconds(
    fn: Callable[[], object], device: torch.device, *, warmup: int, repeats: int, budget_s: float | None = None
) -> float:
    """Median wall time of `fn()` over `repeats` runs after `warmup` untimed ones (synchronized on CUDA).
    With `budget_s`, timing stops early once the timed runs add up to that many seconds (at least one run):
    a run of seconds is its own average, and repeating it costs more than it tells."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    for _ in range(repeats):
        if budget_s is not None and times and sum(times) >= budget_s:
            break
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# Dense bf16 tensor-core peaks (no sparsity), FLOP/s. First substring match of the device name wins,
# so the more specific names come first.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("V100", 125e12),  # fp16; V100 has no bf16
]


def peak_flops_for_name(name: str) -> float | None:
    """Dense bf16 peak FLOP/s for a GPU name as torch reports it (e.g. 'NVIDIA H200'), or None."""
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


def peak_flops(device: torch.device | str) -> float | None:
    """Dense bf16 peak FLOP/s of a CUDA device (by name), or None (CPU, unknown GPU)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device))


def estimate_mfu(flops_per_token: float, tokens_per_s: float, device: torch.device | str) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the device's dense bf16 peak. None on a CPU
    or on a GPU missing from the peak table."""
    peak = peak_flops(device)
    return None if peak is None else flops_per_token * tokens_per_s / peak
