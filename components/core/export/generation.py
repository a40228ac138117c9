"""Text from an export folder (`generate`, what `w2t-generate` calls) and the load-time benchmark of
its weights (safetensors against torch.load); components/core/export/folder.py writes and reads the
folder."""

from __future__ import annotations

import inspect
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, cast

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import load_file

from ..errors import ConfigError
from ..tokenizer import EOS, decode, encode
from .folder import DEFAULT_GENERATION, GENERATION, MAX_NEW_TOKENS, load_export, read_json
from .precision import eager


def cache_kind(model: nn.Module) -> str:
    """How the model's generation reuses past work: 'kv' (a KV cache), 'recurrent state', or 'none'."""
    if _cache_kwargs(model):
        return "kv"
    if hasattr(model, "step") and hasattr(model, "init_state"):
        return "recurrent state"
    return "none (recomputes the context each token)"


def _generate_method(model: nn.Module) -> Callable[..., torch.Tensor]:
    """`model.generate` (every model family has one; nn.Module's typing cannot know it)."""
    return cast(Callable[..., torch.Tensor], model.generate)


def _cache_kwargs(model: nn.Module) -> dict[str, bool]:
    params = inspect.signature(_generate_method(model)).parameters
    return {k: True for k in ("use_cache", "kv_cache") if k in params}


@torch.no_grad()
def generate_tokens(
    model: nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
) -> torch.Tensor:
    """`model.generate` with its KV cache switched on when it has one; temperature 0 = greedy. A seed
    samples in a forked RNG (the caller's RNG state is left alone)."""
    kw = _cache_kwargs(model)
    device = idx.device
    with eager(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if seed is not None:
            torch.manual_seed(seed)
        return _generate_method(model)(idx, max_new_tokens, temperature=temperature, top_k=top_k, **kw)


@dataclass
class Generation:
    text: str  # the prompt's continuation (new tokens, decoded, up to the first [EOS])
    prompt_tokens: int  # the prompt's tokens the model saw (at most its block_size)
    new_tokens: int
    seconds: float
    variant: str
    prompt_tokens_dropped: int = 0  # the prompt's first tokens cut off to fit the model's context


def generate(
    folder: str | Path,
    prompt: str,
    *,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    loaded: tuple | None = None,
) -> Generation:
    """Continue `prompt` with the model of an export folder; unset sampling settings come from its
    generation_config.json. An empty prompt starts a new document (after [EOS]). At most
    MAX_NEW_TOKENS new tokens per call (more is a ConfigError, before anything runs); a prompt longer
    than the model's context keeps its last block_size tokens (`prompt_tokens_dropped` says how many
    went). Text is encoded and decoded as the model was trained (Chinese segmented by jieba for a
    word-level tokenizer, and decoded without the spaces between its words)."""
    if max_new_tokens is not None and max_new_tokens > MAX_NEW_TOKENS:
        raise ConfigError(
            f"max_new_tokens={max_new_tokens} is over the maximum of {MAX_NEW_TOKENS} new tokens per call"
        )
    folder = Path(folder)
    model, tokenizer, cfg = loaded or load_export(folder, device)
    gen = {
        **DEFAULT_GENERATION,
        **(read_json(folder / GENERATION, "sampling defaults") if (folder / GENERATION).is_file() else {}),
    }
    n = gen["max_new_tokens"] if max_new_tokens is None else max_new_tokens
    t = gen["temperature"] if temperature is None else temperature
    k = gen.get("top_k") if top_k is None else top_k
    if n < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {n}")
    if n > MAX_NEW_TOKENS:
        raise ConfigError(f"max_new_tokens={n} is over the maximum of {MAX_NEW_TOKENS} new tokens per call")
    if t < 0:
        raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {t}")
    if k is not None and k < 1:
        raise ConfigError(f"top_k must be >= 1 (or unset), got {k}")
    ids = encode(tokenizer, prompt) if prompt else []
    ids = ids or [EOS]
    block = getattr(getattr(model, "config", None), "block_size", None)
    dropped = max(0, len(ids) - block) if block is not None else 0
    ids = ids[dropped:]
    dev = next(model.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=dev)
    t0 = time.perf_counter()
    out = generate_tokens(model, idx, n, temperature=t, top_k=k, seed=seed)[0, len(ids) :].tolist()
    seconds = time.perf_counter() - t0
    if EOS in out:
        out = out[: out.index(EOS)]
    return Generation(
        text=decode(tokenizer, out, skip_special_tokens=True),
        prompt_tokens=len(ids),
        new_tokens=len(out),
        seconds=seconds,
        variant=cfg["quantization"]["variant"],
        prompt_tokens_dropped=dropped,
    )


# --------------------------------------------------------------------------------------------------
# Load time: safetensors vs torch.load


def _median(fn, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats + 1):  # the first run warms the page cache and is not counted
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def load_benchmark(
    weights: str | Path, *, repeats: int = 5, device: str | torch.device | None = None
) -> dict[str, float]:
    """Seconds (median, warm page cache) to read the state dict of `weights`: safetensors memory-mapped
    (`safe_open` + `get_tensor`) and `load_file`, against `torch.load(weights_only=True)` (plain and
    mmap=True) of the same tensors saved with `torch.save` into a temporary file — on the CPU, and
    onto the GPU where there is one (`device`, default: CUDA if available)."""
    weights = Path(weights)
    tensors = load_file(str(weights))
    out: dict[str, float] = {"bytes": float(weights.stat().st_size)}
    with tempfile.TemporaryDirectory(prefix="w2t-loadbench-") as d:
        pt = Path(d) / "state_dict.pt"
        torch.save(tensors, pt)
        out["torch_file_bytes"] = float(pt.stat().st_size)
        cpu = torch.device("cpu")

        def st_mmap():
            with safe_open(str(weights), framework="pt", device="cpu") as f:
                return {k: f.get_tensor(k) for k in f.keys()}

        out["safetensors_mmap_s"] = _median(st_mmap, repeats, cpu)
        out["safetensors_load_file_s"] = _median(lambda: load_file(str(weights), device="cpu"), repeats, cpu)
        out["torch_load_s"] = _median(lambda: torch.load(pt, weights_only=True, map_location="cpu"), repeats, cpu)
        out["torch_load_mmap_s"] = _median(
            lambda: torch.load(pt, weights_only=True, mmap=True, map_location="cpu"), repeats, cpu
        )
        gpu = (
            torch.device(device) if device is not None else (torch.device("cuda") if torch.cuda.is_available() else cpu)
        )
        if gpu.type == "cuda":
            out["safetensors_to_gpu_s"] = _median(lambda: load_file(str(weights), device=str(gpu)), repeats, gpu)
            out["torch_load_to_gpu_s"] = _median(
                lambda: torch.load(pt, weights_only=True, map_location=gpu), repeats, gpu
            )
    out["speedup_mmap_vs_torch_load"] = out["torch_load_s"] / max(out["safetensors_mmap_s"], 1e-12)
    return out
