"""`model_comparison`: every language-model asset of the graph (each asset tagged as one by the
`LanguageModel` component), side by side. Built after the defs folder is loaded, so a new
`defs.yaml` joins the comparison with no code change."""


from typing import Any

import dagster as dg

from components.core.lm import load_lm
from components.core.studies.ablations import accounting_markdown, parameter_accounting
from components.core.studies.comparison import compare_models
from components.orchestration.language_model import LM_TAG
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "transformer"


def model_name(asset_name: str) -> str:
    return asset_name.removesuffix("_lm")


def language_model_keys(defs: dg.Definitions) -> list[dg.AssetKey]:
    """The keys of the assets tagged as language models (read from the definitions, nothing resolved)."""
    specs = (spec for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition) for spec in a.specs)
    return sorted((spec.key for spec in specs if LM_TAG in spec.tags), key=lambda k: k.to_user_string())


def model_comparison_asset(lm_keys: list[dg.AssetKey]) -> tuple[dg.AssetsDefinition, dg.AssetChecksDefinition]:
    ins = {k.path[-1]: dg.AssetIn(k) for k in lm_keys}

    @dg.asset(name="model_comparison", group_name=GROUP, kinds={"pytorch"}, ins=ins)
    def model_comparison(context: dg.AssetExecutionContext, mlflow: MlflowTracker, **lms: dict) -> dg.Output[dict]:
        """Every language model of the graph on the same labels at matched parameter budgets and
        matched wall-clock: val loss, perplexity, tokens/s, parameters; plus each Transformer's
        parameter accounting per component and its FFN share."""
        models = {model_name(k): m for k, m in lms.items()}
        hashes = {m["tokenizer_sha256"] for m in models.values()}
        if len(hashes) != 1:
            raise dg.Failure("the models were trained on labels of different tokenizers; re-materialize them together")
        with stage(context, mlflow, {"models": sorted(models)}) as s:
            result = compare_models(models)
            accounting = {n: parameter_accounting(load_lm(m["weights"])) for n, m in models.items() if m["family"] == "transformer"}
            metrics: dict[str, Any] = dict(result.metrics())
            metrics.update({f"{n}/ffn_share": a["ffn_share"] for n, a in accounting.items()})
            # One child run per model with the shared metric names: MLflow's compare view lines them up.
            for row in result.rows:
                m = models[row["model"]]
                s.run.child(
                    row["model"],
                    {"val/loss": row["val_loss"], "val/ppl": row["val_ppl"], "train/tokens_per_s_mean": row["tokens_per_s_mean"],
                     "params": row["params"], "val/loss_at_matched_time": row["val_loss_at_matched_time"]},
                    params={"family": m["family"], **{f"model.{k}": v for k, v in m["model_config"].items()}},
                    series={"val/loss": [(h["step"], h["val/loss"]) for h in m["history"] if "val/loss" in h]},
                )
            st = result.settledness
            return s.publish(
                {"rows": result.rows, "matched_time_s": result.matched_time_s, "accounting": accounting, "settledness": st},
                metrics=metrics,
                tables={"comparison": result.rows},
                figures=result.figures,
                texts={"summary": result.markdown(), **{f"parameter_accounting_{n}": accounting_markdown(a) for n, a in accounting.items()}},
                values={"ranking": " < ".join(st.get("ranking_last_eval", [])), "ranking_settled": bool(st.get("ranking_settled"))},
                warnings=[] if st.get("ranking_settled") else [
                    f"the ranking by validation loss still changes between the last two evaluations "
                    f"({' < '.join(st.get('ranking_previous_eval', []))} → {' < '.join(st.get('ranking_last_eval', []))}): "
                    "train longer before trusting it"],
            )

    @dg.asset_check(asset=model_comparison, description="The FFN holds about two thirds of each Transformer's block parameters (attention + FFN + norms; measured from the module).")
    def ffn_holds_two_thirds(model_comparison: dict) -> dg.AssetCheckResult:
        shares = {n: a["ffn_share"] for n, a in model_comparison["accounting"].items()}
        return dg.AssetCheckResult(
            passed=bool(shares) and all(abs(v - 2 / 3) < 0.05 for v in shares.values()),
            metadata={f"{n}_ffn_share": v for n, v in shares.items()},
        )

    return model_comparison, ffn_holds_two_thirds
