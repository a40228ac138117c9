"""Models in MLflow: an export folder logged as an MLflow model of the asset's run and registered as
a new version under a stable name (`rnn_lm`, `lstm_lm`, `transformer_lm`, ..., `transformer_lm_fp16`).

Why a safetensors folder with a pyfunc `loader_module` rather than MLflow's PyTorch flavour: in
mlflow 3.17 `mlflow.pytorch.log_model` defaults to `torch.export` (it needs an `input_example`,
traces the model, and recurrent loops or the KV-cache path do not always export), and its other
mode pickles the whole module, which this project never does with weights. The export folder is
what `w2t-generate` and `components.core.export.folder.load_export` already read (weights with the
config in the header, config.json, tokenizer.json, generation defaults); MLflow gets it as a logged
model (the experiment's "Models" tab) whose `MLmodel` has a signature (a `prompt` column in, the
continuation out; `max_new_tokens`, `temperature`, `seed` as params) and the pyfunc flavour with
`components.orchestration.pyfunc` as loader, so `mlflow.pyfunc.load_model("models:/rnn_lm/latest")`
works offline where the project is installed. Cost: a few SQLite writes and one copy of the
folder into the artifact store, no tracing, no environment inference.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .tracking import AssetRun

LOADER_MODULE = "components.orchestration.pyfunc"
MODEL_TYPE = "language-model"


@contextmanager
def default_tracking_uri(uri: str) -> Iterator[None]:
    """The process's default MLflow tracking URI set to `uri` for the block, then restored, and with
    it the MLFLOW_TRACKING_URI variable: MLflow's own setter writes the variable and, restoring an
    unset default, deletes it, which would send every later step of an in-process run (configured
    by that variable) to the local store instead of the server."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    saved = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        with _use_tracking_uri(uri):
            yield
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved


def signature():
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    from components.core.export.folder import DEFAULT_GENERATION

    return ModelSignature(
        inputs=Schema([ColSpec("string", "prompt")]),
        outputs=Schema([ColSpec("string", "text")]),
        params=ParamSchema(
            [
                ParamSpec("max_new_tokens", "long", DEFAULT_GENERATION["max_new_tokens"]),
                ParamSpec("temperature", "double", DEFAULT_GENERATION["temperature"]),
                ParamSpec("seed", "long", 0),
            ]
        ),
    )


def _ensure_registered_model(client: Any, name: str, description: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description=description)
    except MlflowException as e:  # exists already (or was created meanwhile by another run)
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code) and "already exists" not in str(e):
            raise


def log_and_register(
    run: AssetRun,
    folder: str | Path,
    registered_name: str,
    *,
    description: str,
    model_description: str,
    tags: dict[str, Any],
    params: dict[str, Any] | None = None,
) -> dict[str, str]:
    """Log the export `folder` as an MLflow model of `run` and register it as a new version of
    `registered_name`; `tags` go on the logged model and the version. Returns name, version, model
    id and the `models:/name/version` URI. The folder itself is left as it is."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix=f"{registered_name}-mlmodel-") as tmp:
        staged = Path(tmp) / "model"
        shutil.copytree(folder, staged)
        return _log_and_register(run, staged, registered_name, description, model_description, tags, params)


def _log_and_register(
    run: AssetRun,
    folder: Path,
    registered_name: str,
    description: str,
    model_description: str,
    tags: dict[str, Any],
    params: dict[str, Any] | None,
) -> dict[str, str]:
    from mlflow.entities import LoggedModelOutput
    from mlflow.models import Model
    from mlflow.pyfunc import add_to_model

    client = run.client
    tags = {k: str(v) for k, v in tags.items()}
    logged = client.create_logged_model(
        run.experiment_id,
        name=registered_name,
        source_run_id=run.run_id,
        tags=tags,
        params={k: str(v)[:6000] for k, v in (params or {}).items()},
        model_type=MODEL_TYPE,
    )
    try:
        mlmodel = Model(
            artifact_path=logged.artifact_location,
            run_id=run.run_id,
            model_id=logged.model_id,
            model_uuid=logged.model_id,
            signature=signature(),
        )
        add_to_model(mlmodel, loader_module=LOADER_MODULE, data=".")
        mlmodel.save(str(folder / "MLmodel"))
        client.log_model_artifacts(logged.model_id, str(folder))
        client.log_outputs(run.run_id, [LoggedModelOutput(logged.model_id, step=0)])
    except BaseException:
        client.finalize_logged_model(logged.model_id, "FAILED")
        raise
    client.finalize_logged_model(logged.model_id, "READY")
    _ensure_registered_model(client, registered_name, description)
    # Source `models:/<model id>`, as MLflow's own log_model registers: the version then links to the
    # logged model. The SQL registry resolves that URI through the process's default tracking URI,
    # so it is pointed at this client's store for the call (and restored after).
    with default_tracking_uri(client.tracking_uri):
        mv = client.create_model_version(
            registered_name,
            source=f"models:/{logged.model_id}",
            run_id=run.run_id,
            tags=tags,
            description=model_description,
            model_id=logged.model_id,
        )
    return {
        "name": mv.name,
        "version": str(mv.version),
        "model_id": logged.model_id,
        "source": mv.source,
        "uri": f"models:/{mv.name}/{mv.version}",
    }


CHAMPION = "champion"  # the version of lowest validation loss among those trained on the same tokenizer
LATEST_SCHEDULED = "latest-scheduled"  # the version the latest scheduled run registered


def move_aliases(client: Any, name: str, version: str, *, scheduled: bool) -> dict[str, str]:
    """Aliases that say which version to use: `champion` moves to the version of lowest `val_loss` tag
    among the versions trained on the same tokenizer as `version` (only those are scored on the same
    targets), and `latest-scheduled` to `version` when a schedule started its run. Returns alias →
    version as set."""
    new = client.get_model_version(name, version)
    tok = new.tags.get("tokenizer_sha256")
    same = [
        v
        for v in client.search_model_versions(f"name = '{name}'", max_results=10_000)
        if v.tags.get("tokenizer_sha256") == tok and _loss(v) is not None
    ]
    out = {}
    if same:
        best = min(same, key=lambda v: (_loss(v), -int(v.version)))
        client.set_registered_model_alias(name, CHAMPION, best.version)
        out[CHAMPION] = str(best.version)
    if scheduled:
        client.set_registered_model_alias(name, LATEST_SCHEDULED, version)
        out[LATEST_SCHEDULED] = str(version)
    return out


def _loss(v: Any) -> float | None:
    try:
        return float(v.tags["val_loss"])
    except (KeyError, ValueError):
        return None
