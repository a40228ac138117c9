"""Long-context cost: the exponent fit, the attention-cost study (rows, fits, ceiling), the generation
cost of the KV cache against recomputing and against recurrent state, and bad settings refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from components.core.models.recurrent import RecurrentLM, RecurrentSettings
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.studies.attention_cost import AttentionCostSettings, attention_cost, fit_exponent
from components.core.studies.generation_cost import GenerationCostSettings, generation_cost

V = 64


def test_exponent_fit_recovers_known_powers():
    n = [256, 512, 1024, 2048, 4096]
    quad = fit_exponent(n, [3e-6 * x**2 for x in n])
    assert quad["exponent"] == pytest.approx(2.0, abs=1e-9) and quad["r2"] == pytest.approx(1.0)
    rng = np.random.default_rng(0)  # ±10 % multiplicative noise still reads as ≈ 2, and a line as ≈ 1
    noisy = fit_exponent(n, [x**2 * (1 + 0.1 * rng.uniform(-1, 1)) for x in n])
    assert abs(noisy["exponent"] - 2.0) < 0.1
    assert fit_exponent(n, [5.0 * x + 0.0 for x in n])["exponent"] == pytest.approx(1.0, abs=1e-9)


def test_attention_cost_rows_fits_and_memory_exponents():
    # From 256 up: at 128 and below the window is one SDPA under the dense band mask (DENSE_BAND_MAX_T), a
    # different path with a smaller constant, which would bend the fit.
    s = AttentionCostSettings(seq_lens=[256, 512, 1024], window=64, repeats=1, warmup=0, fit_from=256, device="cpu")
    r = attention_cost(s)
    assert {(x["pass"], x["impl"], x["n"]) for x in r.rows} == {
        (p, i, n)
        for p in ("forward", "forward_backward")
        for i in ("reference", "fused", "window")
        for n in (256, 512, 1024)
    }
    assert all(x["ms"] > 0 and x["peak_bytes"] > 0 for x in r.rows)
    ref = r.fit("forward_backward", "reference")
    # The reference materialises the (N, N) scores: memory exactly quadratic in N (allocator accounting).
    assert 1.8 <= ref["memory_exponent"] <= 2.2 and ref["memory_ratio_last_doubling"] == pytest.approx(4.0, rel=0.1)
    # Fused and window memory grow far slower (≈ N; at these small N the kernels' fixed buffers still show).
    assert r.fit("forward_backward", "fused")["memory_exponent"] < ref["memory_exponent"] - 0.6
    assert r.fit("forward", "window")["memory_exponent"] < ref["memory_exponent"] - 0.6
    ratios = r.ratios_at_max()
    assert ratios["forward_backward/at_n"] == 1024 and ratios["forward_backward/memory_reference_over_fused"] > 3
    assert r.info["fused_kernel"] and "profiler" in r.info["memory_accounting"]
    assert "attention_cost" in r.figures and "| forward | reference | 1024 |" in r.markdown()
    assert all(math.isfinite(v) for v in r.metrics().values())


@pytest.mark.usefixtures("one_thread")  # the CPU flash kernel's buffers depend on the thread count
def test_memory_claim_fails_when_the_reference_never_builds_the_score_matrix(monkeypatch):
    """Measured counterexample of `attention_scales_as_claimed`: a "reference" that is the fused kernel,
    never building the (N, N) scores. Its peak memory, measured by allocator accounting, then grows like
    the fused kernel's, not ×4 per doubling, and both reference memory checks fail. Memory only: nothing
    here depends on a timing."""
    from components.core import claims
    from components.core import manifests as M
    from components.core.models.attention import fused_attention
    from components.core.studies import attention_cost as study

    def fused_as_reference(q, k, v, *, scale, **kw):
        return fused_attention(q, k, v, scale=scale), None  # (output, no weights): no N×N tensor anywhere

    monkeypatch.setattr(study, "reference_attention", fused_as_reference)
    s = AttentionCostSettings(
        seq_lens=[256, 512, 1024],
        impls=["reference", "fused"],
        passes=["forward"],
        repeats=1,
        warmup=0,
        fit_from=256,
        device="cpu",
    )
    r = attention_cost(s)
    peaks = {(x["impl"], x["n"]): x["peak_bytes"] for x in r.rows}
    assert all(peaks[("reference", n)] == peaks[("fused", n)] for n in s.seq_lens)  # the same kernel, measured
    manifest = M.AttentionCost(rows=r.rows, fits=r.fits, info=r.info, metrics=r.metrics())
    v = claims.attention_scales_as_claimed(manifest)
    assert v.figures["pass"] == "forward" and not v.passed
    assert not v.checks["reference_memory_quadratic"], v.figures
    assert not v.checks["reference_memory_x4_per_doubling"], v.figures


def test_memory_ceiling_ends_an_implementation_and_records_why():
    # 4 heads · 512² · 4 bytes = 4 MiB of scores at N = 512: a 2 MiB ceiling stops the reference at 256 or 512.
    s = AttentionCostSettings(
        seq_lens=[128, 256, 512, 1024],
        impls=["reference", "fused"],
        passes=["forward"],
        window=64,
        repeats=1,
        warmup=0,
        memory_ceiling_mib=2.0,
        device="cpu",
    )
    rows = attention_cost(s).rows
    ref = [x for x in rows if x["impl"] == "reference"]
    assert "stop" in ref[-1] and "memory ceiling" in ref[-1]["stop"] and ref[-1]["n"] < 1024
    assert [x["n"] for x in rows if x["impl"] == "fused"] == [128, 256, 512, 1024]  # the fused kernel fits throughout


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"seq_lens": []}, "seq_lens"),
        ({"seq_lens": [512, 256]}, "seq_lens"),
        ({"seq_lens": [0, 256]}, "seq_lens"),
        ({"window": 0}, "window"),
        ({"seq_lens": [128, 256], "window": 256}, "window"),
        ({"memory_ceiling_mib": 0.01}, "memory_ceiling_mib"),
        ({"impls": ["flash3"]}, "impls"),
        ({"passes": []}, "passes"),
    ],
)
def test_bad_attention_settings_are_refused_by_name(kw, field):
    with pytest.raises(ValidationError) as e:
        AttentionCostSettings(**kw)
    assert field in str(e.value)


def test_generation_cost_kv_cache_against_recompute_and_state():
    t = Transformer(TransformerSettings(n_layer=2, n_head=4, n_embd=32, block_size=16), V)
    lstm = RecurrentLM(RecurrentSettings(cell="lstm", hidden_size=24, n_layer=2), V)
    rnn = RecurrentLM(RecurrentSettings(cell="rnn", hidden_size=24, n_layer=1), V)
    s = GenerationCostSettings(context_lens=[8, 32, 128], gen_tokens=3, repeats=1, warmup=0, device="cpu")
    r = generation_cost({"transformer": t, "lstm": lstm, "rnn": rnn}, s)
    held = {(x["model"], x["context_len"]): x["bytes_per_sequence"] for x in r.rows}
    for L in (8, 32, 128):  # keys and values of every layer at every position, float32
        assert held[("transformer_kv_cache", L)] == 2 * 2 * L * 32 * 4
        assert held[("lstm", L)] == 2 * 2 * 24 * 4  # (h, c) per layer
        assert held[("rnn", L)] == 1 * 24 * 4
    assert {f["model"] for f in r.fits} == {"transformer_kv_cache", "transformer_no_cache", "lstm", "rnn"}
    assert all(x["ms_per_token"] > 0 for x in r.rows)
    assert "generation_cost" in r.figures and all(math.isfinite(v) for v in r.metrics().values())


def test_learned_positions_stop_at_the_block_and_are_recorded():
    t = Transformer(TransformerSettings(n_layer=1, n_head=2, n_embd=16, block_size=16, pos_encoding="learned"), V)
    r = generation_cost(
        {"t": t}, GenerationCostSettings(context_lens=[4, 32], gen_tokens=2, repeats=1, warmup=0, device="cpu")
    )
    skipped = [x for x in r.rows if "skipped" in x]
    assert {x["context_len"] for x in skipped} == {32} and "block_size=16" in skipped[0]["skipped"]


def test_bad_generation_settings_are_refused_by_name():
    for kw in ({"context_lens": []}, {"context_lens": [64, 32]}, {"gen_tokens": 0}):
        with pytest.raises(ValidationError) as e:
            GenerationCostSettings(**kw)
        assert next(iter(kw)) in str(e.value)
