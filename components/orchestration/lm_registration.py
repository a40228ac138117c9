"""A trained language model in the MLflow model registry: its FP32 export folder logged to the
asset's MLflow run and registered as a new version of the model named after the asset, with its
links back to Dagster, and the aliases that say which version to use moved (`registry.move_aliases`)."""

from pathlib import Path
from typing import Any

import dagster as dg

from components.core import manifests as M

from .lm_settings import effective_architecture
from .registry import log_and_register, move_aliases
from .tracking import dagster_asset_url, dagster_run_url

SCHEDULE_TAG = "dagster/schedule_name"  # set on the runs a schedule starts


def register_model(
    context: dg.AssetExecutionContext,
    s: Any,
    weights: Path,
    tokenizer: M.Tokenizer,
    result: Any,
    config: Any,
    description: str,
) -> dict[str, str]:
    """The trained model as an MLflow model (an FP32 export folder: weights, config, tokenizer) of the
    asset's run, registered as a new version of the model named after the asset."""
    import tempfile

    from components.core.export.folder import export_model
    from components.core.lm import load_lm

    name = context.asset_key.to_user_string()
    run_id = context.run.run_id
    links = {
        "dagster.run_id": run_id,
        "dagster.run_url": dagster_run_url(run_id),
        "dagster.asset_url": dagster_asset_url(context.asset_key),
        "family": result.family,
        "val_loss": f"{result.metrics['val/loss']:.4f}",
        "params": str(int(result.metrics["params"])),
        "tokenizer_sha256": tokenizer.sha256,
    }
    provenance = {"asset": name, "dagster_run_id": run_id, "mlflow_run_id": s.run.run_id}
    with tempfile.TemporaryDirectory(prefix=f"{name}-export-") as tmp:  # the run folder keeps only the weights
        folder = Path(tmp) / "model"
        model = load_lm(weights)
        export_model(
            model,
            "fp32",
            folder,
            tokenizer_path=tokenizer.path,
            config=result.config.model_dump(),
            train_settings=config.train.model_dump(),
            provenance=provenance,
            tokenizer_sha256=tokenizer.sha256,
        )
        registered = log_and_register(
            s.run,
            folder,
            name,
            description=f"{description} (asset `{name}`; one version per materialization; alias `champion`: the "
            "lowest validation loss on the same tokenizer, `latest-scheduled`: what the weekly run produced).",
            model_description=(
                f"Dagster run [{run_id[:8]}]({dagster_run_url(run_id)}) (asset "
                f"[{name}]({dagster_asset_url(context.asset_key)})): "
                f"val loss {result.metrics['val/loss']:.4f}."
            ),
            tags=links,
            params={
                "family": result.family,
                "vocab_size": model.vocab_size,
                "tokenizer_sha256": tokenizer.sha256,
                **{f"resolved.{k}": v for k, v in effective_architecture(result.config.model_dump()).items()},
            },
        )
    registered["aliases"] = ", ".join(
        f"{k}={v}"
        for k, v in move_aliases(
            s.run.client, registered["name"], registered["version"], scheduled=bool(context.run.tags.get(SCHEDULE_TAG))
        ).items()
    )
    return registered
