"""`model_comparison`: every language-model asset of the graph (each asset tagged as one by the
`LanguageModel` component), side by side. Built after the defs folder is loaded, so a new
`defs.yaml` joins the comparison with no code change."""

import shutil
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from components.core.labels import load_labels
from components.core.lm import load_lm
from components.core.manifests import Labels, LanguageModel, ModelComparison, NgramBaseline, SeedSpread, typed_row
from components.core.models.transformer import require_transformer
from components.core.studies.ablation_tables import accounting_markdown
from components.core.studies.comparison import compare_models, parameter_split, tiers_text, train_other_seeds
from components.core.studies.transformer_probes import parameter_accounting
from components.orchestration.language_model import LM_TAG, TRAINING_POOL
from components.orchestration.lm_settings import effective_architecture
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "transformer"


def model_name(asset_name: str) -> str:
    return asset_name.removesuffix("_lm")


def language_model_keys(defs: dg.Definitions) -> list[dg.AssetKey]:
    """The keys of the assets tagged as language models (read from the definitions, nothing resolved)."""
    specs = (spec for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition) for spec in a.specs)
    return sorted((spec.key for spec in specs if LM_TAG in spec.tags), key=lambda k: k.to_user_string())


class ModelComparisonConfig(dg.Config):
    """Seeds: the same models trained again with other seeds give the seed-to-seed spread of their
    validation loss, against which the differences between models are judged."""

    extra_seeds: list[int] = Field(
        default=[7],
        description="Train the `seed_models` again with each of these seeds (same settings, data and steps) and report "
        "the spread of their final validation loss; empty = one seed, no spread.",
    )
    seed_models: list[str] = Field(
        default=["rnn", "transformer"],
        description="Models (asset name without `_lm`) retrained with `extra_seeds`; empty = all. "
        "The others are given the largest spread measured.",
    )
    seed_workers: int = Field(
        default=2,
        ge=1,
        description="Processes the retrainings run in side by side, one torch thread each (on 2 cores two at once "
        "finish in about 0.8× the time of one after the other at two threads); 1: one after the other here.",
    )


def model_comparison_asset(lm_keys: list[dg.AssetKey]) -> dg.AssetsDefinition:
    ins = {k.path[-1]: dg.AssetIn(k) for k in lm_keys}
    ins["labels"] = dg.AssetIn(dg.AssetKey("labels"))
    ins["ngram_baseline"] = dg.AssetIn(dg.AssetKey("ngram_baseline"))

    # In the training pool: with extra seeds it trains, and it must not share the cores with another training.
    @dg.asset(name="model_comparison", group_name=GROUP, kinds={"pytorch"}, ins=ins, pool=TRAINING_POOL)
    def model_comparison(
        context: dg.AssetExecutionContext,
        config: ModelComparisonConfig,
        mlflow: MlflowTracker,
        labels: Labels,
        ngram_baseline: NgramBaseline,
        **lms: LanguageModel,
    ) -> dg.Output[ModelComparison]:
        """Every language model of the graph on the same labels at matched parameter budgets and
        matched wall-clock: val loss, perplexity, tokens/s, parameters, with the seed-to-seed spread
        when `extra_seeds` is set; plus each Transformer's parameter accounting per component and its
        FFN share."""
        models = {model_name(k): m for k, m in lms.items()}
        hashes = _check_models(models, config)
        with stage(context, mlflow, {"models": sorted(models), **config.model_dump()}) as s:
            seed_losses = _seed_losses(context, config, models, hashes, labels, s.tmp) if config.extra_seeds else None
            # The count ladder is rows and lines only where it was scored on the models' own targets.
            same = (
                all(m.val_targets == ngram_baseline.n_targets for m in models.values())
                and ngram_baseline.tokenizer_sha256 in hashes
            )
            result = compare_models(models, seed_losses, ngram_baseline if same else None)
            if not same:
                context.log.warning(
                    "ngram_baseline was scored on other validation targets than the models: left out of the comparison"
                )
            accounting, metrics = _parameter_accounting(models, result)
            _log_model_runs(s.run, models, result)
            st = result.settledness
            values, loaded, settled = _ranking_values(st, models)
            return s.publish(
                ModelComparison(
                    rows=result.rows,
                    matched_time_s=result.matched_time_s,
                    accounting=accounting,
                    settledness=st,
                    seeds={n: typed_row(SeedSpread, v) for n, v in result.seeds.items()},
                    baseline=result.baseline,
                    pairs=result.pairs,
                ),
                metrics=metrics,
                tables={"comparison": result.rows + result.baseline, "pairs": result.pairs},
                figures=result.figures,
                texts={
                    "summary": result.markdown(),
                    **{f"parameter_accounting_{n}": accounting_markdown(a) for n, a in accounting.items()},
                },
                values=values,
                warnings=_warnings(loaded, settled, st),
            )

    return model_comparison


def _check_models(models: dict[str, LanguageModel], config: ModelComparisonConfig) -> set[str]:
    """The one tokenizer hash the models were trained with; fails on several, or on `seed_models`
    naming a model the graph does not have."""
    hashes = {m.tokenizer_sha256 for m in models.values()}
    if len(hashes) != 1:
        raise dg.Failure("the models were trained on labels of different tokenizers; re-materialize them together")
    unknown = sorted(set(config.seed_models) - set(models))
    if unknown:
        raise dg.Failure(
            f"model_comparison.seed_models names {unknown}, which are not language models of the graph; "
            f"valid: {sorted(models)}"
        )
    return hashes


def _seed_losses(
    context: dg.AssetExecutionContext,
    config: ModelComparisonConfig,
    models: dict[str, LanguageModel],
    hashes: set[str],
    labels: Labels,
    tmp: Path,
) -> Any:
    """The `seed_models` trained again with each of `extra_seeds` (scratch under `tmp`, removed after):
    their final validation losses."""
    if labels.tokenizer_sha256 not in hashes:
        raise dg.Failure(
            "`labels` were built with another tokenizer than the models were trained with: "
            "re-materialize the models (or the whole graph) before retraining them with other seeds"
        )
    train, val, meta = load_labels(labels.path)
    chosen = {n: m for n, m in models.items() if n in (config.seed_models or models)}
    seed_losses = train_other_seeds(
        chosen,
        config.extra_seeds,
        train,
        val,
        int(meta["vocab_size"]),
        tmp / "seeds",
        model_meta={"tokenizer_sha256": labels.tokenizer_sha256},
        log=context.log.info,
        workers=config.seed_workers,
    )
    shutil.rmtree(tmp / "seeds")  # scratch checkpoints: only the losses are kept
    return seed_losses


def _parameter_accounting(models: dict[str, LanguageModel], result: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each Transformer's parameter accounting, and where each model's budget sits (embedding,
    output head, core: added to its row of `result`); with the comparison's metrics."""
    accounting = {
        n: parameter_accounting(require_transformer(load_lm(m.weights), f"{n}'s parameter accounting"))
        for n, m in models.items()
        if m.family == "transformer"
    }
    split = {n: parameter_split(load_lm(m.weights)) for n, m in models.items()}
    for row in result.rows:  # where each model's budget sits: embedding, output head, core
        row.update({f"params_{k}": v for k, v in split[row["model"]].items() if k != "total"})
    metrics: dict[str, Any] = dict(result.metrics())
    metrics.update({f"{n}/ffn_share": a["ffn_share"] for n, a in accounting.items()})
    metrics.update({f"{n}/params_{k}": float(v) for n, sp in split.items() for k, v in sp.items() if k != "total"})
    return accounting, metrics


def _log_model_runs(run: Any, models: dict[str, LanguageModel], result: Any) -> None:
    # One child run per model with the shared metric names: MLflow's compare view lines them up.
    # Named `model_comparison/<model>`, so none is mistaken for the model's own run (`<model>_lm`);
    # the trained architecture as `resolved.*`, the name the models' own runs give it.
    for row in result.rows:
        m = models[row["model"]]
        run.child(
            f"model_comparison/{row['model']}",
            {
                "val/loss": row["val_loss"],
                "val/ppl": row["val_ppl"],
                "train/tokens_per_s_mean": row["tokens_per_s_mean"],
                "params": row["params"],
                "val/loss_at_matched_time": row["val_loss_at_matched_time"],
                "machine/loaded": float(m.metrics.get("machine/loaded", 0.0)),
            },
            params={
                "family": m.family,
                **{f"resolved.{k}": v for k, v in effective_architecture(m.model_config).items()},
            },
            series={"val/loss": [(h["step"], h["val/loss"]) for h in m.history if "val/loss" in h]},
        )


def _ranking_values(st: dict[str, Any], models: dict[str, LanguageModel]) -> tuple[dict[str, Any], list[str], Any]:
    """The ranking's metadata values, the models whose speeds were measured on a loaded machine, and
    whether the ranking is settled."""
    # With seeds, a ranking is judged beyond seed noise; without, exactly.
    settled = st.get("ranking_settled_beyond_spread", st.get("ranking_settled"))
    values = {
        "ranking": " < ".join(st.get("ranking_last_eval", [])),
        "ranking_settled": bool(st.get("ranking_settled")),
    }
    if "tiers_last_eval" in st:
        values.update(
            {
                "ranking_beyond_spread": tiers_text(st["tiers_last_eval"]),
                "ranking_settled_beyond_spread": bool(st["ranking_settled_beyond_spread"]),
            }
        )
    # Speeds measured on a loaded machine (the models record their load) are not comparable.
    loaded = sorted(n for n, m in models.items() if m.metrics.get("machine/loaded"))
    values["speeds_measured_loaded"] = ", ".join(loaded) or "none"
    return values, loaded, settled


def _warnings(loaded: list[str], settled: Any, st: dict[str, Any]) -> list[str]:
    return (
        [
            f"tokens_per_s_mean of {', '.join(loaded)} measured on a loaded machine (their runs' "
            f"machine/load_1m_*): "
            "the speeds are not comparable"
        ]
        if loaded
        else []
    ) + (
        []
        if settled
        else [
            "the ranking by validation loss still changes between the last two evaluations"
            + (" beyond the seed-to-seed spread" if "tiers_last_eval" in st else "")
            + f" ({' < '.join(st.get('ranking_previous_eval', []))} → "
            f"{' < '.join(st.get('ranking_last_eval', []))}): "
            "train longer before trusting it"
        ]
    )
