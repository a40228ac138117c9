"""A Dagster Component type: one language-model asset per YAML instance.

RNN, LSTM and Transformer assets are instances of `LanguageModel`, declared in
`pipelines/defs/<name>/defs.yaml`. Each instance names its model family and the defaults of its
model and training settings; the run config (configs/*.yaml) can still override every field. A
new model variant is a new defs.yaml, not new code: it trains through the one driver
(`components.core.lm.train_lm`), is tagged as a language model, and so joins `model_comparison`.

Resume: an interrupted training continues from a scratch checkpoint whose key is the content of
what it trains on (the labels' and tokenizer's hashes, the settings), not a path, so a rerun from any
launcher finds it; a lock on that key makes two runs of the same training wait for each other
instead of writing the same folder. The final folder holds the weights (config in their header),
not the optimizer state.
"""


import fcntl
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal

import dagster as dg
from pydantic import create_model
from pydantic.fields import FieldInfo

from components.core.errors import PipelineInputError
from components.core.labels import load_labels
from components.core.lm import SamplingSettings, train_lm
from components.core.models.recurrent import RecurrentSettings
from components.core.models.transformer import TransformerSettings
from components.core.tokenizer import load_tokenizer
from components.core.training import WEIGHTS_FILE, TrainSettings

from .checks import claim_spec, judged
from .stage import stage
from .state import state_root
from .tracking import MlflowTracker, config_hash

LM_TAG = "pipeline/language_model"  # tag key every language-model asset carries (value: family)
TRAINING_POOL = "training"  # one training at a time per device (pool limit in dagster.yaml)
LM_CLAIMS = ("better_than_uniform", "clipping_bounds_gradient")  # judged on every language model by its own step


class RecurrentModelConfig(dg.Config, RecurrentSettings):
    """RNN / LSTM architecture."""


class TransformerModelConfig(dg.Config, TransformerSettings):
    """Transformer architecture."""


class TrainConfig(dg.Config, TrainSettings):
    """The shared training loop."""


class SamplingConfig(dg.Config, SamplingSettings):
    """Text samples drawn after training."""


FAMILY_MODEL_CONFIG = {"recurrent": RecurrentModelConfig, "transformer": TransformerModelConfig}
FAMILY_SETTINGS = {"recurrent": RecurrentSettings, "transformer": TransformerSettings}


def with_defaults(name: str, base: type, defaults: dict[str, Any], where: str) -> type:
    """A subclass of the config class `base` whose field defaults are `defaults` (validated now)."""
    unknown = sorted(set(defaults) - set(base.model_fields))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown} for {base.__name__}; valid: {sorted(base.model_fields)}")
    base(**defaults)  # raises, naming the field, if a value is invalid
    # The base field with only its default replaced: constraints (ge=..., Literal) and descriptions stay.
    fields = {k: (base.model_fields[k].annotation, FieldInfo.merge_field_infos(base.model_fields[k], default=v)) for k, v in defaults.items()}
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


def content_identity(labels: dict, tokenizer: dict) -> dict[str, str]:
    """What a model is trained on, by content: the hashes of the label arrays and the tokenizer."""
    return {
        "labels": config_hash({k: v["sha256"] for k, v in sorted(labels.get("files", {}).items())}),
        "tokenizer_sha256": tokenizer["sha256"],
    }


def scratch_dir(asset: str, identity: dict[str, Any]) -> Path:
    """Where an interrupted training of this exact (settings, data content) resumes from; removed on success."""
    return state_root() / "checkpoints" / asset / config_hash(identity)


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`.lock (released by the kernel if the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _history_summary(history: list[dict]) -> list[dict]:
    keep = ("step", "step_ms", "train/loss", "val/loss", "val/ppl", "tokens_per_s", "lr", "grad_norm", "grad_norm_clipped")
    return [{k: h[k] for k in keep if k in h} for h in history]


def language_model_asset(
    name: str,
    family: Literal["recurrent", "transformer"],
    model: dict[str, Any],
    train: dict[str, Any],
    sampling: dict[str, Any],
    description: str,
    group: str,
    labels: str = "labels",
    tokenizer: str = "tokenizer",
) -> dg.AssetsDefinition:
    """labels, tokenizer: the assets it trains on (`sharded_labels` and `shard_tokenizer` for a
    sharded corpus: the labels are then one memory-mapped view over every shard)."""
    where = f"language model `{name}`"
    model_cls = with_defaults(f"{_camel(name)}ModelConfig", FAMILY_MODEL_CONFIG[family], model, where)
    train_cls = with_defaults(f"{_camel(name)}TrainConfig", TrainConfig, train, where)
    sampling_cls = with_defaults(f"{_camel(name)}SamplingConfig", SamplingConfig, sampling, where)
    fields: dict[str, Any] = {
        "model": (model_cls, model_cls()),
        "train": (train_cls, train_cls()),
        "sampling": (sampling_cls, sampling_cls()),
    }
    config_cls = create_model(f"{_camel(name)}Config", __base__=dg.Config, **fields)

    @dg.asset(
        name=name,
        group_name=group,
        description=description,
        kinds={"pytorch", "safetensors"},
        tags={LM_TAG: family},
        pool=TRAINING_POOL,
        check_specs=[claim_spec(c, name) for c in LM_CLAIMS],
        ins={"labels": dg.AssetIn(dg.AssetKey(labels)), "tokenizer": dg.AssetIn(dg.AssetKey(tokenizer))},
    )
    def _lm(context: dg.AssetExecutionContext, config: config_cls, labels: dict, tokenizer: dict, mlflow: MlflowTracker):
        check_same_tokenizer(labels, tokenizer)
        settings = config.model_dump()
        identity = {"asset": name, "family": family, **settings, **content_identity(labels, tokenizer)}
        scratch = scratch_dir(name, identity)
        with exclusive(scratch):
            output = _train_and_publish(context, mlflow, config, labels, tokenizer, scratch)
            shutil.rmtree(scratch, ignore_errors=True)  # under the lock: a waiting run starts clean
        yield output
        for c in LM_CLAIMS:
            yield judged(c, output.value)

    def _train_and_publish(context, mlflow, config, labels, tokenizer, scratch) -> dg.Output[dict]:
        settings = config.model_dump()
        with stage(context, mlflow, {**settings, "family": family}) as s:
            train_data, val_data, meta = load_labels(labels["path"])
            tok = load_tokenizer(tokenizer["path"])
            result = train_lm(
                family,
                FAMILY_SETTINGS[family](**config.model.model_dump()),
                TrainSettings(**config.train.model_dump()),
                train_data,
                val_data,
                int(meta["vocab_size"]),
                scratch,
                sampling=SamplingSettings(**config.sampling.model_dump()),
                decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
                encode=lambda text: tok.encode(text, add_special_tokens=False).ids,
                log_metrics=s.run.log_metrics,
                progress=s.progress,
                model_meta={"tokenizer_sha256": labels["tokenizer_sha256"]},
            )
            weights = s.tmp / WEIGHTS_FILE
            shutil.copy2(result.weights_path, weights)  # weights and config only: no optimizer state
            (s.tmp / "samples.txt").write_text("\n\n----------\n\n".join(result.samples) + "\n", encoding="utf-8")
            s.run.log_artifact(weights, "model")
            metrics = result.metrics
            output = s.publish(
                {
                    "name": name,
                    "family": family,
                    "weights": s.final_path(weights),
                    "tokenizer_sha256": labels["tokenizer_sha256"],
                    "vocab_size": labels["vocab_size"],
                    "metrics": metrics,
                    "model_config": result.config.model_dump(),
                    "train_settings": config.train.model_dump(),
                    "attention_backend": result.attention_backend,
                    "resumed_from_step": result.resumed_from_step,
                    "inputs": {"labels": labels["dagster_run_id"], "tokenizer": tokenizer["dagster_run_id"]},
                    "history": _history_summary(result.history),
                },
                metrics=metrics,
                figures=result.figures,
                texts={"samples": "\n\n".join(f"```\n{t[:600]}\n```" for t in result.samples)} if result.samples else None,
                files={"weights": weights, "samples": s.tmp / "samples.txt"},
                artifacts=[s.tmp / "samples.txt"],
                values={
                    "params": int(metrics["params"]),
                    "resumed_from_step": result.resumed_from_step,
                    "attention_backend": str(result.attention_backend.get("observed", result.attention_backend)),
                },
                warnings=result.warnings,
            )
        return output

    return _lm


class LanguageModel(dg.Component, dg.Model, dg.Resolvable):
    """A language-model asset trained on `labels` through the shared loop.

    Attributes (defs.yaml):
      name: the asset name (e.g. rnn_lm)
      family: recurrent | transformer
      architecture / training / sampling: default settings (any field of the family's config classes)
      labels / tokenizer: the assets it trains on (default `labels` and `tokenizer`; `sharded_labels`
        and `shard_tokenizer` train it on a sharded corpus through one memory-mapped view)
    """

    name: str
    family: Literal["recurrent", "transformer"]
    description: str = ""
    group: str = "models"
    architecture: dict[str, Any] = {}
    training: dict[str, Any] = {}
    sampling: dict[str, Any] = {}
    labels: str = "labels"
    tokenizer: str = "tokenizer"

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        asset = language_model_asset(
            self.name, self.family, self.architecture, self.training, self.sampling, self.description or self.name, self.group,
            labels=self.labels, tokenizer=self.tokenizer,
        )
        return dg.Definitions(assets=[asset])
