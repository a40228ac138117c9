"""What machine a measurement ran on: the CPU model and the ISA flags that decide CPU speed here
(AMX, AVX512-BF16, AVX-VNNI). The same machine family comes with and without AMX, and there a bf16
matmul is 4-6x faster or about 2x slower than float32: a figure without its CPU kind cannot be
compared. No torch: benchmarks without it record the CPU too."""

from __future__ import annotations

import platform
from pathlib import Path

# The CPU flags (/proc/cpuinfo names) that decide which path is fast on this machine.
ISA_FLAGS = ("amx_bf16", "amx_tile", "amx_int8", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx512f", "avx2")


def cpu_identity(cpuinfo: str | None = None) -> dict:
    """{"cpu_model", "isa": {flag: bool for ISA_FLAGS}, "cpu_kind"} from /proc/cpuinfo (or the text
    given); on a system without it, the model from platform and no flags known (isa None)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    model = fields.get("model name") or platform.processor() or platform.machine()
    if "flags" not in fields:
        return {"cpu_model": model, "isa": None, "cpu_kind": "unknown (no CPU flags readable)"}
    flags = set(fields["flags"].split())
    isa = {f: f in flags for f in ISA_FLAGS}
    if isa["amx_bf16"]:
        kind = "AMX-BF16 (bf16 matmuls native)"
    elif isa["avx512_bf16"]:
        kind = "AVX512-BF16 without AMX (bf16 matmuls slower than float32)"
    else:
        kind = "no bf16 matrix unit"
    return {"cpu_model": model, "isa": isa, "cpu_kind": kind}
