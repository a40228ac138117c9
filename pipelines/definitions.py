"""The code location: every asset, check, job, schedule and resource of the pipeline."""

from __future__ import annotations

import dagster as dg

from .assets import ingest
from .io import ManifestIOManager
from .tracking import MlflowTracker

ASSET_MODULES = [ingest]

all_assets = dg.load_assets_from_modules(ASSET_MODULES)
all_checks = dg.load_asset_checks_from_modules(ASSET_MODULES)

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    resources={"mlflow": MlflowTracker(), "manifest_io": ManifestIOManager()},
)
