"""Rendering the attention-map grid (`plot_head_maps`: layers × heads panels of one sequence) as the
pipeline logs it (PNG, 100 dpi, tight bounding box), with the tokens labelling the grid's outer edges
only, against the previous figure that labelled every panel. Shapes of the default run: the
Transformers' `attention_maps` (4 × 4 panels, 16 tokens) and `attention_heads`' maps (4 × 4, 20
tokens). The two take turns --rounds times, so that a change in the machine's load hits both alike.

    python benchmarks/head_maps_render.py --out benchmarks/results/head_maps_render_cpu_<kind>.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import emit  # noqa: E402

from components.core.plots import plot_head_maps  # noqa: E402
from components.orchestration.tracking import figure_png  # noqa: E402

SHAPES = [("language model attention_maps", 4, 4, 16), ("attention_heads map", 4, 4, 20)]


def every_panel_labelled(weights: list[torch.Tensor], labels: list[str], title: str) -> Figure:
    """The previous figure: plot_head_maps with each panel's own tick labels shown again."""
    fig = plot_head_maps(weights, labels, title)
    for ax in fig.axes:
        ax.tick_params(labelbottom=True, labelleft=True)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    rows = []
    for name, L, H, T in SHAPES:
        g = torch.Generator().manual_seed(0)
        weights = [torch.softmax(torch.randn(1, H, T, T, generator=g), -1) for _ in range(L)]
        labels = [f"tok{i}" for i in range(T)]
        makers = {"outer_edges_labelled": plot_head_maps, "every_panel_labelled": every_panel_labelled}
        seconds: dict[str, list[float]] = {k: [] for k in makers}
        sizes = {}
        for _ in range(a.rounds):
            for k, make in makers.items():
                t0 = time.perf_counter()
                png = figure_png(make(weights, labels, "attention weights"))
                seconds[k].append(time.perf_counter() - t0)
                sizes[k] = len(png)
        rows.append(
            {
                "figure": name,
                "panels": [L, H],
                "tokens": T,
                **{f"seconds_{k}": [round(s, 3) for s in v] for k, v in seconds.items()},
                **{f"png_bytes_{k}": v for k, v in sizes.items()},
                "time_outer_over_every": round(
                    min(seconds["outer_edges_labelled"]) / min(seconds["every_panel_labelled"]), 3
                ),
            }
        )
    emit({"benchmark": "head_maps_render", "rows": rows}, a.out)


if __name__ == "__main__":
    main()
