"""MLflow tracking as one Dagster resource: one parent run per Dagster run, one nested run per
asset materialization, tagged with the Dagster run id, asset key, partition and a config hash.

A small resource of our own rather than the legacy `dagster-mlflow` one; it talks to MLflow only
through `MlflowClient` (no global active-run state), so step processes never interfere.

The parent run is found or created through MLflow itself, with no local lock, so it works the same
against a tracking server with steps on other machines: each step searches for the parents tagged
with its Dagster run id, creates one if there is none, then converges on the one with the smallest
MLflow run id, moving the children of any duplicate onto it and deleting the duplicate. Two steps
that raced both end on the same parent whichever order their writes landed in.

Links both ways: the Dagster run is tagged with its parent's id and URL (`mlflow/parent_run_id`,
`mlflow/parent_run_url`); every MLflow run carries the URL of its Dagster run (`dagster.run_url`)
and, nested, of its asset page (`dagster.asset_url`), also as clickable links in its description.
The addresses are the state folder's recorded ones (`state.ui_addresses`: DAGSTER_UI_URL and
MLFLOW_UI_URL when the folder was first used, else the defaults), where scripts/ui.sh and
scripts/mlflow_ui.sh serve, so links recorded by earlier runs keep working whichever address a later
start asks for. Runs carry MLflow's source
fields (`mlflow.source.type` JOB, `mlflow.source.name` module:asset or module:job, the git commit
when the project is a git checkout) and `mlflow.user`.

Parent status mirrors the run: RUNNING while a step runs; after each step FAILED if any child failed,
else FINISHED once no child is running. A step that fails before its child exists (or a killed run)
is caught up by `recovery.sync_mlflow_parents`, which the next step of any run calls.
"""

from __future__ import annotations

import datetime as _dt
import functools
import getpass
import hashlib
import io
import json
import math
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import dagster as dg

from .state import PROJECT_ROOT, default_tracking_uri, ensure_stores, experiment_artifact_location, ui_addresses

PARENT_ROLE = "dagster_run"
EXPERIMENT = "wordvec-to-transformer"
UI_URL_ENV = "MLFLOW_UI_URL"
MAX_NOTE_CHARS = 8000  # MLflow's limit on a tag value
# MLflow 3.17's UI has two views of an experiment, GenAI (traces) and machine learning (runs,
# charts, models). Which one opens follows the `workflowType` URL parameter, else the sidebar switch
# (stored in the browser, GenAI by default); the experiment tag below is what MLflow's API records
# for the kind and what UIs that read it go by. Links into MLflow carry the parameter.
ML_VIEW = "workflowType=machine_learning"
EXPERIMENT_TAGS = {
    "mlflow.experimentKind": "custom_model_development",
    "mlflow.note.content": (
        "From word vectors to Transformer: one parent run per Dagster run (its name is the job, or "
        "`assets:<selection> @ <time>` for runs launched from the asset graph or by automation), one "
        "nested run per asset materialization with its config as params, its headline numbers as "
        "metrics and its files, tables and plots as artifacts. Language models share metric names "
        "(`train/loss`, `val/loss`, `train/tokens_per_s_mean`, ...) so the compare view lines them up; "
        "each is registered as a model under its asset name (Models). Every run links back to its "
        "Dagster run (tag `dagster.run_url`)."
    ),
}


def dagster_ui_url() -> str:
    """The Dagster UI's address: the state folder's recorded one (DAGSTER_UI_URL when it was first
    used, default http://127.0.0.1:3000), where scripts/ui.sh serves."""
    return ui_addresses()["dagster"]


def dagster_run_url(run_id: str) -> str:
    return f"{dagster_ui_url()}/runs/{run_id}"


def dagster_asset_url(asset_key: dg.AssetKey) -> str:
    from urllib.parse import quote

    return f"{dagster_ui_url()}/assets/{'/'.join(quote(p, safe='') for p in asset_key.path)}"


@functools.cache
def git_commit() -> str | None:
    """HEAD of the project's git checkout, once per process; None when it is not one (an installed copy)."""
    if not (PROJECT_ROOT / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


@functools.cache
def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name for this uid (some containers)
        return "unknown"


def source_tags(name: str) -> dict[str, str]:
    """MLflow's source fields for a run started by a Dagster step: type JOB, `name`, git commit, user."""
    tags = {"mlflow.source.type": "JOB", "mlflow.source.name": name, "mlflow.user": _user()}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def adhoc_run_name(asset_keys: Any, created: _dt.datetime | None) -> str:
    """A readable parent name for a run launched from the asset graph or by automation:
    `assets:rnn_lm,lstm_lm @ 2026-12-02 10:31 UTC` (the first three assets of a larger selection, then +N)."""
    names = sorted(k.to_user_string() for k in asset_keys or [])
    shown = ",".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "") if names else "all"
    when = (created or _dt.datetime.now(_dt.timezone.utc)).astimezone(_dt.timezone.utc)
    return f"assets:{shown} @ {when:%Y-%m-%d %H:%M} UTC"


def job_label(job_name: str) -> str:
    """A job's name as MLflow shows it: Dagster's implicit job of asset-graph and automation runs
    (`__ASSET_JOB`) reads `asset selection`."""
    return "asset selection" if job_name.startswith("__") else job_name


def run_subject(job_name: str, asset_keys: Any = None) -> str:
    """What a Dagster run ran, for a description: the job `tiny_pipeline`, or the assets selected."""
    if not job_name.startswith("__"):
        return f"job `{job_name}`"
    names = sorted(k.to_user_string() for k in asset_keys or [])
    shown = ", ".join(f"`{n}`" for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"the assets {shown}" if names else "an asset selection"


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
    """The nested MLflow run of one asset materialization. A training's log points (`log_progress`) are
    sent in batches, at most `METRICS_FLUSH_S` apart, and the rest when the run ends (`flush`): each
    would otherwise be a transaction of the tracking store (150 points of a default-run model took
    0.77 s to SQLite one by one, 0.07 s together). `log_metrics` sends at once."""

    METRICS_FLUSH_S = 5.0

    def __init__(self, client: Any, run_id: str, experiment_id: str, ui_base: str):
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.ui_base = ui_base
        self._pending: list[Any] = []  # mlflow Metric entities not sent yet
        self._sent_at = time.monotonic()

    @property
    def url(self) -> str:
        return self.page_url()

    def page_url(self, page: str = "") -> str:
        """A page of this run in the MLflow UI (`/artifacts/<path>`, …), in its machine-learning view."""
        return f"{self.ui_base}/#/experiments/{self.experiment_id}/runs/{self.run_id}{page}?{ML_VIEW}"

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self._queue(metrics, step)
        self.flush()

    def log_progress(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """`log_metrics` for a training's log points: sent with the next batch (class doc)."""
        self._queue(metrics, step)
        if len(self._pending) >= 500 or time.monotonic() - self._sent_at >= self.METRICS_FLUSH_S:
            self.flush()

    def _queue(self, metrics: dict[str, Any], step: int | None) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self._pending += [Metric(k, v, ts, step or 0) for k, v in finite_metrics(metrics).items()]

    def flush(self) -> None:
        """Send the metrics logged and not sent yet."""
        items, self._pending = self._pending, []
        for i in range(0, len(items), 500):
            self.client.log_batch(self.run_id, metrics=items[i : i + 500])
        self._sent_at = time.monotonic()

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
        self.client.log_table(
            self.run_id, data={c: [r.get(c) for r in rows] for c in cols}, artifact_file=f"tables/{name}.json"
        )

    def child(
        self,
        name: str,
        metrics: dict[str, Any],
        params: dict[str, Any] | None = None,
        series: dict[str, list[tuple[int, float]]] | None = None,
    ) -> "AssetRun":
        """A finished run nested under this one (e.g. one per model in a comparison), so MLflow's
        compare view lines the children up by metric name."""
        parent = self.client.get_run(self.run_id).data.tags
        tags = {
            "mlflow.parentRunId": self.run_id,
            **{k: v for k, v in parent.items() if k.startswith(("dagster.", "mlflow.source.", "mlflow.user"))},
        }
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

    def children_by(self, metric: str) -> list[Any]:
        """This run's child runs (a comparison's, one per model), best first by `metric` (lower is better)."""
        runs = self.client.search_runs(
            [self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.run_id}'", max_results=200
        )
        return sorted(runs, key=lambda r: r.data.metrics.get(metric, math.inf))

    def compare_url(self, run_ids: list[str]) -> str:
        """MLflow's compare view of `run_ids` (in that order)."""
        from urllib.parse import quote

        runs = quote(json.dumps(run_ids, separators=(",", ":")))
        experiments = quote(json.dumps([self.experiment_id], separators=(",", ":")))
        return f"{self.ui_base}/#/compare-runs?runs={runs}&experiments={experiments}"

    def ranked_children_url(self, metric: str) -> str:
        """The experiment's runs table filtered to this run's children, ordered by `metric` (ascending)."""
        from urllib.parse import quote

        search = quote(f"tags.`mlflow.parentRunId` = '{self.run_id}'", safe="")
        order = quote(f"metrics.`{metric}`", safe="")
        return (
            f"{self.ui_base}/#/experiments/{self.experiment_id}?searchFilter={search}&orderByKey={order}"
            f"&orderByAsc=true&{ML_VIEW}"
        )

    def artifact_url(self, path: str) -> str:
        """The MLflow UI's view of one of this run's artifacts."""
        return self.page_url(f"/artifacts/{path}")

    def artifact_file_url(self, path: str) -> str:
        """One of this run's artifact files itself, as the MLflow server serves it (an image's `src`)."""
        from urllib.parse import urlencode

        return f"{self.ui_base}/get-artifact?{urlencode({'path': path, 'run_uuid': self.run_id})}"

    def figure_markdown(self, name: str, path: str, shown: str | None = None) -> dg.MetadataValue:
        """A logged figure (artifact `path`) for Dagster's metadata: the image `shown` (default: the
        figure; a preview that fits the page) as the MLflow server serves it, and a link to the figure
        full size in the MLflow UI. Short enough (under Dagster's 1,000 characters) that Dagster shows
        the image in place instead of behind "[Show Markdown]"; the event log keeps no image."""
        src = self.artifact_file_url(shown or path)
        return dg.MetadataValue.md(f"![{name}]({src})\n\n[{name} in MLflow, full size]({self.artifact_url(path)})")

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
    one. Links in Dagster's metadata point at `ui_url`; else, with a tracking server, at
    MLFLOW_UI_URL or the server; else at the state folder's recorded MLflow address (MLFLOW_UI_URL
    when the folder was first used), where scripts/mlflow_ui.sh serves."""

    tracking_uri: str = ""
    experiment: str = EXPERIMENT
    ui_url: str = ""

    def resolved_uri(self) -> str:
        return self.tracking_uri or default_tracking_uri()

    def resolved_ui_url(self) -> str:
        uri = self.resolved_uri()
        if self.ui_url:
            return self.ui_url.rstrip("/")
        if uri.startswith(("http://", "https://")):
            return (os.environ.get(UI_URL_ENV) or uri).rstrip("/")
        return ui_addresses()["mlflow"]

    def client(self):
        from mlflow.tracking import MlflowClient

        uri = self.resolved_uri()
        # The store is created once, under a lock, whoever comes first; a server must answer (once
        # per process), else the step fails in seconds naming the setting.
        ensure_stores(uri, setting="the resource `mlflow`, field `tracking_uri`" if self.tracking_uri else None)
        return MlflowClient(tracking_uri=uri)

    def experiment_id(self, client: Any) -> str:
        """The experiment's id (created when missing), with its kind and description tags."""
        exp = client.get_experiment_by_name(self.experiment)
        if exp is None:
            try:
                client.create_experiment(
                    self.experiment,
                    artifact_location=experiment_artifact_location(self.resolved_uri()),
                    tags=EXPERIMENT_TAGS,
                )
            except Exception:  # created meanwhile by another process
                pass
            exp = client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise RuntimeError(
                    f"MLflow experiment {self.experiment!r} could not be created at {self.resolved_uri()}"
                )
        for key, value in EXPERIMENT_TAGS.items():  # an experiment created elsewhere (e.g. by the store's init)
            if exp.tags.get(key) != value:
                try:
                    client.set_experiment_tag(exp.experiment_id, key, value)
                except Exception:  # two runs starting at once both set it: the second insert hits the unique key
                    if client.get_experiment(exp.experiment_id).tags.get(key) != value:
                        raise
        return exp.experiment_id

    def parent_run(
        self,
        client: Any,
        experiment_id: str,
        dagster_run_id: str,
        job_name: str,
        asset_selection: Any = None,
        created: _dt.datetime | None = None,
    ) -> str:
        """The one parent run of this Dagster run (create, then converge; see the module docstring).

        Named after the job (`tiny_pipeline:1a2b3c4d`), or for a run of an asset selection launched
        from the asset graph or by automation (job `__ASSET_JOB`) after the selection and its time."""
        query = f"tags.`dagster.run_id` = '{dagster_run_id}' and tags.`dagster.role` = '{PARENT_ROLE}'"
        found = client.search_runs([experiment_id], filter_string=query, max_results=50)
        if not found:
            adhoc = job_name.startswith("__")
            name = adhoc_run_name(asset_selection, created) if adhoc else f"{job_name}:{dagster_run_id[:8]}"
            run_url = dagster_run_url(dagster_run_id)
            client.create_run(
                experiment_id,
                run_name=name,
                tags={
                    "dagster.run_id": dagster_run_id,
                    "dagster.role": PARENT_ROLE,
                    "dagster.job": job_name,
                    "dagster.run_url": run_url,
                    "mlflow.note.content": f"Dagster run [{dagster_run_id[:8]}]({run_url}) of "
                    f"{run_subject(job_name, asset_selection)}.",
                    **source_tags(f"pipelines.definitions:{job_label(job_name)}"),
                },
            )
            found = client.search_runs([experiment_id], filter_string=query, max_results=50)
        keep, *duplicates = sorted(r.info.run_id for r in found)
        for dup in duplicates:
            merge_parent(client, experiment_id, dup, keep)
        return keep

    def parent_url(self, experiment_id: str, parent: str) -> str:
        return f"{self.resolved_ui_url()}/#/experiments/{experiment_id}/runs/{parent}?{ML_VIEW}"

    def tag_dagster_run(self, context: dg.AssetExecutionContext, experiment_id: str, parent: str) -> None:
        """Tag the Dagster run with its MLflow parent's id and URL (each step re-checks: after two steps
        raced to create the parent, the one they converged on wins)."""
        tags = {"mlflow/parent_run_id": parent, "mlflow/parent_run_url": self.parent_url(experiment_id, parent)}
        run = context.instance.get_run_by_id(context.run.run_id)
        if run is not None and any(run.tags.get(k) != v for k, v in tags.items()):
            context.instance.add_run_tags(context.run.run_id, tags)

    @contextmanager
    def asset_run(
        self, context: dg.AssetExecutionContext, params: dict[str, Any] | None = None, key: dg.AssetKey | None = None
    ) -> Iterator[AssetRun]:
        """A nested MLflow run for this asset (`key`, in a multi-asset); FINISHED on success, FAILED (never
        left RUNNING) on error."""
        client = self.client()
        params = params or {}
        run_id = context.run.run_id
        experiment_id = self.experiment_id(client)
        record = context.instance.get_run_record_by_id(run_id)
        selection = context.run.asset_selection or context.job_def.asset_layer.selected_asset_keys
        parent = self.parent_run(
            client, experiment_id, run_id, context.run.job_name, selection, record.create_timestamp if record else None
        )
        client.update_run(parent, "RUNNING")
        self.tag_dagster_run(context, experiment_id, parent)
        key = key or context.asset_key
        asset_key = key.to_user_string()
        run_url, asset_url = dagster_run_url(run_id), dagster_asset_url(key)
        fn = context.op_def.compute_fn
        module = getattr(getattr(fn, "decorated_fn", fn), "__module__", "pipelines")
        tags = {
            "mlflow.parentRunId": parent,
            "dagster.run_id": run_id,
            "dagster.asset_key": asset_key,
            "dagster.partition": context.partition_key if context.has_partition_key else "",
            "dagster.step_key": context.get_step_execution_context().step.key,
            "dagster.run_url": run_url,
            "dagster.asset_url": asset_url,
            "mlflow.note.content": f"Asset [{asset_key}]({asset_url}) in Dagster run [{run_id[:8]}]({run_url}).",
            "config_hash": config_hash(params),
            **source_tags(f"{module}:{asset_key}"),
        }
        run = client.create_run(experiment_id, run_name=asset_key, tags=tags)
        handle = AssetRun(client, run.info.run_id, experiment_id, self.resolved_ui_url())
        try:
            if params:
                handle.log_params(params)
            yield handle
            handle.flush()
        except BaseException as e:
            try:
                handle.flush()  # what the failed run logged before it failed
            except Exception:  # the tracking store itself may be what failed
                pass
            client.set_tag(handle.run_id, "error", f"{type(e).__name__}: {e}"[:5000])
            client.set_terminated(handle.run_id, "FAILED")
            settle_parent(client, experiment_id, parent)
            raise
        client.set_terminated(handle.run_id, "FINISHED")
        settle_parent(client, experiment_id, parent)


def merge_parent(client: Any, experiment_id: str, duplicate: str, keep: str) -> None:
    """Move the children of a duplicate parent onto `keep`, then delete the duplicate."""
    children = client.search_runs(
        [experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{duplicate}'", max_results=1000
    )
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
    children = client.search_runs(
        [experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'", max_results=1000
    )
    statuses = {r.info.status for r in children}
    if statuses & {"FAILED", "KILLED"}:
        client.set_terminated(parent, "FAILED")
    elif "RUNNING" not in statuses:
        client.set_terminated(parent, "FINISHED")


# Figures are rendered at 100 dpi: 8 pt labels are 11 px, the smallest that reads; at the former
# 80 dpi they were 9 px, and 5 pt tick labels 5 px. Figures that hold many labels grow with them instead (see
# components/core/plots.py: plot_head_maps), so the image stays readable without zooming.
FIGURE_DPI = 100


def figure_png(fig: Any, dpi: int = FIGURE_DPI) -> bytes:
    """A matplotlib figure as PNG bytes (rendered once; the same bytes go to MLflow and Dagster); a
    figure with Chinese text is drawn with the packaged CJK font as the fallback (`cjk_font`)."""
    from components.core.cjk_font import ensure_matplotlib_fallback, has_cjk_text

    if has_cjk_text(fig):
        ensure_matplotlib_fallback()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


# Dagster shows an image at its pixel size and cuts off what does not fit its metadata table (about
# 800 px of a 1600 px window, 640 px of a 1280 px one, for the value column): a wider figure is
# shown as a preview rendered at this width, linked to the full-size file.
INLINE_MAX_PX = 640


def scaled_png(png: bytes, width: int) -> bytes:
    """The PNG scaled down to `width` pixels (aspect kept), with Pillow (matplotlib's own dependency):
    a resample, where drawing a large figure again costs seconds."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        w, h = im.size
        small = im.resize((width, max(1, round(h * width / w))), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's header."""
    import struct

    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return struct.unpack(">II", png[16:24])
