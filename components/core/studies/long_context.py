"""Long-context cost, put together: why long text is cheap to remember but expensive to compute.

Reads what the sweeps measured (`attention_cost`, `generation_cost`, `recurrent_cost`) and adds one
measurement of its own, then sets the arithmetic of real model shapes beside the figures:

- Exponents. Every fitted log-log slope of the sweeps in one table (attention time and memory per
  implementation and pass, per-token generation time per model) with its R² and the ratio
  cost(2N)/cost(N) at the top doubling: the article's "double the length, four times the cost".
- Crossover. The trained Transformer's training step is timed at the recurrent sweep's lengths and
  batch (the same AdamW step, the same timing as `recurrent_cost`), so both have a per-token training
  cost c(T) = step time / (batch · T). A recurrent model's c is flat in T; the Transformer's grows
  (its attention does T work per token), c(T) ≈ a + b·T. The crossover is the first measured T
  where the Transformer's cost is above the recurrent model's, and the fitted lines' intersection
  (an extrapolation when it lies outside the measured lengths, and said so).
- Arithmetic. For a few real shapes (7B-class with full multi-head attention, 8B and 70B-class with
  grouped-query attention) at 4k … 1M tokens: the KV cache, 2 · n_layer · n_kv_head · head_dim · L
  values; one layer's attention scores as the reference materialises them, n_head · L² values; and
  causal attention's matmul FLOPs per forward, 2 · n_layer · n_head · head_dim · L². The same
  formulas applied to our own Transformer and sweep shapes are checked against what was measured:
  the KV cache bytes `generation_cost` held (equal, by construction of the cache: any difference is
  a bug), and the reference attention's peak memory in `attention_cost` (the score matrix times a
  constant number of N×N buffers alive at once: the ratio must not drift with N).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..device import DeviceSetting, resolve_device, seed_everything
from ..manifests import AttentionCost, AttentionFit, GenerationCost, GenerationFit, GenerationRow, RecurrentCost
from ..models.transformer import Transformer, require_transformer
from .attention_cost import fit_exponent
from .recurrent_cost import linear_fit, timing_optimizer, train_step_seconds


class ModelShape(BaseModel):
    """The attention-relevant shape of a model (per layer: n_head query heads, n_kv_head key/value heads)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    params_b: float = Field(gt=0, description="Parameters in billions (for the table only).")
    n_layer: int = Field(ge=1)
    n_head: int = Field(ge=1)
    n_kv_head: int = Field(ge=1, description="Key/value heads (= n_head without grouped-query attention).")
    head_dim: int = Field(ge=1)


# Published shapes of widely used open models (their config.json files).
REFERENCE_SHAPES = [
    ModelShape(
        name="7B, multi-head (Llama-2-7B shape)", params_b=6.7, n_layer=32, n_head=32, n_kv_head=32, head_dim=128
    ),
    ModelShape(
        name="8B, grouped-query (Llama-3-8B shape)", params_b=8.0, n_layer=32, n_head=32, n_kv_head=8, head_dim=128
    ),
    ModelShape(
        name="70B, grouped-query (Llama-3-70B shape)", params_b=70.6, n_layer=80, n_head=64, n_kv_head=8, head_dim=128
    ),
]


class LongContextSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context_lens: list[int] = Field(
        default=[4096, 32768, 131072, 1048576], description="Context lengths of the arithmetic table."
    )
    bytes_per_value: int = Field(
        default=2, ge=1, description="Bytes per cached key/value and score in the arithmetic (2: FP16/BF16)."
    )
    repeats: int = Field(
        default=3, ge=1, description="Timed Transformer training steps per length (the median is reported)."
    )
    warmup: int = Field(default=1, ge=0, description="Untimed steps before timing each length.")
    device: DeviceSetting = Field(default="auto", description="Where to time: 'auto' = CUDA if present, else CPU.")
    threads: int = Field(default=0, ge=0, description="torch.set_num_threads when > 0 (CPU).")
    seed: int = Field(default=0, description="Seed of the random inputs.")

    @field_validator("context_lens")
    @classmethod
    def _lens(cls, v: list[int]) -> list[int]:
        if not v or any(n < 1 for n in v) or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"context_lens must be a non-empty, strictly increasing list of lengths >= 1, got {v}")
        return v


def kv_cache_bytes(n_layer: int, n_kv_head: int, head_dim: int, L: int, bytes_per_value: int) -> int:
    """Keys and values of every layer for L positions, one sequence."""
    return 2 * n_layer * n_kv_head * head_dim * L * bytes_per_value


def scores_bytes(n_head: int, L: int, bytes_per_value: int) -> int:
    """One layer's attention scores (n_head × L × L) as the reference computes them, one sequence."""
    return n_head * L * L * bytes_per_value


def attention_flops(n_layer: int, n_head: int, head_dim: int, L: int) -> float:
    """Causal attention's two matmuls (QKᵀ and ×V) over a whole L-token forward: 4·L²·d per layer and
    head for the full square, halved by the causal mask."""
    return 2.0 * n_layer * n_head * head_dim * L * L


def arithmetic_table(settings: LongContextSettings, shapes: list[ModelShape] = REFERENCE_SHAPES) -> list[dict]:
    rows = []
    for sh in shapes:
        for L in settings.context_lens:
            rows.append(
                {
                    "model": sh.name,
                    "params_b": sh.params_b,
                    "context_len": L,
                    "kv_cache_gib": kv_cache_bytes(sh.n_layer, sh.n_kv_head, sh.head_dim, L, settings.bytes_per_value)
                    / 2**30,
                    "weights_fp16_gib": sh.params_b * 1e9 * 2 / 2**30,
                    "scores_per_layer_gib": scores_bytes(sh.n_head, L, settings.bytes_per_value) / 2**30,
                    "attention_tflops_per_forward": attention_flops(sh.n_layer, sh.n_head, sh.head_dim, L) / 1e12,
                }
            )
    return rows


def transformer_train_rows(
    model: Transformer, seq_lens: list[int], batch_size: int, s: LongContextSettings
) -> list[dict]:
    """The Transformer's training step (forward, backward, AdamW) timed at each length exactly as
    `recurrent_cost` times the recurrent models. Lengths beyond block_size run where the positional
    encoding extends (RoPE, sinusoidal, none): the cost is what is measured there, not the quality."""
    device, _ = resolve_device(s.device)
    if s.threads > 0:
        torch.set_num_threads(s.threads)
    seed_everything(s.seed)
    m = copy.deepcopy(model).to(device).train()
    cfg = m.config
    if cfg.pos_encoding == "learned":
        seq_lens = [T for T in seq_lens if T <= cfg.block_size]
    vocab = m.lm_head.out_features
    opt = timing_optimizer(m, device)
    gen = torch.Generator().manual_seed(s.seed)
    rows = []
    for T in seq_lens:
        x = torch.randint(1, vocab, (batch_size, T), generator=gen).to(device)  # (B, T)
        y = torch.randint(1, vocab, (batch_size, T), generator=gen).to(device)  # (B, T)
        sec = train_step_seconds(m, opt, x, y, device, warmup=s.warmup, repeats=s.repeats)
        # The critical path of a forward pass: attention and FFN sub-layers, each over every position at
        # once, so 2·n_layer dependent steps whatever T (the recurrent models wait T·n_layer).
        rows.append(
            {
                "model": "transformer",
                "seq_len": T,
                "batch_size": batch_size,
                "train_step_ms": 1000 * sec,
                "tokens_per_s": batch_size * T / sec,
                "sequential_steps": 2 * cfg.n_layer,
                "device": str(device),
            }
        )
    return rows


def recurrent_train_rows(rec_rows: list[dict]) -> list[dict]:
    """recurrent_cost's rows as training-step rows beside the Transformer's (its generation timings left out)."""
    keys = ("model", "seq_len", "batch_size", "train_step_ms", "tokens_per_s", "sequential_steps")
    return [{k: r[k] for k in keys if k in r} for r in rec_rows]


def per_token_us(row: dict) -> float:
    return 1000.0 * row["train_step_ms"] / (row["batch_size"] * row["seq_len"])


def crossover(transformer: list[dict], recurrent: list[dict], name: str) -> dict:
    """Where the Transformer's per-token training cost overtakes recurrent model `name`'s."""
    tf = {r["seq_len"]: per_token_us(r) for r in transformer}
    rec = {r["seq_len"]: per_token_us(r) for r in recurrent if r["model"] == name}
    common = sorted(set(tf) & set(rec))
    above = [T for T in common if tf[T] > rec[T]]
    fit = linear_fit(common, [tf[T] for T in common])  # a + b·T, µs per token
    flat = float(np.mean([rec[T] for T in common]))
    out = {
        "recurrent": name,
        "measured_lens": f"{common[0]}…{common[-1]}" if common else "",
        "transformer_us_per_token_intercept": fit["intercept"],
        "transformer_us_per_token_slope": fit["slope"],
        "transformer_fit_r2": fit["r2"],
        "recurrent_us_per_token_mean": flat,
        "first_measured_len_transformer_costlier": above[0] if above else None,
        "transformer_costlier_at_every_len": bool(common) and len(above) == len(common),
    }
    # The lines' intersection a + b·T = flat, where the Transformer's cost grows with T.
    if fit["slope"] > 0:
        t_star = (flat - fit["intercept"]) / fit["slope"]
        out["fitted_crossover_len"] = max(t_star, 0.0)
        out["fitted_crossover_extrapolated"] = not (common and common[0] <= t_star <= common[-1])
    else:
        out["fitted_crossover_len"], out["fitted_crossover_extrapolated"] = float("nan"), True
    if common:
        out["ratio_at_max_len"] = tf[common[-1]] / rec[common[-1]]
    return out


def exponent_table(
    attention_fits: list[AttentionFit], generation_fits: list[GenerationFit], train_rows: list[dict]
) -> list[dict]:
    """`attention_fits`, `generation_fits`: the sweeps' manifests' fits; `train_rows`: the training steps timed."""
    rows = []
    for f in attention_fits:
        for what, exponent, r2, ratio in (
            ("time", f.time_exponent, f.time_r2, f.time_ratio_last_doubling),
            ("memory", f.memory_exponent, f.memory_r2, f.memory_ratio_last_doubling),
        ):
            rows.append(
                {
                    "source": "attention_cost",
                    "what": f"{f.pass_} {what}",
                    "impl": f.impl,
                    "exponent": exponent,
                    "r2": r2,
                    "ratio_last_doubling": ratio,
                    "n_range": f"{f.n_min}…{f.n_max}",
                }
            )
    for f in generation_fits:
        rows.append(
            {
                "source": "generation_cost",
                "what": "ms per generated token",
                "impl": f.model,
                "exponent": f.time_exponent,
                "r2": f.time_r2,
                "ratio_last_doubling": float("nan"),
                "n_range": f"…{f.context_max}",
            }
        )
    for name in dict.fromkeys(r["model"] for r in train_rows):
        rs = [r for r in train_rows if r["model"] == name]
        fit = fit_exponent([r["seq_len"] for r in rs], [r["train_step_ms"] for r in rs])
        last = (
            rs[-1]["train_step_ms"] / rs[-2]["train_step_ms"]
            if len(rs) >= 2 and rs[-1]["seq_len"] == 2 * rs[-2]["seq_len"]
            else float("nan")
        )
        rows.append(
            {
                "source": "training step",
                "what": "ms per step vs T",
                "impl": name,
                "exponent": fit["exponent"],
                "r2": fit["r2"],
                "ratio_last_doubling": last,
                "n_range": f"{rs[0]['seq_len']}…{rs[-1]['seq_len']}",
            }
        )
    return rows


def check_kv_arithmetic(generation_rows: list[GenerationRow], model_config: dict) -> list[dict]:
    """Our Transformer's KV cache as measured by `generation_cost` (its manifest's rows) against
    2·n_layer·n_head·head_dim·L·4 bytes."""
    head_dim = model_config["n_embd"] // model_config["n_head"]
    out = []
    for r in generation_rows:
        if r.model != "transformer_kv_cache" or r.skipped is not None or r.bytes_per_sequence is None:
            continue
        predicted = kv_cache_bytes(model_config["n_layer"], model_config["n_head"], head_dim, r.context_len, 4)
        out.append(
            {
                "context_len": r.context_len,
                "measured_bytes": r.bytes_per_sequence,
                "predicted_bytes": predicted,
                "measured_over_predicted": r.bytes_per_sequence / predicted,
            }
        )
    return out


def check_scores_arithmetic(attention_rows: list[dict], attention_info: dict, fit_from: int) -> list[dict]:
    """The reference attention's measured peak memory against one score matrix, batch·n_head·N²·bytes."""
    s = attention_info["settings"]
    bpv = {"float32": 4, "bfloat16": 2, "float16": 2}[s["dtype"]]
    out = []
    for r in attention_rows:
        if r["impl"] != "reference" or "error" in r:
            continue
        predicted = s["batch"] * scores_bytes(s["n_head"], r["n"], bpv)
        out.append(
            {
                "pass": r["pass"],
                "n": r["n"],
                "measured_bytes": r["peak_bytes"],
                "scores_bytes": predicted,
                "measured_over_scores": r["peak_bytes"] / predicted,
                "in_fit": r["n"] >= fit_from,
            }
        )
    return out


def plot_long_context(train_rows: list[dict], crossovers: list[dict], arithmetic: list[dict], kv: list[dict]) -> Figure:
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    ax_c, ax_a = fig.subplots(1, 2)
    for name in dict.fromkeys(r["model"] for r in train_rows):
        rs = [r for r in train_rows if r["model"] == name]
        ax_c.plot([r["seq_len"] for r in rs], [per_token_us(r) for r in rs], "o-", label=name)
    for c in crossovers:
        t = c.get("fitted_crossover_len")
        if t and np.isfinite(t) and not c["fitted_crossover_extrapolated"]:
            ax_c.axvline(t, ls=":", color="grey")
    ax_c.set_xscale("log", base=2)
    ax_c.set_xlabel("sequence length T (tokens)")
    ax_c.set_ylabel("training cost per token (µs)")
    ax_c.set_title("training: per-token cost vs length")
    for name in dict.fromkeys(r["model"] for r in arithmetic):
        rs = [r for r in arithmetic if r["model"] == name]
        ax_a.loglog(
            [r["context_len"] for r in rs], [r["kv_cache_gib"] for r in rs], "o-", base=2, label=f"{name}: KV cache"
        )
    if kv:
        ax_a.loglog(
            [r["context_len"] for r in kv],
            [r["measured_bytes"] / 2**30 for r in kv],
            "ks",
            base=2,
            label="ours, measured KV cache",
        )
        ax_a.loglog(
            [r["context_len"] for r in kv],
            [r["predicted_bytes"] / 2**30 for r in kv],
            "k:",
            base=2,
            label="ours, formula",
        )
    ax_a.set_xlabel("context length (tokens)")
    ax_a.set_ylabel("GiB per sequence")
    ax_a.set_title("KV cache: formula for real shapes, checked on ours")
    for ax in (ax_c, ax_a):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return fig


@dataclass
class LongContextResult:
    exponents: list[dict]
    train_rows: list[dict]
    crossovers: list[dict]
    arithmetic: list[dict]
    kv_check: list[dict]
    scores_check: list[dict]
    figures: dict[str, Figure] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {}
        kv = [r["measured_over_predicted"] for r in self.kv_check]
        if kv:
            out["kv_cache_measured_over_formula_min"], out["kv_cache_measured_over_formula_max"] = min(kv), max(kv)
        for p in dict.fromkeys(r["pass"] for r in self.scores_check):
            sc = [r["measured_over_scores"] for r in self.scores_check if r["pass"] == p and r["in_fit"]]
            if sc:
                out[f"reference_{p}_peak_over_scores_min"], out[f"reference_{p}_peak_over_scores_max"] = (
                    min(sc),
                    max(sc),
                )
        for c in self.crossovers:
            n = c["recurrent"]
            out[f"crossover_{n}_fitted_len"] = c["fitted_crossover_len"]
            if c.get("ratio_at_max_len") is not None:
                out[f"crossover_{n}_transformer_over_recurrent_at_max"] = c["ratio_at_max_len"]
        for e in self.exponents:
            if e["source"] == "attention_cost" and e["impl"] == "reference" and e["what"].endswith("memory"):
                out[f"reference_{e['what'].split()[0]}_memory_ratio_last_doubling"] = e["ratio_last_doubling"]
            if e["source"] == "attention_cost" and e["impl"] == "reference" and e["what"].endswith("time"):
                out[f"reference_{e['what'].split()[0]}_time_ratio_last_doubling"] = e["ratio_last_doubling"]
        return out

    def metrics(self) -> dict[str, float]:
        return {f"long_context/{k}": float(v) for k, v in self.summary().items() if v is not None and np.isfinite(v)}

    def markdown(self) -> str:
        lines = [
            "| source | what | impl | exponent | R² | cost(2N)/cost(N) |",
            "| --- | --- | --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {e['source']} | {e['what']} | {e['impl']} | {e['exponent']:.2f} | {e['r2']:.3f} | "
            f"{e['ratio_last_doubling']:.2f} |"
            for e in self.exponents
        ]
        lines += [
            "",
            "| vs | first T where the Transformer costs more per token | fitted crossover T | extrapolated | "
            "Transformer/recurrent at the longest T |",
            "| --- | ---: | ---: | --- | ---: |",
        ]
        for c in self.crossovers:
            lines.append(
                f"| {c['recurrent']} | {c['first_measured_len_transformer_costlier']} | "
                f"{c['fitted_crossover_len']:.0f} | "
                f"{c['fitted_crossover_extrapolated']} | {c.get('ratio_at_max_len', float('nan')):.2f} |"
            )
        lines += [
            "",
            "| model | context | KV cache GiB | FP16 weights GiB | scores per layer GiB | attention TFLOP per forward "
            "|",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {r['model']} | {r['context_len']:,} | {r['kv_cache_gib']:.2f} | {r['weights_fp16_gib']:.1f} | "
            f"{r['scores_per_layer_gib']:.3g} | "
            f"{r['attention_tflops_per_forward']:.3g} |"
            for r in self.arithmetic
        ]
        return "\n".join(lines)


def long_context_cost(
    transformer: nn.Module,
    *,
    attention: AttentionCost,
    generation: GenerationCost,
    recurrent: RecurrentCost,
    settings: LongContextSettings,
    shapes: list[ModelShape] = REFERENCE_SHAPES,
) -> LongContextResult:
    """`attention`, `generation`, `recurrent`: the manifests of the three sweeps (rows, fits, info);
    `shapes`: the real model shapes of the arithmetic table."""
    transformer = require_transformer(transformer, "the long-context cost")
    rec_rows = recurrent.rows
    seq_lens = sorted({r["seq_len"] for r in rec_rows})
    batch = rec_rows[0]["batch_size"]
    tf_rows = transformer_train_rows(transformer, seq_lens, batch, settings)
    train_rows = tf_rows + recurrent_train_rows(rec_rows)
    crossovers = [crossover(tf_rows, rec_rows, name) for name in dict.fromkeys(r["model"] for r in rec_rows)]
    arithmetic = arithmetic_table(settings, shapes)
    kv = check_kv_arithmetic(generation.rows, transformer.config.model_dump())
    fit_from = attention.info["settings"]["fit_from"]
    scores = check_scores_arithmetic(attention.rows, attention.info, fit_from)
    return LongContextResult(
        exponents=exponent_table(attention.fits, generation.fits, train_rows),
        train_rows=train_rows,
        crossovers=crossovers,
        arithmetic=arithmetic,
        kv_check=kv,
        scores_check=scores,
        figures={"long_context_cost": plot_long_context(train_rows, crossovers, arithmetic, kv)},
    )
