"""The code location: the assets and checks of `pipelines/defs/` (modules and component instances,
autoloaded), the model comparison over every language model found there, the run's report over
every asset, one job per experiment
file in `configs/`, the weekly schedule, declarative automation, the recovery sensor (marks runs
whose processes died as failed and frees their pool slots), and the resources.

One graph, two routes. The default route (every group but `shards`) materializes in one run: the
config jobs, the schedule, automation, the comparison and the report cover it. The sharded route
(group `shards`: a corpus of many shard files, one dynamic partition per shard) cannot join a
"whole graph" run, which has no partition key; it has its own jobs and sensor
(`pipelines/defs/shards.py`), and no eager automation (a new shard must not retrain its tokenizer)."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from components.orchestration import pool_wait
from components.orchestration.checks import claim_checks
from components.orchestration.io import ManifestIOManager
from components.orchestration.language_model import LM_TAG
from components.orchestration.recovery import recovery_sensor
from components.orchestration.shards import SHARD_GROUP, ShardFolder
from components.orchestration.state import PROJECT_ROOT
from components.orchestration.tracking import MlflowTracker
from components.orchestration.versions import asset_code_version

from .comparison import language_model_keys, model_comparison_asset
from .report import asset_specs, report_asset

CONFIG_DIR = PROJECT_ROOT / "configs"

# A step waiting for a pool slot sleeps instead of spinning a core (Dagster 1.13's executors busy-loop).
pool_wait.apply()

# Declarative automation, set in one place for every asset: when an upstream asset is
# re-materialized on its own (say `corpus` with a new config from the UI), everything downstream
# follows, once its parents are all present.
AUTOMATION = dg.AutomationCondition.eager()
TUNE_GROUP = "tune"  # the learning-rate sweep (pipelines/defs/tune.py): its own job, never part of a default run
SCALING_GROUP = "scaling"  # the scaling study (pipelines/defs/scaling.py): its own jobs, after a default run
OFF_ROUTE = (SHARD_GROUP, TUNE_GROUP, SCALING_GROUP)
# Everything but the sharded route, the sweep and the scaling study: what "the whole graph" means for jobs,
# automation and the report.
DEFAULT_ROUTE = dg.AssetSelection.all() - dg.AssetSelection.groups(*OFF_ROUTE)
# Ops of a config file that run in a job of their own, not in the file's `<name>_pipeline`: op → job suffix.
OWN_JOB_OPS = {"scaling_laws": "scaling"}

OWNERS = ["team:ml"]

# The language models are retrained by the weekly schedule (Monday 03:00 UTC): a model older than
# 7 days and 2 hours means that run was missed or failed (warning; the 2 hours are the weekly run's
# own time), older than 8 days is stale (failing). Evaluated by the daemon's freshness loop
# (`dg dev`) and shown on each model's asset page, whose text rounds to whole days ("Warns if more
# than 7 days", "Fails if more than 8 days"): a half day would read as 8 days, like the failure.
LM_FRESHNESS = dg.FreshnessPolicy.time_window(
    fail_window=dt.timedelta(days=8), warn_window=dt.timedelta(days=7, hours=2)
)


def route_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config file's run config for its `<name>_pipeline` (the default route): without the ops that
    run in a job of their own (`OWN_JOB_OPS`)."""
    ops = config.get("ops") or {}
    return {**config, "ops": {k: v for k, v in ops.items() if k not in OWN_JOB_OPS}}


def own_job_config(config: Mapping[str, Any], op: str) -> dict[str, Any]:
    """A config file's run config for the job of `op` (e.g. `scaling_laws`): its section, and the rest of
    the file but the other ops."""
    return {**{k: v for k, v in config.items() if k != "ops"}, "ops": {op: (config.get("ops") or {})[op]}}


def config_jobs(with_execution: bool = True) -> list[dg.UnresolvedAssetJobDefinition]:
    """One job per experiment file in configs/: the whole graph, launchpad pre-filled from the YAML;
    and for a file with a `scaling_laws:` section under `ops:`, the job `<name>_scaling` with that grid.
    with_execution=False leaves out the files' `execution` section (for a location whose executor is
    configured once, pipelines/cluster.py)."""
    jobs = []
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        config = dg.config_from_files([str(path)])
        if not with_execution:
            config = {k: v for k, v in config.items() if k != "execution"}
        ops = config.get("ops") or {}
        jobs.append(
            dg.define_asset_job(
                name=f"{path.stem}_pipeline",
                selection=DEFAULT_ROUTE,
                config=route_config(config),
                description=f"Materialize the whole graph with configs/{path.name}.",
            )
        )
        for op, suffix in OWN_JOB_OPS.items():
            if op in ops:
                jobs.append(
                    dg.define_asset_job(
                        name=f"{path.stem}_{suffix}",
                        selection=dg.AssetSelection.assets(op),
                        config=own_job_config(config, op),
                        description=f"Materialize `{op}` with the grid of configs/{path.name} (after a run of "
                        f"{path.stem}_pipeline trained its inputs).",
                    )
                )
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
    target=DEFAULT_ROUTE,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Evaluates the assets' automation conditions (eager: follow upstream updates).",
)


def build_defs(executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """The code location; `executor` replaces Dagster's default (multiprocess, or in-process where a
    config file says so) for every job."""
    loaded = dg.load_from_defs_folder(path_within_project=Path(__file__).parent / "defs")
    sharded = {
        spec.key
        for a in loaded.assets or []
        if isinstance(a, dg.AssetsDefinition)
        for spec in a.specs
        if spec.group_name in OFF_ROUTE
    }  # off the default route
    lm_keys = [k for k in language_model_keys(loaded) if k not in sharded]
    comparison = model_comparison_asset(lm_keys)
    upstream = [a for a in loaded.assets or [] if isinstance(a, dg.AssetsDefinition) and not set(a.keys) & sharded] + [
        comparison
    ]
    report = report_asset(asset_specs(upstream), lm_keys)  # everything ──► report
    merged = dg.Definitions.merge(
        loaded,
        dg.Definitions(
            assets=[comparison, report],
            asset_checks=claim_checks(
                [*(a for a in loaded.assets or [] if isinstance(a, dg.AssetsDefinition)), comparison]
            ),
            jobs=config_jobs(with_execution=executor is None),
            schedules=[weekly_rerun],
            sensors=[automation, recovery_sensor()],
            resources={"mlflow": MlflowTracker(), "io_manager": ManifestIOManager(), "shards": ShardFolder()},
            executor=executor,
        ),
    )
    versions = {
        spec.key: asset_code_version(a)
        for a in merged.assets or []
        if isinstance(a, dg.AssetsDefinition)
        for spec in a.specs
    }
    with warnings.catch_warnings():  # map_asset_specs is marked preview in 1.13; it is the one-place way to set this
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return merged.map_asset_specs(func=lambda spec: with_metadata(spec, versions[spec.key]))


# Assets whose output is trained or exported weights, besides every language model (tag LM_TAG).
WEIGHTS_ASSETS = {"word_embeddings", "quantized_models", "model_export"}


def role(spec: dg.AssetSpec) -> str:
    """Tag `role`: data (ingest), model (weights), or study (measurements over them)."""
    if spec.group_name == "ingest" or (spec.group_name == SHARD_GROUP and LM_TAG not in spec.tags):
        return "data"
    return "model" if LM_TAG in spec.tags or spec.key.to_user_string() in WEIGHTS_ASSETS else "study"


def with_metadata(spec: dg.AssetSpec, code_version: str) -> dg.AssetSpec:
    """What every asset carries, set here once: the automation condition, its code version (see
    components/orchestration/versions.py), owners, tags, and for language models the freshness policy."""
    spec = spec.replace_attributes(
        # The sharded route follows new shards through its sensor, not eagerly (a new shard must not retrain the
        # tokenizer).
        automation_condition=None if spec.group_name in OFF_ROUTE else AUTOMATION,
        code_version=code_version,
        owners=OWNERS,
        freshness_policy=LM_FRESHNESS if LM_TAG in spec.tags else spec.freshness_policy,
    )
    return spec.merge_attributes(tags={"project": "wordvec-to-transformer", "role": role(spec)})


defs = build_defs()


def default_route_job() -> dg.JobDefinition:
    """The whole default route as one job without preset config (what the config jobs run)."""
    return dg.define_asset_job("default_route", selection=DEFAULT_ROUTE).resolve(asset_graph=defs.resolve_asset_graph())
