"""`report`: one HTML page for the whole run, downstream of every other asset. Built after the defs
folder is loaded (like `model_comparison`), so a new asset or `defs.yaml` model joins the report with
no code change.

The page (`components.core.report`) shows the article's claims judged on this run's manifests by the
same functions the asset checks call, then each stage's headline figures, tables and plots. It is
logged on the Dagster run's MLflow parent run, with the headline metrics as the parent's metrics
(`<asset>/<metric>`, plus `claims/passed` …) and the claims' summary as its description, and linked
from Dagster (the file's path, and its view in the MLflow UI).
"""

import dataclasses
from typing import Any

import dagster as dg

from components.core.claims import BY_NAME, Judgement, count_model_at_scale, judge_all
from components.core.manifests import LanguageModel, ModelComparison, NgramBaseline, Report, Scaling
from components.core.report import (
    DataCheck,
    claim_counts,
    demonstration_counts,
    headline_metrics,
    invariant_counts,
    render_report,
    result_html,
    result_markdown,
    result_rows,
    section_from_manifest,
    summary_markdown,
)
from components.orchestration.checks import reason
from components.orchestration.io import latest_manifest
from components.orchestration.stage import since_previous, stage
from components.orchestration.tracking import AssetRun, MlflowTracker, dagster_run_url, job_label, run_subject

GROUP = "report"
REPORT_FILE = "report.html"
# The article's order of the stages (asset groups); a group not listed follows them.
STAGES = ("ingest", "embeddings", "baseline", "recurrent", "transformer", "long_context", "inside", "quantization")


def asset_specs(defs: list[dg.AssetsDefinition]) -> list[dg.AssetSpec]:
    """Every asset's spec, stage by stage (`STAGES`), and within a stage in dependency order
    (upstream first; ties in definition order)."""
    specs = {spec.key: spec for a in defs for spec in a.specs}
    order: list[dg.AssetKey] = []
    done: set[dg.AssetKey] = set()

    def visit(key: dg.AssetKey) -> None:
        if key in done or key not in specs:
            return
        done.add(key)
        for dep in specs[key].deps:
            visit(dep.asset_key)
        order.append(key)

    for key in specs:
        visit(key)
    groups = list(dict.fromkeys(specs[k].group_name for k in order))
    rank = {g: (STAGES.index(g) if g in STAGES else len(STAGES) + groups.index(g)) for g in groups}
    return sorted((specs[k] for k in order), key=lambda s: rank[s.group_name])


COMPARE_KEYS = {
    "mlflow_compare_url": "compare the models in MLflow",
    "mlflow_models_by_val_loss_url": "the models by val/loss in MLflow",
}


def compare_links(run: Any, comparison: Any) -> dict[str, str]:
    """MLflow views of this run's language models side by side, best validation loss first: the compare
    view of `model_comparison`'s child runs (one per model, a handful of metrics and the architecture),
    and the experiment's table of them ordered by `val/loss`. Empty without a comparison."""
    if not isinstance(comparison, ModelComparison) or not comparison.mlflow_run_id:
        return {}
    comp = AssetRun(run.client, comparison.mlflow_run_id, run.experiment_id, run.ui_base)
    children = comp.children_by("val/loss")
    if not children:
        return {}
    return {
        COMPARE_KEYS["mlflow_compare_url"]: comp.compare_url([r.info.run_id for r in children]),
        COMPARE_KEYS["mlflow_models_by_val_loss_url"]: comp.ranked_children_url("val/loss"),
    }


def recorded_checks(context: dg.AssetExecutionContext, skip: set[str]) -> list[DataCheck]:
    """The run's check evaluations recorded so far whose names are not among `skip` (the claims, which
    the report judges itself): the data checks, which run before anything downstream of them."""
    records = context.instance.get_records_for_run(
        context.run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    out = []
    for r in records:
        ev = r.event_log_entry.get_dagster_event().asset_check_evaluation_data
        if ev.check_name not in skip:
            out.append(
                DataCheck(
                    name=ev.check_name,
                    asset=ev.asset_key.to_user_string(),
                    passed=bool(ev.passed),
                    severity=ev.severity.value if ev.severity else "",
                )
            )
    return out


SCALING = dg.AssetKey("scaling_laws")


def latest_scaling(instance: dg.DagsterInstance) -> tuple[Scaling | None, str]:
    """The scaling job's latest run (another job's: a default run does not wait for it), or None and why."""
    try:
        found = latest_manifest(instance, SCALING, Scaling)
    except Exception as e:  # noqa: BLE001 - a pruned or old scaling run leaves its claim not judged, not the report
        return None, f"the latest scaling run cannot be read ({type(e).__name__}: {e})"
    if found is None:
        return None, "no scaling run in this instance: run the `scaling` job (after a default run) to judge it"
    return found, ""


def at_scale(
    judgements: list[Judgement], scaling: Scaling | None, manifests: dict[str, Any], why: str
) -> list[Judgement]:
    """The count-model claims with the compute where the scaling job saw each family pass the count
    model; the scaling claim not judged, with the reason, where there is no scaling run."""
    out = []
    for j in judgements:
        if j.claim.name == "language_models_beat_the_count_model" and j.verdict is not None:
            j = dataclasses.replace(
                j, verdict=count_model_at_scale(j.verdict, j.asset, scaling, manifests[j.asset].tokenizer_sha256)
            )
        elif j.claim.asset == "scaling_laws" and scaling is None:
            j = dataclasses.replace(j, error=why)
        out.append(j)
    return out


def report_asset(specs: list[dg.AssetSpec], lm_keys: list[dg.AssetKey]) -> dg.AssetsDefinition:
    names = [s.key.path[-1] for s in specs]
    group_of = {s.key.path[-1]: s.group_name or "default" for s in specs}
    description_of = {s.key.path[-1]: (s.description or "").strip().split("\n\n")[0] for s in specs}
    language_models = [k.path[-1] for k in lm_keys]

    @dg.asset(name="report", group_name=GROUP, kinds={"html"}, ins={n: dg.AssetIn(s.key) for n, s in zip(names, specs)})
    def report(context: dg.AssetExecutionContext, mlflow: MlflowTracker, **manifests: Any) -> dg.Output[Report]:
        """One HTML page for the whole run: the article's claims with their verdicts on this run
        (judged as the asset checks judge them), then every stage's headline figures, tables and
        plots; logged on the run's MLflow parent run, whose description and metrics it fills."""
        with stage(context, mlflow, {"assets": names}) as s:
            sections = [section_from_manifest(n, group_of[n], manifests[n], description_of[n]) for n in names]
            scaling, why = latest_scaling(context.instance)
            judgements = at_scale(
                judge_all({**manifests, **({"scaling_laws": scaling} if scaling else {})}, language_models),
                scaling,
                manifests,
                why,
            )
            parent = s.run.parent()
            run = context.run
            title = f"Run report: {job_label(run.job_name)} · {run.run_id[:8]}"
            data_checks = recorded_checks(context, set(BY_NAME))
            # The counts as Dagster shows them: this run's assets (the report among them) and its checks
            # (each claim once per asset it judges, and the data checks; the scaling claim judges another
            # job's asset, so it is not one of this run's checks).
            run_checks = [j for j in judgements if j.asset in manifests] + data_checks
            comparison = manifests.get("model_comparison")
            compare = compare_links(s.run, comparison)
            info = {
                "Dagster run": run.run_id,
                "job": job_label(run.job_name),
                "MLflow parent run": parent.url,
                **compare,
                "assets in this run": len(sections) + 1,
                "checks in this run": len(run_checks),
            }
            headline = headline_metrics(sections)  # this run's alone
            shown = sections + (
                [
                    section_from_manifest(
                        SCALING.to_user_string(),
                        "scaling",
                        scaling,
                        f"From the scaling job's latest run (Dagster run {scaling.dagster_run_id[:8]}), not this "
                        "one: each family at growing training budgets, where it passes the count model and where the "
                        "Transformer passes the LSTM.",
                    )
                ]
                if scaling
                else []
            )
            counts, inv = claim_counts(judgements), invariant_counts(judgements)
            demo = demonstration_counts(judgements)
            count_metrics = {
                **{f"claims/{k.replace(' ', '_')}": float(v) for k, v in counts.as_dict().items()},
                **{f"demonstrations/{k.replace(' ', '_')}": float(v) for k, v in demo.as_dict().items()},
                **{f"invariants/{k.replace(' ', '_')}": float(v) for k, v in inv.as_dict().items()},
            }
            lms = {n: manifests[n] for n in language_models if isinstance(manifests.get(n), LanguageModel)}
            rows = result_rows(lms, comparison if isinstance(comparison, ModelComparison) else None)
            ngram = manifests.get("ngram_baseline")
            count_model = (ngram.chosen.model, ngram.val_loss) if isinstance(ngram, NgramBaseline) else None
            since = since_previous(context, count_metrics, None)  # read once: the page and the metadata
            count_changes = since[1]
            result = result_html(
                rows, count_model, {"claims": counts, "demonstrations": demo, "invariants": inv}, count_changes
            )
            page = render_report(title, info, shown, judgements, data_checks, result=result)
            path = s.tmp / REPORT_FILE
            path.write_text(page, encoding="utf-8")
            links = " · ".join(f"[{k}]({v})" for k, v in compare.items())
            summary = summary_markdown(
                title,
                judgements,
                headline,
                REPORT_FILE,
                result=result_markdown(rows, count_model) + (f"\n\n{links}" if links else ""),
            )
            # The run's summary on its parent run: the page, the headline metrics, the description.
            parent.log_artifact(path)
            parent.log_metrics({**headline, **count_metrics})
            # The parent's description keeps its link back to the Dagster run above the summary.
            parent.set_note(
                f"Dagster run [{run.run_id[:8]}]({dagster_run_url(run.run_id)}) of "
                f"{run_subject(run.job_name, run.asset_selection)}.\n\n{summary}"
            )
            claims = [
                {
                    "claim": j.claim.name,
                    "asset": j.asset,
                    "status": j.status,
                    "kind": j.claim.kind,
                    "section": j.claim.section,
                    "reason": reason(j.claim, j.verdict) if j.verdict is not None else j.error,
                    **({"error": j.error} if j.verdict is None else {}),
                    **({"note": j.verdict.note} if j.verdict is not None and not j.verdict.judged else {}),
                }
                for j in judgements
            ]
            failed = [
                f"{c['claim']} on {c['asset']}: {c['status']}"
                for c in claims
                if c["status"] in ("failed", "not judged")
            ]
            return s.publish(
                Report(
                    path=s.final_path(path),
                    claims=claims,
                    counts=counts.as_dict(),
                    demonstration_counts=demo.as_dict(),
                    invariant_counts=inv.as_dict(),
                    mlflow_parent_run_id=parent.run_id,
                ),
                metrics=count_metrics,
                since=since,
                files={"report": path},
                artifacts=[path],
                values={
                    "report_url": dg.MetadataValue.url(parent.artifact_url(REPORT_FILE)),
                    "mlflow_parent_url": dg.MetadataValue.url(parent.url),
                    **{
                        key: dg.MetadataValue.url(compare[label])
                        for key, label in COMPARE_KEYS.items()
                        if label in compare
                    },
                    "result": dg.MetadataValue.md(result_markdown(rows, count_model)),
                    "claims": dg.MetadataValue.md(
                        "\n".join(
                            f"- {c['status']}: `{c['claim']}` "
                            f"({c['asset']}{'' if c['kind'] == 'evidence' else ', ' + c['kind']})"
                            for c in claims
                        )
                    ),
                },
                warnings=failed,
            )

    return report
