"""The language-model assets' samples, drawn together against one after another: `sample_texts` with the
default run's sampling settings (3 samples of 200 tokens after 8 validation tokens) against three calls
of one sample each (what the function did before it batched prompts of one length), for every
language model a default run trained, at 2 threads, taking turns --repeats times.

    python benchmarks/sample_batch.py --state .state --out benchmarks/results/sample_batch_cpu_<kind>.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eval_batch import MODELS  # noqa: E402
from result_file import emit, newest_in_state, trained_lm  # noqa: E402

from components.core.labels import load_labels  # noqa: E402
from components.core.lm import SamplingSettings, sample_texts  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--state", required=True, help="the state folder of a finished default run")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    torch.set_num_threads(2)
    art = Path(a.state).resolve() / "artifacts"
    _, val, _ = load_labels(newest_in_state(art / "labels", "meta.json").parent)
    together = SamplingSettings()
    alone = together.model_copy(update={"num_samples": 1})
    cpu = torch.device("cpu")
    rows = []
    for name in a.models:
        _, model, dtype = trained_lm(art, name)
        sample_texts(model, val, together, cpu, dtype)  # warm-up
        times: dict[str, list[float]] = {"together": [], "one_by_one": []}
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            sample_texts(model, val, together, cpu, dtype)
            times["together"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _ in range(together.num_samples):
                sample_texts(model, val, alone, cpu, dtype)
            times["one_by_one"].append(time.perf_counter() - t0)
        rows.append(
            {
                "model": name,
                "dtype": str(dtype).removeprefix("torch."),
                "samples": together.num_samples,
                "sample_tokens": together.sample_tokens,
                "seconds_together": [round(t, 3) for t in times["together"]],
                "seconds_one_by_one": [round(t, 3) for t in times["one_by_one"]],
                "time_together_over_one_by_one": round(min(times["together"]) / min(times["one_by_one"]), 3),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    emit({"benchmark": "sample_batch", "state": str(Path(a.state)), "rows": rows}, a.out)


if __name__ == "__main__":
    main()
