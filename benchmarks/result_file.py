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
from typing import Any

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)

from components.core.machine import ISA_FLAGS, cpu_identity  # noqa: E402,F401 - ISA_FLAGS: where benchmarks read it


def machine_info() -> dict:
    """The machine of a result: CPU model and kind, ISA flags, `auto`'s dtype on this CPU, torch's
    thread count (as the benchmark left it), CPU count, Python and torch versions."""
    info = {**cpu_identity(), "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

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


def trained_lm(artifacts: Path, name: str) -> tuple[dict, Any, Any]:
    """The language model asset `name` of a run's artifacts folder, on the CPU: its manifest (a dict), the
    model loaded from its safetensors file and the dtype it trained in."""
    import torch

    from components.core.device import resolve_dtype
    from components.core.lm import load_lm

    folder = newest_in_state(artifacts / name, "manifest.json").parent
    manifest = json.loads((folder / "manifest.json").read_text())
    dtype = resolve_dtype(manifest["train_settings"]["dtype"], torch.device("cpu"))
    return manifest, load_lm(folder / "model.safetensors"), dtype
