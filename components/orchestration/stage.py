"""What every asset does around its one call into the core, in one place.

`stage(context, tracker, params)` opens, in order: recovery of dead runs (a killed run is marked
failed at the latest when the next step starts), a lease that tells later steps this process is
alive, the nested MLflow run, validation of the whole run config (every problem listed, before
anything trains), and a run-scoped output folder that appears only when the step succeeds.

`Stage.publish(...)` is the one epilogue: it takes headline metrics, tables, figures, texts and
files, logs them to the nested MLflow run (metrics, tables, figures, artifacts) and returns the
`dg.Output` whose manifest names every file with its size and hash and whose metadata carries the
same numbers, sortable tables, inline figures and a link to the MLflow run. The manifest also keeps
what was published (metrics, the first rows of each table, texts, the figures as PNG files beside
the outputs) for the run's report.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import dagster as dg

from components.core.artifacts import atomic_dir, file_info
from components.core.manifests import FileRecord, Manifest, Published, row_dict
from components.core.rerun import Change, changes_markdown, compare, counts

from .leases import run_lease
from .recovery import recover_dead_runs
from .retention import prune
from .state import artifacts_root
from .tracking import INLINE_MAX_PX, AssetRun, MlflowTracker, figure_png, finite_metrics, png_size, scaled_png
from .validation import validate_run_config

RETENTION_ENV = "PIPELINE_KEEP_LAST"
DEFAULT_KEEP_LAST = 3
REPORT_TABLE_ROWS = 50  # rows of each table kept in the manifest for the report (MLflow has them all)


def metric_key(name: str) -> str:
    """MLflow names (`val/loss`) as Dagster metadata keys (`val_loss`)."""
    return name.replace("/", "_")


KEY_FIGURES = ("val/loss",)  # figures whose previous value and change are metadata entries of their own


def previous_materialization(
    context: dg.AssetExecutionContext, key: dg.AssetKey | None = None
) -> tuple[str, dict[str, float]] | None:
    """The run id and numeric metadata of this asset's (or, in a multi-asset, `key`'s) latest
    materialization by another run (the run before this one), or None when it was never materialized."""
    key = key or context.asset_key
    records = context.instance.fetch_materializations(key, limit=5).records
    for r in records:
        if r.run_id != context.run.run_id and r.asset_materialization is not None:
            values = {}
            for k, v in r.asset_materialization.metadata.items():
                x = getattr(v, "value", None)
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    values[k] = float(x)
            return r.run_id, values
    return None


def since_previous(
    context: dg.AssetExecutionContext,
    metrics: dict[str, float],
    spreads: dict[str, float] | None,
    key: dg.AssetKey | None = None,
) -> tuple[str, list[Change]]:
    """This materialization's figures against the previous one's ("" and [] when there is none, or
    for a partition: the previous materialization may be another partition's)."""
    if context.has_partition_key:
        return "", []
    prev = previous_materialization(context, key)
    if prev is None:
        return "", []
    run_id, values = prev
    return run_id, compare(metrics, {k: values[metric_key(k)] for k in metrics if metric_key(k) in values}, spreads)


def changes_metadata(run_id: str, changes: list[Change]) -> dict[str, Any]:
    """The changes as Dagster metadata: a table, the previous run's link and, for the key figures,
    the previous value and the change as numbers of their own (plotted across materializations)."""
    from .tracking import dagster_run_url

    if not run_id:
        return {"since_previous_run": "first materialization: nothing to compare with"}
    moved = counts(changes)
    out: dict[str, Any] = {
        "since_previous_run": dg.MetadataValue.md(
            f"Against the previous materialization, Dagster run [{run_id[:8]}]({dagster_run_url(run_id)}); "
            f"noise is the seed spread where `model_comparison` measured one.\n\n" + changes_markdown(changes)
        ),
        "previous_run_id": run_id,
        "figures_moved_beyond_noise": sum(moved.get(k, 0) for k in ("better", "worse")),
        "figures_worse_beyond_noise": moved.get("worse", 0),
    }
    for c in changes:
        if c.name in KEY_FIGURES and c.previous is not None:
            out[f"{metric_key(c.name)}_previous"] = c.previous
            out[f"{metric_key(c.name)}_change"] = c.delta
            out[f"{metric_key(c.name)}_verdict"] = c.verdict
    return out


def table_metadata(rows: list[dict]) -> dg.MetadataValue:
    """Rows of dicts as a sortable Dagster table."""
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def kind(c: str) -> str:
        values = [r[c] for r in rows if r.get(c) is not None]
        if values and all(isinstance(v, bool) for v in values):
            return "bool"
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return "int"
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return "float"
        return "string"

    kinds = {c: kind(c) for c in cols}
    # Dagster wants every record to carry every column: a missing number is NaN (its column then
    # float), anything else missing an empty string.
    for c in cols:
        if any(r.get(c) is None for r in rows):
            kinds[c] = "float" if kinds[c] in ("int", "float") else "string"

    def cell(c: str, v: Any) -> Any:
        if v is None:
            return float("nan") if kinds[c] == "float" else ""
        if kinds[c] == "float":
            return float(v)
        return str(v) if kinds[c] == "string" else v

    return dg.MetadataValue.table(
        records=[dg.TableRecord({c: cell(c, r.get(c)) for c in cols}) for r in rows],
        schema=dg.TableSchema(columns=[dg.TableColumn(c, kinds[c]) for c in cols]),
    )


def progress_line(point: dict[str, float], step: int, max_steps: int, eta_s: float) -> str:
    """One training log point as a line of the run's log."""
    shown = ", ".join(f"{k} {v:.4g}" for k, v in point.items() if k in ("train/loss", "val/loss", "tokens_per_s"))
    return f"step {step}/{max_steps}: {shown}; ETA {eta_s:.0f} s"


@dataclass
class Stage:
    context: dg.AssetExecutionContext
    run: AssetRun
    tmp: Path  # write here; renamed to `final` when the step succeeds
    final: Path
    notes: list[str] = field(default_factory=list)
    key: dg.AssetKey | None = None  # the asset published, in a multi-asset (else the context's one)

    @property
    def asset_key(self) -> dg.AssetKey:
        return self.key or self.context.asset_key

    def final_path(self, p: str | Path) -> str:
        return str(self.final / Path(p).relative_to(self.tmp))

    def progress(self, point: dict[str, float], step: int, max_steps: int, eta_s: float) -> None:
        """Training progress into the run's log in the Dagster UI (called at the loop's log points)."""
        self.context.log.info(progress_line(point, step, max_steps, eta_s))

    def _inline_preview(self, name: str, png_bytes: bytes) -> str:
        """The artifact Dagster's metadata shows in place: the figure itself when it is at most
        INLINE_MAX_PX wide, else the full-size PNG scaled down to that width (`previews/<name>.png` on
        the MLflow run; the full-size file stays `<name>.png`, linked beside it)."""
        import tempfile

        width = png_size(png_bytes)[0]
        if width <= INLINE_MAX_PX:
            return f"{name}.png"
        with tempfile.TemporaryDirectory() as tmp:
            preview = Path(tmp) / f"{name}.png"
            preview.write_bytes(scaled_png(png_bytes, INLINE_MAX_PX))
            self.run.log_artifact(preview, "previews")
        return f"previews/{name}.png"

    def publish(
        self,
        manifest: Manifest,
        *,
        metrics: dict[str, float] | None = None,
        tables: Mapping[str, Sequence[Any]] | None = None,
        figures: dict[str, Any] | None = None,
        texts: dict[str, str] | None = None,
        files: Mapping[str, str | Path] | None = None,
        artifacts: list[str | Path] | None = None,
        values: dict[str, Any] | None = None,
        warnings: list[str] | None = None,
        recorded_files: dict[str, FileRecord] | None = None,
        spreads: dict[str, float] | None = None,
        since: tuple[str, list[Change]] | None = None,
    ) -> dg.Output:
        """Log everything to the nested MLflow run and return the asset's output with its metadata.

        manifest: the asset's typed manifest (its own fields); the envelope (files, figures, what was
            published, the asset and its runs) is filled in here.

        metrics: headline numbers (MLflow metrics; Dagster metadata with `/` as `_`).
        tables: name → rows; an MLflow table artifact and a sortable Dagster table each.
        figures: name → matplotlib Figure; logged as `<name>.png`, shown inline in Dagster.
        texts: name → markdown; logged as `<name>.md`, shown in Dagster.
        files: name → path under `tmp`; path, size and SHA-256 into the manifest (read back and checked by
            the IO manager) and the metadata.
        artifacts: paths under `tmp` also copied to MLflow.
        values: further Dagster metadata as is (ints, strings, MetadataValues).
        recorded_files: name → the FileRecord of a file that other materializations wrote and
            recorded (not under `tmp`, not hashed again): into the manifest beside `files`, so that
            whoever reads this output has them checked too.
        spreads: metric → the noise of a rerun (seed spread), for the comparison with the previous
            materialization: every metric gets its previous value and change (`since_previous_run`),
            and a change beyond its spread a verdict (better, worse).
        since: that comparison when the asset already made it (`since_previous` over these `metrics`),
            so that the previous materialization is read once.
        """
        if not isinstance(manifest, Manifest) or not manifest.KIND:
            raise TypeError(f"publish takes a typed manifest (a Manifest subclass), got {type(manifest).__name__}")
        metadata: dict[str, Any] = {}
        if metrics:
            self._log_metrics(metrics, metadata)
        if since is not None:
            previous_run, changes = since
        else:
            previous_run, changes = since_previous(self.context, metrics, spreads, self.key) if metrics else ("", [])
        if metrics and not self.context.has_partition_key:
            metadata.update(changes_metadata(previous_run, changes))
        # Rows as dicts (a manifest's typed rows may be passed as they are).
        tables = {name: [row_dict(r) for r in rows] for name, rows in (tables or {}).items()}
        self._log_tables(tables, metadata)
        figure_files = self._publish_figures(figures or {}, metadata)
        for name, text in (texts or {}).items():
            self.run.log_text(text, f"{name}.md")
            metadata[name] = dg.MetadataValue.md(text)
        recorded = self._record_files(files or {}, recorded_files or {}, metadata)
        for p in artifacts or []:
            self.run.log_artifact(p)
        all_warnings = self._publish_warnings([*self.notes, *(warnings or [])], metadata)
        metadata.update(values or {})
        metadata.update(self.run.metadata())
        out = dataclasses.replace(
            manifest,
            files=recorded,
            figures=figure_files,
            published=Published(
                metrics=finite_metrics(metrics or {}),
                tables={name: rows[:REPORT_TABLE_ROWS] for name, rows in tables.items() if rows},
                table_rows={name: len(rows) for name, rows in tables.items() if rows},
                texts=dict(texts or {}),
                warnings=all_warnings,
                mlflow_url=self.run.url,
                previous_run_id=previous_run,
                changes=list(changes),
            ),
            asset=self.asset_key.to_user_string(),
            dagster_run_id=self.context.run.run_id,
            mlflow_run_id=self.run.run_id,
        )
        if self.key is not None:  # a multi-asset's output is named after its asset
            return dg.Output(out, output_name=self.key.to_python_identifier(), metadata=metadata)
        return dg.Output(out, metadata=metadata)

    def _log_metrics(self, metrics: dict[str, float], metadata: dict[str, Any]) -> None:
        """The headline metrics to the MLflow run and, with `/` as `_`, into `metadata`."""
        # A headline that is already the last point of a series logged during the step (a model's
        # `train/loss`, `val/loss`) is not logged again: at step 0 it would start that series'
        # curve at its final value.
        self.run.flush()  # the step's series as they end, batched progress points included
        series = self.run.client.get_run(self.run.run_id).data.metrics
        self.run.log_metrics({k: v for k, v in metrics.items() if series.get(k) != v})
        metadata.update({metric_key(k): v for k, v in metrics.items()})

    def _log_tables(self, tables: dict[str, list[dict]], metadata: dict[str, Any]) -> None:
        """Each non-empty table as an MLflow table artifact and a sortable Dagster table in `metadata`."""
        for name, rows in tables.items():
            if rows:
                self.run.log_table(rows, name)
                metadata[name] = table_metadata(rows)

    def _publish_figures(self, figures: dict[str, Any], metadata: dict[str, Any]) -> dict[str, FileRecord]:
        """Each figure as `figures/<name>.png` under `tmp`, logged to MLflow and shown in `metadata`
        (closed once written); returns the files' records for the manifest."""
        import matplotlib.pyplot as plt

        figure_files = {}
        for name, fig in figures.items():
            png_bytes = figure_png(
                fig
            )  # rendered once: the file (report; MLflow `<name>.png`, which Dagster's metadata shows)
            png = self.tmp / "figures" / f"{name}.png"
            png.parent.mkdir(exist_ok=True)
            png.write_bytes(png_bytes)
            self.run.log_artifact(png)
            info = file_info(png)
            figure_files[name] = FileRecord(path=self.final_path(png), bytes=info["bytes"], sha256=info["sha256"])
            metadata[name] = self.run.figure_markdown(name, png.name, self._inline_preview(name, png_bytes))
            plt.close(fig)
        return figure_files

    def _record_files(
        self,
        files: Mapping[str, str | Path],
        recorded_files: dict[str, FileRecord],
        metadata: dict[str, Any],
    ) -> dict[str, FileRecord]:
        """The manifest's files: those under `tmp` hashed now (path, size and hash into `metadata` too),
        then those other materializations recorded, as they are (a name given twice is refused)."""
        recorded = {}
        for name, p in files.items():
            info = file_info(p)
            recorded[name] = FileRecord(path=self.final_path(p), bytes=info["bytes"], sha256=info["sha256"])
            metadata[f"{name}_path"] = dg.MetadataValue.path(recorded[name].path)
            metadata[f"{name}_bytes"] = info["bytes"]
            metadata[f"{name}_sha256"] = info["sha256"]
        for name, rec in recorded_files.items():
            if name in recorded:
                raise ValueError(f"file name {name!r} given both in files and recorded_files")
            recorded[name] = FileRecord(path=rec.path, bytes=rec.bytes, sha256=rec.sha256)
        return recorded

    def _publish_warnings(self, all_warnings: list[str], metadata: dict[str, Any]) -> list[str]:
        """The stage's notes and the asset's warnings, when there are any, into `metadata` and as the MLflow
        run's `warnings` tag; returns them for the manifest."""
        if all_warnings:
            metadata["warnings"] = dg.MetadataValue.md("\n".join(f"- {w}" for w in all_warnings))
            self.run.client.set_tag(self.run.run_id, "warnings", "; ".join(all_warnings)[:5000])
        return all_warnings


def run_dir(context: dg.AssetExecutionContext, asset_key: dg.AssetKey | None = None) -> Path:
    key = "/".join((asset_key or context.asset_key).path)
    part = f"/{context.partition_key}" if context.has_partition_key else ""
    return artifacts_root() / key / f"{context.run.run_id}{part}"


def keep_last() -> int:
    import os

    return int(os.environ.get(RETENTION_ENV, DEFAULT_KEEP_LAST))


def _recover(context: dg.AssetExecutionContext, tracker: MlflowTracker) -> None:
    """Runs whose process died marked failed (in Dagster and MLflow), before this step starts."""
    recovered = recover_dead_runs(context.instance, tracker.resolved_uri())
    if recovered.get("runs_failed"):
        context.log.warning(f"marked dead runs failed: {recovered}")


@contextmanager
def step_guard(context: dg.AssetExecutionContext, tracker: MlflowTracker) -> Iterator[None]:
    """What a step holds while it works, before any asset of it is published: dead runs recovered, this
    process's lease on the step, the whole run config validated (every problem listed)."""
    _recover(context, tracker)
    step_key = context.get_step_execution_context().step.key
    with run_lease(context.run.run_id, step_key):
        validate_run_config(context)
        yield


@contextmanager
def stage(
    context: dg.AssetExecutionContext,
    tracker: MlflowTracker,
    params: dict[str, Any],
    key: dg.AssetKey | None = None,
) -> Iterator[Stage]:
    """One asset's stage. `key`: the asset of a multi-asset this stage publishes, inside the step's
    `step_guard` (the multi-asset's step holds it around all of its work); without it, the step's one
    asset, the guard taken here (recovery first, the MLflow run open while the config is validated)."""
    if key is None:
        _recover(context, tracker)
    final = run_dir(context, key)
    with ExitStack() as held:
        if key is None:
            held.enter_context(run_lease(context.run.run_id, context.get_step_execution_context().step.key))
        run = held.enter_context(tracker.asset_run(context, params, key))
        if key is None:
            validate_run_config(context)
        with atomic_dir(final) as tmp:
            yield Stage(context=context, run=run, tmp=tmp, final=final, key=key)
    n = keep_last()
    if n > 0:
        asset = "/".join((key or context.asset_key).path)
        prune(n, instance=context.instance, assets=[asset], tracking_uri=tracker.resolved_uri())
