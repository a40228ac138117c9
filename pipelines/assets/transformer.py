"""Transformer stage studies: ablations of the architecture, and the comparison of RNN, LSTM and
Transformer on the same labels."""

from typing import Any, Optional

import dagster as dg
from pydantic import Field

from components.core.ablations import AblationSettings, accounting_markdown, parameter_accounting, run_ablations
from components.core.comparison import compare_models
from components.core.labels import load_labels
from components.core.models.transformer import TransformerSettings, load_transformer
from components.core.training import TrainSettings
from components.orchestration.language_model import TrainConfig, TransformerModelConfig, check_same_tokenizer
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "transformer"


class AblationStudyConfig(dg.Config, AblationSettings):
    """Which ablations, and how long each run trains."""

    deep_n_layer: int = Field(6, ge=2, description="Depth of the with/without-residual pair (residuals matter in deep stacks).")


class AblationModelConfig(TransformerModelConfig):
    n_layer: int = 2
    n_embd: int = 64
    block_size: int = 64


class AblationTrainConfig(TrainConfig):
    max_steps: int = 300
    block_size: Optional[int] = 64
    eval_interval: int = 100
    lr: float = 3e-3
    min_lr: float = 3e-4


class TransformerAblationsConfig(dg.Config):
    model: AblationModelConfig = AblationModelConfig()
    train: AblationTrainConfig = AblationTrainConfig()
    study: AblationStudyConfig = AblationStudyConfig()


@dg.asset(group_name=GROUP, kinds={"pytorch"}, io_manager_key="manifest_io", automation_condition=dg.AutomationCondition.eager())
def transformer_ablations(
    context: dg.AssetExecutionContext, config: TransformerAblationsConfig, labels: dict, tokenizer: dict, mlflow: MlflowTracker
) -> dg.Output[dict]:
    """Short runs of the full model and each ablation (no positional encoding, no √d scaling, a deep
    stack without residuals) with the same data, steps and seed; permutation equivariance without
    PE; softmax entropy and gradient norm at init with and without scaling."""
    check_same_tokenizer(labels, tokenizer)
    with stage(context, mlflow, config.model_dump()) as s:
        train, val, meta = load_labels(labels["path"])
        result = run_ablations(
            TransformerSettings(**config.model.model_dump()),
            TrainSettings(**config.train.model_dump()),
            AblationSettings(**config.study.model_dump()),
            train,
            val,
            int(meta["vocab_size"]),
            s.tmp,
            log_metrics=s.run.log_metrics,
            model_meta={"tokenizer_sha256": labels["tokenizer_sha256"]},
        )
        s.run.log_metrics(result.metrics)
        s.run.log_artifact(result.table_path)
        md: dict[str, Any] = {name: s.figure(fig, name) for name, fig in result.figures.items()}
        md["report"] = dg.MetadataValue.md(result.markdown)
        md.update({k.replace("/", "_"): v for k, v in result.metrics.items()})
        if result.warnings:
            md["warnings"] = dg.MetadataValue.md("\n".join(f"- {w}" for w in result.warnings))
        md.update(s.run.metadata())
        manifest = {"table": result.table, "metrics": result.metrics, "permutation": result.permutation, "scaling": result.scaling}
    return dg.Output(manifest, metadata=md)


@dg.asset_check(asset=transformer_ablations, description="Without positional encoding the model (bidirectional attention) is permutation-equivariant; with it, it is not.")
def position_breaks_order_symmetry(transformer_ablations: dict) -> dg.AssetCheckResult:
    m = transformer_ablations["metrics"]
    no_pe, with_pe = m["permutation/no_pe_rel_err"], m["permutation/with_pe_rel_err"]
    # Without PE the outputs permute with the inputs up to float32 rounding (~1e-7); with PE the
    # error must stand well clear of that noise (small models at init are only mildly position-aware).
    passed = bool(no_pe < 1e-5 and with_pe > 100 * max(no_pe, 1e-7))
    return dg.AssetCheckResult(passed=passed, metadata={"no_pe_rel_err": no_pe, "with_pe_rel_err": with_pe})


@dg.asset(group_name=GROUP, kinds={"pytorch"}, io_manager_key="manifest_io", automation_condition=dg.AutomationCondition.eager())
def model_comparison(
    context: dg.AssetExecutionContext, rnn_lm: dict, lstm_lm: dict, transformer_lm: dict, mlflow: MlflowTracker
) -> dg.Output[dict]:
    """RNN, LSTM and Transformer on the same labels at matched parameter budgets and matched
    wall-clock: val loss, perplexity, tokens/s, parameters; plus the Transformer's parameter
    accounting per component and its FFN share."""
    models = {"rnn": rnn_lm, "lstm": lstm_lm, "transformer": transformer_lm}
    hashes = {m["tokenizer_sha256"] for m in models.values()}
    if len(hashes) != 1:
        raise dg.Failure("the models were trained on labels of different tokenizers; re-materialize them together")
    with stage(context, mlflow, {"models": list(models)}) as s:
        result = compare_models(models)
        accounting = parameter_accounting(load_transformer(transformer_lm["weights"]))
        metrics = {**result.metrics(), "transformer/ffn_share": accounting["ffn_share"]}
        s.run.log_metrics(metrics)
        # One child run per model with the shared metric names: MLflow's compare view lines them up.
        for row in result.rows:
            m = models[row["model"]]
            s.run.child(
                row["model"],
                {"val/loss": row["val_loss"], "val/ppl": row["val_ppl"], "tokens_per_s": row["tokens_per_s"],
                 "params": row["params"], "val/loss_at_matched_time": row["val_loss_at_matched_time"]},
                params={"family": m["family"], **{f"model.{k}": v for k, v in m["model_config"].items()}},
                series={"val/loss": [(h["step"], h["val/loss"]) for h in m["history"] if "val/loss" in h]},
            )
        md: dict[str, Any] = {name: s.figure(fig, name) for name, fig in result.figures.items()}
        md["comparison"] = dg.MetadataValue.md(result.markdown())
        md["parameter_accounting"] = dg.MetadataValue.md(accounting_markdown(accounting))
        md["ffn_share"] = accounting["ffn_share"]
        md.update(s.run.metadata())
        manifest = {"rows": result.rows, "matched_time_s": result.matched_time_s, "accounting": accounting}
    return dg.Output(manifest, metadata=md)


@dg.asset_check(asset=model_comparison, description="The FFN holds about two thirds of the Transformer's non-embedding parameters (measured from the module).")
def ffn_holds_two_thirds(model_comparison: dict) -> dg.AssetCheckResult:
    a = model_comparison["accounting"]
    return dg.AssetCheckResult(passed=bool(abs(a["ffn_share"] - 2 / 3) < 0.05), metadata={"ffn_share": a["ffn_share"], **a["components"]})
