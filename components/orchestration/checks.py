"""The article's claims (`components.core.claims`) as Dagster asset checks: the claim's statement is
the check's description, its verdict the result, its sub-checks and figures the metadata. The run's
report judges the same claims with the same functions."""

from __future__ import annotations

import math
from typing import Any

import dagster as dg

from components.core.claims import Claim, Verdict, claim


def _metadata_value(v: Any) -> Any:
    if isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)  # NaN/inf shown as text
    return dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else str(v)


def check_result(c: Claim, v: Verdict, *, named: bool = False) -> dg.AssetCheckResult:
    """The verdict as a check result; `named` for a check yielded by its asset (a check spec)."""
    metadata = {k: _metadata_value(x) for k, x in {**v.checks, **v.figures}.items() if x is not None}
    metadata.update(kind=c.kind, section=c.section, verdict="passed" if v.passed else ("failed" if v.judged else "not judged"))
    if v.note:
        metadata["note"] = v.note
    # Not judged (nothing measured) is no pass: a failed check at WARN severity whose metadata says why.
    return dg.AssetCheckResult(
        check_name=c.name if named else None,
        passed=v.passed,
        severity=dg.AssetCheckSeverity.WARN if c.warn or not v.judged else dg.AssetCheckSeverity.ERROR,
        metadata=metadata,
    )


def description(c: Claim) -> str:
    """The check's description: the statement, and for an article claim its section and falsifier."""
    if c.kind == "invariant":
        return f"Invariant (true by construction): {c.statement}"
    return f"Article §{c.section}: {c.statement} Fails if: {c.falsifier}"


def claim_spec(name: str, asset: str) -> dg.AssetCheckSpec:
    """A check spec of claim `name` for an asset that evaluates it itself (`yield judged(...)`)."""
    c = claim(name)
    return dg.AssetCheckSpec(c.name, asset=asset, description=description(c), blocking=c.blocking)


def judged(name: str, manifest: dict) -> dg.AssetCheckResult:
    c = claim(name)
    return check_result(c, c.judge(manifest), named=True)


def claim_check(name: str, asset: Any) -> dg.AssetChecksDefinition:
    """An asset check of claim `name` on `asset` (its manifest judged by the claim's function)."""
    c = claim(name)

    @dg.asset_check(asset=asset, name=c.name, description=description(c), blocking=c.blocking)
    def _check(manifest: dict) -> dg.AssetCheckResult:
        return check_result(c, c.judge(manifest))

    return _check
