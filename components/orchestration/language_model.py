"""A Dagster Component type: one language-model asset per YAML instance.

RNN, LSTM and Transformer assets are instances of `LanguageModel`, declared in
`pipelines/defs/<name>/defs.yaml`. Each instance names its model family and the defaults of its
model and training settings; the run config (configs/*.yaml) can still override every field. A
new model variant is a new defs.yaml, not new code.

Every instance trains through the one shared loop (`components.core.training.train`), logs the
shared metric names to MLflow and writes `.safetensors` weights into its run-scoped folder.
"""

import shutil
from pathlib import Path
from typing import Any, Callable, Literal

import dagster as dg
from pydantic import Field, create_model

from components.core.errors import PipelineInputError
from components.core.labels import load_labels
from components.core.models.recurrent import RecurrentLM, RecurrentSettings, lstm_gate_callback
from components.core.models.recurrent import size_for_budget as recurrent_size_for_budget
from components.core.models.transformer import SamplingSettings, TransformerSettings, train_transformer_lm
from components.core.models.transformer import size_for_budget as transformer_size_for_budget
from components.core.tokenizer import load_tokenizer
from components.core.training import TrainSettings, seed_everything, train

from .stage import Stage, stage
from .state import state_root
from .tracking import MlflowTracker, config_hash


class RecurrentModelConfig(dg.Config, RecurrentSettings):
    """RNN / LSTM architecture."""


class TransformerModelConfig(dg.Config, TransformerSettings):
    """Transformer architecture."""


class TrainConfig(dg.Config, TrainSettings):
    """The shared training loop."""


class SamplingConfig(dg.Config, SamplingSettings):
    """Text samples drawn after training."""


FAMILY_MODEL_CONFIG = {"recurrent": RecurrentModelConfig, "transformer": TransformerModelConfig}


def with_defaults(name: str, base: type, defaults: dict[str, Any], where: str) -> type:
    """A subclass of the config class `base` whose field defaults are `defaults` (validated now)."""
    unknown = sorted(set(defaults) - set(base.model_fields))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown} for {base.__name__}; valid: {sorted(base.model_fields)}")
    base(**defaults)  # raises, naming the field, if a value is invalid
    fields = {
        k: (base.model_fields[k].annotation, Field(v, description=base.model_fields[k].description))
        for k, v in defaults.items()
    }
    return create_model(name, __base__=base, **fields)


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


def check_same_tokenizer(labels: dict, tokenizer: dict) -> None:
    if labels["tokenizer_sha256"] != tokenizer["sha256"]:
        raise PipelineInputError(
            f"the labels at {labels['path']} were built with tokenizer {labels['tokenizer_sha256'][:12]}…, but the "
            f"current tokenizer is {tokenizer['sha256'][:12]}… ({tokenizer['path']}): the token ids mean different "
            "things. Re-materialize `labels` (or the whole graph) first."
        )


def scratch_dir(asset: str, identity: dict[str, Any]) -> Path:
    """Where an interrupted training of this exact (config, labels) resumes from; removed on success."""
    return state_root() / "checkpoints" / asset / config_hash(identity)


def _history_summary(history: list[dict]) -> list[dict]:
    keep = ("step", "step_ms", "train/loss", "val/loss", "val/ppl", "tokens_per_s", "lr", "grad_norm")
    return [{k: h[k] for k in keep if k in h} for h in history]


def _metrics_md(metrics: dict[str, float]) -> dg.MetadataValue:
    rows = "\n".join(f"| `{k}` | {v:.6g} |" for k, v in sorted(metrics.items()))
    return dg.MetadataValue.md("| metric | value |\n|---|---|\n" + rows)


def train_recurrent(s: Stage, config: Any, labels: dict, tokenizer: dict, scratch: Path) -> tuple[dict, dict]:
    train_data, val_data, meta = load_labels(labels["path"])
    vocab = int(meta["vocab_size"])
    settings = TrainSettings(**config.train.model_dump())
    model_cfg = recurrent_size_for_budget(RecurrentSettings(**config.model.model_dump()), vocab)
    seed_everything(settings.seed)
    model = RecurrentLM(model_cfg, vocab)
    explicit = model_cfg.cell == "lstm" and model_cfg.lstm_impl == "explicit"
    result = train(
        model,
        train_data,
        val_data,
        settings,
        scratch,
        log_metrics=s.run.log_metrics,
        model_meta={"tokenizer_sha256": labels["tokenizer_sha256"]},
        step_callback=lstm_gate_callback if explicit else None,
    )
    metadata = {name: s.figure(fig, name) for name, fig in result.figures.items()}  # the loop's loss curve
    if result.warnings:
        metadata["warnings"] = dg.MetadataValue.md("\n".join(f"- {w}" for w in result.warnings))
    gates = [h for h in result.history if "lstm/gate_forget" in h]
    if gates:
        metadata["gate_means_last"] = {k: gates[-1][k] for k in gates[-1] if k.startswith("lstm/gate")}
    return {"metrics": result.metrics(), "model_config": model_cfg.model_dump(), "history": result.history}, metadata


def train_transformer(s: Stage, config: Any, labels: dict, tokenizer: dict, scratch: Path) -> tuple[dict, dict]:
    train_data, val_data, meta = load_labels(labels["path"])
    vocab = int(meta["vocab_size"])
    tok = load_tokenizer(tokenizer["path"])
    model_cfg = transformer_size_for_budget(TransformerSettings(**config.model.model_dump()), vocab)
    result = train_transformer_lm(
        model_cfg,
        TrainSettings(**config.train.model_dump()),
        train_data,
        val_data,
        vocab,
        scratch,
        sampling=SamplingSettings(**config.sampling.model_dump()),
        decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
        encode=lambda text: tok.encode(text, add_special_tokens=False).ids,
        log_metrics=s.run.log_metrics,
        model_meta={"tokenizer_sha256": labels["tokenizer_sha256"]},
    )
    metadata: dict[str, Any] = {name: s.figure(fig, name) for name, fig in result.figures.items()}
    s.run.log_artifact(result.samples_path)
    metadata["samples"] = dg.MetadataValue.md("\n\n".join(f"```\n{t[:600]}\n```" for t in result.samples))
    metadata["attention_backend"] = str(result.attention_backend.get("observed", result.attention_backend))
    if result.warnings:
        metadata["warnings"] = dg.MetadataValue.md("\n".join(f"- {w}" for w in result.warnings))
    shutil.copy(result.samples_path, s.tmp / "samples.txt")
    out = {
        "metrics": result.metrics,
        "model_config": result.config.model_dump(),
        "history": result.history,
        "attention_backend": result.attention_backend,
    }
    return out, metadata


RUNNERS: dict[str, Callable[..., tuple[dict, dict]]] = {"recurrent": train_recurrent, "transformer": train_transformer}


def language_model_asset(
    name: str,
    family: Literal["recurrent", "transformer"],
    model: dict[str, Any],
    train: dict[str, Any],
    sampling: dict[str, Any],
    description: str,
    group: str,
) -> dg.AssetsDefinition:
    where = f"language model `{name}`"
    model_cls = with_defaults(f"{_camel(name)}ModelConfig", FAMILY_MODEL_CONFIG[family], model, where)
    train_cls = with_defaults(f"{_camel(name)}TrainConfig", TrainConfig, train, where)
    fields: dict[str, Any] = {"model": (model_cls, model_cls()), "train": (train_cls, train_cls())}
    if family == "transformer":
        sampling_cls = with_defaults(f"{_camel(name)}SamplingConfig", SamplingConfig, sampling, where)
        fields["sampling"] = (sampling_cls, sampling_cls())
    elif sampling:
        raise ValueError(f"{where}: `sampling` applies to the transformer family only")
    config_cls = create_model(f"{_camel(name)}Config", __base__=dg.Config, **fields)
    runner = RUNNERS[family]

    @dg.asset(
        name=name,
        group_name=group,
        description=description,
        kinds={"pytorch", "safetensors"},
        io_manager_key="manifest_io",
        automation_condition=dg.AutomationCondition.eager(),
    )
    def _lm(context: dg.AssetExecutionContext, config: config_cls, labels: dict, tokenizer: dict, mlflow: MlflowTracker) -> dg.Output[dict]:
        check_same_tokenizer(labels, tokenizer)
        params = {**config.model_dump(), "family": family, "labels_path": labels["path"]}
        scratch = scratch_dir(name, params)
        with stage(context, mlflow, params) as s:
            out, metadata = runner(s, config, labels, tokenizer, scratch)
            shutil.move(str(scratch / "checkpoint"), str(s.tmp / "checkpoint"))
            weights = s.tmp / "checkpoint" / "model.safetensors"
            s.run.log_artifact(weights, "checkpoint")
            metrics = out["metrics"]
            meta = {
                "params": int(metrics["params"]),
                "val_loss": metrics["val/loss"],
                "val_ppl": metrics["val/ppl"],
                "tokens_per_s": metrics["tokens_per_s"],
                "metrics": _metrics_md(metrics),
                **metadata,
                **s.file_metadata("weights", weights),
                **s.run.metadata(),
            }
            manifest = {
                "name": name,
                "family": family,
                "weights": s.final_path(weights),
                "tokenizer_sha256": labels["tokenizer_sha256"],
                "vocab_size": labels["vocab_size"],
                **{k: v for k, v in out.items() if k != "history"},
                "history": _history_summary(out["history"]),
            }
        shutil.rmtree(scratch, ignore_errors=True)
        return dg.Output(manifest, metadata=meta)

    return _lm


class LanguageModel(dg.Component, dg.Model, dg.Resolvable):
    """A language-model asset trained on `labels` through the shared loop.

    Attributes (defs.yaml):
      name: the asset name (e.g. rnn_lm)
      family: recurrent | transformer
      architecture / training / sampling: default settings (any field of the family's config classes)
    """

    name: str
    family: Literal["recurrent", "transformer"]
    description: str = ""
    group: str = "models"
    architecture: dict[str, Any] = {}
    training: dict[str, Any] = {}
    sampling: dict[str, Any] = {}

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return dg.Definitions(
            assets=[
                language_model_asset(
                    self.name, self.family, self.architecture, self.training, self.sampling, self.description or self.name, self.group
                )
            ]
        )
