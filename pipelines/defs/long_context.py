"""Long-context stage: what attention costs as the sequence grows (reference O(N²) against the fused
kernel and the sliding window), and what one generated token costs as the context grows (the
Transformer with and without its KV cache, against the RNN and LSTM).

    (q, k, v at each N) ──► attention_cost ─┐
    transformer_lm, rnn_lm, lstm_lm ──► generation_cost ─┼─► long_context_cost ◄── transformer_lm
                                         recurrent_cost ─┘
    transformer_lm, transformer_window_lm, lstm_lm, labels ──► context_usage
"""

import dagster as dg

from components.core.labels import load_labels
from components.core.lm import load_lm
from components.core.studies.attention_cost import AttentionCostSettings, attention_cost as run_attention_cost
from components.core.studies.context_usage import ContextUsageSettings, context_usage as run_context_usage
from components.core.studies.generation_cost import GenerationCostSettings, generation_cost as run_generation_cost
from components.core.studies.long_context import LongContextSettings, long_context_cost as run_long_context_cost
from components.orchestration.language_model import TRAINING_POOL
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "long_context"


class AttentionCostConfig(dg.Config, AttentionCostSettings):
    """Sequence lengths, implementations, passes, memory ceiling and time cap of the attention sweep."""


class GenerationCostConfig(dg.Config, GenerationCostSettings):
    """Context lengths and tokens generated per point."""


class LongContextConfig(dg.Config, LongContextSettings):
    """Context lengths of the arithmetic (for the 7B/8B/70B-class shapes); timing of the Transformer's training step."""


class ContextUsageConfig(dg.Config, ContextUsageSettings):
    """Validation blocks and buckets of the loss-by-position curves."""


# Both assets time things: in the training pool, so no training shares the cores while they measure.
@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def attention_cost(context: dg.AssetExecutionContext, config: AttentionCostConfig, mlflow: MlflowTracker) -> dg.Output[dict]:
    """Causal attention's time and peak memory against sequence length N, forward and forward+backward:
    the reference (materialises the N×N scores), the fused SDPA kernel (FlashAttention-class; the kernel
    observed is recorded) and the blocked sliding window. Log-log exponents fitted per implementation;
    a point over the memory ceiling or the time cap ends that implementation's sweep and is recorded."""
    with stage(context, mlflow, config.model_dump()) as s:
        result = run_attention_cost(config)
        metrics = result.metrics()
        errors = [r for r in result.rows if "error" in r or "stop" in r]
        return s.publish(
            {"rows": result.rows, "fits": result.fits, "info": result.info, "metrics": metrics},
            metrics=metrics,
            tables={"points": [{k: r.get(k) for k in ("pass", "impl", "n", "ms", "peak_mib", "error", "stop")} for r in result.rows],
                    "fits": result.fits},
            figures=result.figures,
            texts={"report": result.markdown()},
            values={"fused_kernel": result.info["fused_kernel"], "memory_accounting": result.info["memory_accounting"]},
            warnings=[f"{r['pass']} {r['impl']} N={r['n']}: {r.get('error') or r.get('stop')}" for r in errors],
        )


@dg.asset_check(
    asset=attention_cost,
    description="Double the length, four times the cost: the reference's time and memory grow as N² (exponents 1.5–2.8 and 1.8–2.2), "
    "the fused kernel's memory as N (exponent ≤ 1.1), the sliding window's time about as N (0.6–1.5, and below the reference's by 0.3 "
    "or more), in the training pass. Time on a CPU is noisier than memory: cache effects push the reference above 2 at some N.",
)
def attention_scales_as_claimed(attention_cost: dict) -> dg.AssetCheckResult:
    f = {(x["pass"], x["impl"]): x for x in attention_cost["fits"]}
    p = "forward_backward" if any(k[0] == "forward_backward" for k in f) else "forward"
    ref, fused, window = f.get((p, "reference")), f.get((p, "fused")), f.get((p, "window"))
    checks = {}
    if ref:
        checks["reference_time_quadratic"] = 1.5 <= ref["time_exponent"] <= 2.8
        checks["reference_memory_quadratic"] = 1.8 <= ref["memory_exponent"] <= 2.2
    if fused:
        checks["fused_memory_linear"] = fused["memory_exponent"] <= 1.1
    if window:
        checks["window_time_linear"] = 0.6 <= window["time_exponent"] <= 1.5 and (
            ref is None or window["time_exponent"] <= ref["time_exponent"] - 0.3
        )
    figures = {f"{impl}_{k}": x[k] for (q, impl), x in f.items() if q == p for k in ("time_exponent", "memory_exponent", "time_ratio_last_doubling")}
    return dg.AssetCheckResult(passed=bool(checks) and all(checks.values()), metadata={"pass": p, **checks, **figures})


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def generation_cost(
    context: dg.AssetExecutionContext, config: GenerationCostConfig, transformer_lm: dict, rnn_lm: dict, lstm_lm: dict, mlflow: MlflowTracker
) -> dg.Output[dict]:
    """Time per generated token against context length for the trained Transformer with and without
    its KV cache and for the RNN and LSTM, and the memory each carries per sequence between tokens
    (KV cache bytes against the recurrent state's)."""
    with stage(context, mlflow, config.model_dump()) as s:
        models = {"transformer": load_lm(transformer_lm["weights"]), "rnn": load_lm(rnn_lm["weights"]), "lstm": load_lm(lstm_lm["weights"])}
        result = run_generation_cost(models, config)
        metrics = result.metrics()
        return s.publish(
            {"rows": result.rows, "fits": result.fits, "metrics": metrics},
            metrics=metrics,
            tables={"timings": [{k: r.get(k) for k in ("model", "context_len", "ms_per_token", "prefill_ms", "bytes_per_sequence", "skipped")}
                                for r in result.rows],
                    "fits": result.fits},
            figures=result.figures,
            warnings=[f"{r['model']} L={r['context_len']}: skipped, {r['skipped']}" for r in result.rows if "skipped" in r],
        )


@dg.asset_check(
    asset=generation_cost,
    description="With the KV cache a token's time grows at most linearly with the context (exponent ≤ 1.1) and grows less than without "
    "it (which reruns the context); the cache holds 2·n_layer·L·n_embd values, growing with L, while the RNN's and LSTM's state stays one size.",
)
def kv_cache_pays(generation_cost: dict) -> dg.AssetCheckResult:
    f = {x["model"]: x for x in generation_cost["fits"]}
    kv, nc = f["transformer_kv_cache"], f["transformer_no_cache"]
    rows = generation_cost["rows"]

    def held(model: str) -> list[int]:
        return [r["bytes_per_sequence"] for r in rows if r["model"] == model and "skipped" not in r]

    kv_bytes = held("transformer_kv_cache")
    checks = {
        "cached_at_most_linear": kv["time_exponent"] <= 1.1,
        "uncached_grows_faster": nc["max_over_min"] > kv["max_over_min"] and nc["time_exponent"] > kv["time_exponent"],
        "cache_grows_with_context": all(b > a for a, b in zip(kv_bytes, kv_bytes[1:])),
        "recurrent_state_constant": all(len(set(held(m))) == 1 for m in ("rnn", "lstm")),
    }
    figures = {f"{m}_{k}": x[k] for m, x in f.items() for k in ("time_exponent", "max_over_min", "bytes_per_sequence_at_max")}
    return dg.AssetCheckResult(passed=all(checks.values()), metadata={**checks, **figures})


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def long_context_cost(
    context: dg.AssetExecutionContext, config: LongContextConfig, attention_cost: dict, generation_cost: dict, recurrent_cost: dict,
    transformer_lm: dict, mlflow: MlflowTracker,
) -> dg.Output[dict]:
    """The long-context figures in one place: every fitted exponent with its R² and cost(2N)/cost(N);
    the length where the Transformer's per-token training cost overtakes the RNN's and LSTM's (its
    training step timed at recurrent_cost's lengths); the KV-cache, score-matrix and FLOP arithmetic
    of 7B/8B/70B-class shapes at 4k…1M tokens, with the same formulas checked against our measurements."""
    with stage(context, mlflow, config.model_dump()) as s:
        result = run_long_context_cost(
            load_lm(transformer_lm["weights"]), attention=attention_cost, generation=generation_cost, recurrent=recurrent_cost, settings=config
        )
        metrics = result.metrics()
        return s.publish(
            {"exponents": result.exponents, "crossovers": result.crossovers, "arithmetic": result.arithmetic, "train_rows": result.train_rows,
             "kv_check": result.kv_check, "scores_check": result.scores_check, "summary": result.summary(), "metrics": metrics},
            metrics=metrics,
            tables={"exponents": result.exponents, "crossovers": result.crossovers, "arithmetic": result.arithmetic,
                    "training_steps": result.train_rows, "kv_cache_check": result.kv_check, "scores_check": result.scores_check},
            figures=result.figures,
            texts={"report": result.markdown()},
        )


@dg.asset_check(
    asset=long_context_cost,
    description="The arithmetic holds on our own runs: the KV cache measured in generation_cost equals 2·n_layer·n_head·head_dim·L·4 bytes "
    "at every L; the reference attention's peak memory is a constant multiple of its N×N score matrix (max/min of the ratio ≤ 1.25 over the "
    "fitted N) and doubling N multiplies it by 3.6–4.4 (the article's ×4).",
)
def arithmetic_matches_measurement(long_context_cost: dict) -> dg.AssetCheckResult:
    s = long_context_cost["summary"]
    checks = {"kv_cache_equals_formula": bool(long_context_cost["kv_check"]) and all(
        abs(r["measured_over_predicted"] - 1) < 1e-9 for r in long_context_cost["kv_check"])}
    for p in ("forward", "forward_backward"):
        lo, hi = s.get(f"reference_{p}_peak_over_scores_min"), s.get(f"reference_{p}_peak_over_scores_max")
        if lo is not None:
            checks[f"reference_{p}_memory_tracks_n_squared"] = hi / lo <= 1.25
        r = s.get(f"reference_{p}_memory_ratio_last_doubling")
        if r is not None:
            checks[f"reference_{p}_memory_x4_per_doubling"] = 3.6 <= r <= 4.4
    return dg.AssetCheckResult(passed=all(checks.values()), metadata={**checks, **{k: float(v) for k, v in s.items() if v is not None}})


@dg.asset(group_name=GROUP, kinds={"pytorch"})
def context_usage(
    context: dg.AssetExecutionContext, config: ContextUsageConfig, transformer_lm: dict, transformer_window_lm: dict, lstm_lm: dict,
    labels: dict, mlflow: MlflowTracker,
) -> dg.Output[dict]:
    """Validation loss by position within the context window for the full-attention Transformer, the
    sliding-window Transformer trained on the same data and steps, and the LSTM: how much later
    context helps each, and where the window's limit shows."""
    with stage(context, mlflow, config.model_dump()) as s:
        _, val, _ = load_labels(labels["path"])
        models = {name: load_lm(m["weights"]) for name, m in
                  (("transformer", transformer_lm), ("transformer_window", transformer_window_lm), ("lstm", lstm_lm))}
        result = run_context_usage(models, val, config)
        metrics = result.metrics()
        return s.publish(
            {"curves": result.curves, "summaries": result.summaries, "window_gaps": result.window_gaps, "metrics": metrics},
            metrics=metrics,
            tables={"summaries": result.summaries, "by_position": result.buckets, "window_gaps": result.window_gaps},
            figures=result.figures,
        )


@dg.asset_check(
    asset=context_usage,
    description="Later context helps: every model's loss falls from the first positions to the last (gain > 0); the windowed "
    "Transformer saturates no later than its receptive field and is no better than full attention after its window.",
)
def later_context_helps(context_usage: dict) -> dg.AssetCheckResult:
    checks = {f"{s['model']}_gains_from_context": s["gain_from_context"] > 0 for s in context_usage["summaries"]}
    for s in context_usage["summaries"]:
        if s["receptive_field"]:
            checks[f"{s['model']}_saturates_within_receptive_field"] = s["saturation_position"] <= s["receptive_field"]
    for g in context_usage["window_gaps"]:
        checks[f"{g['model']}_not_better_after_window"] = not g["gap_after_window"] < 0
    figures = {k.replace("/", "_"): v for k, v in context_usage["metrics"].items()}
    return dg.AssetCheckResult(passed=all(checks.values()), severity=dg.AssetCheckSeverity.WARN, metadata={**checks, **figures})
