"""`lr_sweep` and the `tune` job: each language-model family's learning rate (warmup, batch size)
swept at a fixed budget on the run's own labels, every trial a nested MLflow run. Not part of the
default route (`pipelines.definitions.DEFAULT_ROUTE` leaves the `tune` group out): the default run uses
the values written into the models' `defs.yaml`, with the sweep's MLflow run and date beside them;
the sweep is one job away (`dg launch --job tune`, after a default run has trained the models)."""

import datetime
import shutil
from typing import Callable, Optional

import dagster as dg
from pydantic import Field, model_validator

from components.core.data import TokenBlocks, split_tail
from components.core.errors import PipelineInputError
from components.core.labels import load_labels
from components.core.manifests import Labels, LanguageModel, LrSweep
from components.core.studies.sweep import SweepBudget, SweepSettings, check_grid, lm_trial, run_sweep
from components.orchestration.language_model import TRAINING_POOL
from components.orchestration.stage import Stage, stage
from components.orchestration.tracking import MlflowTracker

GROUP = "tune"
SWEPT = (
    "rnn_lm",
    "lstm_lm",
    "transformer_lm",
)  # one per family; the Transformer variants share transformer_lm's values


# Each family's grid around where its best lay: 3 + 6 + 12 trials. The whole job took 20 min 21 s on
# the 2-core Xeon without AMX and chose the default config's values
# (benchmarks/results/lr_sweep_default_grid_cpu_avx512.json). Smaller batches (more steps of the same FLOPs)
# helped every family at 5.5e12 FLOPs. The RNN's are not tried: its step at batch 8 costs 1.5-1.6x the
# wall time per token (the LSTM's fused step 0.99-1.15x, the Transformer's 1.12x at 4:
# benchmarks/results/batch_step_cost_cpu_avx512.json), more than the default run's 15 minutes hold;
# benchmarks/results/lr_sweep_batch_cpu_avx512.json has its trials at 8.
GRID_LRS = {
    "rnn_lm": [2e-3, 4e-3, 8e-3],
    "lstm_lm": [1.6e-2, 3.2e-2, 6.4e-2],
    "transformer_lm": [1e-3, 1.5e-3, 2e-3, 3e-3],
}
GRID_BATCH_SIZES = {"lstm_lm": [8, 16], "transformer_lm": [4, 8, 16]}


class LrSweepConfig(dg.Config, SweepBudget):
    """The grid and the budget. A model's learning rates are, first found: its `lrs_by_model` entry, the
    global `lrs`, its family's own grid (`GRID_LRS`); batch sizes likewise (`batch_sizes_by_model`,
    `batch_sizes`, `GRID_BATCH_SIZES`, then [16]). A list you give is never replaced, and an empty one
    is refused."""

    models: list[str] = Field(default=list(SWEPT), description=f"Language models to sweep (of {list(SWEPT)}).")
    heldout_fraction: float = Field(
        default=0.1,
        gt=0,
        lt=0.5,
        description="The last fraction of the training blocks the trials are scored on (and do not train on): the "
        "choices are made on data no claim judges, never on the validation split.",
    )
    lrs: Optional[list[float]] = Field(
        default=None,
        description="Peak learning rates for every model without its own `lrs_by_model` entry; null: each family's "
        f"own grid ({GRID_LRS}).",
    )
    batch_sizes: Optional[list[int]] = Field(
        default=None,
        description="Batch sizes for every model without its own `batch_sizes_by_model` entry; null: each family's "
        f"own ({GRID_BATCH_SIZES}, else [16]). At a model's flops_budget each size trains the steps the budget buys.",
    )
    lrs_by_model: dict[str, list[float]] = Field(
        default={}, description="A model's own learning rates, in place of `lrs` and its family's grid."
    )
    batch_sizes_by_model: dict[str, list[int]] = Field(
        default={}, description="A model's own batch sizes, in place of `batch_sizes` and its family's."
    )

    @model_validator(mode="after")
    def _known_models(self) -> "LrSweepConfig":
        # Refused when the run's config is read, before any input is loaded or any trial trains.
        for field_name, names in (
            ("models", self.models),
            ("lrs_by_model", self.lrs_by_model),
            ("batch_sizes_by_model", self.batch_sizes_by_model),
        ):
            unknown = sorted(set(names) - set(SWEPT))
            if unknown:
                raise ValueError(f"lr_sweep.{field_name} names {unknown}; valid: {list(SWEPT)}")
        if not self.models:
            raise ValueError(f"lr_sweep.models is empty: name at least one of {list(SWEPT)}")
        for field_name, value in (
            ("lrs", self.lrs),
            ("batch_sizes", self.batch_sizes),
            *((f"lrs_by_model[{n}]", v) for n, v in self.lrs_by_model.items()),
            *((f"batch_sizes_by_model[{n}]", v) for n, v in self.batch_sizes_by_model.items()),
        ):
            if value is not None and not value:
                raise ValueError(f"lr_sweep.{field_name} is empty: give at least one value, or leave it out")
        for name in self.models:
            check_grid(self.for_model(name), where=f"lr_sweep[{name}]")
        return self

    def for_model(self, name: str) -> SweepSettings:
        fields = {k: v for k, v in self.model_dump().items() if k in SweepSettings.model_fields}
        lrs = self.lrs_by_model.get(name) or self.lrs or GRID_LRS.get(name)
        batches = self.batch_sizes_by_model.get(name) or self.batch_sizes or GRID_BATCH_SIZES.get(name)
        fields["lrs"] = lrs if lrs is not None else SweepSettings.model_fields["lrs"].default
        fields["batch_sizes"] = batches if batches is not None else SweepSettings.model_fields["batch_sizes"].default
        return SweepSettings(**fields)


def _check_grids(grids: dict[str, SweepSettings], lms: dict[str, LanguageModel]) -> None:
    """Each model's grid checked against the tokens its steps and budget take, before any trial trains."""
    for name, g in grids.items():  # every grid checked before any trial trains, at the context it trained at
        block = lms[name].context_length or 1
        check_grid(
            g,
            where=f"lr_sweep[{name}]",
            tokens_per_step=max(g.batch_sizes) * block,
            budget_tokens=g.max_steps * g.batch_sizes[0] * block,
        )


def _trial_logger(
    context: dg.AssetExecutionContext, s: Stage, name: str, budget: float | None
) -> Callable[[dict], None]:
    """What `run_sweep` calls after each of `name`'s trials: a line in the run's log and a finished MLflow
    run nested under the sweep's (held-out loss, the trial's settings, its held-out loss curve)."""

    def log(row: dict) -> None:
        context.log.info(
            f"{name}: batch {row['batch_size']}, lr {row['lr']:g}, warmup {row['warmup_steps']}: "
            f"held-out loss {row['val_loss']:.4f}"
        )
        s.run.child(
            f"{name} batch={row['batch_size']} lr={row['lr']:g} warmup={row['warmup_steps']}",
            {
                "heldout/loss": row["val_loss"],  # the training split's held-out tail, not validation
                **({"train/tokens_per_s_mean": row["tokens_per_s"]} if "tokens_per_s" in row else {}),
            },
            params={
                "model": name,
                "lr": row["lr"],
                "min_lr": row["min_lr"],
                "warmup_steps": row["warmup_steps"],
                "steps": row.get("steps", row["max_steps"]),
                **({"flops_budget": budget} if budget else {}),
                "batch_size": row["batch_size"],
            },
            series={"heldout/loss": [(int(a), float(b)) for a, b in row.get("history", [])]},
        )

    return log


@dg.asset(group_name=GROUP, kinds={"pytorch"}, pool=TRAINING_POOL, ins={m: dg.AssetIn(dg.AssetKey(m)) for m in SWEPT})
def lr_sweep(
    context: dg.AssetExecutionContext,
    config: LrSweepConfig,
    labels: Labels,
    mlflow: MlflowTracker,
    **lms: LanguageModel,
) -> dg.Output[LrSweep]:
    """For each model: its architecture and training settings as trained, retrained at every (batch
    size, warmup, lr) of its grid at its budget (its flops_budget, else `max_steps`), each with a full
    schedule ending there; trained on the training split less its last `heldout_fraction` and scored
    on that held-out tail (the validation split, which the claims judge, is never used to choose).
    The chosen values, and the `defs.yaml` lines that set them, are published."""
    grids = {name: config.for_model(name) for name in config.models}
    _check_grids(grids, lms)
    with stage(context, mlflow, config.model_dump()) as s:
        train_all, _, meta = load_labels(labels.path)
        if not isinstance(train_all, TokenBlocks):
            raise PipelineInputError(
                f"labels folder {labels.path} holds sharded labels; the sweep splits `labels`' own .npy arrays"
            )
        train, heldout = split_tail(train_all, config.heldout_fraction)
        context.log.info(
            f"trials train on {train.n_blocks} blocks and are scored on the held-out last "
            f"{heldout.n_blocks} ({config.heldout_fraction:.0%}) of the training split"
        )
        chosen, rows, figures, texts, budgets = {}, [], {}, {}, {}
        for name in config.models:
            m = lms[name]
            base = {k: v for k, v in m.train_settings.items() if k not in ("launcher", "nproc_per_node", "strategy")}
            trial = lm_trial(
                m.family,
                m.model_config,
                base,
                train,
                heldout,
                int(meta["vocab_size"]),
                s.tmp / name,
                model_meta={"tokenizer_sha256": labels.tokenizer_sha256},
            )
            log = _trial_logger(context, s, name, base.get("flops_budget"))
            settings = grids[name]
            result = run_sweep(settings, trial, where=f"lr_sweep[{name}]", log=log)
            shutil.rmtree(s.tmp / name, ignore_errors=True)  # trial checkpoints: only the losses are kept
            b = result.best
            chosen[name] = {
                "lr": b["lr"],
                "min_lr": b["min_lr"],
                "warmup_steps": b["warmup_steps"],
                "batch_size": b["batch_size"],
                "val_loss": b["val_loss"],
                "at_grid_edge": float(result.at_edge),
                "steps": float(b.get("steps", settings.max_steps)),
            }
            flops = base.get("flops_budget")
            budgets[name] = (
                f"{flops:.3g} FLOPs ({int(chosen[name]['steps'])} steps)" if flops else f"{settings.max_steps} steps"
            )
            rows += [
                {
                    "model": name,
                    **{k: t[k] for k in ("batch_size", "lr", "warmup_steps", "val_loss")},
                    "steps": t.get("steps", t["max_steps"]),
                    "chosen": t is b,
                }
                for t in result.trials
            ]
            figures[f"sweep_{name}"] = result.figures["sweep"]
            texts[f"sweep_{name}"] = result.markdown()
        url, day = s.run.url, datetime.date.today().isoformat()
        texts["defs_yaml"] = "\n\n".join(
            f"`pipelines/defs/{n}/defs.yaml`, under `training:`\n```yaml\n    batch_size: {c['batch_size']}\n"
            f"    lr: {c['lr']:g}  # lr_sweep {day}, {budgets[n]}: {url}\n"
            f"    min_lr: {c['min_lr']:g}\n    warmup_steps: {c['warmup_steps']}\n```"
            for n, c in chosen.items()
        )
        return s.publish(
            LrSweep(chosen=chosen, trials=rows, budget_steps=config.max_steps, mlflow_url=url),
            metrics={f"{n}/chosen_lr": c["lr"] for n, c in chosen.items()}
            | {f"{n}/val_loss": c["val_loss"] for n, c in chosen.items()}
            | {f"{n}/at_grid_edge": c["at_grid_edge"] for n, c in chosen.items()},
            tables={"trials": rows},
            figures=figures,
            texts=texts,
        )


tune_job = dg.define_asset_job(
    "tune",
    selection=dg.AssetSelection.groups(GROUP),
    description="Sweep each language-model family's learning rate, warmup and batch size at a fixed budget (after "
    "a default run trained the models).",
)
