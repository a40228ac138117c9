"""A language-model asset trained by torchrun through Dagster Pipes (`train.launcher: torchrun`, 2 gloo
processes, tiny config): a rank killed mid-training fails the step with the launcher's report, records
no materialization, leaves the MLflow run FAILED and no process behind, while the `training` pool's
slot is held for the whole launch; the rerun resumes from the last checkpoint and materializes
through Pipes with rank 0's metrics in MLflow. A world size that does not fit fails before anything
launches. The labels chain is materialized once for the module."""

from __future__ import annotations

import copy
import os
import signal
import threading
import time
from pathlib import Path

import dagster as dg
import pytest
from cli import TINY, instance, manifest, materializations, mlflow_runs, step_errors

from components.core.distributed import cpu_cores

pytestmark = pytest.mark.slow  # Dagster runs that launch torchrun workers

LM = "transformer_lm"


def materialize(inst, selection: list[str], lm_train: dict | None = None):
    from pipelines.definitions import defs

    cfg = copy.deepcopy(TINY)
    cfg["ops"][LM]["config"]["train"].update(lm_train or {})
    return dg.materialize(
        list(defs.assets) + list(defs.asset_checks),
        resources=defs.resources,
        selection=selection,
        instance=inst,
        run_config={"ops": {k: v for k, v in cfg["ops"].items() if k in selection}},
        raise_on_error=False,
    )


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """A state folder with a real SQLite instance (the `training` pool limited to 1) and the labels chain."""
    state = tmp_path_factory.mktemp("ddp") / "state"
    mp = pytest.MonkeyPatch()
    mp.setenv("PIPELINE_STATE_DIR", str(state))
    mp.setenv("DAGSTER_HOME", str(state / "dagster"))
    from components.orchestration.state import ensure_stores

    ensure_stores(dagster=True)  # what `pipelines.maintenance init` does first, in this process
    inst = instance(state)
    result = materialize(inst, ["corpus", "tokenizer", "labels", "ngram_baseline"])
    assert result.success, "\n".join(step_errors(inst, result.run_id))
    yield state, inst
    mp.undo()


def rank_processes() -> dict[int, int]:
    """Rank → pid of the torchrun workers started below this process."""
    me, found = str(os.getpid()), {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            env = dict(kv.split("=", 1) for kv in (d / "environ").read_text().split("\0") if "=" in kv)
        except OSError:
            continue
        if "TORCHELASTIC_RUN_ID" in env and "RANK" in env and _descends_from(int(d.name), me):
            found[int(env["RANK"])] = int(d.name)
    return found


def _descends_from(pid: int, ancestor: str) -> bool:
    while pid > 1:
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        if str(pid) == ancestor:
            return True
    return False


def checkpoint_step(state: Path) -> int | None:
    from components.core.checkpoint import read_metadata

    found = list((state / "checkpoints" / LM).glob("*/checkpoint/model.safetensors"))
    return int(read_metadata(found[0])["step"]) if found else None


def lm_mlflow_runs(state: Path, run_id: str):
    client, runs = mlflow_runs(state)
    mine = [
        r for r in runs if r.data.tags.get("dagster.run_id") == run_id and r.data.tags.get("dagster.asset_key") == LM
    ]
    assert len(mine) == 1, [r.data.tags for r in runs]
    return client, mine[0]


# Long enough that the kill lands mid-training (5-20 ms a step here), checkpoints every 10 steps.
DDP = {
    "launcher": "torchrun",
    "nproc_per_node": 2,
    "max_steps": 200,
    "flops_budget": None,  # 200 is max_steps' default: only with the budget off does it decide the steps
    "checkpoint_interval": 10,
    "eval_interval": 100,
    "log_interval": 10,
}


def test_a_killed_rank_fails_the_asset_and_the_rerun_resumes(state):
    state, inst = state
    seen: dict = {}

    def kill_rank_1_after_a_checkpoint() -> None:
        watcher = instance(state)
        deadline = time.time() + 240
        while time.time() < deadline:
            ranks = rank_processes()
            step = checkpoint_step(state)
            if step is not None and 1 in ranks:
                seen["claims"] = [
                    (c.run_id, c.step_key)
                    for c in watcher.event_log_storage.get_concurrency_info("training").claimed_slots
                ]
                seen["killed_after_step"] = step
                os.kill(ranks[1], signal.SIGKILL)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_rank_1_after_a_checkpoint)
    killer.start()
    failed = materialize(inst, [LM], DDP)
    killer.join()

    # The step failed with the launcher's report: which rank, how, and the checkpoint kept.
    assert "killed_after_step" in seen, "the training ended before a rank could be killed"
    assert not failed.success
    (error,) = step_errors(inst, failed.run_id)
    assert "data-parallel training failed: rank 1" in error and "was killed by SIGKILL; then rank 0" in error, error
    kept = checkpoint_step(state)
    assert kept is not None and kept >= seen["killed_after_step"] and kept < DDP["max_steps"]
    assert f"The last checkpoint (step {kept})" in error and "a rerun resumes from it" in error
    # The `training` pool's one slot was this step's while torchrun ran.
    assert seen["claims"] == [(failed.run_id, LM)]
    assert LM not in materializations(inst, failed.run_id)
    client, run = lm_mlflow_runs(state, failed.run_id)
    assert run.info.status == "FAILED" and "rank 1" in run.data.tags["error"]
    assert min(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == 10  # rank 0 logged live
    assert rank_processes() == {}  # no rank left training into the checkpoint folder

    # The rerun resumes from the kept checkpoint, in 2 processes again, and materializes through Pipes.
    rerun = materialize(inst, [LM], DDP)
    assert rerun.success, "\n".join(step_errors(inst, rerun.run_id))
    meta = materializations(inst, rerun.run_id)[LM].metadata
    assert meta["resumed_from_step"].value == kept
    assert (meta["launcher"].value, meta["world_size"].value, meta["backend"].value) == ("torchrun", 2, "gloo")
    out = manifest(inst, rerun.run_id, LM)
    assert (
        out["launch"] == {"launcher": "torchrun", "world_size": 2, "backend": "gloo", "strategy": "ddp"}
        and out["metrics"]["steps"] == 200
    )
    client, run = lm_mlflow_runs(state, rerun.run_id)
    assert run.info.status == "FINISHED"
    # rank 0's log points after the resume, once each (the asset's headline train/loss is the last
    # of them, not logged again)
    logged = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert logged == list(range(kept + 10, 201, 10))
    assert run.data.metrics["val/loss"] == pytest.approx(out["metrics"]["val/loss"])
    assert checkpoint_step(state) is None  # the scratch checkpoint is gone with the success


def test_a_world_size_that_does_not_fit_fails_before_anything_launches(state):
    state, inst = state
    too_many = cpu_cores() + 1
    specs = set(state.glob("checkpoints/**/spec.json"))
    result = materialize(inst, [LM], {"launcher": "torchrun", "nproc_per_node": too_many, "batch_size": 8 * too_many})
    assert not result.success
    (error,) = step_errors(inst, result.run_id)
    assert f"ops.{LM}.config.train.nproc_per_node={too_many} CPU processes do not fit this machine" in error
    assert LM not in materializations(inst, result.run_id)
    assert set(state.glob("checkpoints/**/spec.json")) == specs  # no launch was prepared
    _, run = lm_mlflow_runs(state, result.run_id)
    assert run.info.status == "FAILED"
