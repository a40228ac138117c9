"""A run whose step waits for a pool slot held by another run sleeps while it waits
(components/orchestration/pool_wait.py), instead of spinning a core as Dagster 1.13 does."""

from __future__ import annotations

import threading
import time

import dagster as dg

import pipelines.definitions  # noqa: F401  (loading the code location applies the fix, as in every run)
from components.orchestration import pool_wait

HOLD_S = 4.0


def test_the_installed_dagster_is_recognised_and_patched_once():
    from dagster._core.execution.plan.active import ActiveExecution
    from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

    assert InstanceConcurrencyContext.interval_to_next_pending_claim_check is (
        pool_wait._interval_to_next_pending_claim_check
    )
    assert getattr(ActiveExecution.get_steps_to_execute, "_waits_when_blocked", False)
    assert pool_wait.apply() == []  # applying again changes nothing


def test_a_step_blocked_by_another_runs_slot_sleeps_until_it_is_free(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        storage = inst.event_log_storage
        storage.set_concurrency_slots("training", 1)
        assert storage.claim_concurrency_slot("training", "other-run", "other-step").is_claimed

        @dg.asset(pool="training")
        def waits_for_the_slot() -> int:
            return 1

        release = threading.Timer(HOLD_S, storage.free_concurrency_slot_for_step, ("other-run", "other-step"))
        release.start()
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        try:
            result = dg.materialize([waits_for_the_slot], instance=inst)
        finally:
            release.cancel()
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    assert result.success
    assert wall >= HOLD_S  # it did wait for the other run's slot
    # Spinning, this thread burns the whole wait (about HOLD_S of CPU); sleeping, only the run's own
    # work and a claim retry about once a second.
    assert cpu < 0.5 * HOLD_S, f"the waiting run used {cpu:.2f} s of CPU in {wall:.2f} s"
