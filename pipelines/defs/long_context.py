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
from components.core.manifests import (
    AttentionCost,
    AttentionFit,
    ContextSummary,
    ContextUsage,
    Crossover,
    GenerationCost,
    GenerationFit,
    GenerationRow,
    KvCheck,
    Labels,
    LanguageModel,
    LongContextCost,
    RecurrentCost,
    TrainStepRow,
    WindowGap,
    typed_rows,
)
from components.core.studies.attention_cost import AttentionCostSettings
from components.core.studies.attention_cost import attention_cost as run_attention_cost
from components.core.studies.context_usage import ContextUsageSettings
from components.core.studies.context_usage import context_usage as run_context_usage
from components.core.studies.generation_cost import GenerationCostSettings
from components.core.studies.generation_cost import generation_cost as run_generation_cost
from components.core.studies.long_context import LongContextSettings
from components.core.studies.long_context import long_context_cost as run_long_context_cost
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
def attention_cost(
    context: dg.AssetExecutionContext, config: AttentionCostConfig, mlflow: MlflowTracker
) -> dg.Output[AttentionCost]:
    """Causal attention's time and peak memory against sequence length N, forward and forward+backward:
    the reference (materialises the N×N scores), the fused SDPA kernel (FlashAttention-class; the kernel
    observed is recorded) and the blocked sliding window. Log-log exponents fitted per implementation;
    a point over the memory ceiling or the time cap ends that implementation's sweep and is recorded."""
    with stage(context, mlflow, config.model_dump()) as s:
        result = run_attention_cost(config)
        metrics = result.metrics()
        errors = [r for r in result.rows if "error" in r or "stop" in r]
        return s.publish(
            AttentionCost(
                rows=result.rows,
                fits=typed_rows(AttentionFit, result.fits),
                info=result.info,
                metrics=metrics,
            ),
            metrics=metrics,
            tables={
                "points": [
                    {k: r.get(k) for k in ("pass", "impl", "n", "ms", "peak_mib", "error", "stop")} for r in result.rows
                ],
                "fits": result.fits,
            },
            figures=result.figures,
            texts={"report": result.markdown()},
            values={"fused_kernel": result.info["fused_kernel"], "memory_accounting": result.info["memory_accounting"]},
            warnings=[f"{r['pass']} {r['impl']} N={r['n']}: {r.get('error') or r.get('stop')}" for r in errors],
        )


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def generation_cost(
    context: dg.AssetExecutionContext,
    config: GenerationCostConfig,
    transformer_lm: LanguageModel,
    rnn_lm: LanguageModel,
    lstm_lm: LanguageModel,
    mlflow: MlflowTracker,
) -> dg.Output[GenerationCost]:
    """Time per generated token against context length for the trained Transformer with and without
    its KV cache and for the RNN and LSTM, and the memory each carries per sequence between tokens
    (KV cache bytes against the recurrent state's)."""
    with stage(context, mlflow, config.model_dump()) as s:
        models = {
            "transformer": load_lm(transformer_lm.weights),
            "rnn": load_lm(rnn_lm.weights),
            "lstm": load_lm(lstm_lm.weights),
        }
        result = run_generation_cost(models, config)
        metrics = result.metrics()
        return s.publish(
            GenerationCost(
                rows=typed_rows(GenerationRow, result.rows),
                fits=typed_rows(GenerationFit, result.fits),
                metrics=metrics,
            ),
            metrics=metrics,
            tables={
                "timings": [
                    {
                        k: r.get(k)
                        for k in ("model", "context_len", "ms_per_token", "prefill_ms", "bytes_per_sequence", "skipped")
                    }
                    for r in result.rows
                ],
                "fits": result.fits,
            },
            figures=result.figures,
            warnings=[
                f"{r['model']} L={r['context_len']}: skipped, {r['skipped']}" for r in result.rows if "skipped" in r
            ],
        )


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def long_context_cost(
    context: dg.AssetExecutionContext,
    config: LongContextConfig,
    attention_cost: AttentionCost,
    generation_cost: GenerationCost,
    recurrent_cost: RecurrentCost,
    transformer_lm: LanguageModel,
    mlflow: MlflowTracker,
) -> dg.Output[LongContextCost]:
    """The long-context figures in one place: every fitted exponent with its R² and cost(2N)/cost(N);
    the length where the Transformer's per-token training cost overtakes the RNN's and LSTM's (its
    training step timed at recurrent_cost's lengths); the KV-cache, score-matrix and FLOP arithmetic
    of 7B/8B/70B-class shapes at 4k…1M tokens, with the same formulas checked against our measurements."""
    with stage(context, mlflow, config.model_dump()) as s:
        result = run_long_context_cost(
            load_lm(transformer_lm.weights),
            attention=attention_cost,
            generation=generation_cost,
            recurrent=recurrent_cost,
            settings=config,
        )
        metrics = result.metrics()
        return s.publish(
            LongContextCost(
                exponents=result.exponents,
                crossovers=typed_rows(Crossover, result.crossovers),
                arithmetic=result.arithmetic,
                train_rows=typed_rows(TrainStepRow, result.train_rows),
                kv_check=typed_rows(KvCheck, result.kv_check),
                scores_check=result.scores_check,
                summary=result.summary(),
                metrics=metrics,
            ),
            metrics=metrics,
            tables={
                "exponents": result.exponents,
                "crossovers": result.crossovers,
                "arithmetic": result.arithmetic,
                "training_steps": result.train_rows,
                "kv_cache_check": result.kv_check,
                "scores_check": result.scores_check,
            },
            figures=result.figures,
            texts={"report": result.markdown()},
        )


@dg.asset(group_name=GROUP, kinds={"pytorch"})
def context_usage(
    context: dg.AssetExecutionContext,
    config: ContextUsageConfig,
    transformer_lm: LanguageModel,
    transformer_window_lm: LanguageModel,
    lstm_lm: LanguageModel,
    labels: Labels,
    mlflow: MlflowTracker,
) -> dg.Output[ContextUsage]:
    """Validation loss by position within the context window for the full-attention Transformer, the
    sliding-window Transformer trained on the same data and steps, and the LSTM: how much later
    context helps each, and where the window's limit shows."""
    with stage(context, mlflow, config.model_dump()) as s:
        _, val, _ = load_labels(labels.path)
        models = {
            name: load_lm(m.weights)
            for name, m in (
                ("transformer", transformer_lm),
                ("transformer_window", transformer_window_lm),
                ("lstm", lstm_lm),
            )
        }
        result = run_context_usage(models, val, config)
        metrics = result.metrics()
        return s.publish(
            ContextUsage(
                curves=result.curves,
                summaries=typed_rows(ContextSummary, result.summaries),
                window_gaps=typed_rows(WindowGap, result.window_gaps),
                metrics=metrics,
            ),
            metrics=metrics,
            tables={"summaries": result.summaries, "by_position": result.buckets, "window_gaps": result.window_gaps},
            figures=result.figures,
            texts={"how_far_context_helps": result.plainly()},
        )
