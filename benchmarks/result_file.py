"""How a benchmark hands back its result: the JSON on stdout, and into `--out` when given (written
whole or not at all, so an interrupted run never leaves half a result under benchmarks/results/).

Every result also records the machine it was measured on, under "machine" (fields a benchmark set
there itself are kept): the CPU model, the ISA flags that decide CPU speed here (AMX, AVX512-BF16,
AVX-VNNI), the dtype that `dtype: auto` chooses on this CPU, and torch's thread count at the end of
the run. The same machine family comes with and without AMX, and there a bf16 matmul is 4-6x faster
or about 2x slower than float32: a figure without its CPU kind cannot be compared."""

from __future__ import annotations

import json
import os
import platform
import sys
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


def machine_info() -> dict:
    """The machine of a result: CPU model and kind, ISA flags, `auto`'s dtype on this CPU, torch's
    thread count (as the benchmark left it), CPU count, Python and torch versions."""
    info = {**cpu_identity(), "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        root = str(Path(__file__).resolve().parents[1])
        if root not in sys.path:
            sys.path.append(root)
        from components.core.device import resolve_dtype

        info["auto_dtype_cpu"] = str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")
        info["torch_threads"] = torch.get_num_threads()
        info["torch"] = torch.__version__
    except ImportError as e:  # a benchmark without torch still records the CPU
        info["auto_dtype_cpu"] = info["torch_threads"] = f"unknown: {e}"
    return info


def emit(out: dict, path: str | Path | None) -> dict:
    own = out.get("machine")
    out = {**out, "machine": {**machine_info(), **own} if isinstance(own, dict) else machine_info()}
    text = json.dumps(out, indent=2)
    print(text)
    if path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_text(text + "\n")
        os.replace(tmp, path)
    return out


def newest_in_state(folder: Path, name: str) -> Path:
    """The newest `folder/<run>/name` a run wrote into a state folder's artifacts (one folder per run)."""
    found = sorted(folder.glob(f"*/{name}"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no {name} under {folder}: is --state a folder a default run wrote?")
    return found[-1]
