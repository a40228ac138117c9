"""MLflow tracking as one Dagster resource: one parent run per Dagster run, one nested run per
asset materialization, tagged with the Dagster run id, asset key, partition and a config hash.

A small resource of our own rather than the legacy `dagster-mlflow` one; it talks to MLflow only
through `MlflowClient` (no global active-run state), so step processes never interfere.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import dagster as dg

from .state import mlflow_root

PARENT_ROLE = "dagster_run"


def config_hash(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


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

        flat = _flatten(params)
        items = [Param(k, str(v)[:6000]) for k, v in flat.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [
            Metric(k, float(v), ts, step or 0)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
        ]
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

    def child(self, name: str, metrics: dict[str, Any], params: dict[str, Any] | None = None,
              series: dict[str, list[tuple[int, float]]] | None = None) -> "AssetRun":
        """A finished run nested under this one (e.g. one per model in a comparison), so MLflow's
        compare view lines the children up by metric name."""
        from mlflow.entities import Metric

        parent = self.client.get_run(self.run_id).data.tags
        tags = {"mlflow.parentRunId": self.run_id, **{k: v for k, v in parent.items() if k.startswith("dagster.")}}
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        child = AssetRun(self.client, run.info.run_id, self.experiment_id, self.ui_base)
        if params:
            child.log_params(params)
        child.log_metrics(metrics)
        ts = int(time.time() * 1000)
        for key, points in (series or {}).items():
            items = [Metric(key, float(v), ts, int(step)) for step, v in points if math.isfinite(float(v))]
            for i in range(0, len(items), 500):
                self.client.log_batch(child.run_id, metrics=items[i : i + 500])
        self.client.set_terminated(child.run_id, "FINISHED")
        return child

    def metadata(self) -> dict[str, Any]:
        return {"mlflow_run_id": self.run_id, "mlflow_url": dg.MetadataValue.url(self.url)}


class MlflowTracker(dg.ConfigurableResource):
    """MLflow tracking. Defaults to a SQLite store inside the state folder; point `tracking_uri`
    at a server (e.g. http://127.0.0.1:5000) to use one."""

    tracking_uri: str = ""
    experiment: str = "wordvec-to-transformer"
    ui_url: str = "http://127.0.0.1:5000"

    def resolved_uri(self) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        root = mlflow_root()
        root.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{root / 'mlflow.db'}"

    def _client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.resolved_uri())

    @contextmanager
    def _lock(self) -> Iterator[None]:
        # Steps run as separate processes: serialise find-or-create of the experiment/parent run.
        lock = mlflow_root() / ".lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _experiment_id(self, client: Any) -> str:
        exp = client.get_experiment_by_name(self.experiment)
        if exp is not None:
            return exp.experiment_id
        location = None if self.tracking_uri else (mlflow_root() / "artifacts").as_uri()
        return client.create_experiment(self.experiment, artifact_location=location)

    def _parent_run(self, client: Any, experiment_id: str, dagster_run_id: str, job_name: str) -> str:
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`dagster.run_id` = '{dagster_run_id}' and tags.`dagster.role` = '{PARENT_ROLE}'",
            max_results=1,
        )
        if found:
            return found[0].info.run_id
        run = client.create_run(
            experiment_id,
            run_name=f"{job_name}:{dagster_run_id[:8]}",
            tags={"dagster.run_id": dagster_run_id, "dagster.role": PARENT_ROLE, "dagster.job": job_name},
        )
        return run.info.run_id

    @contextmanager
    def asset_run(self, context: dg.AssetExecutionContext, params: dict[str, Any] | None = None) -> Iterator[AssetRun]:
        """A nested MLflow run for this asset; FINISHED on success, FAILED (never left RUNNING) on error."""
        client = self._client()
        params = params or {}
        run_id = context.run.run_id
        with self._lock():
            experiment_id = self._experiment_id(client)
            parent = self._parent_run(client, experiment_id, run_id, context.run.job_name)
        asset_key = context.asset_key.to_user_string()
        tags = {
            "mlflow.parentRunId": parent,
            "dagster.run_id": run_id,
            "dagster.asset_key": asset_key,
            "dagster.partition": context.partition_key if context.has_partition_key else "",
            "config_hash": config_hash(params),
        }
        run = client.create_run(experiment_id, run_name=asset_key, tags=tags)
        handle = AssetRun(client, run.info.run_id, experiment_id, self.ui_url)
        try:
            if params:
                handle.log_params(params)
            yield handle
        except BaseException as e:
            client.set_tag(handle.run_id, "error", f"{type(e).__name__}: {e}"[:5000])
            client.set_terminated(handle.run_id, "FAILED")
            client.set_terminated(parent, "FAILED")
            raise
        client.set_terminated(handle.run_id, "FINISHED")
        # The parent finishes with its last child; a failed child leaves it FAILED.
        if client.get_run(parent).info.status != "FAILED":
            client.set_terminated(parent, "FINISHED")


def figure_markdown(fig: Any, dpi: int = 60) -> dg.MetadataValue:
    """A small PNG of a matplotlib figure, inline in Dagster's metadata (it lives in the event log)."""
    import base64

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode()
    return dg.MetadataValue.md(f"![figure](data:image/png;base64,{data})")
