"""Settings of the scaling-law study (`scaling.run_scaling`) and their check: a leaf module."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError


class ScalingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    budgets: list[float] = Field(
        default=[5.5e12, 1.1e13, 2.2e13, 4.4e13],
        description="Training FLOPs of each point, increasing; at least 3 (the fit has three parameters). The default "
        "starts at the default run's 5.5e12 and spans 8× upward.",
    )
    size_exponent: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="param_budget ∝ C^size_exponent from the input model's parameters at budgets[0] (0.5: "
        "Chinchilla's compute-optimal split, parameters and tokens growing alike; 0: one size).",
    )
    smallest_lr_factors: list[float] = Field(
        default=[0.5, 1.0, 2.0],
        description="The learning rates swept at budgets[0], × the input model's, when the input model was not "
        "trained at budgets[0] and so cannot be the first point.",
    )
    largest_lr_factors: list[float] = Field(
        default=[0.5, 1.0], description="The learning rates swept at the largest budget, × the smallest budget's."
    )
    largest_batch_factors: list[int] = Field(
        default=[1], description="The batch sizes swept at the largest budget, × the smallest budget's."
    )
    reuse_trained: bool = Field(
        default=True,
        description="The input model is the first point when it was trained at budgets[0] (saves its cost).",
    )
    heldout_fraction: float = Field(
        default=0.1,
        gt=0.0,
        lt=1.0,
        description="The sweeps' trials train on the training split less its last `heldout_fraction` and are scored "
        "on that tail; the chosen values are then trained on the whole training split and scored on the validation "
        "split, which the claims judge and which never chooses.",
    )
    bootstrap: int = Field(default=1000, ge=50, description="Redraws of the points for the fits' intervals.")
    horizon: float = Field(
        default=1e4, gt=1.0, description="Crossings of two fitted curves are searched up to this × the largest budget."
    )
    default_noise: float = Field(
        default=0.01,
        gt=0.0,
        description="Seed noise (nats) of a family whose spread over seeds was not measured, when no family's was.",
    )
    seed: int = Field(default=0, description="Seed of the bootstrap.")


def check_settings(s: ScalingSettings, where: str = "scaling_laws") -> None:
    """Bad grids fail before anything trains, naming the setting."""
    if not s.budgets:
        raise ConfigError(f"{where}.budgets is empty: give at least 3 training-FLOP budgets, increasing")
    bad = [b for b in s.budgets if not (math.isfinite(b) and b > 0)]
    if bad:
        raise ConfigError(f"{where}.budgets holds non-positive or non-finite values {bad}")
    if any(b >= c for b, c in zip(s.budgets, s.budgets[1:])):
        raise ConfigError(f"{where}.budgets={s.budgets} is not increasing: list each budget once, smallest first")
    if len(s.budgets) < 3:
        raise ConfigError(f"{where}.budgets has {len(s.budgets)} budget(s): the fit L∞ + a·C^−α needs at least 3")
    for name in ("smallest_lr_factors", "largest_lr_factors", "largest_batch_factors"):
        values = getattr(s, name)
        if not values:
            raise ConfigError(f"{where}.{name} is empty: give at least one factor (1 for the value itself)")
        if any(not (math.isfinite(v) and v > 0) for v in values):
            raise ConfigError(f"{where}.{name}={values}: every factor must be > 0")
