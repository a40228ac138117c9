"""A language model trained under torchrun (`train.launcher: torchrun`): the worker spec, the launch
through `dg.PipesSubprocessClient`, the hashes rank 0 reports checked, and the model finished in the
step's process from the checkpoint (components/orchestration/language_model.py's module doc)."""

import sys
from pathlib import Path

import dagster as dg

from components.core.artifacts import sha256_file
from components.core.checkpoint import WEIGHTS_FILE, load_weights_into, model_metadata
from components.core.distributed import (
    FAILURE_FILE,
    RESULT_FILE,
    LaunchSettings,
    WorkerSpec,
    check_world_size,
    launch_env,
    read_failure,
    read_train_result,
    write_spec,
)
from components.core.errors import ConfigError, PipelineInputError
from components.core.labels import load_labels
from components.core.lm import FAMILIES, Family, LMResult, ModelSettings, finish_lm, prepare_lm
from components.core.manifests import Labels
from components.core.train_settings import TrainSettings

from .ddp_worker import MLFLOW_RUN_ID, MLFLOW_TRACKING_URI
from .stage import Stage
from .tracking import MlflowTracker

DDP_WORKER = "components.orchestration.ddp_worker"
KNOWN_FAMILIES: tuple[Family, ...] = FAMILIES  # typed: a check against it narrows a str to a Family


class DistributedTrainingError(RuntimeError):
    """A torchrun training failed: the message names the rank and how it died, and the checkpoint kept."""


def train_torchrun(
    context,
    s: Stage,
    mlflow: MlflowTracker,
    model_settings: ModelSettings,
    launch: LaunchSettings,
    train_settings: TrainSettings,
    labels: Labels,
    scratch: Path,
    common: dict,
    *,
    name: str,
    family: str,
) -> tuple[LMResult, dict]:
    """Train under torchrun through Pipes (module doc); then finish in this process from the checkpoint."""
    check_world_size(launch, train_settings)  # (the run config's validation has said so already)
    if family not in KNOWN_FAMILIES:
        raise ConfigError(f"family={family!r} is unknown; use one of: {', '.join(KNOWN_FAMILIES)}")
    spec = WorkerSpec(
        family=family,
        model=model_settings.model_dump(),
        train=train_settings,
        labels=labels.path,
        # By path: sharded labels list the files of every shard (same names, other folders).
        labels_sha256={f.path: f.sha256 for f in labels.files.values()},
        tokenizer_sha256=labels.tokenizer_sha256,
        out_dir=str(scratch),
        strategy=launch.strategy,
    )
    spec_path = write_spec(spec, scratch / "spec.json")
    for stale in (RESULT_FILE, FAILURE_FILE):  # never read an earlier launch's result or failure
        (scratch / stale).unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "components.core.distributed",
        "launch",
        f"--nproc-per-node={launch.nproc_per_node}",
        "--worker",
        DDP_WORKER,
        str(spec_path),
    ]
    extras = {MLFLOW_RUN_ID: s.run.run_id, MLFLOW_TRACKING_URI: mlflow.resolved_uri()}
    context.log.info(
        f"launching torchrun: {launch.nproc_per_node} processes, {launch.strategy} ({' '.join(command[1:])})"
    )
    try:
        invocation = dg.PipesSubprocessClient().run(
            context=context, command=command, extras=extras, env=launch_env(launch, train_settings)
        )
    except Exception as e:
        failure = read_failure(scratch)
        if failure is None:
            raise
        raise DistributedTrainingError(f"{name}: {failure['message']}") from e
    metadata = invocation.get_materialize_result().metadata
    if metadata is None:
        raise DistributedTrainingError(f"{name}: rank 0 reported no materialization through Pipes")
    # Pipes resolves what rank 0 reports into MetadataValues (the type says raw values may be given).
    reported = {k: v.value for k, v in metadata.items() if isinstance(v, dg.MetadataValue)}
    result_file = scratch / RESULT_FILE
    for key, path in (
        ("train_result_sha256", result_file),
        ("weights_sha256", scratch / "checkpoint" / WEIGHTS_FILE),
    ):
        if reported.get(key) != sha256_file(path):
            raise PipelineInputError(
                f"{path} does not match the sha256 rank 0 reported through Pipes ({key}); it changed after training"
            )
    trained, _ = read_train_result(result_file)
    train_data, val_data, meta = load_labels(labels.path)
    prep = prepare_lm(
        family,
        model_settings,
        train_settings,
        train_data,
        int(meta["vocab_size"]),
        model_meta={"tokenizer_sha256": labels.tokenizer_sha256},
    )
    load_weights_into(prep.model, trained.checkpoint_dir, expected_meta=model_metadata(prep.model, prep.header))
    prep.model.to(prep.device)
    # What rank 0 reported through Pipes is what the materialization records.
    launched = {"launcher": "torchrun", **{k: reported[k] for k in ("world_size", "backend", "strategy")}}
    world_size = reported["world_size"]
    if not isinstance(world_size, int):
        raise PipelineInputError(f"rank 0 reported world_size={world_size!r} through Pipes, not a number of processes")
    return finish_lm(prep, trained, val_data, world_size=world_size, **common), launched
