"""The long-context summary and the context-usage curves: the arithmetic against published figures
and against our own measurements, the crossover on known lines, and loss by position on real models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from components.core import manifests as M
from components.core.data import TokenBlocks
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.studies.attention_cost import AttentionCostSettings, attention_cost
from components.core.studies.context_usage import ContextUsageSettings, context_usage, loss_by_position, receptive_field
from components.core.studies.generation_cost import GenerationCostSettings, generation_cost
from components.core.studies.long_context import (
    REFERENCE_SHAPES,
    LongContextSettings,
    ModelShape,
    arithmetic_table,
    check_kv_arithmetic,
    check_scores_arithmetic,
    crossover,
    kv_cache_bytes,
    long_context_cost,
)
from components.core.train_step import evaluate

V = 60


def test_kv_cache_arithmetic_matches_published_figures():
    seven, _, seventy = REFERENCE_SHAPES
    # Llama-2-7B: 0.5 MiB of FP16 keys and values per token, 2 GiB at its 4k context.
    assert kv_cache_bytes(seven.n_layer, seven.n_kv_head, seven.head_dim, 1, 2) == 512 * 2**10
    assert kv_cache_bytes(seven.n_layer, seven.n_kv_head, seven.head_dim, 4096, 2) == 2 * 2**30
    # Llama-3-70B (8 KV heads): 40 GiB at 128k tokens; without GQA (64 heads) it would be 8x that.
    assert kv_cache_bytes(seventy.n_layer, seventy.n_kv_head, seventy.head_dim, 131072, 2) == 40 * 2**30
    rows = {(r["model"], r["context_len"]): r for r in arithmetic_table(LongContextSettings())}
    r = rows[(seventy.name, 1048576)]
    assert (
        r["kv_cache_gib"] == pytest.approx(320) and r["kv_cache_gib"] > 2 * r["weights_fp16_gib"]
    )  # the cache outgrows the weights
    assert r["scores_per_layer_gib"] == pytest.approx(64 * 2**40 * 2 / 2**30)  # 64 heads × (2^20)² × 2 bytes


def test_crossover_of_known_lines():
    # Transformer: 1 + 0.01·T µs per token; recurrent: flat 3 µs per token → they cross at T = 200.
    lens = [64, 128, 256, 512]
    tf = [
        {"model": "transformer", "seq_len": T, "batch_size": 2, "train_step_ms": (1 + 0.01 * T) * 2 * T / 1000}
        for T in lens
    ]
    rec = [{"model": "rnn", "seq_len": T, "batch_size": 2, "train_step_ms": 3 * 2 * T / 1000} for T in lens]
    c = crossover(tf, rec, "rnn")
    assert c["fitted_crossover_len"] == pytest.approx(200) and not c["fitted_crossover_extrapolated"]
    assert c["first_measured_len_transformer_costlier"] == 256 and not c["transformer_costlier_at_every_len"]
    assert c["ratio_at_max_len"] == pytest.approx(6.12 / 3)
    # A recurrent model cheaper at every measured length: the crossover lies below the range, extrapolated.
    rec_cheap = [{**r, "train_step_ms": 0.5 * 2 * r["seq_len"] / 1000} for r in rec]
    c = crossover(tf, rec_cheap, "rnn")
    assert (
        c["transformer_costlier_at_every_len"] and c["fitted_crossover_extrapolated"] and c["fitted_crossover_len"] == 0
    )


def test_settings_are_checked():
    with pytest.raises(ValidationError, match="strictly increasing"):
        LongContextSettings(context_lens=[4096, 1024])
    with pytest.raises(ValidationError, match="n_kv_head"):
        ModelShape(name="x", params_b=1, n_layer=1, n_head=1, n_kv_head=0, head_dim=8)
    with pytest.raises(ValidationError, match="saturation"):
        ContextUsageSettings(saturation=1.5)


def tiny_transformer(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(TransformerSettings(**({"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32} | kw)), V)


def test_formulas_checked_against_our_own_measurements():
    m = tiny_transformer()
    gen = generation_cost(
        {"transformer": m}, GenerationCostSettings(context_lens=[8, 16, 32], gen_tokens=2, repeats=1, warmup=0)
    )
    rows = M.GenerationCost(rows=gen.rows).rows
    kv = check_kv_arithmetic(rows, m.config.model_dump())
    assert [r["context_len"] for r in kv] == [8, 16, 32] and all(r["measured_over_predicted"] == 1 for r in kv)
    att = attention_cost(
        AttentionCostSettings(
            seq_lens=[128, 256, 512],
            impls=["reference"],
            passes=["forward"],
            n_head=2,
            head_dim=16,
            window=64,
            repeats=1,
            warmup=0,
            fit_from=128,
            threads=1,
        )
    )
    manifest = {"rows": att.rows, "fits": att.fits, "info": att.info}
    sc = check_scores_arithmetic(manifest["rows"], manifest["info"], 128)
    ratios = [r["measured_over_scores"] for r in sc]
    # The reference holds a fixed number of N×N buffers at its peak: the ratio is >= 1 and does not drift with N.
    assert len(ratios) == 3 and min(ratios) >= 1 and max(ratios) / min(ratios) < 1.1


def test_long_context_cost_end_to_end_on_small_sweeps():
    m = tiny_transformer()
    att = attention_cost(
        AttentionCostSettings(
            seq_lens=[128, 256, 512],
            n_head=2,
            head_dim=16,
            window=64,
            repeats=1,
            warmup=0,
            fit_from=128,
            threads=1,
            passes=["forward"],
        )
    )
    gen = generation_cost(
        {"transformer": m}, GenerationCostSettings(context_lens=[8, 16], gen_tokens=2, repeats=1, warmup=0)
    )
    rec_rows = [
        {
            "model": "lstm",
            "seq_len": T,
            "batch_size": 2,
            "train_step_ms": 0.05 * T,
            "tokens_per_s": 2 * T / (0.05 * T / 1000),
        }
        for T in (16, 32, 64)
    ]
    res = long_context_cost(
        m,
        attention=M.AttentionCost(rows=att.rows, fits=att.fits, info=att.info),
        generation=M.GenerationCost(rows=gen.rows, fits=gen.fits),
        recurrent=M.RecurrentCost(rows=rec_rows),
        settings=LongContextSettings(repeats=1, warmup=0, threads=1),
    )
    assert [r["seq_len"] for r in res.train_rows if r["model"] == "transformer"] == [
        16,
        32,
        64,
    ]  # timed at the recurrent sweep's lengths
    assert {(e["source"], e["impl"]) for e in res.exponents} >= {
        ("attention_cost", "reference"),
        ("attention_cost", "fused"),
        ("generation_cost", "transformer_kv_cache"),
        ("training step", "transformer"),
    }
    s = res.summary()
    assert s["kv_cache_measured_over_formula_min"] == s["kv_cache_measured_over_formula_max"] == 1
    assert 3.5 < s["reference_forward_memory_ratio_last_doubling"] < 4.5
    assert (
        "long_context/crossover_lstm_transformer_over_recurrent_at_max" in res.metrics() and "| 70B" in res.markdown()
    )


def test_loss_by_position_averages_to_the_evaluated_loss():
    m = tiny_transformer()
    g = np.random.default_rng(0)
    x = g.integers(1, V, size=(12, 32)).astype(np.uint16)
    y = np.concatenate([x[:, 1:], g.integers(1, V, size=(12, 1))], axis=1).astype(np.int32)
    y[0, 20:] = -100  # padded targets are skipped
    blocks = TokenBlocks(x, y)
    loss, count = loss_by_position(m, blocks, max_blocks=12, batch_size=5, device=torch.device("cpu"))
    assert loss.shape == (32,) and count[0] == 12 and count[25] == 11
    want = evaluate(m, blocks, batch_size=12, max_batches=None, device="cpu")
    assert float((loss * count).sum() / count.sum()) == pytest.approx(want, rel=1e-5)


def test_window_changes_only_the_positions_beyond_it():
    full = tiny_transformer()
    win = tiny_transformer(attention="sliding_window", window=8)
    win.load_state_dict(full.state_dict())  # the same weights: only the mask differs
    assert receptive_field(win) == 2 * 7 + 1 and receptive_field(full) is None
    g = np.random.default_rng(1)
    x = g.integers(1, V, size=(16, 32)).astype(np.uint16)
    blocks = TokenBlocks(x, np.concatenate([x[:, 1:], x[:, :1]], axis=1).astype(np.int32))
    res = context_usage(
        {"transformer": full, "transformer_window": win}, blocks, ContextUsageSettings(bucket=4, device="cpu")
    )
    a, b = (np.asarray(res.curves[n]) for n in ("transformer", "transformer_window"))
    np.testing.assert_allclose(a[:8], b[:8], rtol=1e-5)  # within the window both see everything before
    assert np.abs(a[8:] - b[8:]).max() > 1e-4
    gap = res.window_gaps[0]
    assert (
        gap["model"] == "transformer_window" and gap["versus"] == "transformer" and abs(gap["gap_within_window"]) < 1e-5
    )
    assert len(res.buckets) == 8 and set(res.metrics()) >= {
        "context/transformer/gain_from_context",
        "context/transformer_window/gap_after_window",
    }


def test_a_window_better_than_full_attention_beyond_its_field_fails_later_context_helps():
    """Counterexample: a windowed model trained on text where each token repeats the one before (a
    local rule) against an untrained full-attention model: beyond its receptive field the window is
    better, beyond the bootstrap interval, and later_context_helps says so."""
    from components.core import claims
    from components.core.studies.memory import train_model
    from components.core.studies.memory_tasks import MemoryTrainSettings, TaskData

    g = np.random.default_rng(2)
    x = np.repeat(g.integers(1, V, size=(256, 16)), 2, axis=1)  # pairs of equal tokens
    y = np.concatenate([x[:, 1:], x[:, :1]], axis=1)
    y[:, 1::2] = -100  # only the second token of each pair is asked: it equals the first
    win = tiny_transformer(attention="sliding_window", window=4)
    train_model(
        win, TaskData(x, y, np.zeros(256), np.zeros_like(x)), MemoryTrainSettings(steps=60, batch_size=16), lr=3e-3
    )
    blocks = TokenBlocks(x[:64].astype(np.uint16), y[:64].astype(np.int32))
    res = context_usage(
        {"transformer": tiny_transformer(), "transformer_window": win},
        blocks,
        ContextUsageSettings(bucket=4, device="cpu"),
    )
    gap = res.window_gaps[0]
    assert (
        gap["receptive_field"] == 7
        and gap["gap_beyond_field_low"] <= gap["gap_beyond_field"] <= gap["gap_beyond_field_high"] < 0
    )
    v = claims.later_context_helps(
        M.ContextUsage(
            summaries=res.summaries,
            window_gaps=res.window_gaps,
            metrics=res.metrics(),
        )
    )
    assert not v.passed and not v.checks["transformer_window_not_better_beyond_field"]


def test_a_point_stops_repeating_once_its_timed_passes_fill_the_budget():
    """repeat_budget_s: a pass longer than the budget is timed once; without a budget every repeat runs."""
    import time

    from components.core.device import median_seconds

    calls = []

    def slow() -> None:
        calls.append(1)
        time.sleep(0.05)

    cpu = torch.device("cpu")
    assert median_seconds(slow, cpu, warmup=0, repeats=3, budget_s=0.01) >= 0.05 and len(calls) == 1
    calls.clear()
    median_seconds(slow, cpu, warmup=1, repeats=3, budget_s=None)
    assert len(calls) == 4
