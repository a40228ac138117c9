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
from pathlib import Path
from typing import Any

import dagster as dg

from components.core.claims import BY_NAME, Judgement, count_model_at_scale, judge_all
from components.core.manifests import LanguageModel, ModelComparison, NgramBaseline, Report, Scaling
from components.core.report import (
    DataCheck,
    ResultRow,
    Section,
    StatusCounts,
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


def judge_run(
    instance: dg.DagsterInstance, manifests: dict[str, Any], language_models: list[str]
) -> tuple[list[Judgement], Scaling | None]:
    """The article's claims judged on this run's manifests by the functions the asset checks call, the
    claims at scale on the scaling job's latest run (None, and those claims not judged, without one)."""
    scaling, why = latest_scaling(instance)
    judgements = at_scale(
        judge_all({**manifests, **({"scaling_laws": scaling} if scaling else {})}, language_models),
        scaling,
        manifests,
        why,
    )
    return judgements, scaling


def run_info(
    run: dg.DagsterRun, parent: AssetRun, compare: dict[str, str], n_sections: int, n_checks: int
) -> dict[str, Any]:
    """The page's facts about the run: its ids and links, and how many assets and checks it has."""
    return {
        "Dagster run": run.run_id,
        "job": job_label(run.job_name),
        "MLflow parent run": parent.url,
        **compare,
        "assets in this run": n_sections + 1,
        "checks in this run": n_checks,
    }


def with_scaling(sections: list[Section], scaling: Scaling | None) -> list[Section]:
    """The sections the page shows: this run's, then the scaling job's latest run's where there is one."""
    return sections + (
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


def status_metrics(by_kind: dict[str, StatusCounts]) -> dict[str, float]:
    """The judgements' counts as metrics, `<kind>/<status>` (`claims/passed`, `invariants/not_judged` …)."""
    return {f"{kind}/{k.replace(' ', '_')}": float(v) for kind, c in by_kind.items() for k, v in c.as_dict().items()}


def result_table(
    manifests: dict[str, Any], language_models: list[str], comparison: Any
) -> tuple[list[ResultRow], tuple[str, float] | None]:
    """The models against the count model: one row per language model, and the count model's
    (name, validation loss) where the run has the n-gram baseline."""
    lms = {n: manifests[n] for n in language_models if isinstance(manifests.get(n), LanguageModel)}
    rows = result_rows(lms, comparison if isinstance(comparison, ModelComparison) else None)
    ngram = manifests.get("ngram_baseline")
    count_model = (ngram.chosen.model, ngram.val_loss) if isinstance(ngram, NgramBaseline) else None
    return rows, count_model


def write_page(
    folder: Path,
    title: str,
    info: dict[str, Any],
    shown: list[Section],
    judgements: list[Judgement],
    data_checks: list[DataCheck],
    result: str,
) -> Path:
    """The HTML page, written to `folder`/`REPORT_FILE`."""
    page = render_report(title, info, shown, judgements, data_checks, result=result)
    path = folder / REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path


def run_summary(
    title: str,
    judgements: list[Judgement],
    headline: dict[str, float],
    rows: list[ResultRow],
    count_model: tuple[str, float] | None,
    compare: dict[str, str],
) -> str:
    """The claims' summary in Markdown, with the result table and the MLflow comparison links."""
    links = " · ".join(f"[{k}]({v})" for k, v in compare.items())
    return summary_markdown(
        title,
        judgements,
        headline,
        REPORT_FILE,
        result=result_markdown(rows, count_model) + (f"\n\n{links}" if links else ""),
    )


def summarize_on_parent(
    parent: AssetRun, run: dg.DagsterRun, path: Path, metrics: dict[str, float], summary: str
) -> None:
    """The run's summary on its parent run: the page, the headline metrics, the description."""
    parent.log_artifact(path)
    parent.log_metrics(metrics)
    # The parent's description keeps its link back to the Dagster run above the summary.
    parent.set_note(
        f"Dagster run [{run.run_id[:8]}]({dagster_run_url(run.run_id)}) of "
        f"{run_subject(run.job_name, run.asset_selection)}.\n\n{summary}"
    )


def claim_rows(judgements: list[Judgement]) -> list[dict[str, Any]]:
    """The manifest's claims: one row per judgement, with its status and why."""
    return [
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


def failed_claims(claims: list[dict[str, Any]]) -> list[str]:
    """The materialization's warnings: each claim that failed or could not be judged."""
    return [f"{c['claim']} on {c['asset']}: {c['status']}" for c in claims if c["status"] in ("failed", "not judged")]


def report_values(
    parent: AssetRun,
    compare: dict[str, str],
    rows: list[ResultRow],
    count_model: tuple[str, float] | None,
    claims: list[dict[str, Any]],
) -> dict[str, Any]:
    """The Dagster metadata: the page and the parent run's links, the comparison links, the result and
    the claims' list."""
    return {
        "report_url": dg.MetadataValue.url(parent.artifact_url(REPORT_FILE)),
        "mlflow_parent_url": dg.MetadataValue.url(parent.url),
        **{key: dg.MetadataValue.url(compare[label]) for key, label in COMPARE_KEYS.items() if label in compare},
        "result": dg.MetadataValue.md(result_markdown(rows, count_model)),
        "claims": dg.MetadataValue.md(
            "\n".join(
                f"- {c['status']}: `{c['claim']}` ({c['asset']}{'' if c['kind'] == 'evidence' else ', ' + c['kind']})"
                for c in claims
            )
        ),
    }


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
            judgements, scaling = judge_run(context.instance, manifests, language_models)
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
            info = run_info(run, parent, compare, len(sections), len(run_checks))
            headline = headline_metrics(sections)  # this run's alone
            shown = with_scaling(sections, scaling)
            counts, inv = claim_counts(judgements), invariant_counts(judgements)
            demo = demonstration_counts(judgements)
            by_kind = {"claims": counts, "demonstrations": demo, "invariants": inv}
            count_metrics = status_metrics(by_kind)
            rows, count_model = result_table(manifests, language_models, comparison)
            since = since_previous(context, count_metrics, None)  # read once: the page and the metadata
            result = result_html(rows, count_model, by_kind, since[1])
            path = write_page(s.tmp, title, info, shown, judgements, data_checks, result)
            summary = run_summary(title, judgements, headline, rows, count_model, compare)
            summarize_on_parent(parent, run, path, {**headline, **count_metrics}, summary)
            claims = claim_rows(judgements)
            failed = failed_claims(claims)
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
                values=report_values(parent, compare, rows, count_model, claims),
                warnings=failed,
            )

    return report
