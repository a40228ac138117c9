"""The memory tasks' trainings in one pool against each task's own pool, one task after another (how
the three assets ran before they became one step), at the default config's settings. Both sides
take turns, --repeats times, so that a change in the machine's load hits them alike; every result
row of the two is compared, to show that the pool changes the time and nothing else.

    python benchmarks/memory_pool.py --out benchmarks/results/memory_pool_cpu_<kind>.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import emit  # noqa: E402

from components.core.studies.induction import InductionSettings, plan_induction  # noqa: E402
from components.core.studies.memory import plan_delay, plan_recall  # noqa: E402
from components.core.studies.memory_pool import run_studies  # noqa: E402
from components.core.studies.memory_tasks import DelaySettings, RecallSettings  # noqa: E402

PLANS = {
    "delay": (plan_delay, DelaySettings),
    "induction": (plan_induction, InductionSettings),
    "recall": (plan_recall, RecallSettings),
}
ORDER = ("delay", "induction", "recall")  # the order the three assets ran in, one after another


def _plans() -> dict:
    return {name: PLANS[name][0](PLANS[name][1]()) for name in ORDER}


def one_after_another() -> tuple[float, dict]:
    """Each task planned and run on its own pool, in turn (planning, training and finishing timed)."""
    t0, out = time.perf_counter(), {}
    for name in ORDER:
        out |= run_studies({name: PLANS[name][0](PLANS[name][1]())})
    return time.perf_counter() - t0, out


def together() -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = run_studies(_plans())
    return time.perf_counter() - t0, out


def _comparable(r) -> dict:
    return {"rows": r.rows, "final_losses": [m["final_loss"] for m in r.models]}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out")
    a = p.parse_args()
    seconds: dict[str, list[float]] = {"one_after_another": [], "one_pool": []}
    same = True
    for _ in range(a.repeats):
        s1, apart = one_after_another()
        s2, pooled = together()
        seconds["one_after_another"].append(round(s1, 2))
        seconds["one_pool"].append(round(s2, 2))
        same = same and all(_comparable(apart[n]) == _comparable(pooled[n]) for n in ORDER)
        print(f"one after another {s1:.1f} s, one pool {s2:.1f} s, same results: {same}", file=sys.stderr, flush=True)
    train_seconds = {
        n: {
            m["model"] + (f"_delay{m['delay']}" if "delay" in m else ""): round(m["train_seconds"], 2) for m in r.models
        }
        for n, r in pooled.items()
    }
    emit(
        {
            "benchmark": "memory_pool",
            "settings": "the config classes' defaults (configs/default.yaml)",
            "repeats": a.repeats,
            "seconds": seconds,
            "ratio_one_pool": round(min(seconds["one_pool"]) / min(seconds["one_after_another"]), 3),
            "same_results": same,
            "train_seconds_in_pool": train_seconds,
            "train_seconds_total": round(sum(v for t in train_seconds.values() for v in t.values()), 1),
        },
        a.out,
    )


if __name__ == "__main__":
    main()
