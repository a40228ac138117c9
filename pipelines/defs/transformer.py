"""Transformer stage study: ablations of the architecture."""

import dagster as dg
from pydantic import Field

from components.core.labels import load_labels
from components.core.manifests import (
    AblationRun,
    DepthRun,
    Labels,
    PermutationStudy,
    SoftmaxScaling,
    Tokenizer,
    TransformerAblations,
    typed_row,
    typed_rows,
)
from components.core.models.transformer import TransformerSettings
from components.core.studies.ablations import AblationSettings, run_ablations
from components.core.train_settings import TrainSettings
from components.orchestration.language_model import (
    TRAINING_POOL,
    TrainConfig,
    TransformerModelConfig,
    check_same_tokenizer,
)
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "transformer"


class AblationStudyConfig(dg.Config, AblationSettings):
    """Which ablations, and how long each run trains."""

    deep_n_layer: int = Field(
        default=6, ge=2, description="Depth of the with/without-residual pair (residuals matter in deep stacks)."
    )


class AblationModelConfig(TransformerModelConfig):
    n_layer: int = 2
    n_embd: int = 64
    block_size: int = 64


class AblationTrainConfig(TrainConfig):
    max_steps: int = 300
    # The whole validation split once, at the last step, which the rows read. A midway evaluation drew only a
    # two-point curve and took a quarter of the asset's time (a full split is 1.8 s for a 2-layer model and 5 s
    # for a 6-layer one at one thread); the curves figure plots each run's training loss, logged every 10 steps.
    eval_interval: int = 0
    lr: float = 3e-3
    min_lr: float = 3e-4


class TransformerAblationsConfig(dg.Config):
    model: AblationModelConfig = AblationModelConfig()
    train: AblationTrainConfig = AblationTrainConfig()
    study: AblationStudyConfig = AblationStudyConfig()


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def transformer_ablations(
    context: dg.AssetExecutionContext,
    config: TransformerAblationsConfig,
    labels: Labels,
    tokenizer: Tokenizer,
    mlflow: MlflowTracker,
) -> dg.Output[TransformerAblations]:
    """Short runs of the full model and each ablation (no positional encoding, no √d scaling, a deep
    stack without residuals) with the same data, steps and seed; permutation equivariance without
    PE; softmax entropy and gradient norm at init with and without scaling."""
    check_same_tokenizer(labels, tokenizer)
    with stage(context, mlflow, config.model_dump()) as s:
        train, val, meta = load_labels(labels.path)
        result = run_ablations(
            TransformerSettings(**config.model.model_dump()),
            TrainSettings(**config.train.model_dump()),
            AblationSettings(**config.study.model_dump()),
            train,
            val,
            int(meta["vocab_size"]),
            s.tmp,
            log_metrics=s.run.log_progress,
            model_meta={"tokenizer_sha256": labels.tokenizer_sha256},
        )
        return s.publish(
            TransformerAblations(
                table=typed_rows(AblationRun, result.table),
                metrics=result.metrics,
                permutation=typed_row(PermutationStudy, result.permutation),
                scaling=typed_row(SoftmaxScaling, result.scaling),
                depth=typed_rows(DepthRun, result.depth),
            ),
            metrics=result.metrics,
            tables={"ablations": result.table},
            figures=result.figures,
            texts={"report": result.markdown},
            artifacts=[result.table_path],
            warnings=result.warnings,
        )
