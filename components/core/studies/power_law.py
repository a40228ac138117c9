"""The power law the scaling study fits, L(x) = L∞ + a · (x / x0)^(−α), with its parametric bootstrap,
and where fitted curves cross a level or each other (components/core/studies/scaling.py runs the
trainings and calls these)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from ..manifests import Crossing, ScalingFit

MAX_ALPHA = 3.0  # the fit's bound on α


def power_law(x: np.ndarray, l_inf: float, a: float, alpha: float) -> np.ndarray:
    return l_inf + a * np.power(x, -alpha)


@dataclass
class PowerLawFit:
    """L(x) = l_inf + a · (x / x0)^(−alpha) over points (x, loss ± sigma); `samples`: the bootstrap's
    refits (l_inf, a, alpha), one row each."""

    x0: float
    l_inf: float
    a: float
    alpha: float
    samples: np.ndarray  # (n, 3)

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        return power_law(np.asarray(x, dtype=float) / self.x0, self.l_inf, self.a, self.alpha)

    def interval(self, name: str) -> tuple[float, float]:
        col = self.samples[:, ("l_inf", "a", "alpha").index(name)]
        return float(np.percentile(col, 2.5)), float(np.percentile(col, 97.5))

    def summary(self) -> ScalingFit:
        (l_lo, l_hi), (a_lo, a_hi) = self.interval("l_inf"), self.interval("alpha")
        return ScalingFit(
            l_inf=self.l_inf,
            a=self.a,
            alpha=self.alpha,
            x0=self.x0,
            l_inf_lo=l_lo,
            l_inf_hi=l_hi,
            alpha_lo=a_lo,
            alpha_hi=a_hi,
        )


def _fit_once(x: np.ndarray, y: np.ndarray, sigma: np.ndarray) -> tuple[float, float, float] | None:
    from scipy.optimize import curve_fit

    top = float(y.min())
    l0 = max(top - 0.5 * max(float(y.max() - y.min()), 0.05), 0.0)
    p0 = (l0, max(float(y[0]) - l0, 1e-3), 0.5)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p, _ = curve_fit(
                power_law,
                x,
                y,
                p0=p0,
                sigma=sigma,
                absolute_sigma=True,
                bounds=([0.0, 0.0, 0.0], [max(top, 1e-9), np.inf, MAX_ALPHA]),
                maxfev=20000,
            )
    except (RuntimeError, ValueError):
        return None
    return float(p[0]), float(p[1]), float(p[2])


def fit_power_law(
    x: list[float] | np.ndarray,
    y: list[float] | np.ndarray,
    sigma: float | list[float],
    *,
    bootstrap: int = 1000,
    seed: int = 0,
) -> PowerLawFit:
    """The least-squares fit of L∞ + a·(x/x0)^−α (x0 = the smallest x) and its parametric bootstrap:
    every loss redrawn as y + N(0, σ²) and refitted `bootstrap` times."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) < 3 or len(x) != len(y):
        raise ValueError(f"a power-law fit needs at least 3 points (x, loss), got {len(x)} and {len(y)}")
    order = np.argsort(x)
    x, y = x[order], y[order]
    sig = np.broadcast_to(np.asarray(sigma, dtype=float), y.shape)
    if isinstance(sigma, (list, np.ndarray)):
        sig = np.asarray(sigma, dtype=float)[order]
    x0 = float(x[0])
    central = _fit_once(x / x0, y, sig)
    if central is None:
        raise RuntimeError("the power-law fit did not converge on the measured points")
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(bootstrap):
        p = _fit_once(x / x0, y + rng.normal(0.0, sig), sig)
        if p is not None:
            samples.append(p)
    return PowerLawFit(x0, *central, samples=np.asarray(samples, dtype=float).reshape(-1, 3))


def level_crossing(l_inf: float, a: float, alpha: float, level: float) -> float:
    """x / x0 where L(x) = level (the curve passes below `level` beyond it); inf if it never does."""
    if level <= l_inf or a <= 0 or alpha <= 0:
        return math.inf if power_law(np.array(1.0), l_inf, a, alpha) >= level else 0.0
    return (a / (level - l_inf)) ** (1.0 / alpha)


def curves_crossing(
    p: tuple[float, float, float], q: tuple[float, float, float], x_q0_over_p0: float, horizon: float, grid: int = 4000
) -> float:
    """The smallest x / x0_p ≥ 1 (on a log grid up to `horizon`) from which curve p lies below curve q
    for good; 1.0 when p is already below at x0_p, inf when it never passes within the horizon.
    `x_q0_over_p0`: q's normalisation point over p's (the same axis, other first points)."""
    xs = np.geomspace(1.0, horizon, grid)
    diff = power_law(xs, *p) - power_law(xs / x_q0_over_p0, *q)
    below = diff < 0
    if not below.any():
        return math.inf
    above = np.flatnonzero(~below)
    if len(above) == 0:
        return 1.0
    if above[-1] == len(xs) - 1:
        return math.inf  # p is above q at the horizon: it has not passed for good
    return float(xs[above[-1] + 1])


def _percentiles(values: list[float], central: float, measured: float | None = None) -> Crossing:
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return Crossing(central=central, median=central, lo=math.nan, hi=math.nan, never=math.nan, measured=measured)
    # Order statistics, not interpolation: a percentile among redraws that never cross is infinite.
    lo, med, hi = (float(np.percentile(v, q, method="inverted_cdf")) for q in (2.5, 50, 97.5))
    return Crossing(
        central=central,
        median=med,
        lo=lo,
        hi=hi,
        never=float(np.mean(np.isinf(v))),
        measured=None if measured is None else float(measured),
    )


def pass_level(fit: PowerLawFit, level: float, xs: list[float], losses: list[float]) -> Crossing:
    """Where `fit` passes `level`, in the fit's x units; `measured`: the first x whose measured loss is
    below the level."""
    measured = next((x for x, y in sorted(zip(xs, losses)) if y < level), None)
    central = fit.x0 * level_crossing(fit.l_inf, fit.a, fit.alpha, level)
    boot = [fit.x0 * level_crossing(l_inf, a, alpha, level) for l_inf, a, alpha in fit.samples]  # rows (n, 3)
    return _percentiles(boot, central, measured)


def overtake(
    p: PowerLawFit, q: PowerLawFit, horizon: float, xs: list[float], lp: list[float], lq: list[float]
) -> Crossing:
    """Where curve p passes below curve q for good (x units of p's axis); `measured`: the first
    common x from which p's measured loss stays below q's."""
    ratio = q.x0 / p.x0
    pairs = sorted(zip(xs, lp, lq))
    measured = None
    for i, (x, _, _) in enumerate(pairs):
        if all(a < b for _, a, b in pairs[i:]):
            measured = x
            break
    central = p.x0 * curves_crossing((p.l_inf, p.a, p.alpha), (q.l_inf, q.a, q.alpha), ratio, horizon)
    n = min(len(p.samples), len(q.samples))
    boot = [p.x0 * curves_crossing(tuple(p.samples[i]), tuple(q.samples[i]), ratio, horizon) for i in range(n)]
    return _percentiles(boot, central, measured)
