"""Which SDPA kernel runs: verified by running it, not assumed from the settings.

`detect_sdpa_backend` pins each kernel of `attention.SDPA_BACKENDS` in turn on causal attention of a
given shape, asks torch's dispatcher which one it would pick unpinned, and runs the requested one
under the profiler to see which aten op (`SDPA_OPS`) actually dispatched."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import SDPA_BACKENDS

# aten ops SDPA dispatches to, as the profiler names them, and the backend each one is.
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash_cpu",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


def _observed_sdpa_ops(q, k, v, backend: str) -> list[str]:
    """Run one causal SDPA forward+backward under the profiler; the dispatched kernels' backend names."""
    from torch.profiler import ProfilerActivity, profile

    from ..device import quiet_profiler

    quiet_profiler()
    pin = sdpa_kernel(SDPA_BACKENDS[backend]) if backend != "auto" else nullcontext()
    with profile(activities=[ProfilerActivity.CPU]) as prof, pin:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum().backward()
    return sorted({SDPA_OPS[e.key] for e in prof.key_averages() if e.key in SDPA_OPS})


def detect_sdpa_backend(
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    shape: tuple[int, int, int, int] = (2, 4, 64, 32),
    requested: str = "auto",
) -> dict:
    """Which SDPA kernels work for causal attention of `shape` = (B, nh, T, hs) on `device`, `dtype`.

    Returns {"requested", "device", "dtype", "shape", "available": {backend: bool} (each pinned in turn
    and run forward+backward), "auto_choice" (what torch's dispatcher picks unpinned),
    "observed": the backend the profiler saw run with `requested` (None if it failed), "error"}.
    """
    device = torch.device(device)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    available = {}
    for name, backend in SDPA_BACKENDS.items():
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum().backward()
            available[name] = True
        except RuntimeError:
            available[name] = False
    try:  # the dispatcher's own choice; a private helper, so tolerate its absence
        choice = torch._fused_sdp_choice(q, k, v, is_causal=True)  # pyright: ignore[reportPrivateImportUsage]
        auto_choice = SDPBackend(int(choice)).name.lower()
    except Exception:  # noqa: BLE001 - informational only
        auto_choice = None
    observed, error = None, None
    try:
        ops = _observed_sdpa_ops(q, k, v, requested)
        observed = ops[0] if len(ops) == 1 else (",".join(ops) or None)
    except RuntimeError as e:
        error = f"sdpa_backend={requested!r} cannot run here: {str(e).splitlines()[0]}"
    return {
        "requested": requested,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "shape": list(shape),
        "available": available,
        "auto_choice": auto_choice,
        "observed": observed,
        "error": error,
    }
