"""Hugging Face-style export folders that load and generate on their own.

    <folder>/model.safetensors        weights (quantization state as tensors), the scheme in the header
            config.json              architecture, precision recipe, training settings, tokenizer hash,
                                     the weights file's size and SHA-256, provenance
            tokenizer.json           the tokenizer the model was trained with (its SHA-256 is checked)
            generation_config.json   sampling defaults (max_new_tokens, temperature, top_k, special ids)
            README.md                a short model card

Safety: nothing is ever unpickled — weights are safetensors only, config files are JSON, and the
one `torch.load` (the load-time comparison) uses `weights_only=True`. A folder is written under a
temporary name and renamed into place, so a failed export leaves nothing half-written. `load_export`
refuses, each with an error naming the file or setting: a missing, truncated or corrupted
`model.safetensors` (size and SHA-256 against config.json, then the header itself), a tensor whose
shape does not fit the architecture in config.json, a `tokenizer.json` whose hash differs from the
one the model was trained with, an unknown quantization scheme, and (through
`precision.check_backend`) a bitsandbytes build that cannot run the scheme on the device.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from ..artifacts import atomic_dir, set_weights_mode, sha256_file
from ..checkpoint import check_layout
from ..data import PAD_ID
from ..errors import ConfigError, PipelineInputError
from ..tokenizer import BOS, EOS, UNK, load_tokenizer
from .linear_recurrence import rewrite_recurrent
from .precision import apply_precision, check_shapes, precision_state_dict, spec_of, to_precision
from .precision_spec import VARIANTS, PrecisionSpec, scheme_variant

FORMAT = "wordvec-to-transformer/export"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
GENERATION = "generation_config.json"
CARD = "README.md"
DEFAULT_GENERATION = {"max_new_tokens": 64, "temperature": 0.8, "top_k": 50}
MAX_NEW_TOKENS = 4096  # per `generate` call: a bound on the time one request can take


@dataclass
class ExportInfo:
    path: Path
    variant: str
    scheme: str
    weights_bytes: int  # model.safetensors on disk
    header_bytes: int  # its 8-byte length prefix + JSON header
    tensor_bytes: int  # the tensors' data
    files: dict[str, dict[str, Any]]  # name -> {bytes, sha256}
    spec: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "variant": self.variant,
            "scheme": self.scheme,
            "weights_bytes": self.weights_bytes,
            "header_bytes": self.header_bytes,
            "tensor_bytes": self.tensor_bytes,
            "files": self.files,
        }


# --------------------------------------------------------------------------------------------------
# Models of any family


def family_and_kind(model: nn.Module) -> tuple[str, str]:
    from ..lm import family_of

    return family_of(model), str(getattr(model, "model_kind", type(model).__name__))


def build_float(family: str, model_config: dict, vocab_size: int) -> nn.Module:
    """The float model of `family` from resolved settings (through the one driver, `lm.build_model`)."""
    from ..lm import build_model

    try:
        return build_model(family, {**model_config, "param_budget": None}, int(vocab_size))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model_config does not describe a {family} model ({e})") from e


# --------------------------------------------------------------------------------------------------
# Safetensors header


def read_header(path: str | Path) -> tuple[dict[str, Any], int]:
    """(the JSON header of a .safetensors file, its size on disk incl. the 8-byte length). Checks that
    the header is complete and that every tensor's data lies inside the file."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise PipelineInputError(
                f"{path} is truncated ({size} bytes): not even a safetensors length prefix; re-export the model"
            )
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100_000_000:
            raise PipelineInputError(
                f"{path} is truncated or not a safetensors file: its header claims {n} bytes but the file has {size}; "
                f"re-export the model"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise PipelineInputError(
            f"{path}: the safetensors header is not valid JSON ({e}); the file is corrupted, re-export the model"
        ) from e
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise PipelineInputError(
            f"{path} is truncated: its tensors need {8 + n + end} bytes but the file has {size}; re-export the model"
        )
    return header, 8 + n


def tensor_shapes(header: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def weights_metadata(model: nn.Module, config: dict | None = None) -> dict[str, str]:
    """The safetensors header that makes a weights file rebuildable on its own: family, kind,
    architecture, vocabulary, variant, scheme and the full precision recipe."""
    from .bnb_layers import bnb

    spec = spec_of(model)
    if spec is None:
        raise ConfigError("the model carries no precision spec; convert it with to_precision first")
    family, kind = family_and_kind(model)
    if config is None:
        cfg = getattr(model, "config", None)
        config = cfg.model_dump() if cfg is not None else {}
    spec_json = json.loads(spec.model_dump_json())
    if spec.quantized:
        spec_json["bitsandbytes_version"] = getattr(bnb(), "__version__", "?")
    return {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "family": family,
        "model_kind": kind,
        "model_config": json.dumps(config, sort_keys=True),
        "vocab_size": str(int(cast(int, model.vocab_size))),  # an int attribute: nn.Module's typing loses it
        "variant": spec.variant,
        "scheme": spec.scheme,
        "quantization": json.dumps(spec_json, sort_keys=True),
        **getattr(model, "weight_layout", {}),
    }


def save_weights(
    model: nn.Module, path: str | Path, *, config: dict | None = None, metadata: dict | None = None
) -> dict[str, int]:
    """Write a converted model's tensors to `path` (.safetensors, via a temporary name), its
    identity and precision in the header. Returns {bytes, header_bytes, tensor_bytes}."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        **weights_metadata(model, config),
        **{
            k: v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
            for k, v in (metadata or {}).items()
        },
    }
    tmp = path.with_name(f".{path.name}.partial")
    try:
        save_file(precision_state_dict(model), str(tmp), metadata=meta)
        set_weights_mode(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _, header_bytes = read_header(path)
    size = path.stat().st_size
    return {"bytes": size, "header_bytes": header_bytes, "tensor_bytes": size - header_bytes}


def _spec_from(q: dict, where: str) -> PrecisionSpec:
    variant = scheme_variant(q.get("scheme", ""), f"{where} quantization.scheme")
    if q.get("variant") != variant:
        raise ConfigError(f"{where}: quantization.variant {q.get('variant')!r} does not match scheme {q['scheme']!r}")
    return PrecisionSpec(**{k: v for k, v in q.items() if k in PrecisionSpec.model_fields})


def _rebuild(
    family: str,
    model_config: dict,
    vocab_size: int,
    spec: PrecisionSpec,
    weights: Path,
    header: dict,
    device: str | torch.device,
    config_note: str,
) -> nn.Module:
    skeleton = build_float(family, model_config, vocab_size)
    check_layout(header.get("__metadata__", {}) or {}, skeleton, weights)
    if spec.quantized:
        rewrite_recurrent(skeleton, spec.recurrent_as_linear)
    check_shapes(skeleton, spec, tensor_shapes(header), str(weights), config_note)
    try:
        tensors = load_file(str(weights), device="cpu")
    except Exception as e:  # safetensors' own validation (overlapping offsets, bad dtypes, …)
        raise PipelineInputError(f"{weights} is not a readable safetensors file ({e}); re-export the model") from e
    return apply_precision(skeleton, spec, tensors, device, str(weights))


def load_weights(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """A model from a weights file written by `save_weights` (or an export's model.safetensors) alone:
    architecture and precision from its header."""
    path = Path(path)
    if not path.is_file():
        raise PipelineInputError(f"{path}: no such weights file")
    header, _ = read_header(path)
    meta = header.get("__metadata__", {}) or {}
    missing = [k for k in ("family", "model_config", "vocab_size", "quantization") if k not in meta]
    if missing:
        raise PipelineInputError(
            f"{path}: the header lacks {missing}; not a weights file written by components.core.export"
        )
    try:
        q, model_config = json.loads(meta["quantization"]), json.loads(meta["model_config"])
    except ValueError as e:
        raise PipelineInputError(f"{path}: the header's quantization/model_config is not valid JSON ({e})") from e
    spec = _spec_from(q, f"{path} header")
    return _rebuild(
        meta["family"],
        model_config,
        int(meta["vocab_size"]),
        spec,
        path,
        header,
        device,
        "the architecture in its header",
    )


# --------------------------------------------------------------------------------------------------
# Export


def export_model(
    model: nn.Module,
    variant: str,
    out_dir: str | Path,
    *,
    tokenizer_path: str | Path,
    config: dict,
    train_settings: dict,
    provenance: dict,
    tokenizer_sha256: str | None = None,
    generation: dict | None = None,
    precision: dict | None = None,
) -> ExportInfo:
    """Write `model` at `variant` as a self-contained folder `out_dir` (replaced atomically).

    `model` is either already at `variant` (it carries a `precision_spec`, e.g. from `to_precision`)
    or a float model, then converted here with `precision` (to_precision's keyword settings).
    `config` is the architecture (the model's resolved settings); `tokenizer_sha256` the hash the model
    was trained with (default: provenance["tokenizer_sha256"]), refused if `tokenizer_path` differs.
    """
    if variant not in VARIANTS:
        raise ConfigError(f"variant {variant!r} is unknown; use one of: {', '.join(VARIANTS)}")
    tokenizer_path = Path(tokenizer_path)
    if not tokenizer_path.is_file():
        raise PipelineInputError(f"tokenizer file not found: {tokenizer_path}")
    tok_sha = sha256_file(tokenizer_path)
    expected = tokenizer_sha256 or provenance.get("tokenizer_sha256")
    if expected and expected != tok_sha:
        raise PipelineInputError(
            f"{tokenizer_path} has SHA-256 {tok_sha[:12]}…, but the model was trained with tokenizer {expected[:12]}…: "
            "its token ids would mean different things. Export with the tokenizer the model was trained with"
        )
    spec = spec_of(model)
    if spec is None:
        model = to_precision(model, variant, **(precision or {}))
        spec = spec_of(model)
        assert spec is not None  # to_precision attaches it
    elif spec.variant != variant:
        raise ConfigError(f"the model is at variant {spec.variant!r}, not {variant!r}; convert the float model instead")
    family, kind = family_and_kind(model)
    vocab_size = int(cast(int, model.vocab_size))
    spec_json = json.loads(weights_metadata(model, config)["quantization"])
    extra = {"tokenizer_sha256": tok_sha, "provenance": provenance}
    gen = {**DEFAULT_GENERATION, **(generation or {})}
    gen.update({"do_sample": gen["temperature"] > 0, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD_ID})
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        saved = save_weights(model, tmp / WEIGHTS, config=config, metadata=extra)
        shutil.copy2(tokenizer_path, tmp / TOKENIZER)
        header_bytes = saved["header_bytes"]
        weights = {"file": WEIGHTS, "bytes": saved["bytes"], "sha256": sha256_file(tmp / WEIGHTS)}
        cfg = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "architectures": [type(model).__name__],
            "family": family,
            "model_type": kind,
            "model_config": config,
            "vocab_size": vocab_size,
            "torch_dtype": spec.keep_dtype,
            "quantization": spec_json,
            "training": train_settings,
            "tokenizer_sha256": tok_sha,
            "special_tokens": {"pad": PAD_ID, "unk": UNK, "bos": BOS, "eos": EOS},
            "weights": weights,
            "provenance": provenance,
        }
        (tmp / CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n")
        (tmp / GENERATION).write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
        (tmp / CARD).write_text(_model_card(cfg, out_dir.name), encoding="utf-8")
        files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tmp.iterdir())}
    return ExportInfo(
        path=out_dir,
        variant=variant,
        scheme=spec.scheme,
        weights_bytes=weights["bytes"],
        header_bytes=header_bytes,
        tensor_bytes=weights["bytes"] - header_bytes,
        files=files,
        spec=spec_json,
    )


def _model_card(cfg: dict, name: str) -> str:
    q = cfg["quantization"]
    lines = [
        f"# {name}: {cfg['model_type']} at {q['variant']} ({q['scheme']})",
        "",
        f"- architecture: `{json.dumps(cfg['model_config'], sort_keys=True)}`, vocabulary {cfg['vocab_size']}",
        f"- quantized layers: {len(q.get('modules', []))}; kept float: {'; '.join(q.get('kept_float', [])) or '-'}",
        f"- weights: {cfg['weights']['bytes']} bytes, SHA-256 {cfg['weights']['sha256']}",
        f"- tokenizer SHA-256: {cfg['tokenizer_sha256']}",
        f"- provenance: `{json.dumps(cfg['provenance'], sort_keys=True, default=str)}`",
        "",
        "Try it without Dagster:",
        "",
        "```bash",
        f'python -m components.core generate --model {name} --prompt "The history of" --max-new-tokens 40',
        "```",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Load


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise PipelineInputError(f"{path} is missing: not a complete export folder ({what})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise PipelineInputError(f"{path} is not valid JSON ({e}); re-export the model") from e


def load_export(folder: str | Path, device: str | torch.device = "cpu", *, verify: bool = True):
    """(model in eval mode on `device`, tokenizer, config dict) from an export folder alone.

    verify: check model.safetensors' size and SHA-256 against config.json before reading it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise PipelineInputError(f"{folder}: no such export folder")
    cfg = read_json(folder / CONFIG, "architecture and precision")
    if cfg.get("format") != FORMAT:
        raise PipelineInputError(
            f"{folder / CONFIG}: format {cfg.get('format')!r} is not {FORMAT!r}; not an export of this project"
        )
    for key in ("family", "model_config", "vocab_size", "quantization", "tokenizer_sha256", "weights"):
        if key not in cfg:
            raise PipelineInputError(f"{folder / CONFIG} lacks {key!r}; re-export the model")
    q = cfg["quantization"]
    spec = _spec_from(q, str(folder / CONFIG))

    weights = folder / WEIGHTS
    if not weights.is_file():
        raise PipelineInputError(f"{weights} is missing; re-export the model")
    size = weights.stat().st_size
    if verify:
        rec = cfg["weights"]
        if size != rec.get("bytes"):
            raise PipelineInputError(
                f"{weights} has {size} bytes but {CONFIG} records {rec.get('bytes')}: the file is truncated or was "
                f"replaced; re-export the model"
            )
        if sha256_file(weights) != rec.get("sha256"):
            raise PipelineInputError(
                f"{weights} is corrupted: its SHA-256 differs from the one {CONFIG} records; re-export the model"
            )
    header, _ = read_header(weights)
    meta = header.get("__metadata__", {}) or {}
    if meta.get("scheme") != q["scheme"]:
        scheme_variant(meta.get("scheme", ""), f"{weights} header scheme")
        raise PipelineInputError(
            f"{weights} header says scheme {meta.get('scheme')!r} but {CONFIG} says {q['scheme']!r}; the files come "
            f"from different exports"
        )

    tok_file = folder / TOKENIZER
    if not tok_file.is_file():
        raise PipelineInputError(f"{tok_file} is missing; re-export the model")
    tok_sha = sha256_file(tok_file)
    if tok_sha != cfg["tokenizer_sha256"]:
        raise PipelineInputError(
            f"{tok_file} has SHA-256 {tok_sha[:12]}…, but the model was trained with tokenizer "
            f"{cfg['tokenizer_sha256'][:12]}… "
            f"({CONFIG}): token ids would mean different things. Put the original tokenizer.json back or re-export"
        )
    tokenizer = load_tokenizer(tok_file)

    note = f"the architecture in {folder / CONFIG} ({_arch_note(cfg)})"
    model = _rebuild(cfg["family"], cfg["model_config"], cfg["vocab_size"], spec, weights, header, device, note)
    return model, tokenizer, cfg


def _arch_note(cfg: dict) -> str:
    c = cfg.get("model_config", {})
    keys = [k for k in ("n_layer", "n_head", "n_embd", "hidden_size", "cell") if k in c]
    return ", ".join(f"{k}={c[k]}" for k in keys) + f", vocab_size={cfg.get('vocab_size')}"
