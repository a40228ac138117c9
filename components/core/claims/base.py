"""What every claim is built from: the `Verdict` a check returns, the `Claim` it is registered as,
and the article's sections (`SECTIONS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

LANGUAGE_MODELS = "*language models*"  # a claim judged on every language-model asset
# The kinds of check (see the package docstring): only "evidence" is counted in the report's headline.
KINDS = ("evidence", "demonstration", "invariant")

# The article's sections as this project reads them (the `section` of each claim).
SECTIONS = {
    "1.1": "One-hot vectors and learned word vectors",
    "1.2": "What word vectors learn: similarity and analogy (king − man + woman ≈ queen)",
    "2.1": "Recurrent networks: one word after another",
    "2.2": "Vanishing and exploding gradients; clipping",
    "2.3": "The LSTM's gates",
    "3.1": "Attention: a weighted mix of every word",
    "3.2": "Positional encoding",
    "3.3": "Multi-head attention, the FFN and the residual stream",
    "4.1": "Long context: the N² score matrix and fused kernels",
    "4.2": "Generation: the KV cache against a recurrent state",
    "5.1": "Quantization: INT8 and 4-bit",
    "5.2": "Export and reload",
}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    checks: dict[str, bool]
    figures: dict[str, Any]  # numbers, short strings
    note: str = ""
    judged: bool = True  # False: nothing was measured to judge (never counted as passed)


def verdict(checks: dict[str, bool], figures: dict[str, Any] | None = None, note: str = "") -> Verdict:
    checks = {k: bool(v) for k, v in checks.items()}
    return Verdict(passed=bool(checks) and all(checks.values()), checks=checks, figures=dict(figures or {}), note=note)


def not_judged(note: str, figures: dict[str, Any] | None = None) -> Verdict:
    """Nothing to judge (the stage did not measure it in this configuration): not passed, and says why."""
    return Verdict(passed=False, checks={}, figures=dict(figures or {}), note=note, judged=False)


not_measured = not_judged  # the older name


@dataclass(frozen=True)
class Claim:
    name: str  # the asset check's name
    asset: str  # the asset whose manifest is judged, or LANGUAGE_MODELS
    statement: str  # in English, the project's own words
    judge: Callable[[Any], Verdict] = field(repr=False)  # the manifest of `asset` (its Manifest class) → verdict
    blocking: bool = False
    warn: bool = False  # a finding of a trained model or a timing: a warning, not an error, when it fails
    # "evidence": the article's, a plausible wrong model, data or implementation would fail it on this run;
    # "demonstration": the article's point where it holds by construction or by mathematics (shown, never
    # counted as evidence); "invariant": true by construction of our code (a failure is a bug)
    kind: str = "evidence"
    section: str = ""  # the article's section it tests (`SECTIONS`)
    statement_zh: str = ""  # the statement in Chinese
    falsifier: str = ""  # the result that fails it
    # Evidence: the test that builds a world where it must fail and asserts it does ("tests/<file>.py::<test>"),
    # and whether that world is measured (real code trained or run) or a hand-written manifest.
    counterexample: str = ""
    counterexample_measured: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.name}: kind {self.kind!r} is not one of {KINDS}")
