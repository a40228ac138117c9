"""Checkpoint files of a training run: write, verify, read back, and refuse another model's.

`save_checkpoint` writes `model.safetensors` (weights + metadata: the model identity and step),
`train_state.pt` (optimizer, step, identity, sampler/RNG state, history; torch.save, loaded with
weights_only=True) and `sha256.json` (the SHA-256 of both) into a folder, atomically.
`load_checkpoint` restores them, refusing (CheckpointMismatchError) a checkpoint of another model or
a pair of files from different saves, and (CheckpointCorruptError) a file whose bytes changed since
it was written, all before anything is loaded. `read_metadata`, `load_model_weights` and
`load_weights_into` serve downstream stages. Split out of `components.core.training` (the module
doc there describes the files under `out_dir`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
from pydantic import BaseModel
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_model

from .artifacts import atomic_dir, read_json, set_weights_mode, sha256_file, write_json
from .errors import ConfigError, PipelineInputError
from .models.sizing import count_parameters

WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "train_state.pt"
CHECKSUM_FILE = "sha256.json"
CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FORMAT = "1"

# What a checkpoint's weights belong to: recorded in both files, compared on every restore.
IDENTITY_KEYS = ("model_kind", "model_config", "vocab_size", "tokenizer_sha256")


class CheckpointMismatchError(ConfigError):
    """A checkpoint on disk belongs to another model (kind, config, vocabulary or tokenizer), or its
    two files (weights and train state) come from different saves."""


class CheckpointCorruptError(PipelineInputError):
    """A checkpoint file's bytes are not those written (its SHA-256 differs from the one recorded
    with the checkpoint), or no SHA-256 was recorded: it is never resumed from."""


def model_metadata(model: nn.Module, model_meta: dict | None = None) -> dict[str, str]:
    """The identity of a model, as safetensors metadata (strings only)."""
    config = getattr(model, "config", None)
    if isinstance(config, BaseModel):
        config_json = config.model_dump_json()
    elif config is not None and hasattr(config, "__dict__"):
        config_json = json.dumps(vars(config), sort_keys=True, default=str)
    else:
        config_json = "{}"
    meta = {
        "format_version": CHECKPOINT_FORMAT,
        "model_kind": str(getattr(model, "model_kind", type(model).__name__)),
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "model_config": config_json,
        "vocab_size": str(getattr(model, "vocab_size", "")),
        "params": str(count_parameters(model)),
        "tokenizer_sha256": "",
        **getattr(model, "weight_layout", {}),
    }
    for k, v in (model_meta or {}).items():
        meta[k] = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return meta


def check_compatible(stored: dict[str, str], expected: dict[str, str], where: str | Path) -> None:
    """Refuse a checkpoint of another model; the message names every differing field."""
    diffs = []
    for key in ("model_kind", "vocab_size", "tokenizer_sha256"):
        a, b = stored.get(key, ""), expected.get(key, "")
        if a != b:
            diffs.append(f"{key}: checkpoint {a or '(none)'!r} != now {b or '(none)'!r}")
    old_cfg = json.loads(stored.get("model_config", "{}") or "{}")
    new_cfg = json.loads(expected.get("model_config", "{}") or "{}")
    for key in sorted(set(old_cfg) | set(new_cfg)):
        if old_cfg.get(key) != new_cfg.get(key):
            diffs.append(f"model_config.{key}: checkpoint {old_cfg.get(key)!r} != now {new_cfg.get(key)!r}")
    if diffs:
        raise CheckpointMismatchError(
            f"cannot resume from {where}: it belongs to another model ({'; '.join(diffs)}). "
            "Restore the original settings, point out_dir elsewhere, or start fresh with resume=False."
        )


def check_layout(meta: dict[str, str], model: nn.Module, where: str | Path) -> None:
    """Refuse weights whose layout (`model.weight_layout`, e.g. which channels RoPE pairs) is not the
    one `model` computes with: such weights load without a shape error and give wrong numbers."""
    for key, want in getattr(model, "weight_layout", {}).items():
        got = meta.get(key)
        if got != want:
            raise CheckpointMismatchError(
                f"{where} was written with {key}={got or '(not recorded: written by an earlier version)'!r}, "
                f"but this model computes with {key}={want!r}; retrain it (rematerialize the model asset)"
            )


def _check_same_save(meta: dict[str, str], state: dict, ckpt_dir: Path) -> None:
    """The weights' header and train_state.pt must describe the same step of the same model."""
    weights, state_file = ckpt_dir / WEIGHTS_FILE, ckpt_dir / STATE_FILE
    fix = f"delete {ckpt_dir} or start fresh with resume=False"
    if "metadata" not in state:
        raise CheckpointMismatchError(f"{state_file} records no model identity (an older format); {fix}")
    if meta.get("step") != str(state["step"]):
        raise CheckpointMismatchError(
            f"{weights} says step {meta.get('step')} but {state_file} says step {state['step']}: "
            f"the two files come from different saves; {fix}"
        )
    for key in IDENTITY_KEYS:
        if meta.get(key, "") != state["metadata"].get(key, ""):
            raise CheckpointMismatchError(
                f"{weights} says {key}={meta.get(key, '')!r} but {state_file} says "
                f"{key}={state['metadata'].get(key, '')!r}: the two files belong to different models; {fix}"
            )


def save_checkpoint(
    ckpt_dir: str | Path,
    model: nn.Module,
    *,
    step: int,
    optimizer: torch.optim.Optimizer | None = None,
    train_state: dict | None = None,
    model_meta: dict | None = None,
) -> Path:
    """Write `ckpt_dir/model.safetensors` (+ `train_state.pt` when an optimizer is given), atomically.

    The folder is replaced as a whole, so a crash mid-write leaves the previous checkpoint intact.
    Both files record the step and the model identity. Tied tensors are stored once (safetensors
    refuses aliases); `load_weights_into` restores the tie.
    """
    ckpt_dir = Path(ckpt_dir)
    meta = {**model_metadata(model, model_meta), "step": str(step)}
    with atomic_dir(ckpt_dir) as tmp:
        save_model(model, str(tmp / WEIGHTS_FILE), metadata=meta)
        set_weights_mode(tmp / WEIGHTS_FILE)
        if optimizer is not None:
            identity = {k: meta[k] for k in IDENTITY_KEYS}
            state = {"step": step, "metadata": identity, "optimizer": optimizer.state_dict(), **(train_state or {})}
            torch.save(state, tmp / STATE_FILE)
        write_json(tmp / CHECKSUM_FILE, {f.name: sha256_file(f) for f in sorted(tmp.iterdir()) if f.is_file()})
    return ckpt_dir


def verify_checkpoint_file(ckpt_dir: Path, name: str) -> None:
    """`ckpt_dir/name` has the SHA-256 recorded when the checkpoint was written (CheckpointCorruptError if not)."""
    path, sums = ckpt_dir / name, ckpt_dir / CHECKSUM_FILE
    over = f"Start over with resume=False (or delete {ckpt_dir}); it is never resumed from"
    if not sums.is_file():
        raise CheckpointCorruptError(
            f"{ckpt_dir} records no checksums ({CHECKSUM_FILE}; an older or partial checkpoint) so "
            f"{path} cannot be verified. {over}"
        )
    try:
        expected = read_json(sums).get(name)
    except (ValueError, AttributeError) as e:
        raise CheckpointCorruptError(f"{sums} is corrupt ({e}). {over}") from e
    got = sha256_file(path)
    if got != expected:
        raise CheckpointCorruptError(
            f"{path} is corrupt: its sha256 is {got[:12]}… but {expected[:12] if expected else '(none)'}… was recorded "
            f"when the checkpoint was written (in {sums}). {over}"
        )


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata header of a .safetensors file (or of a checkpoint folder's weights)."""
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    if not path.is_file():
        raise PipelineInputError(f"no weights at {path}; train the model first")
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # a truncated or foreign file: say which, and what to do
        raise PipelineInputError(f"{path} is not a readable safetensors file ({e}); delete it and retrain") from e


def load_model_weights(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(state_dict, metadata) of a .safetensors file or checkpoint folder, for downstream stages.

    A tied matrix appears under one name only; load it with `load_weights_into(model, path)` or
    `model.load_state_dict(sd, strict=False)`.
    """
    meta = read_metadata(path)
    path = Path(path)
    return load_file(str(path / WEIGHTS_FILE if path.is_dir() else path), device=str(device)), meta


def load_weights_into(
    model: nn.Module, path: str | Path, *, expected_meta: dict[str, str] | None = None
) -> dict[str, str]:
    """Load a checkpoint's weights into `model` (strict; ties restored), after an identity check."""
    path = Path(path)
    meta = read_metadata(path)
    if expected_meta is not None:
        check_compatible(meta, expected_meta, path)
    check_layout(meta, model, path)
    device = next(model.parameters()).device
    load_model(model, str(path / WEIGHTS_FILE if path.is_dir() else path), strict=True, device=str(device))
    return meta


def load_checkpoint(
    ckpt_dir: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    expected_meta: dict[str, str] | None = None,
) -> dict:
    """Restore weights (and optimizer) from `ckpt_dir`; returns the train state dict plus 'metadata'
    (the weights' header).

    Refuses (CheckpointMismatchError) a checkpoint whose model kind, config, vocabulary or
    tokenizer hash differ from `expected_meta`, and a train_state.pt whose step or model identity
    differ from the weights' header; refuses (CheckpointCorruptError) a file whose SHA-256 is not
    the one recorded in sha256.json — all before anything is loaded into `model`.
    """
    ckpt_dir = Path(ckpt_dir)
    meta = read_metadata(ckpt_dir)
    if expected_meta is not None:
        check_compatible(meta, expected_meta, ckpt_dir)
    state: dict = {}
    if (ckpt_dir / STATE_FILE).is_file():
        verify_checkpoint_file(ckpt_dir, STATE_FILE)
        try:
            state = torch.load(ckpt_dir / STATE_FILE, map_location="cpu", weights_only=True)
        except Exception as e:
            raise PipelineInputError(
                f"{ckpt_dir / STATE_FILE} cannot be read ({e}); delete {ckpt_dir} or start fresh with resume=False"
            ) from e
        _check_same_save(meta, state, ckpt_dir)
    elif optimizer is not None:
        raise PipelineInputError(
            f"{ckpt_dir} holds weights but no {STATE_FILE}; it cannot be resumed, start fresh with resume=False"
        )
    verify_checkpoint_file(ckpt_dir, WEIGHTS_FILE)
    load_weights_into(model, ckpt_dir)
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    state["metadata"] = meta
    return state


class _Unsharded:
    """Checkpoints of a model every rank holds whole: the functions above."""

    save_checkpoint = staticmethod(save_checkpoint)
    load_checkpoint = staticmethod(load_checkpoint)
