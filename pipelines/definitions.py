"""The code location: every asset, check, job, schedule and resource of the pipeline."""

from __future__ import annotations

import dagster as dg

from .assets import ingest
from .io import ManifestIOManager
from .state import PROJECT_ROOT
from .tracking import MlflowTracker

ASSET_MODULES = [ingest]

all_assets = dg.load_assets_from_modules(ASSET_MODULES)
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

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    jobs=jobs,
    resources={"mlflow": MlflowTracker(), "manifest_io": ManifestIOManager()},
)
