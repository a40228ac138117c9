"""Recurrent stage studies over the trained RNN and LSTM: gradients across time, and the cost of
computing one step after another."""

import dagster as dg

from components.core.labels import load_labels
from components.core.lm import load_lm
from components.core.manifests import GradientFactor, GradientStudy, Labels, LanguageModel, RecurrentCost, typed_rows
from components.core.models.recurrent import require_recurrent
from components.core.studies.gradients import GradientStudySettings
from components.core.studies.gradients import gradient_study as run_gradient_study
from components.core.studies.recurrent_cost import RecurrentCostSettings
from components.core.studies.recurrent_cost import recurrent_cost as run_recurrent_cost
from components.orchestration.language_model import TRAINING_POOL
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "recurrent"


class GradientStudyConfig(dg.Config, GradientStudySettings):
    """Norms of dL_T/dh_t and the clipping experiment."""


class RecurrentCostConfig(dg.Config, RecurrentCostSettings):
    """Wall time per training step and per generated token versus sequence length."""


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def gradient_study(
    context: dg.AssetExecutionContext,
    config: GradientStudyConfig,
    labels: Labels,
    rnn_lm: LanguageModel,
    lstm_lm: LanguageModel,
    mlflow: MlflowTracker,
) -> dg.Output[GradientStudy]:
    """||dL_T/dh_t|| over t for trained, fresh, contractive and expansive RNN/LSTM, with the fitted
    per-step factor; and an RNN trained at a high learning rate with and without clipping."""
    with stage(context, mlflow, config.model_dump()) as s:
        train, val, _ = load_labels(labels.path)
        models = {
            name: require_recurrent(load_lm(m.weights), f"gradient_study's {name}")
            for name, m in (("rnn", rnn_lm), ("lstm", lstm_lm))
        }
        result = run_gradient_study(
            models, val, config, train_data=train, clip_model_config=models["rnn"].config, out_dir=s.tmp / "clipping"
        )
        metrics = result.metrics()
        texts = {}
        c = result.clipping
        if c is not None:
            texts["clipping"] = (
                f"Plain SGD at lr {config.clip_lr}, {config.clip_steps} steps.\n\n"
                f"- unclipped: diverged = **{c.unclipped_diverged}**, max gradient norm "
                f"{c.max_grad_norm_unclipped:.3g}, "
                f"loss {c.loss_unclipped[0]:.3f} → {c.loss_unclipped[-1]:.3f}\n"
                f"- clipped at {config.clip_grad}: diverged = **{c.clipped_diverged}**, trained = "
                f"**{c.clipped_trained}**, "
                f"loss {c.loss_clipped[0]:.3f} → {c.loss_clipped[-1]:.3f}"
            )
        return s.publish(
            GradientStudy(rows=typed_rows(GradientFactor, result.rows), metrics=metrics, clip_grad=config.clip_grad),
            metrics=metrics,
            tables={"factors": result.rows},
            figures=result.figures,
            texts=texts,
        )


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL)
def recurrent_cost(
    context: dg.AssetExecutionContext,
    config: RecurrentCostConfig,
    rnn_lm: LanguageModel,
    lstm_lm: LanguageModel,
    mlflow: MlflowTracker,
) -> dg.Output[RecurrentCost]:
    """Time per training step and per generated token vs sequence length for the trained
    architectures: linear in length, one step after another."""
    with stage(context, mlflow, config.model_dump()) as s:
        result = run_recurrent_cost({"rnn": load_lm(rnn_lm.weights), "lstm": load_lm(lstm_lm.weights)}, config)
        metrics = result.metrics()
        return s.publish(
            RecurrentCost(rows=result.rows, fits=result.fits, metrics=metrics),
            metrics=metrics,
            tables={"timings": result.rows, "fits": [{"model": k, **v} for k, v in result.fits.items()]},
            figures=result.figures,
        )
