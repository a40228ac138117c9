"""Memory tasks where the article's thesis is structural: generated, seeded sequences on which the RNN,
the LSTM, full attention and the sliding window part ways (components/core/studies/memory.py).

    memory_delay   delayed recall: accuracy against delay, the gradient reaching t − d
    memory_recall  multi-query associative recall: accuracy against pairs and key-query distance
    memory_induction  repeated random spans: the previous-token and induction heads, found and ablated

No upstream assets: the tasks generate their own data, and each trains its own small models. The three
are one step (`memory_tasks`, a multi-asset that materializes any of them alone too): their trainings
share one pool of worker processes (components/core/studies/memory_pool.py), so that the short
trainings of one task fill the core another's longest training leaves idle.
"""

import dagster as dg

from components.core.manifests import MemoryDelay, MemoryInduction, MemoryRecall
from components.core.studies.induction import InductionSettings, plan_induction
from components.core.studies.memory import MemoryResult, plan_delay, plan_recall
from components.core.studies.memory_pool import StudyPlan, run_studies
from components.core.studies.memory_tasks import DelaySettings, RecallSettings
from components.orchestration.language_model import TRAINING_POOL
from components.orchestration.stage import Stage, stage, step_guard
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


class MemoryTasksConfig(dg.Config):
    """Each memory task's settings; their trainings run in one pool of as many workers as the most any
    selected task asks for."""

    delay: DelayConfig = DelayConfig()
    recall: RecallConfig = RecallConfig()
    induction: InductionConfig = InductionConfig()


def _publish_delay(s: Stage, r: MemoryResult) -> dg.Output:
    return s.publish(
        MemoryDelay(**r.manifest()),
        metrics=r.metrics("delay"),
        tables={**_tables(r), "gradients": r.extra["gradients"]},
        figures=r.figures,
    )


def _publish_recall(s: Stage, r: MemoryResult) -> dg.Output:
    return s.publish(MemoryRecall(**r.manifest()), metrics=r.metrics("recall"), tables=_tables(r), figures=r.figures)


def _publish_induction(s: Stage, r: MemoryResult) -> dg.Output:
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


TASKS = {  # asset -> its config field, its plan, its publication
    "memory_delay": ("delay", plan_delay, _publish_delay),
    "memory_recall": ("recall", plan_recall, _publish_recall),
    "memory_induction": ("induction", plan_induction, _publish_induction),
}


DESCRIPTIONS = {
    "memory_delay": "Delayed recall: the RNN, the LSTM and the Transformer (one parameter budget), each trained on "
    "each delay alone (or on every delay at once, `training: mixed`); accuracy per delay with 95% intervals, and "
    "the norm of the gradient reaching the symbol's position from the query's loss in the trained models.",
    "memory_recall": "Multi-query associative recall: the RNN, the LSTM, the Transformer and the sliding-window "
    "Transformer (one parameter budget) trained on every number of pairs at once; accuracy per number of pairs, per "
    "key-query distance, and for the window model within and beyond its receptive field.",
    "memory_induction": "Induction: a small Transformer trained on random spans repeated once; accuracy and loss on "
    "the first part and the repeat; per head the previous-token and prefix-matching scores; the previous-token head "
    "and the induction head found by them; the repeat with the induction heads zeroed, and with as many other heads "
    "zeroed.",
}


@dg.multi_asset(
    outs={
        name: dg.AssetOut(group_name=GROUP, kinds={"pytorch"}, description=DESCRIPTIONS[name], is_required=False)
        for name in TASKS
    },
    can_subset=True,
    pool=TRAINING_POOL,
)
def memory_tasks(context: dg.AssetExecutionContext, config: MemoryTasksConfig, mlflow: MlflowTracker):
    """The selected memory tasks: every training of theirs in one pool, then each task's asset
    published on its own (its MLflow run, its folder, its metadata, its materialization)."""
    chosen = [name for name in TASKS if dg.AssetKey(name) in context.selected_asset_keys]
    with step_guard(context, mlflow):
        plans: dict[str, StudyPlan[MemoryResult]] = {
            name: TASKS[name][1](getattr(config, TASKS[name][0])) for name in chosen
        }
        results = run_studies(plans)
        for name in chosen:
            field_name, _, publish = TASKS[name]
            with stage(context, mlflow, getattr(config, field_name).model_dump(), dg.AssetKey(name)) as s:
                out = publish(s, results[name])
            yield out  # once its folder is in place: a task published stays so if a later one fails
