"""MLflow tracking as one Dagster resource: one parent run per Dagster run, one nested run per
asset materialization, tagged with the Dagster run id, asset key, partition and a config hash.

A small resource of our own rather than the legacy `dagster-mlflow` one; it talks to MLflow only
through `MlflowClient` (no global active-run state), so step processes never interfere.

The parent run is found or created through MLflow itself, with no local lock, so it works the same
against a tracking server with steps on other machines: each step searches for the parents tagged
with its Dagster run id, creates one if there is none, then converges on the one with the smallest
MLflow run id, moving the children of any duplicate onto it and deleting the duplicate. Two steps
that raced both end on the same parent whichever order their writes landed in.

Parent status mirrors the run: RUNNING while a step runs; after each step FAILED if any child failed,
else FINISHED once no child is running. A step that fails before its child exists (or a killed run)
is caught up by `recovery.sync_mlflow_parents`, which the next step of any run calls.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import dagster as dg

from .state import default_tracking_uri, ensure_stores, experiment_artifact_location

PARENT_ROLE = "dagster_run"
EXPERIMENT = "wordvec-to-transformer"
UI_URL_ENV = "MLFLOW_UI_URL"
DEFAULT_UI_URL = "http://127.0.0.1:5000"
MAX_NOTE_CHARS = 8000  # MLflow's limit on a tag value


def config_hash(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def finite_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


class AssetRun:
    """The nested MLflow run of one asset materialization."""

    def __init__(self, client: Any, run_id: str, experiment_id: str, ui_base: str):
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.ui_base = ui_base

    @property
    def url(self) -> str:
        return f"{self.ui_base}/#/experiments/{self.experiment_id}/runs/{self.run_id}"

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, v, ts, step or 0) for k, v in finite_metrics(metrics).items()]
        for i in range(0, len(items), 500):
            self.client.log_batch(self.run_id, metrics=items[i : i + 500])

    def log_series(self, series: dict[str, list[tuple[int, float]]]) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        for key, points in series.items():
            items = [Metric(key, float(v), ts, int(step)) for step, v in points if math.isfinite(float(v))]
            for i in range(0, len(items), 500):
                self.client.log_batch(self.run_id, metrics=items[i : i + 500])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        p = Path(path)
        if p.is_dir():
            self.client.log_artifacts(self.run_id, str(p), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(p), artifact_path)

    def log_figure(self, fig: Any, name: str) -> None:
        self.client.log_figure(self.run_id, fig, name)

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def log_table(self, rows: list[dict], name: str) -> None:
        """Rows as an MLflow table artifact (`tables/<name>.json`), shown in the run's artifact view."""
        cols = list(dict.fromkeys(k for r in rows for k in r))
        self.client.log_table(self.run_id, data={c: [r.get(c) for r in rows] for c in cols}, artifact_file=f"tables/{name}.json")

    def child(self, name: str, metrics: dict[str, Any], params: dict[str, Any] | None = None,
              series: dict[str, list[tuple[int, float]]] | None = None) -> "AssetRun":
        """A finished run nested under this one (e.g. one per model in a comparison), so MLflow's
        compare view lines the children up by metric name."""
        parent = self.client.get_run(self.run_id).data.tags
        tags = {"mlflow.parentRunId": self.run_id, **{k: v for k, v in parent.items() if k.startswith("dagster.")}}
        tags["dagster.role"] = "comparison_child"
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        child = AssetRun(self.client, run.info.run_id, self.experiment_id, self.ui_base)
        if params:
            child.log_params(params)
        child.log_metrics(metrics)
        child.log_series(series or {})
        self.client.set_terminated(child.run_id, "FINISHED")
        return child

    def metadata(self) -> dict[str, Any]:
        return {"mlflow_run_id": self.run_id, "mlflow_url": dg.MetadataValue.url(self.url)}

    def artifact_url(self, path: str) -> str:
        """The MLflow UI's view of one of this run's artifacts."""
        return f"{self.url}/artifacts/{path}"

    def parent(self) -> "AssetRun":
        """The run this one is nested in (for an asset's run: the Dagster run's parent run, which holds
        the run's summary)."""
        parent_id = self.client.get_run(self.run_id).data.tags["mlflow.parentRunId"]
        return AssetRun(self.client, parent_id, self.experiment_id, self.ui_base)

    def set_note(self, markdown: str) -> None:
        """The run's description in the MLflow UI (`mlflow.note.content`, at most 8000 characters)."""
        self.client.set_tag(self.run_id, "mlflow.note.content", markdown[:MAX_NOTE_CHARS])


class MlflowTracker(dg.ConfigurableResource):
    """MLflow tracking. Defaults to a SQLite store inside the state folder; point `tracking_uri`, or
    the MLFLOW_TRACKING_URI environment variable, at a server (e.g. http://127.0.0.1:5000) to use
    one. Links in Dagster's metadata point at `ui_url`, or the MLFLOW_UI_URL environment variable
    (which scripts/mlflow_ui.sh honours too), else at the tracking server."""

    tracking_uri: str = ""
    experiment: str = EXPERIMENT
    ui_url: str = ""

    def resolved_uri(self) -> str:
        return self.tracking_uri or default_tracking_uri()

    def resolved_ui_url(self) -> str:
        uri = self.resolved_uri()
        server = uri if uri.startswith(("http://", "https://")) else ""
        return (self.ui_url or os.environ.get(UI_URL_ENV) or server or DEFAULT_UI_URL).rstrip("/")

    def client(self):
        from mlflow.tracking import MlflowClient

        uri = self.resolved_uri()
        # The store is created once, under a lock, whoever comes first; a server must answer (once
        # per process), else the step fails in seconds naming the setting.
        ensure_stores(uri, setting="the resource `mlflow`, field `tracking_uri`" if self.tracking_uri else None)
        return MlflowClient(tracking_uri=uri)

    def experiment_id(self, client: Any) -> str:
        exp = client.get_experiment_by_name(self.experiment)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(self.experiment, artifact_location=experiment_artifact_location(self.resolved_uri()))
        except Exception:  # created meanwhile by another process
            exp = client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    def parent_run(self, client: Any, experiment_id: str, dagster_run_id: str, job_name: str) -> str:
        """The one parent run of this Dagster run (create, then converge; see the module docstring)."""
        query = f"tags.`dagster.run_id` = '{dagster_run_id}' and tags.`dagster.role` = '{PARENT_ROLE}'"
        found = client.search_runs([experiment_id], filter_string=query, max_results=50)
        if not found:
            name = job_name if not job_name.startswith("__") else "adhoc"
            client.create_run(
                experiment_id,
                run_name=f"{name}:{dagster_run_id[:8]}",
                tags={"dagster.run_id": dagster_run_id, "dagster.role": PARENT_ROLE, "dagster.job": job_name},
            )
            found = client.search_runs([experiment_id], filter_string=query, max_results=50)
        keep, *duplicates = sorted(r.info.run_id for r in found)
        for dup in duplicates:
            merge_parent(client, experiment_id, dup, keep)
        return keep

    @contextmanager
    def asset_run(self, context: dg.AssetExecutionContext, params: dict[str, Any] | None = None) -> Iterator[AssetRun]:
        """A nested MLflow run for this asset; FINISHED on success, FAILED (never left RUNNING) on error."""
        client = self.client()
        params = params or {}
        run_id = context.run.run_id
        experiment_id = self.experiment_id(client)
        parent = self.parent_run(client, experiment_id, run_id, context.run.job_name)
        client.update_run(parent, "RUNNING")
        asset_key = context.asset_key.to_user_string()
        tags = {
            "mlflow.parentRunId": parent,
            "dagster.run_id": run_id,
            "dagster.asset_key": asset_key,
            "dagster.partition": context.partition_key if context.has_partition_key else "",
            "dagster.step_key": context.get_step_execution_context().step.key,
            "config_hash": config_hash(params),
        }
        run = client.create_run(experiment_id, run_name=asset_key, tags=tags)
        handle = AssetRun(client, run.info.run_id, experiment_id, self.resolved_ui_url())
        try:
            if params:
                handle.log_params(params)
            yield handle
        except BaseException as e:
            client.set_tag(handle.run_id, "error", f"{type(e).__name__}: {e}"[:5000])
            client.set_terminated(handle.run_id, "FAILED")
            settle_parent(client, experiment_id, parent)
            raise
        client.set_terminated(handle.run_id, "FINISHED")
        settle_parent(client, experiment_id, parent)


def merge_parent(client: Any, experiment_id: str, duplicate: str, keep: str) -> None:
    """Move the children of a duplicate parent onto `keep`, then delete the duplicate."""
    children = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{duplicate}'", max_results=1000)
    for child in children:
        client.set_tag(child.info.run_id, "mlflow.parentRunId", keep)
    try:
        client.delete_run(duplicate)
    except Exception:  # already deleted by the other step that saw it
        pass


def settle_parent(client: Any, experiment_id: str, parent: str) -> None:
    """After a child ends: FAILED if any child failed; FINISHED once none is running; else RUNNING.

    Each child marks itself terminated before looking, so whichever of two simultaneous children
    looks last sees both terminated.
    """
    children = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'", max_results=1000)
    statuses = {r.info.status for r in children}
    if statuses & {"FAILED", "KILLED"}:
        client.set_terminated(parent, "FAILED")
    elif "RUNNING" not in statuses:
        client.set_terminated(parent, "FINISHED")


def figure_markdown(fig: Any, dpi: int = 80) -> dg.MetadataValue:
    """A PNG of a matplotlib figure, inline in Dagster's metadata (it lives in the event log)."""
    import base64

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode()
    return dg.MetadataValue.md(f"![figure](data:image/png;base64,{data})")
