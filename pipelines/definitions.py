"""The code location: the assets and checks of `pipelines/defs/` (modules and component instances,
autoloaded), the model comparison over every language model found there, the run's report over
every asset, one job per experiment
file in `configs/`, the weekly schedule, declarative automation, the recovery sensor (marks runs
whose processes died as failed and frees their pool slots), and the resources."""

from __future__ import annotations

import warnings
from pathlib import Path

import dagster as dg

from components.orchestration.io import ManifestIOManager
from components.orchestration.recovery import recovery_sensor
from components.orchestration.state import PROJECT_ROOT
from components.orchestration.tracking import MlflowTracker

from .comparison import language_model_keys, model_comparison_asset
from .report import asset_specs, report_asset

CONFIG_DIR = PROJECT_ROOT / "configs"

# Declarative automation, set in one place for every asset: when an upstream asset is
# re-materialized on its own (say `corpus` with a new config from the UI), everything downstream
# follows, once its parents are all present.
AUTOMATION = dg.AutomationCondition.eager()


def config_jobs(with_execution: bool = True) -> list[dg.UnresolvedAssetJobDefinition]:
    """One job per experiment file in configs/: the whole graph, launchpad pre-filled from the YAML.
    with_execution=False leaves out the files' `execution` section (for a location whose executor is
    configured once, pipelines/cluster.py)."""
    jobs = []
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        config = dg.config_from_files([str(path)])
        if not with_execution:
            config = {k: v for k, v in config.items() if k != "execution"}
        jobs.append(dg.define_asset_job(
            name=f"{path.stem}_pipeline",
            selection=dg.AssetSelection.all(),
            config=config,
            description=f"Materialize the whole graph with configs/{path.name}.",
        ))
    return jobs


weekly_rerun = dg.ScheduleDefinition(
    name="weekly_default_pipeline",
    job_name="default_pipeline",
    cron_schedule="0 3 * * 1",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Rerun the whole graph on configs/default.yaml every Monday 03:00 UTC (needs the daemon: `dg dev`).",
)

automation = dg.AutomationConditionSensorDefinition(
    "downstream_automation",
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Evaluates the assets' automation conditions (eager: follow upstream updates).",
)


def build_defs(executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """The code location; `executor` replaces Dagster's default (multiprocess, or in-process where a
    config file says so) for every job."""
    loaded = dg.load_from_defs_folder(path_within_project=Path(__file__).parent / "defs")
    lm_keys = language_model_keys(loaded)
    comparison, ffn_check = model_comparison_asset(lm_keys)
    upstream = [a for a in loaded.assets or [] if isinstance(a, dg.AssetsDefinition)] + [comparison]
    report = report_asset(asset_specs(upstream), lm_keys)  # everything ──► report
    merged = dg.Definitions.merge(
        loaded,
        dg.Definitions(
            assets=[comparison, report],
            asset_checks=[ffn_check],
            jobs=config_jobs(with_execution=executor is None),
            schedules=[weekly_rerun],
            sensors=[automation, recovery_sensor()],
            resources={"mlflow": MlflowTracker(), "io_manager": ManifestIOManager()},
            executor=executor,
        ),
    )
    with warnings.catch_warnings():  # map_asset_specs is marked preview in 1.13; it is the one-place way to set this
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return merged.map_asset_specs(func=lambda spec: spec.replace_attributes(automation_condition=AUTOMATION))


defs = build_defs()
