"""A run against the one before it: each figure's previous value, the change, and whether it moved
beyond the noise of a rerun where that noise is known (the seed spread of `model_comparison`).

What a scheduled rerun is for: saying what moved since last time. `compare` takes this run's figures,
the previous materialization's and the known spreads; `Change.verdict` is one of

- "new": no previous value;
- "unchanged": the same value (a deterministic rerun on the same data and code);
- "within noise": moved by no more than its spread;
- "better" / "worse": moved beyond its spread, in a figure whose direction is known (a loss, a
  perplexity: lower is better; a throughput, an accuracy: higher is better);
- "changed": moved, with no spread known or no direction to say which way is better.

Framework-free: the Dagster layer reads the previous values and writes the table into metadata, the
MLflow parent's description and the report.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

LOWER_IS_BETTER = ("loss", "ppl", "perplexity")
HIGHER_IS_BETTER = ("accuracy", "tokens_per_s", "spearman")
EXACT = 1e-12  # relative: a rerun that reproduces a figure to float rounding is "unchanged"


def direction(name: str) -> int:
    """-1 when lower is better, +1 when higher is better, 0 when the figure has no better side."""
    leaf = name.lower()
    if any(k in leaf for k in HIGHER_IS_BETTER):
        return 1
    if any(k in leaf for k in LOWER_IS_BETTER):
        return -1
    return 0


@dataclass(frozen=True)
class Change:
    name: str
    current: float
    previous: float | None = None
    delta: float | None = None
    spread: float | None = None  # the noise of a rerun (seed spread), where known
    verdict: str = "new"

    def row(self) -> dict:
        return asdict(self)


def compare(
    current: Mapping[str, float],
    previous: Mapping[str, float] | None,
    spreads: Mapping[str, float] | None = None,
) -> list[Change]:
    """Each finite figure of `current` against `previous` (None: no previous run), in `current`'s order."""
    out = []
    for name, value in current.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            continue
        prev = (previous or {}).get(name)
        if not isinstance(prev, (int, float)) or isinstance(prev, bool) or not math.isfinite(prev):
            out.append(Change(name, float(value)))
            continue
        delta = float(value) - float(prev)
        spread = (spreads or {}).get(name)
        if abs(delta) <= EXACT * max(abs(value), abs(prev), 1.0):
            verdict = "unchanged"
        elif spread is not None and abs(delta) <= spread:
            verdict = "within noise"
        elif spread is not None and direction(name):
            verdict = "better" if delta * direction(name) > 0 else "worse"
        else:
            verdict = "changed"
        out.append(Change(name, float(value), float(prev), delta, spread, verdict))
    return out


def regressions(changes: Iterable[Change]) -> list[Change]:
    """The figures that got worse beyond their spread."""
    return [c for c in changes if c.verdict == "worse"]


def _fmt(v: float | None) -> str:
    if v is None:
        return ""
    return f"{v:+.4g}" if v and abs(v) < 1e6 else f"{v:.4g}"


def changes_markdown(changes: list[Change], previous_label: str = "previous run", limit: int = 40) -> str:
    """A markdown table: figure, previous, now, change, noise, verdict (the moved figures first)."""
    if not changes:
        return ""
    order = {"worse": 0, "better": 1, "changed": 2, "within noise": 3, "unchanged": 4, "new": 5}
    rows = sorted(changes, key=lambda c: order.get(c.verdict, 9))[:limit]
    lines = [
        f"| figure | {previous_label} | now | change | noise (seed spread) | verdict |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for c in rows:
        prev = "" if c.previous is None else f"{c.previous:.4g}"
        spread = "" if c.spread is None else f"{c.spread:.3g}"
        lines.append(f"| {c.name} | {prev} | {c.current:.4g} | {_fmt(c.delta)} | {spread} | {c.verdict} |")
    if len(changes) > limit:
        lines.append(f"| … {len(changes) - limit} more | | | | | |")
    return "\n".join(lines)


def counts(changes: Iterable[Change]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in changes:
        out[c.verdict] = out.get(c.verdict, 0) + 1
    return out
