"""A run whose step waits for a pool slot held by another run sleeps while it waits
(components/orchestration/pool_wait.py), instead of spinning a core as Dagster 1.13 does."""

from __future__ import annotations

import threading
import time

import dagster as dg

import pipelines.definitions  # noqa: F401  (loading the code location applies the fix, as in every run)
from components.orchestration import pool_wait

HOLD_S = 4.0


@dg.op(pool="training")
def waits_for_the_slot_op() -> int:
    return 1


@dg.job(executor_def=dg.multiprocess_executor)
def blocked_multiprocess_job():
    waits_for_the_slot_op()


def run_blocked(inst, run) -> tuple[bool, float, float]:
    """`run()` while another run holds the only `training` slot for HOLD_S seconds: (success, CPU
    seconds of this thread, wall seconds)."""
    storage = inst.event_log_storage
    storage.set_concurrency_slots("training", 1)
    assert storage.claim_concurrency_slot("training", "other-run", "other-step").is_claimed
    release = threading.Timer(HOLD_S, storage.free_concurrency_slot_for_step, ("other-run", "other-step"))
    release.start()
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    try:
        success = run()
    finally:
        release.cancel()
    return success, time.thread_time() - cpu0, time.perf_counter() - wall0


def test_the_installed_dagster_is_recognised_and_patched_once():
    from dagster._core.execution.plan.active import ActiveExecution
    from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

    assert InstanceConcurrencyContext.interval_to_next_pending_claim_check is (
        pool_wait._interval_to_next_pending_claim_check
    )
    assert getattr(ActiveExecution.get_steps_to_execute, "_waits_when_blocked", False)
    assert pool_wait.apply() == []  # applying again changes nothing


def test_a_step_blocked_by_another_runs_slot_sleeps_until_it_is_free(tmp_path):
    """In-process executor (what the config jobs use)."""

    @dg.asset(pool="training")
    def waits_for_the_slot() -> int:
        return 1

    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        success, cpu, wall = run_blocked(inst, lambda: dg.materialize([waits_for_the_slot], instance=inst).success)
    assert success
    assert wall >= HOLD_S  # it did wait for the other run's slot
    # Spinning, this thread burns the whole wait (about HOLD_S of CPU; 3.5 s unpatched); sleeping, only
    # the run's own work and a claim retry about once a second.
    assert cpu < 0.5 * HOLD_S, f"the waiting run used {cpu:.2f} s of CPU in {wall:.2f} s"


def test_a_multiprocess_run_with_nothing_to_start_sleeps_until_the_slot_is_free(tmp_path):
    """Multiprocess executor (asset-graph selections, automation): its loop runs in this thread and,
    with no step in flight and the only ready step blocked, must wait rather than spin (unpatched:
    4.9 s of CPU in 12 s). The step's process loads this file by path."""
    from dagster._core.definitions.reconstruct import ReconstructableJob

    job = ReconstructableJob.for_file(__file__, "blocked_multiprocess_job")
    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        success, cpu, wall = run_blocked(inst, lambda: dg.execute_job(job, instance=inst).success)
    assert success
    assert wall >= HOLD_S
    assert cpu < 0.5 * HOLD_S, f"the waiting run used {cpu:.2f} s of CPU in {wall:.2f} s"
