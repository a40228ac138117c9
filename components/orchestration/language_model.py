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

Data-parallel training: `train.launcher: torchrun` (with `train.nproc_per_node`) trains the same
model in that many processes instead of in the step's process. The asset writes a worker spec
(settings, the labels folder with every file's SHA-256, the tokenizer hash, the scratch folder) and
runs `python -m components.core.distributed launch` — torchrun over
`components.orchestration.ddp_worker` — through `dg.PipesSubprocessClient`, holding the `training`
pool's slot for the whole launch (the step holds it while its body runs). Rank 0 logs the loop's
metrics to this asset's MLflow run and reports the materialization back through Pipes; the asset
checks the hashes it reports, loads the weights, samples and draws as in process, and publishes
once. The launcher settings are not part of the scratch key: a rerun with another nproc_per_node,
or in process, resumes the same checkpoint (`batch_size` is the global batch in both). A rank that
dies fails the step with the launcher's report (which rank, which signal or exception) and keeps the
checkpoint for the rerun.
"""

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

import dagster as dg
from pydantic import Field, create_model
from pydantic.fields import FieldInfo
from tokenizers import Tokenizer

from components.core import manifests as M
from components.core.checkpoint import WEIGHTS_FILE
from components.core.data import Blocks
from components.core.distributed import LaunchSettings
from components.core.errors import PipelineInputError
from components.core.labels import load_labels
from components.core.lm import LMResult, SamplingSettings, explicit_settings_win, train_lm
from components.core.models.recurrent import RecurrentSettings
from components.core.models.transformer import TransformerSettings
from components.core.tokenizer import decode as decode_text
from components.core.tokenizer import encode as encode_text
from components.core.tokenizer import load_tokenizer
from components.core.train_settings import TrainSettings

from .checks import claim_spec, judged
from .lm_registration import register_model
from .lm_regression import REGRESSION_CHECK, REGRESSION_DESCRIPTION, regression_result, seed_spread
from .lm_settings import LAUNCH_FIELDS, effective_architecture, effective_training, logged_settings
from .lm_torchrun import train_torchrun
from .stage import Stage, stage
from .state import state_root
from .tracking import MlflowTracker, config_hash

LM_TAG = "pipeline/language_model"  # tag key every language-model asset carries (value: family)
TRAINING_POOL = "training"  # one training at a time per device (pool limit in dagster.yaml)
# Judged on every language model by its own step.
LM_CLAIMS = ("language_models_beat_the_count_model", "clipping_bounds_gradient")


class RecurrentModelConfig(dg.Config, RecurrentSettings):
    """RNN / LSTM architecture."""


class TransformerModelConfig(dg.Config, TransformerSettings):
    """Transformer architecture."""


class TrainConfig(dg.Config, TrainSettings):
    """The shared training loop."""


DEFAULT_MAX_STEPS = TrainSettings.model_fields["max_steps"].default


class LanguageModelTrainConfig(LaunchSettings, TrainConfig):
    """The shared training loop, in the step's process or data-parallel under torchrun."""

    # None, not a number, by default: any max_steps a config writes, 200 included, is the user's and
    # turns a default flops_budget off (lm.explicit_settings_win compares a setting with its default).
    # (A pydantic field may narrow or widen its base's type; pyright takes class attributes as invariant.)
    max_steps: Optional[int] = Field(  # pyright: ignore[reportIncompatibleVariableOverride]
        default=None,
        ge=1,
        description=f"Optimizer steps to train for (a resume continues up to this). None = the steps "
        f"flops_budget buys, or {DEFAULT_MAX_STEPS} without a budget. Written, it turns a default flops_budget off.",
    )


class SamplingConfig(dg.Config, SamplingSettings):
    """Text samples drawn after training."""


FAMILY_MODEL_CONFIG = {"recurrent": RecurrentModelConfig, "transformer": TransformerModelConfig}
FAMILY_SETTINGS = {"recurrent": RecurrentSettings, "transformer": TransformerSettings}


def with_defaults(name: str, base: type, defaults: dict[str, Any], where: str) -> type:
    """A subclass of the config class `base` whose field defaults are `defaults` (validated now)."""
    unknown = sorted(set(defaults) - set(base.model_fields))
    if unknown:
        raise ValueError(
            f"{where}: unknown setting(s) {unknown} for {base.__name__}; valid: {sorted(base.model_fields)}"
        )
    base(**defaults)  # raises, naming the field, if a value is invalid
    # The base field with only its default replaced: constraints (ge=..., Literal) and descriptions stay.
    fields: dict[str, Any] = {
        k: (base.model_fields[k].annotation, FieldInfo.merge_field_infos(base.model_fields[k], default=v))
        for k, v in defaults.items()
    }
    return create_model(name, __base__=base, **fields)


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


def check_same_tokenizer(labels: M.Labels, tokenizer: M.Tokenizer) -> None:
    if labels.tokenizer_sha256 != tokenizer.sha256:
        raise PipelineInputError(
            f"the labels at {labels.path} were built with tokenizer {labels.tokenizer_sha256[:12]}…, but the "
            f"current tokenizer is {tokenizer.sha256[:12]}… ({tokenizer.path}): the token ids mean different "
            "things. Re-materialize `labels` (or the whole graph) first."
        )


def content_identity(labels: M.Labels, tokenizer: M.Tokenizer) -> dict[str, str]:
    """What a model is trained on, by content: the hashes of the label arrays and the tokenizer."""
    return {
        "labels": config_hash({k: v.sha256 for k, v in sorted(labels.files.items())}),
        "tokenizer_sha256": tokenizer.sha256,
    }


def training_identity(
    asset: str, family: str, settings: dict[str, Any], labels: M.Labels, tokenizer: M.Tokenizer
) -> dict[str, Any]:
    """What a training is, for its checkpoint's key: the asset, the settings and the data's content.
    Not how it is launched: a rerun under the other launcher, with another process count or strategy,
    resumes the same checkpoint (`batch_size` being the global batch)."""
    settings = {**settings, "train": {k: v for k, v in settings["train"].items() if k not in LAUNCH_FIELDS}}
    return {"asset": asset, "family": family, **settings, **content_identity(labels, tokenizer)}


def scratch_dir(asset: str, identity: dict[str, Any]) -> Path:
    """Where an interrupted training of this exact (settings, data content) resumes from; removed on success."""
    return state_root() / "checkpoints" / asset / config_hash(identity)


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`.lock (released by the kernel if the process dies). Retention
    removes a lock file nobody holds (retention.remove_stale_locks): a lock taken on a file that was
    unlinked meanwhile is dropped and taken again on the current one."""
    lock = path.with_name(path.name + ".lock")
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(lock, "a")
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            current = os.stat(lock).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fh.fileno()).st_ino:
            break
        fh.close()
    try:
        yield
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def _history_summary(history: list[dict]) -> list[dict]:
    keep = (
        "step",
        "step_ms",
        "train/loss",
        "val/loss",
        "val/ppl",
        "tokens_per_s",
        "lr",
        "grad_norm",
        "grad_norm_clipped",
    )
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
    baseline: str | None = "ngram_baseline",
) -> dg.AssetsDefinition:
    """labels, tokenizer: the assets it trains on (`sharded_labels` and `shard_tokenizer` for a
    sharded corpus: the labels are then one memory-mapped view over every shard). baseline: the
    n-gram asset counted on the same labels, whose loss the model must beat (None: not judged)."""
    where = f"language model `{name}`"
    model_cls = with_defaults(f"{_camel(name)}ModelConfig", FAMILY_MODEL_CONFIG[family], model, where)
    train_cls = with_defaults(f"{_camel(name)}TrainConfig", LanguageModelTrainConfig, train, where)
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
        check_specs=[
            *(claim_spec(c, name) for c in LM_CLAIMS),
            dg.AssetCheckSpec(REGRESSION_CHECK, asset=name, description=REGRESSION_DESCRIPTION),
        ],
        ins={
            "labels": dg.AssetIn(dg.AssetKey(labels)),
            "tokenizer": dg.AssetIn(dg.AssetKey(tokenizer)),
            **({"baseline": dg.AssetIn(dg.AssetKey(baseline))} if baseline else {}),
        },
    )
    def _lm(
        context: dg.AssetExecutionContext,
        config: config_cls,  # pyright: ignore[reportInvalidTypeForm] (a class built from defs.yaml: Dagster reads it)
        labels: M.Labels,
        tokenizer: M.Tokenizer,
        mlflow: MlflowTracker,
        **baseline_in: M.NgramBaseline,
    ):
        check_same_tokenizer(labels, tokenizer)
        # A width the run config sets is never resized by a default (explicit_settings_win).
        model_settings, train_settings, notes = explicit_settings_win(
            family, config.model, model_cls(), config.train, train_cls()
        )
        for note in notes:
            context.log.warning(note)
        if train_settings.max_steps is None:  # the budget's steps replace it (lm.steps_for_budget)
            train_settings = train_settings.model_copy(update={"max_steps": DEFAULT_MAX_STEPS})
        config = config.model_copy(update={"model": model_settings, "train": train_settings})
        scratch = scratch_dir(name, training_identity(name, family, config.model_dump(), labels, tokenizer))
        with exclusive(scratch):
            output = _train_and_publish(
                context,
                mlflow,
                config,
                labels,
                tokenizer,
                scratch,
                baseline_in.get("baseline"),
                name=name,
                family=family,
                description=description,
            )
            shutil.rmtree(scratch, ignore_errors=True)  # under the lock: a waiting run starts clean
        yield output
        for c in LM_CLAIMS:
            yield judged(c, output.value)
        yield regression_result(output.value)

    return _lm


def _train_and_publish(
    context,
    mlflow,
    config,
    labels,
    tokenizer,
    scratch,
    ngram: M.NgramBaseline | None,
    *,
    name: str,
    family: str,
    description: str,
) -> dg.Output[M.LanguageModel]:
    """The language model's step inside its stage: train (in process or under torchrun), register the
    model, publish the weights, samples and metrics. `name`, `family`, `description`: the asset's."""
    settings = config.model_dump()
    launch = LaunchSettings(**config.train.model_dump(include=set(LAUNCH_FIELDS)))
    train_settings = TrainSettings(**config.train.model_dump(exclude=set(LAUNCH_FIELDS)))
    # The data's identity among the params: runs on different tokenizers compare side by side.
    data = {"vocab_size": labels.vocab_size, "tokenizer_sha256": labels.tokenizer_sha256}
    with stage(context, mlflow, {**logged_settings(settings), "family": family, **data}) as s:
        train_data, val_data, meta = load_labels(labels.path)
        common = _sampling_hooks(config, load_tokenizer(tokenizer.path))
        load_before = machine_load()
        if launch.launcher == "torchrun":
            result, launched = train_torchrun(
                context,
                s,
                mlflow,
                FAMILY_SETTINGS[family](**config.model.model_dump()),
                launch,
                train_settings,
                labels,
                scratch,
                common,
                name=name,
                family=family,
            )
        else:
            result, launched = _train_in_process(
                s, config, family, train_settings, train_data, val_data, meta, labels, scratch, common
            )
        _log_what_trained(s, result, launched)
        weights = s.tmp / WEIGHTS_FILE
        shutil.copy2(result.weights_path, weights)  # weights and config only: no optimizer state
        (s.tmp / "samples.txt").write_text("\n\n----------\n\n".join(result.samples) + "\n", encoding="utf-8")
        metrics = {**result.metrics, **load_figures(load_before, machine_load(), launched.get("world_size", 1))}
        registered = register_model(context, s, weights, tokenizer, result, config, description)
        spread = seed_spread(context.instance, name.removesuffix("_lm"))  # the noise of a rerun, for the change
        output = s.publish(
            M.LanguageModel(
                name=name,
                family=family,
                weights=s.final_path(weights),
                tokenizer_sha256=labels.tokenizer_sha256,
                vocab_size=labels.vocab_size,
                metrics=metrics,
                model_config=result.config.model_dump(),
                train_settings=config.train.model_dump(),
                attention_backend=result.attention_backend,
                resumed_from_step=result.resumed_from_step,
                launch=launched,
                inputs={"labels": labels.dagster_run_id, "tokenizer": tokenizer.dagster_run_id},
                history=_history_summary(result.history),
                registered_model=registered,
                # The count model to beat, on the same validation targets (the claim checks that they are).
                baseline=_ngram_reference(ngram),
            ),
            metrics=metrics,
            figures=result.figures,
            texts={"samples": "\n\n".join(f"```\n{t[:600]}\n```" for t in result.samples)} if result.samples else None,
            files={"weights": weights, "samples": s.tmp / "samples.txt"},
            artifacts=[s.tmp / "samples.txt"],
            values=_published_values(result, metrics, registered, launched),
            warnings=result.warnings + ([LOADED_WARNING.format(**metrics)] if metrics["machine/loaded"] else []),
            spreads={"val/loss": spread} if spread is not None else None,
        )
    return output


def _sampling_hooks(config: Any, tok: Tokenizer) -> dict[str, Any]:
    """What the training samples with, in either launcher: the sampling settings and the tokenizer's
    decode and encode."""
    return dict(
        sampling=SamplingSettings(**config.sampling.model_dump()),
        decode=lambda ids: decode_text(tok, ids, skip_special_tokens=False),  # Chinese without jieba's spaces
        encode=lambda text: encode_text(tok, text),
    )


def _train_in_process(
    s: Stage,
    config: Any,
    family: str,
    train_settings: TrainSettings,
    train_data: Blocks,
    val_data: Blocks,
    meta: dict[str, Any],
    labels: M.Labels,
    scratch: Path,
    common: dict[str, Any],
) -> tuple[LMResult, dict[str, Any]]:
    """Train in the step's process (`train.launcher: inprocess`): the loop logs to the stage's MLflow
    run and its progress to the run's log. Returns the result and how it was launched."""
    result = train_lm(
        family,
        FAMILY_SETTINGS[family](**config.model.model_dump()),
        train_settings,
        train_data,
        val_data,
        int(meta["vocab_size"]),
        scratch,
        log_metrics=s.run.log_progress,
        progress=s.progress,
        model_meta={"tokenizer_sha256": labels.tokenizer_sha256},
        **common,
    )
    launched = {"launcher": "inprocess", "world_size": 1}
    return result, launched


def _log_what_trained(s: Stage, result: LMResult, launched: dict[str, Any]) -> None:
    """The settings as they took effect, logged to the stage's MLflow run beside those requested."""
    # The architecture that trained, beside the requested one (`model.*`): a parameter
    # budget resizes widths, so `model.hidden_size` 256 may have trained 286 wide. And what the
    # training did: the steps it took (a FLOPs budget decides them), the launcher and world size.
    s.run.log_params(
        {
            "resolved": effective_architecture(result.config.model_dump()),
            "train": effective_training(result.metrics, launched),
        }
    )


def _ngram_reference(ngram: M.NgramBaseline | None) -> M.NgramReference | None:
    """The count model the language model must beat, as its manifest records it (None: no baseline)."""
    return (
        M.NgramReference(
            model=ngram.chosen.model,
            val_loss=ngram.val_loss,
            block_size=ngram.block_size,
            n_targets=ngram.n_targets,
            tokenizer_sha256=ngram.tokenizer_sha256,
            ladder=list(ngram.rows),
        )
        if ngram
        else None
    )


def _published_values(
    result: LMResult, metrics: dict[str, Any], registered: dict[str, str], launched: dict[str, Any]
) -> dict[str, Any]:
    """The language model's own Dagster metadata: its registered version and aliases, its size, where
    it resumed, the attention path it took and how it was launched."""
    return {
        "registered_model": registered["uri"],
        "registry_aliases": registered.get("aliases", ""),
        "params": int(metrics["params"]),
        "resumed_from_step": result.resumed_from_step,
        "attention_backend": str(result.attention_backend.get("observed", result.attention_backend)),
        **launched,
    }


# The training speed (train/tokens_per_s_mean) is only comparable between runs on a quiet machine:
# the 1-minute load average before and after training, beside the threads training used. Above
# those threads (+0.75, as the benchmarks judge it), something else competed for the cores.
LOADED_WARNING = (
    "machine loaded while training (1-min load average {machine/load_1m_before:.2f} before, "
    "{machine/load_1m_after:.2f} after, for {machine/threads:.0f} training threads): "
    "train/tokens_per_s_mean is not comparable with a quiet run's"
)


def machine_load() -> float:
    import os

    return os.getloadavg()[0]


def load_figures(before: float, after: float, processes: int = 1) -> dict[str, float]:
    import torch

    threads = torch.get_num_threads() * max(1, int(processes))
    return {
        "machine/load_1m_before": before,
        "machine/load_1m_after": after,
        "machine/threads": float(threads),
        "machine/loaded": float(max(before, after) > threads + 0.75),
    }


class LanguageModel(dg.Component, dg.Model, dg.Resolvable):
    """A language-model asset trained on `labels` through the shared loop.

    Attributes (defs.yaml):
      name: the asset name (e.g. rnn_lm)
      family: recurrent | transformer
      architecture / training / sampling: default settings (any field of the family's config classes)
      labels / tokenizer: the assets it trains on (default `labels` and `tokenizer`; `sharded_labels`
        and `shard_tokenizer` train it on a sharded corpus through one memory-mapped view)
      baseline: the n-gram asset on the same labels its loss must beat (default `ngram_baseline`;
        null: no baseline, the claim is not measured)
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
    baseline: Optional[str] = "ngram_baseline"

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        asset = language_model_asset(
            self.name,
            self.family,
            self.architecture,
            self.training,
            self.sampling,
            self.description or self.name,
            self.group,
            labels=self.labels,
            tokenizer=self.tokenizer,
            baseline=self.baseline,
        )
        return dg.Definitions(assets=[asset])
