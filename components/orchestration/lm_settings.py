"""What a language model's run logs of its settings: those the config fixes when the step starts
(`logged_settings`, what the run decides later under `requested.`), and what the training did once
it ran — the architecture that trained (`effective_architecture`) and its steps, launcher and world
size (`effective_training`)."""

from typing import Any

from components.core.distributed import LaunchSettings

LAUNCH_FIELDS = tuple(LaunchSettings.model_fields)


def logged_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings logged when the step starts: what is fixed by the config as it is, what the run
    decides later under `requested.` (the steps, which a FLOPs budget overrides; the torchrun width
    and strategy, which an in-process launch does not use), and settings that do not take effect left
    out (a window without sliding-window attention). `effective_training` logs what ran."""
    train = dict(settings.get("train", {}))
    requested = {k: train.pop(k) for k in ("max_steps", *LAUNCH_FIELDS) if k in train}
    out = {**settings, "train": train, "requested": {"train": requested}}
    if "model" in settings:
        out["model"] = effective_architecture(settings["model"])
    return out


def effective_architecture(model: dict[str, Any]) -> dict[str, Any]:
    """A model's settings without those that do not take effect: the window and global positions
    without sliding-window attention, and unset values (a parameter budget of None)."""
    out = {k: v for k, v in model.items() if v is not None}
    if out.get("attention") not in (None, "sliding_window"):
        out.pop("window", None)
        out.pop("n_global", None)
    return out


def effective_training(metrics: dict[str, Any], launched: dict[str, Any]) -> dict[str, Any]:
    """What the training did: the steps it took, the launcher and world size (and the torchrun
    strategy where torchrun ran it)."""
    out = {
        "max_steps": int(metrics["steps"]),
        "launcher": launched.get("launcher", "inprocess"),
        "world_size": int(launched.get("world_size", 1)),
    }
    if "strategy" in launched:
        out["strategy"] = launched["strategy"]
    return out
