"""The run-over-run check of a language model's validation loss: not worse than the previous
materialization's by more than the seed spread `model_comparison` measured."""

import dagster as dg

from components.core import manifests as M

from .io import latest_manifest

REGRESSION_CHECK = "val_loss_holds_since_previous_run"
REGRESSION_DESCRIPTION = (
    "Run over run: the validation loss is not worse than the previous materialization's by more than the "
    "seed spread `model_comparison` measured (the largest family spread for a model trained with one seed). "
    "A warning, with the previous value, the change and the spread; passes on a first materialization."
)


def seed_spread(instance: dg.DagsterInstance, model: str) -> float | None:
    """The noise of a rerun of `model` (asset name without `_lm`): its seed spread in the latest
    `model_comparison`, else the largest spread of a family trained with several seeds; None when no
    comparison with seeds can be read."""
    try:
        comp = latest_manifest(instance, dg.AssetKey("model_comparison"), M.ModelComparison)
    except Exception:  # noqa: BLE001 - a pruned or old comparison leaves the change without a noise figure
        return None
    seeded = {k: v for k, v in (comp.seeds if comp else {}).items() if v.seeds > 1}
    if model in seeded:
        return seeded[model].spread
    return max((v.spread for v in seeded.values()), default=None)


def regression_result(lm: M.LanguageModel) -> dg.AssetCheckResult:
    """The run-over-run check of a language model's validation loss (`REGRESSION_CHECK`)."""
    change = lm.published.change_of("val/loss")
    if change is None or change.previous is None or change.delta is None:
        return dg.AssetCheckResult(
            check_name=REGRESSION_CHECK,
            passed=True,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"reason": "first materialization: nothing to compare with"},
            description="first materialization: nothing to compare with",
        )
    line = (
        f"{change.verdict}: val/loss {change.previous:.4f} → {change.current:.4f} "
        f"({change.delta:+.4f}; seed spread "
        f"{'unknown' if change.spread is None else format(change.spread, '.4f')})"
    )
    return dg.AssetCheckResult(
        check_name=REGRESSION_CHECK,
        passed=change.verdict != "worse",
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "reason": line,
            "previous_run_id": lm.published.previous_run_id,
            **{k: v for k, v in change.row().items() if v is not None and k != "name"},
        },
        description=line,
    )
