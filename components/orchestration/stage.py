"""What every asset does around its one call into the core: a run-scoped output folder that
appears only when the step succeeds, a nested MLflow run, and file metadata (path, size, hash)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import dagster as dg

from components.core.artifacts import atomic_dir, file_info

from .state import artifacts_root
from .tracking import AssetRun, MlflowTracker, figure_markdown


@dataclass
class Stage:
    run: AssetRun
    tmp: Path  # write here; renamed to `final` when the step succeeds
    final: Path

    def final_path(self, p: str | Path) -> str:
        return str(self.final / Path(p).relative_to(self.tmp))

    def file_metadata(self, name: str, p: str | Path) -> dict[str, Any]:
        info = file_info(p)
        return {
            f"{name}_path": dg.MetadataValue.path(self.final_path(p)),
            f"{name}_bytes": info["bytes"],
            f"{name}_sha256": info["sha256"],
        }

    def figure(self, fig: Any, name: str) -> dg.MetadataValue:
        """Log a figure to MLflow and return it as inline Dagster metadata."""
        import matplotlib.pyplot as plt

        self.run.log_figure(fig, f"{name}.png")
        md = figure_markdown(fig)
        plt.close(fig)
        return md


def run_dir(context: dg.AssetExecutionContext) -> Path:
    key = "/".join(context.asset_key.path)
    part = f"/{context.partition_key}" if context.has_partition_key else ""
    return artifacts_root() / key / f"{context.run.run_id}{part}"


@contextmanager
def stage(context: dg.AssetExecutionContext, tracker: MlflowTracker, params: dict[str, Any]) -> Iterator[Stage]:
    final = run_dir(context)
    with tracker.asset_run(context, params) as run, atomic_dir(final) as tmp:
        yield Stage(run=run, tmp=tmp, final=final)
