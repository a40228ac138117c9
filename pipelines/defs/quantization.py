"""Quantization stage: the trained models at every precision, self-contained export folders (the FP16
one registered in the MLflow model registry), and the weights arithmetic checked against the files.

    transformer_lm, lstm_lm ──► quantized_models ──► model_export ──► weights_arithmetic
"""

import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, field_validator

from components.core.checkpoint import read_metadata
from components.core.errors import PipelineInputError
from components.core.labels import load_labels
from components.core.lm import load_lm
from components.core.manifests import (
    Corpus,
    ExportRow,
    Labels,
    LanguageModel,
    ModelExport,
    QuantCheck,
    QuantizedModels,
    SourceModel,
    Tokenizer,
    WeightsArithmetic,
    typed_row,
    typed_rows,
)
from components.core.studies.quant_export import ExportSettings, export_and_verify
from components.core.studies.quant_export import weights_arithmetic as arithmetic_of
from components.core.studies.quant_settings import QuantizationSettings
from components.core.studies.quantization import check_figures, quantize_and_measure
from components.orchestration.language_model import check_same_tokenizer
from components.orchestration.registry import log_and_register
from components.orchestration.stage import stage
from components.orchestration.tracking import AssetRun, MlflowTracker, dagster_asset_url, dagster_run_url

GROUP = "quantization"
REGISTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,255}")
MAIN_MODEL = "transformer_lm"


class QuantizedModelsConfig(dg.Config, QuantizationSettings):
    """Precisions and how each is measured (bytes, perplexity, logits, generation speed)."""


class ModelExportConfig(dg.Config, ExportSettings):
    """Export folders: which variants, generation defaults, reload and load-time checks, registry."""

    register_variant: str = Field(
        default="fp16",
        description="Variant logged to MLflow as a model and registered in the model registry ('' = none).",
    )
    registered_model_name: str = Field(default="transformer_lm_fp16", description="Name in the MLflow model registry.")

    @field_validator("registered_model_name")
    @classmethod
    def _registry_name(cls, v: str) -> str:
        # Checked with the config, before any export work: MLflow would refuse a path-like name only
        # after the export, and a name with '/' or '..' reads as a path in its stores and URLs.
        if not REGISTRY_NAME.fullmatch(v):
            raise ValueError(
                f"registered_model_name {v!r}: use letters, digits, '_', '-' and '.', starting with a letter or "
                "digit (at most 256 characters; no '/', no '..')"
            )
        if ".." in v:
            raise ValueError(f"registered_model_name {v!r}: '..' is not allowed")
        return v


class WeightsArithmeticConfig(dg.Config):
    """Reference model sizes for the parameters × bytes-per-parameter table."""

    reference_params: list[float] = Field(
        default=[124e6, 1.3e9, 7e9, 13e9, 70e9],
        description="Parameter counts to tabulate beside ours (GPT-2 small … 70B).",
    )


def _table(rows: list[dict]) -> list[dict]:
    """Rows for a Dagster table: every record needs every column, so a missing figure (None, e.g. the
    quantized-layer ratio of a float variant) is shown as "-"."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return [{c: ("-" if r.get(c) is None else r[c]) for c in cols} for r in rows]


def _check_model(name: str, manifest: LanguageModel, tokenizer: Tokenizer) -> None:
    """The model's weights were trained with the current tokenizer (manifest and file header agree)."""
    header = read_metadata(manifest.weights).get("tokenizer_sha256", "")
    for where, sha in (("manifest", manifest.tokenizer_sha256), (manifest.weights, header)):
        if sha != tokenizer.sha256:
            raise PipelineInputError(
                f"`{name}` ({where}) was trained with tokenizer {sha[:12] or '(none)'}…, but the current tokenizer is "
                f"{tokenizer.sha256[:12]}… ({tokenizer.path}): re-materialize `{name}` first"
            )


@dg.asset(group_name=GROUP, kinds={"pytorch", "bitsandbytes", "safetensors"})
def quantized_models(
    context: dg.AssetExecutionContext,
    config: QuantizedModelsConfig,
    transformer_lm: LanguageModel,
    lstm_lm: LanguageModel,
    labels: Labels,
    tokenizer: Tokenizer,
    mlflow: MlflowTracker,
) -> dg.Output[QuantizedModels]:
    """The trained Transformer (and the LSTM, for contrast) at FP32, FP16, BF16 and through
    bitsandbytes at INT8 (LLM.int8, Linear8bitLt), NF4 and FP4 (Linear4bit): bytes in memory and on
    disk, validation perplexity and its change against FP32, max-abs logit difference on a fixed
    batch, generation tokens/s. Each variant's weights are saved for `model_export`."""
    check_same_tokenizer(labels, tokenizer)
    sources = {"transformer_lm": transformer_lm, "lstm_lm": lstm_lm}
    for name, manifest in sources.items():
        _check_model(name, manifest, tokenizer)
    with stage(context, mlflow, config.model_dump()) as s:
        _, val, _ = load_labels(labels.path)
        models = {name: load_lm(m.weights) for name, m in sources.items()}
        result = quantize_and_measure(
            models, val, QuantizationSettings(**config.model_dump()), out_dir=s.tmp / "weights", log=context.log.info
        )
        s.run.log_metrics(result.metrics)  # every figure to MLflow; the headline ones also to Dagster below
        checks = check_figures(result.rows, MAIN_MODEL)
        headline = {
            k: v
            for k, v in result.metrics.items()
            if k.startswith(f"quant/{MAIN_MODEL}/")
            and k.rsplit("/", 1)[1] in ("dppl_pct", "memory_bytes", "gen_tokens_per_s")
        }
        return s.publish(
            QuantizedModels(
                rows=result.rows,
                settings=config.model_dump(),
                device=result.device,
                weights={m: {v: s.final_path(p) for v, p in by.items()} for m, by in result.weights.items()},
                models={n: _source(m) for n, m in sources.items()},
                checks={k: typed_row(QuantCheck, v) for k, v in checks.items()},
                main_model=MAIN_MODEL,
            ),
            metrics=headline,
            tables={"quantization": _table(result.rows)},
            figures=result.figures,
            texts={"report": result.markdown},
            files={"weights": s.tmp / "weights"},
            values={"device": result.device, "variants": ", ".join(config.variants)},
            warnings=result.warnings,
        )


def _source(m: LanguageModel) -> SourceModel:
    return SourceModel(
        name=m.name,
        family=m.family,
        weights=m.weights,
        model_config=dict(m.model_config),
        vocab_size=m.vocab_size,
        tokenizer_sha256=m.tokenizer_sha256,
        dagster_run_id=m.dagster_run_id,
        mlflow_run_id=m.mlflow_run_id,
        metrics=dict(m.metrics),
    )


def _train_settings(source: SourceModel, client: Any) -> dict:
    """The training settings of a model asset: the parameters its MLflow run logged (`train.*`)."""
    settings: dict[str, Any] = {}
    try:
        params = client.get_run(source.mlflow_run_id).data.params
        for k, v in params.items():
            if k.startswith("train."):
                try:
                    settings[k[len("train.") :]] = json.loads(v)
                except ValueError:
                    settings[k[len("train.") :]] = None if v == "None" else v
    except Exception as e:  # the training run is gone from this MLflow store: say so in config.json
        settings = {"unavailable": f"{type(e).__name__}: {e}"}
    return {"settings": settings, "metrics": source.metrics}


def _provenance(
    context: dg.AssetExecutionContext,
    run: AssetRun,
    quantized_models: QuantizedModels,
    corpus: Corpus,
    tokenizer: Tokenizer,
    labels: Labels,
) -> dict[str, str]:
    """Where an export folder came from: this run, the training and quantization runs, the corpus,
    tokenizer and labels it was made from."""
    source = quantized_models.models[MAIN_MODEL]
    return {
        "dagster_run_id": context.run.run_id,
        "mlflow_run_id": run.run_id,
        "training_dagster_run_id": source.dagster_run_id,
        "training_mlflow_run_id": source.mlflow_run_id,
        "quantized_models_dagster_run_id": quantized_models.dagster_run_id,
        "quantized_models_mlflow_run_id": quantized_models.mlflow_run_id,
        "corpus_content_sha256": corpus.content_sha256,
        "tokenizer_sha256": tokenizer.sha256,
        "labels_dagster_run_id": labels.dagster_run_id,
        "model": MAIN_MODEL,
    }


def _register(
    context: dg.AssetExecutionContext,
    config: ModelExportConfig,
    run: AssetRun,
    folder: Path,
    corpus: Corpus,
    tokenizer: Tokenizer,
) -> dict[str, str]:
    """The `register_variant` export `folder` logged to `run` as an MLflow model and registered under
    `registered_model_name`, its version linked to this Dagster run and asset."""
    run_id = context.run.run_id
    return log_and_register(
        run,
        folder,
        config.registered_model_name,
        description=f"The trained {MAIN_MODEL}, exported at {config.register_variant} (safetensors, "
        f"config.json, tokenizer.json).",
        model_description=(
            f"{MAIN_MODEL} at {config.register_variant}, Dagster run [{run_id[:8]}]({dagster_run_url(run_id)}) "
            f"(asset [{context.asset_key.to_user_string()}]({dagster_asset_url(context.asset_key)}))."
        ),
        tags={
            "variant": config.register_variant,
            "dagster.run_id": run_id,
            "dagster.run_url": dagster_run_url(run_id),
            "dagster.asset_url": dagster_asset_url(context.asset_key),
            "corpus_content_sha256": corpus.content_sha256,
            "tokenizer_sha256": tokenizer.sha256,
        },
    )


@dg.asset(group_name=GROUP, kinds={"safetensors", "mlflow"})
def model_export(
    context: dg.AssetExecutionContext,
    config: ModelExportConfig,
    quantized_models: QuantizedModels,
    tokenizer: Tokenizer,
    corpus: Corpus,
    labels: Labels,
    mlflow: MlflowTracker,
) -> dg.Output[ModelExport]:
    """A Hugging Face-style folder per variant of the Transformer (model.safetensors with the
    quantization state as tensors and the scheme in the header, config.json, tokenizer.json,
    generation_config.json, provenance), each reloaded from the folder alone and checked against the
    exported model; safetensors load time vs torch.load; the FP16 folder registered in MLflow."""
    check_same_tokenizer(labels, tokenizer)
    source = quantized_models.models[MAIN_MODEL]
    if source.tokenizer_sha256 != tokenizer.sha256:
        raise PipelineInputError(
            f"quantized_models' {MAIN_MODEL} was trained with tokenizer {source.tokenizer_sha256[:12]}…, the "
            f"current one is "
            f"{tokenizer.sha256[:12]}…: re-materialize {MAIN_MODEL} and quantized_models first"
        )
    if config.register_variant and config.register_variant not in config.variants:
        raise PipelineInputError(
            f"register_variant={config.register_variant!r} is not among the exported variants {config.variants}"
        )
    with stage(context, mlflow, config.model_dump()) as s:
        _, val, _ = load_labels(labels.path)
        rows = {r["variant"]: r for r in quantized_models.rows if r["model"] == MAIN_MODEL}
        provenance = _provenance(context, s.run, quantized_models, corpus, tokenizer, labels)
        report = export_and_verify(
            quantized_models.weights[MAIN_MODEL],
            s.tmp / "exports",
            tokenizer_path=tokenizer.path,
            tokenizer_sha256=tokenizer.sha256,
            model_config=source.model_config,
            train_settings=_train_settings(source, s.run.client),
            provenance=provenance,
            val_data=val,
            eval_settings=QuantizationSettings(**quantized_models.settings),
            settings=ExportSettings(
                **{k: v for k, v in config.model_dump().items() if k in ExportSettings.model_fields}
            ),
            study_val_loss={v: r["val_loss"] for v, r in rows.items()},
            device=quantized_models.device,
        )
        registered: dict[str, str] = {}
        if config.register_variant:
            folder = report.exports[config.register_variant].path
            registered = _register(context, config, s.run, folder, corpus, tokenizer)
        exports = {v: {**info.as_dict(), "path": s.final_path(info.path)} for v, info in report.exports.items()}
        s.run.log_metrics(report.metrics)  # every figure to MLflow; the headline ones also to Dagster below
        headline = {
            k: v
            for k, v in report.metrics.items()
            if k.rsplit("/", 1)[1] in ("weights_bytes", "load_speedup_vs_torch_load")
        }
        return s.publish(
            ModelExport(
                model=MAIN_MODEL,
                exports=exports,
                rows=typed_rows(ExportRow, report.rows),
                registered_model=registered,
                samples=report.samples,
                reload_ok=report.all_reloads_pass,
            ),
            metrics=headline,
            tables={"exports": _table(report.rows)},
            texts={"report": report.markdown},
            files={"exports": s.tmp / "exports"},
            values={
                "registered_model_name": registered.get("name", ""),
                "registered_model_version": registered.get("version", ""),
                "registered_model_uri": registered.get("uri", ""),
                "reload_ok": report.all_reloads_pass,
            },
        )


@dg.asset(group_name=GROUP, kinds={"safetensors"})
def weights_arithmetic(
    context: dg.AssetExecutionContext,
    config: WeightsArithmeticConfig,
    model_export: ModelExport,
    quantized_models: QuantizedModels,
    mlflow: MlflowTracker,
) -> dg.Output[WeightsArithmetic]:
    """Parameters × bytes per parameter at FP32/FP16/INT8/INT4 for our models and reference sizes up
    to 70B ("70B ≈ 140 GB in FP16"), next to the measured bytes of the exported files, scales, code
    books and headers included."""
    with stage(context, mlflow, config.model_dump()) as s:
        files = {model_export.model: {v: f"{e['path']}/model.safetensors" for v, e in model_export.exports.items()}}
        params = {r["model"]: int(r["params"]) for r in quantized_models.rows if r["variant"] == "fp32"}
        reference = {_size_name(n): n for n in config.reference_params}
        result = arithmetic_of(files, params, reference)
        s.run.log_metrics(result.metrics)
        headline = {
            k: v
            for k, v in result.metrics.items()
            if k.startswith("arith/70B/") or k.endswith("/bits_per_quantized_param")
        }
        return s.publish(
            WeightsArithmetic(reference=result.reference_rows, measured=result.measured_rows),
            metrics=headline,
            tables={"reference_sizes": _table(result.reference_rows), "measured_files": _table(result.measured_rows)},
            figures={"weights_arithmetic": result.figure},
            texts={"report": result.markdown},
        )


def _size_name(n: float) -> str:
    return f"{n / 1e9:g}B" if n >= 1e9 else f"{n / 1e6:g}M"
