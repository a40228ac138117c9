"""What one generated token costs as the context grows: the Transformer with and without its KV cache,
against the RNN and LSTM, and the memory each holds per sequence between tokens.

For each model and context length L (random token ids: time does not depend on which tokens):
- transformer, KV cache: the L-token prompt is run once (prefill, timed apart), then `gen_tokens`
  greedy tokens one position at a time against the cache. Each step reads every cached key once:
  O(L) attention work per token on top of a constant MLP/projection cost.
- transformer, no cache: each new token reruns the whole context (what generation without a cache
  does, as `generate(use_cache=False)`): O(L) work for the projections and O(L²) for attention per token.
- rnn, lstm: the prompt's state, then one recurrent step per token: constant per token.

Per row: ms per generated token (the median over `repeats` of the whole decode, divided by
`gen_tokens`), prefill ms, and the bytes held per sequence after the prompt: the KV cache
(2 · n_layer · L · n_embd values), the recurrent state (n_layer · hidden (· 2 for the LSTM's cell)),
or, without a cache, the context's token ids. Beyond the Transformer's block_size the context runs
only where its positional encoding extends (RoPE, sinusoidal, none): the cost is what is measured,
not the quality there; a learned table stops at block_size and those points are recorded as skipped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..device import DeviceSetting, median_seconds, resolve_device
from ..models.attention import KVCache
from ..models.recurrent import RecurrentLM
from ..models.transformer import Transformer
from .attention_cost import fit_exponent
from .decode_timing import recurrent_prefill_decode


class GenerationCostSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context_lens: list[int] = Field(
        default=[64, 128, 256, 512, 1024, 2048], description="Context lengths L before generating, increasing."
    )
    gen_tokens: int = Field(
        default=16, ge=1, description="Tokens generated after each context (per-token time = decode time / gen_tokens)."
    )
    batch_size: int = Field(default=1, ge=1, description="Sequences generated at once (1: a user's chat).")
    repeats: int = Field(default=3, ge=1, description="Timed decodes per point (the median is reported).")
    warmup: int = Field(default=1, ge=0, description="Untimed decodes before timing each point.")
    device: DeviceSetting = Field(default="auto", description="Where to time: 'auto' = CUDA if present, else CPU.")
    threads: int = Field(default=0, ge=0, description="torch.set_num_threads when > 0 (CPU).")
    seed: int = Field(default=0, description="Seed of the random contexts.")

    @field_validator("context_lens")
    @classmethod
    def _lens(cls, v: list[int]) -> list[int]:
        if not v or any(n < 1 for n in v):
            raise ValueError(f"context_lens must be a non-empty list of lengths >= 1, got {v}")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"context_lens must be strictly increasing, got {v}")
        return v


def tensor_bytes(x) -> int:
    """Bytes of the tensors in x (a tensor, or nested tuples/lists of them)."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(tensor_bytes(t) for t in x)
    return 0


def _transformer_rows(
    name: str, m: Transformer, s: GenerationCostSettings, device: torch.device, gen: torch.Generator
) -> list[dict]:
    rows = []
    vocab, limit = m.lm_head.out_features, m.config.block_size if m.config.pos_encoding == "learned" else None
    for L in s.context_lens:
        if limit is not None and L + s.gen_tokens > limit:
            for variant in ("kv_cache", "no_cache"):
                rows.append(
                    {
                        "model": f"{name}_{variant}",
                        "context_len": L,
                        "skipped": f"learned positions stop at block_size={limit}",
                    }
                )
            continue
        x = torch.randint(1, vocab, (s.batch_size, L), generator=gen).to(device)  # (B, L)

        def prefill() -> tuple[KVCache, torch.Tensor]:
            cache = KVCache(len(m.h))
            return cache, m(x, cache=cache)[0][:, -1].argmax(-1, keepdim=True)  # (B, 1)

        def decode_cached() -> None:
            cache, tok = prefill_state[0].fork(), prefill_state[1]  # the prompt's cache, not grown by earlier repeats
            for _ in range(s.gen_tokens):
                tok = m(tok, cache=cache)[0][:, -1].argmax(-1, keepdim=True)

        def decode_uncached() -> None:
            idx = torch.cat([x, prefill_state[1]], dim=1)
            for _ in range(s.gen_tokens - 1):
                tok = m(idx)[0][:, -1].argmax(-1, keepdim=True)  # the whole context again
                idx = torch.cat([idx, tok], dim=1)
            m(idx)

        with torch.no_grad():
            prefill_s = median_seconds(prefill, device, warmup=s.warmup, repeats=s.repeats)
            prefill_state = prefill()
            held = prefill_state[0].nbytes() // s.batch_size
            cached_s = median_seconds(decode_cached, device, warmup=s.warmup, repeats=s.repeats)
            uncached_s = median_seconds(decode_uncached, device, warmup=s.warmup, repeats=s.repeats)
        common = {"context_len": L, "batch_size": s.batch_size, "prefill_ms": 1000 * prefill_s, "device": str(device)}
        rows.append(
            {
                "model": f"{name}_kv_cache",
                **common,
                "ms_per_token": 1000 * cached_s / s.gen_tokens,
                "bytes_per_sequence": held,
            }
        )
        rows.append(
            {
                "model": f"{name}_no_cache",
                **common,
                "ms_per_token": 1000 * uncached_s / s.gen_tokens,
                "bytes_per_sequence": (L + s.gen_tokens) * x.element_size(),
            }
        )
    return rows


def _recurrent_rows(
    name: str, m: RecurrentLM, s: GenerationCostSettings, device: torch.device, gen: torch.Generator
) -> list[dict]:
    rows = []
    for L in s.context_lens:
        x = torch.randint(1, m.vocab_size, (s.batch_size, L), generator=gen).to(device)  # (B, L)
        prefill_s, decode_s, state = recurrent_prefill_decode(
            m, x, s.gen_tokens, device, warmup=s.warmup, repeats=s.repeats
        )
        rows.append(
            {
                "model": name,
                "context_len": L,
                "batch_size": s.batch_size,
                "prefill_ms": 1000 * prefill_s,
                "device": str(device),
                "ms_per_token": 1000 * decode_s / s.gen_tokens,
                "bytes_per_sequence": tensor_bytes(state) // s.batch_size,
            }
        )
    return rows


def fit_generation(rows: list[dict]) -> list[dict]:
    """Per model: log-log exponent of ms per token against context length, the ratio of the largest to
    the smallest context's per-token time, and the bytes held at the largest context."""
    out = []
    for name in dict.fromkeys(r["model"] for r in rows):
        ok = [r for r in rows if r["model"] == name and "skipped" not in r]
        if not ok:
            continue
        f = fit_exponent([r["context_len"] for r in ok], [r["ms_per_token"] for r in ok])
        out.append(
            {
                "model": name,
                "time_exponent": f["exponent"],
                "time_r2": f["r2"],
                "max_over_min": ok[-1]["ms_per_token"] / max(ok[0]["ms_per_token"], 1e-12),
                "ms_per_token_at_max": ok[-1]["ms_per_token"],
                "context_max": ok[-1]["context_len"],
                "bytes_per_sequence_at_max": ok[-1]["bytes_per_sequence"],
            }
        )
    return out


def plot_generation(rows: list[dict]) -> Figure:
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2)
    for name in dict.fromkeys(r["model"] for r in rows):
        ok = [r for r in rows if r["model"] == name and "skipped" not in r]
        if not ok:
            continue
        L = [r["context_len"] for r in ok]
        ax_t.loglog(L, [r["ms_per_token"] for r in ok], "o-", base=2, label=name)
        if not name.endswith("_no_cache"):
            ax_m.loglog(L, [r["bytes_per_sequence"] / 2**10 for r in ok], "o-", base=2, label=name)
    ax_t.set_ylabel("ms per generated token")
    ax_t.set_title("generation: time per new token vs context")
    ax_m.set_ylabel("KiB held per sequence")
    ax_m.set_title("memory carried between tokens (KV cache vs state)")
    for ax in (ax_t, ax_m):
        ax.set_xlabel("context length (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    return fig


@dataclass
class GenerationCostResult:
    rows: list[dict]
    fits: list[dict]
    figures: dict[str, Figure] = field(default_factory=dict)

    def fit(self, model: str) -> dict | None:
        return next((f for f in self.fits if f["model"] == model), None)

    def metrics(self) -> dict[str, float]:
        out = {}
        for f in self.fits:
            for k in ("time_exponent", "max_over_min", "ms_per_token_at_max", "bytes_per_sequence_at_max"):
                out[f"generation/{f['model']}/{k}"] = f[k]
        return out


def generation_cost(models: dict[str, nn.Module], settings: GenerationCostSettings) -> GenerationCostResult:
    """Time per generated token and memory per sequence against context length for each model (a
    Transformer gives two rows per length, with and without its KV cache). Models are timed on a copy,
    in eval mode, so the caller's weights and device are untouched."""
    s = settings
    if s.threads > 0:
        torch.set_num_threads(s.threads)
    device, _ = resolve_device(s.device)
    rows = []
    for name, model in models.items():
        m = copy.deepcopy(model).to(device).eval()
        gen = torch.Generator().manual_seed(s.seed)
        if isinstance(m, Transformer):
            rows += _transformer_rows(name, m, s, device, gen)
        elif isinstance(m, RecurrentLM):  # the recurrent model: step and forward_hidden
            rows += _recurrent_rows(name, m, s, device, gen)
        else:
            raise TypeError(
                f"generation_cost: model {name!r} ({type(m).__name__}) is neither a Transformer nor a recurrent model"
            )
    fits = fit_generation(rows)
    return GenerationCostResult(rows=rows, fits=fits, figures={"generation_cost": plot_generation(rows)})
