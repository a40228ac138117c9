"""What a smaller batch costs each language-model family in wall time: one training step (forward,
backward, fused AdamW) of each model of a finished run, as the run built it, at batch 4, 8 and 16 and
at 1 and 2 threads, on random bytes of the run's context length. At equal FLOPs a batch half as large
takes twice the steps, so the cost per token is what decides whether a smaller batch fits a time budget.

    python benchmarks/batch_step_cost.py --state /path/to/state --out benchmarks/results/batch_step_cost_cpu_avx512.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.result_file import emit, newest_in_state  # noqa: E402

MODELS = ("rnn_lm", "lstm_lm", "transformer_lm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, help="the state folder of a finished default run")
    ap.add_argument("--steps", type=int, default=16, help="timed steps per point (after 4 warm-up steps)")
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch

    from components.core.lm import build_model

    arts = Path(args.state) / "artifacts"
    results = {}
    threads_before = torch.get_num_threads()  # restored before `emit` records the machine's thread count
    for name in MODELS:
        m = json.loads(newest_in_state(arts / name, "manifest.json").read_text())
        T = int(m["metrics"]["context_length"])
        torch.manual_seed(0)
        model = build_model(m["family"], m["model_config"], int(m["vocab_size"]))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        row = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for bs in (4, 8, 16):
                x = torch.randint(0, int(m["vocab_size"]), (bs, T))
                times = []
                for i in range(4 + args.steps):
                    t0 = time.perf_counter()
                    _, loss = model(x, x)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    if i >= 4:
                        times.append(time.perf_counter() - t0)
                ms = statistics.median(times) * 1e3
                row[f"threads{threads}_bs{bs}_ms_per_step"] = round(ms, 2)
                row[f"threads{threads}_bs{bs}_us_per_token"] = round(ms * 1e3 / (bs * T), 2)
            for bs in (4, 8):
                row[f"threads{threads}_bs{bs}_cost_per_token_vs_bs16"] = round(
                    row[f"threads{threads}_bs{bs}_us_per_token"] / row[f"threads{threads}_bs16_us_per_token"], 3
                )
        results[name] = {"batch_size_trained": m["train_settings"]["batch_size"], **row}
        print(name, {k: v for k, v in row.items() if "vs_bs16" in k}, file=sys.stderr, flush=True)
    torch.set_num_threads(threads_before)
    emit(
        {
            "benchmark": "batch_step_cost",
            "state": str(args.state),
            "models": results,
            "notes": "median of the timed steps; cost_per_token_vs_bs16 > 1 means that batch costs more wall time per "
            "token than 16, i.e. more wall time for the same FLOPs budget.",
        },
        args.out,
    )


if __name__ == "__main__":
    main()
