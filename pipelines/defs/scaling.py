"""`scaling_laws` and its jobs: where each neural family passes the count model, and where the Transformer
overtakes the LSTM, per FLOP and per second of training (`components.core.studies.scaling`).

Off the default route, like the `tune` job: it reads the latest materializations of the labels, the
count ladder, the model comparison (the families' seed noise) and the three language models, which a
default run makes. `dg launch --job scaling` (or `python -m pipelines.launch scaling`) runs the CPU grid
(the config class's defaults); a config file of `configs/` with a `scaling_laws:` section under `ops:` gets
its own job `<file>_scaling` with that grid (`configs/gpu.yaml`: a GPU grid over 1,000×).
Every training is a nested MLflow run under the asset's run."""

import shutil

import dagster as dg
from pydantic import Field, model_validator

from components.core.labels import load_labels
from components.core.machine import cpu_identity
from components.core.manifests import Labels, LanguageModel, ModelComparison, NgramBaseline, Scaling
from components.core.studies import scaling as core
from components.core.studies.scaling import FamilyInput
from components.core.studies.scaling_settings import ScalingSettings, check_settings
from components.orchestration.language_model import TRAINING_POOL
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "scaling"
FAMILIES = ("rnn_lm", "lstm_lm", "transformer_lm")  # one per family


class ScalingConfig(dg.Config, ScalingSettings):
    """The budgets, the size rule, the sweeps at the two ends and the bootstrap."""

    models: list[str] = Field(default=list(FAMILIES), description=f"Language models to scale (of {list(FAMILIES)}).")

    @model_validator(mode="after")
    def _grid(self) -> "ScalingConfig":
        # Refused when the run's config is read, before any input is loaded or anything trains.
        unknown = sorted(set(self.models) - set(FAMILIES))
        if unknown or not self.models:
            raise ValueError(f"scaling_laws.models={self.models}: name at least one of {list(FAMILIES)}")
        check_settings(self)
        return self


def family_input(name: str, lm: LanguageModel, comparison: ModelComparison, default_noise: float) -> FamilyInput:
    """A trained model as the study's starting point, with its family's seed noise from the comparison
    (the spread over seeds, or the largest measured when its own was not; `default_noise` if none was)."""
    short = name.removesuffix("_lm")
    spreads = {n: s.spread for n, s in comparison.seeds.items() if s.seeds > 1}
    noise = spreads.get(short) or max(spreads.values(), default=default_noise)
    m = lm.metrics
    return FamilyInput(
        name=name,
        family=lm.family,
        model_config=dict(lm.model_config),
        train_settings=dict(lm.train_settings),
        params=lm.params,
        val_loss=lm.val_loss,
        train_seconds=float(m.get("train/seconds", m["steps"] * m["train/step_ms_mean"] / 1000)),
        flops_per_token=float(m["flops_per_token"]),
        steps=int(m["steps"]),
        noise=float(noise),
        noise_measured=short in spreads,
    )


@dg.asset(
    group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL, ins={m: dg.AssetIn(dg.AssetKey(m)) for m in FAMILIES}
)
def scaling_laws(
    context: dg.AssetExecutionContext,
    config: ScalingConfig,
    labels: Labels,
    ngram_baseline: NgramBaseline,
    model_comparison: ModelComparison,
    mlflow: MlflowTracker,
    **lms: LanguageModel,
) -> dg.Output[Scaling]:
    """Each family trained at every budget with its size growing by the rule, learning rate and batch
    swept at the smallest and the largest budget; loss against FLOPs and against training seconds
    fitted as L∞ + a·C^−α with bootstrap intervals; where each curve passes the count model and where
    the Transformer's passes the LSTM's."""
    models = {n: lms[n] for n in config.models}
    hashes = {m.tokenizer_sha256 for m in models.values()} | {ngram_baseline.tokenizer_sha256, labels.tokenizer_sha256}
    if len(hashes) != 1:
        raise dg.Failure(
            "the language models, the count ladder and the labels come from different tokenizers: "
            "re-materialize them together (a default run) before the scaling job"
        )
    off = [n for n, m in models.items() if m.val_targets != ngram_baseline.n_targets]
    if off:
        raise dg.Failure(f"{off} were scored on other validation targets than the count model: re-materialize them")
    settings = ScalingSettings(**{k: v for k, v in config.model_dump().items() if k in ScalingSettings.model_fields})
    with stage(context, mlflow, config.model_dump()) as s:
        train, val, meta = load_labels(labels.path)
        inputs = [family_input(n, m, model_comparison, settings.default_noise) for n, m in models.items()]

        def log(row: dict) -> None:
            # A sweep trial is scored on the training split's tail (what chooses), a point on validation.
            heldout = row["scored_on"] == "heldout"
            context.log.info(
                f"{row['model']} at {row['budget']:.3g} FLOPs ({row['role']}): batch {row['batch_size']}, "
                f"lr {row['lr']:.3g}, {row['steps']} steps, {row['train_seconds']:.0f} s of training: "
                f"{'held-out' if heldout else 'val'} loss {row['val_loss']:.4f}"
            )
            s.run.child(
                f"{row['model']} {row['budget']:.3g} FLOPs lr={row['lr']:.3g} batch={row['batch_size']} {row['role']}",
                {
                    ("heldout/loss" if heldout else "val/loss"): row["val_loss"],
                    "train/seconds": row["train_seconds"],
                    "train/flops": row["flops"],
                    "params": row["params"],
                    "steps": row["steps"],
                    "epochs": row["epochs"],
                },
                params={
                    "model": row["model"],
                    "budget": row["budget"],
                    "lr": row["lr"],
                    "batch_size": row["batch_size"],
                    "reused": row["reused"],
                    "scored_on": row["scored_on"],
                },
            )

        result = core.run_scaling(
            inputs,
            train,
            val,
            int(meta["vocab_size"]),
            ngram_baseline.chosen,
            ngram_baseline.rows,
            settings,
            s.tmp / "trials",
            model_meta={"tokenizer_sha256": labels.tokenizer_sha256},
            log=log,
        )
        shutil.rmtree(s.tmp / "trials", ignore_errors=True)  # trial checkpoints: only the losses are kept
        manifest = Scaling(
            budgets=result.budgets,
            trials=result.trials,
            families=result.families,
            count_model=result.count_model,
            versus=result.versus,
            tokenizer_sha256=labels.tokenizer_sha256,
            n_targets=ngram_baseline.n_targets,
            settings=result.settings,
            machine=cpu_identity(),
        )
        return s.publish(
            manifest,
            metrics=scaling_metrics(manifest),
            tables={"trials": [vars(t) for t in result.trials]},
            figures=result.figures,
            texts={"summary": core.markdown(result)},
            values={"count_model": result.count_model.model, "budgets": str(result.budgets)},
        )


def scaling_metrics(m: Scaling) -> dict[str, float]:
    out: dict[str, float] = {"count_model/val_loss": m.count_model.val_loss}
    for name, f in m.families.items():
        out[f"{name}/alpha_flops"] = f.fit_flops.alpha
        out[f"{name}/l_inf_flops"] = f.fit_flops.l_inf
        out[f"{name}/passes_count_model_flops"] = f.passes_count_model_flops.median
        out[f"{name}/passes_count_model_seconds"] = f.passes_count_model_seconds.median
    if m.versus:
        out["transformer_passes_lstm_flops"] = m.versus.per_flop.median
        out["transformer_passes_lstm_seconds"] = m.versus.per_second.median
        out["lstm_minus_transformer_at_largest"] = m.versus.lstm_minus_transformer
    return out


scaling_job = dg.define_asset_job(
    "scaling",
    selection=dg.AssetSelection.groups(GROUP),
    description="Train each language-model family at growing FLOP budgets (after a default run trained the models) "
    "and fit where each passes the count model and where the Transformer overtakes the LSTM.",
)
