"""Memory tasks where the article's thesis is structural: generated, seeded sequences on which the RNN,
the LSTM, full attention and the sliding window part ways (components/core/studies/memory.py).

    memory_delay   delayed recall: accuracy against delay, the gradient reaching t − d
    memory_recall  multi-query associative recall: accuracy against pairs and key-query distance
    memory_induction  repeated random spans: the previous-token and induction heads, found and ablated

No upstream assets: the tasks generate their own data, and each trains its own small models.
"""

import dagster as dg

from components.core.manifests import MemoryDelay, MemoryInduction, MemoryRecall
from components.core.studies.induction import InductionSettings, induction_study
from components.core.studies.memory import delay_study, recall_study
from components.core.studies.memory_tasks import DelaySettings, RecallSettings
from components.orchestration.language_model import TRAINING_POOL
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "memory"


class DelayConfig(dg.Config, DelaySettings):
    """Delays, sequence length, vocabulary and training of the delayed-recall task."""


class RecallConfig(dg.Config, RecallSettings):
    """Pairs, sequence length, vocabularies, window and training of the associative-recall task."""


class InductionConfig(dg.Config, InductionSettings):
    """Span, vocabulary, depth and training of the induction task."""


def _tables(r) -> dict[str, list[dict]]:
    return {"accuracy": [{k: v for k, v in row.items()} for row in r.rows], "models": r.models}


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def memory_delay(
    context: dg.AssetExecutionContext, config: DelayConfig, mlflow: MlflowTracker
) -> dg.Output[MemoryDelay]:
    """Delayed recall: the RNN, the LSTM and the Transformer (one parameter budget), each trained on
    each delay alone (or on every delay at once, `training: mixed`); accuracy per delay with 95%
    intervals, and the norm of the gradient reaching the symbol's position from the query's loss in
    the trained models."""
    with stage(context, mlflow, config.model_dump()) as s:
        r = delay_study(config)
        metrics = r.metrics("delay")
        return s.publish(
            MemoryDelay(**r.manifest()),
            metrics=metrics,
            tables={**_tables(r), "gradients": r.extra["gradients"]},
            figures=r.figures,
        )


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def memory_recall(
    context: dg.AssetExecutionContext, config: RecallConfig, mlflow: MlflowTracker
) -> dg.Output[MemoryRecall]:
    """Multi-query associative recall: the RNN, the LSTM, the Transformer and the sliding-window
    Transformer (one parameter budget) trained on every number of pairs at once; accuracy per number
    of pairs, per key-query distance, and for the window model within and beyond its receptive field."""
    with stage(context, mlflow, config.model_dump()) as s:
        r = recall_study(config)
        metrics = r.metrics("recall")
        return s.publish(MemoryRecall(**r.manifest()), metrics=metrics, tables=_tables(r), figures=r.figures)


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def memory_induction(
    context: dg.AssetExecutionContext, config: InductionConfig, mlflow: MlflowTracker
) -> dg.Output[MemoryInduction]:
    """Induction: a small Transformer trained on random spans repeated once; accuracy and loss on the
    first part and the repeat; per head the previous-token and prefix-matching scores; the
    previous-token head and the induction head found by them; the repeat with the induction heads
    zeroed, and with as many other heads zeroed."""
    with stage(context, mlflow, config.model_dump()) as s:
        r = induction_study(config)
        b = r.extra["base"]
        metrics = {
            "induction/first_accuracy": b["first_accuracy"],
            "induction/repeat_accuracy": b["repeat_accuracy"],
            "induction/first_loss": b["first_loss"],
            "induction/repeat_loss": b["repeat_loss"],
            **{
                f"induction/repeat_accuracy_{a['ablated'].replace(' ', '_')}_zeroed": a["repeat_accuracy"]
                for a in r.extra["ablations"]
            },
            "induction/train_seconds": r.models[0]["train_seconds"],
        }
        return s.publish(
            MemoryInduction(**r.manifest()),
            metrics=metrics,
            tables={"heads": r.extra["heads"], "ablations": r.extra["ablations"], "models": r.models},
            figures=r.figures,
        )
