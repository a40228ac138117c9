"""The article's claims (`components.core.claims`) as Dagster asset checks: the claim's statement is
the check's description, its verdict the result, its sub-checks and figures the metadata. The run's
report judges the same claims with the same functions."""

from __future__ import annotations

import math
import time
from typing import Any

import dagster as dg

from components.core.claims import Claim, Verdict, claim
from components.core.manifests import Manifest


def _metadata_value(v: Any) -> Any:
    if isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return (
            v if math.isfinite(v) else str(v)
        )  # full precision (the one-line reason shows them rounded); NaN/inf as text
    return dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else str(v)


def reason(c: Claim, v: Verdict, limit: int = 4) -> str:
    """The verdict in one line, what the run's report shows in the claim's row: which sub-checks
    failed (or that all held), the note, then the first figures, rounded."""
    from components.core.report_format import fmt

    failed = [k for k, ok in v.checks.items() if not ok]
    if failed:
        head = ("warning" if c.warn else "failed") + ": not " + ", not ".join(failed)
    elif not v.judged:
        head = "not judged"
    else:
        head = "passed: " + ", ".join(v.checks)
    figures = [
        f"{k} {fmt(x)}" for k, x in v.figures.items() if isinstance(x, (bool, int, float, str)) and x is not None
    ]
    shown = "; ".join(figures[:limit]) + (f"; … {len(figures) - limit} more" if len(figures) > limit else "")
    return head + (f" ({v.note})" if v.note else "") + (f" — {shown}" if shown else "")


def check_result(c: Claim, v: Verdict, *, named: bool = False) -> dg.AssetCheckResult:
    """The verdict as a check result; `named` for a check yielded by its asset (a check spec). Its
    description (which the check page shows above the metadata) and the metadata entry `reason`
    say in one line why it passed or failed. Not judged (nothing measured) is no pass: a failed
    check at WARN severity whose reason says why."""
    line = reason(c, v)
    metadata: dict[str, Any] = {"reason": line}
    metadata.update({k: _metadata_value(x) for k, x in {**v.checks, **v.figures}.items() if x is not None})
    metadata.update(
        kind=c.kind, section=c.section, verdict="passed" if v.passed else ("failed" if v.judged else "not judged")
    )
    if v.note:
        metadata["note"] = v.note
    # When it was judged: the check page's "Timestamp" is when Dagster planned the check (the run's
    # creation), which for a check evaluated by its asset's step is before the materialization.
    metadata["judged_at"] = dg.MetadataValue.timestamp(time.time())
    return dg.AssetCheckResult(
        check_name=c.name if named else None,
        passed=v.passed,
        severity=dg.AssetCheckSeverity.WARN if c.warn or not v.judged else dg.AssetCheckSeverity.ERROR,
        metadata=metadata,
        description=line,
    )


def description(c: Claim) -> str:
    """The check's description: the statement, and for an article claim its section and falsifier."""
    if c.kind == "invariant":
        return f"Invariant (true by construction): {c.statement}"
    if c.kind == "demonstration":
        return f"Demonstration of article §{c.section} (holds by construction, not evidence): {c.statement}"
    return f"Article §{c.section}, evidence: {c.statement} Fails if: {c.falsifier}"


def claim_spec(name: str, asset: str) -> dg.AssetCheckSpec:
    """A check spec of claim `name` for an asset that evaluates it itself (`yield judged(...)`)."""
    c = claim(name)
    return dg.AssetCheckSpec(c.name, asset=asset, description=description(c), blocking=c.blocking)


def judged(name: str, manifest: Manifest) -> dg.AssetCheckResult:
    c = claim(name)
    return check_result(c, c.judge(manifest), named=True)


def claim_check(name: str, asset: Any) -> dg.AssetChecksDefinition:
    """An asset check of claim `name` on `asset` (its manifest judged by the claim's function)."""
    c = claim(name)

    @dg.asset_check(asset=asset, name=c.name, description=description(c), blocking=c.blocking)
    def _check(manifest: Manifest) -> dg.AssetCheckResult:
        return check_result(c, c.judge(manifest))

    return _check


def claim_checks(assets: list[Any]) -> list[dg.AssetChecksDefinition]:
    """The asset check of every registered claim whose asset is among `assets` (definitions or keys),
    in the registry's order: a claim is wired by its registry entry alone. The claims judged on every
    language model (`LANGUAGE_MODELS`) are the language-model component's."""
    from components.core.claims import CLAIMS, LANGUAGE_MODELS

    keys = {}
    for a in assets:
        for key in a.keys if isinstance(a, dg.AssetsDefinition) else [dg.AssetKey.from_coercible(a)]:
            keys[key.to_user_string()] = key
    return [claim_check(c.name, keys[c.asset]) for c in CLAIMS if c.asset != LANGUAGE_MODELS and c.asset in keys]
