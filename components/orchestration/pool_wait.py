"""A blocked step waits without spinning: Dagster 1.13's executors busy-loop while a step waits for
a pool slot (our `training` pool, limit 1, held by another run).

Two defects, both in Dagster's execution loop:
- in-process executor: `InstanceConcurrencyContext.interval_to_next_pending_claim_check` returns
  `min([0, *(time left)])`, never above 0, so `sleep_til_ready` never sleeps and the run's process
  polls at full speed for as long as the other run's step holds the slot;
- multiprocess executor: with no step in flight and every ready step blocked, its loop has no
  wait at all.

Measured (2-core CPU, two runs of `corpus … lstm_lm` on one state folder, in-process): the waiting
run took one core the whole time, and the running run's LSTM step, 4.9 s alone, took 2 min 7 s (its
two torch threads fought the spinning process for two cores). `apply()` patches both places, each
only when the installed Dagster still has the defect (the first is recognised from its source), so
a fixed Dagster runs untouched. Called when the code location loads (`pipelines/definitions.py`),
which every process that executes a run or a step does.
"""

from __future__ import annotations

import inspect
import time

# The longest one wait may last with the multiprocess executor: it also polls for a termination
# request and for its children, so it must come back within about a second.
MAX_IDLE_WAIT_S = 1.0


def _interval_to_next_pending_claim_check(self) -> float:
    """Seconds until the earliest pending claim may be retried (0 when one is due, or none pends)."""
    pending = [self._pending_timeouts[k] for k in self._pending_claims if k in self._pending_timeouts]
    if not pending:
        return 0.0
    return max(0.0, min(pending) - time.time())


def _spins(fn) -> bool:
    try:
        return "min([0," in inspect.getsource(fn).replace(" ", "")
    except (OSError, TypeError):
        return False


def apply() -> list[str]:
    """Patch what the installed Dagster needs; returns the names patched (for tests and logs)."""
    from dagster._core.execution.plan.active import ActiveExecution
    from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

    patched = []
    if _spins(InstanceConcurrencyContext.interval_to_next_pending_claim_check):
        InstanceConcurrencyContext.interval_to_next_pending_claim_check = _interval_to_next_pending_claim_check
        patched.append("InstanceConcurrencyContext.interval_to_next_pending_claim_check")
    if not getattr(ActiveExecution.get_steps_to_execute, "_waits_when_blocked", False):
        original = ActiveExecution.get_steps_to_execute

        def get_steps_to_execute(self, limit=None):
            steps = original(self, limit)
            ctx = getattr(self, "_instance_concurrency_context", None)
            if not steps and not getattr(self, "_in_flight", True) and ctx is not None and ctx.has_pending_claims():
                # nothing running, nothing startable: wait for the next claim retry (bounded), not spin
                time.sleep(min(MAX_IDLE_WAIT_S, max(0.05, ctx.interval_to_next_pending_claim_check())))
            return steps

        get_steps_to_execute.__dict__["_waits_when_blocked"] = True  # (a function attribute: the mark of the patch)
        ActiveExecution.get_steps_to_execute = get_steps_to_execute
        patched.append("ActiveExecution.get_steps_to_execute")
    return patched
