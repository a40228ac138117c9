"""One pool for the memory tasks' trainings.

Each study (delayed recall, associative recall, induction) is planned as its trainings, independent
jobs that each seed themselves, and what makes its result of their outcomes (`StudyPlan`).
`run_studies` runs the trainings of every plan it is given in one set of worker processes, the
longest first, then finishes each study here. Studies run one after another each left a core idle
while their last, longest training ran alone; side by side the short trainings of one fill that
gap in another. The outcomes are the same either way: a job's result depends on its own arguments,
not on the worker, the order or its neighbours.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

import torch

from ..workers import run_jobs

R = TypeVar("R")

ATTENTION_STEP_COST = 2.0  # an attention model's step against a recurrent one's at one batch (see training_cost)


@dataclass
class StudyPlan(Generic[R]):
    """A study's trainings and how its result is made of them.

    jobs: each training, a module-level function and its arguments (sent to a worker process).
    costs: each job's estimated cost: only their order matters (the longest start first).
    finish: the jobs' outcomes in job order -> the study's result (run here, with `threads`).
    workers, threads: the processes the study asks for, and the torch threads it trains and finishes with.
    """

    jobs: list[tuple[Callable[..., Any], tuple]]
    costs: list[float]
    finish: Callable[[list[Any]], R]
    workers: int
    threads: int


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def training_cost(kind: str, steps: int, batch_size: int, seq_len: int) -> float:
    """A training's cost, to order the pool's jobs: the tokens it may train on (steps × batch ×
    sequence length), twice that for the attention models, whose step took about twice a recurrent
    model's at one batch in the default run's associative recall (27 ms against 11-13 ms at one
    thread). A training that solves its task early stops sooner: that is not foreseen, and many short
    jobs queued behind the long ones even out what it leaves."""
    return steps * batch_size * seq_len * (ATTENTION_STEP_COST if kind in ("transformer", "window") else 1.0)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def run_studies(plans: Mapping[str, StudyPlan[R]]) -> dict[str, R]:
    """Every plan's trainings in one pool (as many workers as the most any plan asks for), the
    costliest first; then each study finished here, in the order given: name -> result."""
    if not plans:
        return {}
    flat = [(name, i, job, cost) for name, p in plans.items() for i, (job, cost) in enumerate(zip(p.jobs, p.costs))]
    order = sorted(range(len(flat)), key=lambda k: -flat[k][3])  # stable: ties keep the plans' own order
    workers = max(p.workers for p in plans.values())
    threads = max(p.threads for p in plans.values())
    outcomes: dict[str, list[Any]] = {name: [None] * len(p.jobs) for name, p in plans.items()}
    with torch_threads(threads):  # a job run here sets its own threads; restored after
        done = run_jobs(_call, [(flat[k][2][0], *flat[k][2][1]) for k in order], workers, threads)
    for k, result in zip(order, done):
        outcomes[flat[k][0]][flat[k][1]] = result
    out = {}
    for name, p in plans.items():
        with torch_threads(p.threads):
            out[name] = p.finish(outcomes[name])
    return out
