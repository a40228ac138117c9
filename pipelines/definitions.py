"""The code location: every asset, check, job, schedule and resource of the pipeline."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from .assets import embeddings, ingest, recurrent, transformer
from components.orchestration.io import ManifestIOManager
from components.orchestration.state import PROJECT_ROOT
from components.orchestration.tracking import MlflowTracker

ASSET_MODULES = [ingest, embeddings, recurrent, transformer]

# Declarative automation: when an upstream asset is re-materialized on its own (say `corpus` with a
# new config from the UI), everything downstream follows, once its parents are all present.
all_assets = dg.load_assets_from_modules(ASSET_MODULES, automation_condition=dg.AutomationCondition.eager())
all_checks = dg.load_asset_checks_from_modules(ASSET_MODULES)

CONFIG_DIR = PROJECT_ROOT / "configs"


def config_jobs() -> list[dg.UnresolvedAssetJobDefinition]:
    """One job per experiment file in configs/: the whole graph, launchpad pre-filled from the YAML."""
    return [
        dg.define_asset_job(
            name=f"{path.stem}_pipeline",
            selection=dg.AssetSelection.all(),
            config=dg.config_from_files([str(path)]),
            description=f"Materialize the whole graph with configs/{path.name}.",
        )
        for path in sorted(CONFIG_DIR.glob("*.yaml"))
    ]


jobs = config_jobs()

weekly_rerun = dg.ScheduleDefinition(
    name="weekly_default_pipeline",
    job_name="default_pipeline",
    cron_schedule="0 3 * * 1",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Rerun the whole graph on configs/default.yaml every Monday 03:00 UTC (needs the daemon: `dagster dev`).",
)

automation = dg.AutomationConditionSensorDefinition(
    "downstream_automation",
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Evaluates the assets' automation conditions (eager: follow upstream updates).",
)

# Component instances declared in YAML: pipelines/defs/<name>/defs.yaml (the language models).
def component_defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent / "defs")


defs = dg.Definitions.merge(component_defs(), dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    jobs=jobs,
    schedules=[weekly_rerun],
    sensors=[automation],
    resources={"mlflow": MlflowTracker(), "manifest_io": ManifestIOManager()},
))
