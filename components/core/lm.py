"""One language-model driver for every family: recurrent (RNN, LSTM) and Transformer.

    settings = resolve_settings(family, model_settings, vocab_size)   # param_budget → a width, once
    model = build_model(family, settings, vocab_size)                 # from resolved settings only
    result = train_lm(family, model_settings, train_settings, ...)    # all of it, through the shared loop
    model = load_lm(result.weights_path)                              # any family, never re-sized

`train_lm` builds the model, checks the attention kernel (Transformer) (`prepare_lm`), trains
through `training.train` (logging the explicit LSTM's gates), then adds FLOPs per token,
non-embedding parameters and MFU (GPU) to the loop's metrics, samples text and draws the figures
(`finish_lm`). Data-parallel training (`components.core.distributed`) runs the same two halves: the
ranks prepare and train, the launching process prepares again, loads the weights and finishes. Weights files
are safetensors with the model's identity in the header (family, model_kind, model_config — the
resolved settings —, vocab_size), so `load_lm` rebuilds any of them without knowing the family.
The models never import this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Optional, TypeVar, get_args

import numpy as np
import torch
import torch.nn as nn
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import save_model

from .artifacts import set_weights_mode
from .checkpoint import WEIGHTS_FILE, check_compatible, load_weights_into, model_metadata, read_metadata
from .data import PAD_ID, Blocks, context_length, tokens_per_step
from .device import autocast_context, estimate_mfu, resolve_device, resolve_dtype, seed_everything
from .errors import ConfigError, PipelineInputError
from .models import recurrent, transformer
from .models.recurrent import RecurrentLM, RecurrentSettings
from .models.sdpa_probe import detect_sdpa_backend
from .models.sizing import count_parameters
from .models.transformer import Transformer, TransformerSettings
from .plots import LSTM_GATES, plot_attention_maps, plot_history, plot_lstm_gates
from .train_settings import TrainSettings
from .training import TrainResult, train

Family = Literal["recurrent", "transformer"]
FAMILIES = get_args(Family)
ModelSettings = RecurrentSettings | TransformerSettings

SETTINGS: dict[str, type[ModelSettings]] = {"recurrent": RecurrentSettings, "transformer": TransformerSettings}
_MODELS: dict[str, type[nn.Module]] = {"recurrent": RecurrentLM, "transformer": Transformer}
_SIZERS: dict[str, Callable] = {"recurrent": recurrent.size_for_budget, "transformer": transformer.size_for_budget}


class SamplingSettings(BaseModel):
    """Text samples drawn from the trained model."""

    model_config = ConfigDict(extra="forbid")

    num_samples: int = Field(default=3, ge=0, description="Samples to generate after training (0 = none).")
    sample_tokens: int = Field(default=200, ge=1, description="New tokens per sample.")
    temperature: float = Field(default=0.8, ge=0.0, description="Softmax temperature; 0 = greedy.")
    top_k: Optional[int] = Field(
        default=50, ge=1, description="Sample among the k most likely tokens only (None = all)."
    )
    sample_prompt: str = Field(
        default="",
        description="Prompt text (needs an encoder); empty = the first prompt_tokens tokens of validation blocks.",
    )
    prompt_tokens: int = Field(
        default=8, ge=1, description="Tokens of a validation block used as the prompt when sample_prompt is empty."
    )
    sample_seed: int = Field(default=1234, description="Seed of the sampler.")


@dataclass
class LMResult:
    family: str
    metrics: dict[str, float]  # the loop's shared names + flops_per_token, params_non_embedding, mfu (GPU)
    config: ModelSettings  # as trained: resolved, param_budget None
    weights_path: Path  # checkpoint/model.safetensors, identity and config in its header
    checkpoint_dir: Path
    samples: list[str]
    attention_backend: dict  # the attention path observed (the SDPA kernel), or {"implementation": "recurrent"}
    warnings: list[str]
    history: list[dict]
    resumed_from_step: int  # 0 = a fresh run
    figures: dict[str, Figure] = field(default_factory=dict)  # loss_curve; attention_maps; lstm_gates


# --------------------------------------------------------------------------------------------------
# Settings and models


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ConfigError(f"family={family!r} is unknown; use one of: {', '.join(FAMILIES)}")


def _as_settings(family: str, model_settings: ModelSettings | dict) -> ModelSettings:
    """The family's own settings class (a dict or a subclass instance, e.g. a Dagster config, converted)."""
    _check_family(family)
    cls = SETTINGS[family]
    if isinstance(model_settings, cls) and type(model_settings) is cls:
        return model_settings
    if isinstance(model_settings, BaseModel):
        model_settings = model_settings.model_dump()
    return cls(**model_settings)


def language_net(model: nn.Module) -> Transformer | RecurrentLM:
    """`model` as one of the families' networks; anything else is a ConfigError naming its class."""
    if isinstance(model, (Transformer, RecurrentLM)):
        return model
    raise ConfigError(f"{type(model).__name__} is not a language model of any family ({', '.join(FAMILIES)})")


def family_of(model: nn.Module) -> str:
    for family, cls in _MODELS.items():
        if isinstance(model, cls):
            return family
    raise ConfigError(f"{type(model).__name__} is not a language model of any family ({', '.join(FAMILIES)})")


def resolve_settings(family: str, model_settings: ModelSettings | dict, vocab_size: int) -> ModelSettings:
    """The settings a model is built from: a param_budget resolved into a width (param_budget then
    None), or the settings unchanged when no budget is set."""
    settings = _as_settings(family, model_settings)
    return _SIZERS[family](settings, vocab_size)


WIDTH_FIELDS = {"transformer": ("n_embd",), "recurrent": ("n_embd", "hidden_size")}  # what param_budget sizes


S = TypeVar("S", bound=BaseModel)
T = TypeVar("T", bound=BaseModel)


def explicit_settings_win(
    family: str, model: S, model_defaults: BaseModel, train: T, train_defaults: BaseModel
) -> tuple[S, T, list[str]]:
    """A setting the user changed is never silently overridden by one derived from a default.

    `model`/`train` are the settings of a run, `*_defaults` what they would be had the user written
    nothing (a component's defaults); a setting is the user's when it differs from its default.
    - A width the user set (`n_embd`, or a recurrent `hidden_size`) turns a default `param_budget`
      off: the model is built at that width, as with `param_budget: null`. A width and a
      `param_budget` both set is a ConfigError naming both fields.
    - A `train.max_steps` the user set turns a default `train.flops_budget` off: the model trains
      those steps, as with `flops_budget: null`. Both set is a ConfigError naming both fields.
    Returns (model, train, notes): the same objects, or copies with a setting turned off, and one
    note per setting turned off."""
    notes: list[str] = []

    def changed(obj: BaseModel, defaults: BaseModel, key: str) -> bool:
        return getattr(obj, key) != getattr(defaults, key)

    budget = getattr(model, "param_budget", None)
    widths = [k for k in WIDTH_FIELDS[family] if changed(model, model_defaults, k)]
    if widths and budget is not None:
        written = ", ".join(f"model.{k}={getattr(model, k)}" for k in widths)
        if changed(model, model_defaults, "param_budget"):
            raise ConfigError(
                f"{written} and model.param_budget={budget} are both set, but param_budget chooses "
                f"{' and '.join(WIDTH_FIELDS[family])} itself: drop {written} to size the model by the budget, or set "
                "model.param_budget: null to build it at that width"
            )
        notes.append(f"{written} is set: the default model.param_budget={budget} is off (as with param_budget: null)")
        model = model.model_copy(update={"param_budget": None})
    steps, flops = getattr(train, "max_steps", None), getattr(train, "flops_budget", None)
    if changed(train, train_defaults, "max_steps") and flops is not None:
        if changed(train, train_defaults, "flops_budget"):
            raise ConfigError(
                f"train.max_steps={steps} and train.flops_budget={flops:.3g} are both "
                "set, but flops_budget chooses the steps itself: drop max_steps to train to the budget, or set "
                "train.flops_budget: null to train those steps"
            )
        notes.append(
            f"train.max_steps={steps} is set: the default train.flops_budget={flops:.3g} is off (as with "
            "flops_budget: null)"
        )
        train = train.model_copy(update={"flops_budget": None})
    return model, train, notes


def build_model(family: str, model_settings: ModelSettings | dict, vocab_size: int) -> nn.Module:
    """The family's model from resolved settings (a pending param_budget is a ConfigError: resolve first)."""
    settings = _as_settings(family, model_settings)
    return _MODELS[family](settings, vocab_size)


# --------------------------------------------------------------------------------------------------
# Weights on disk: safetensors only, identity and config in the header


def save_lm(model: nn.Module, path: str | Path, metadata: dict | None = None) -> Path:
    """Weights as .safetensors (tied matrices stored once) with family, model_kind, model_config and
    vocab_size (plus `metadata`) in the JSON header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(model, str(path), metadata=model_metadata(model, {"family": family_of(model), **(metadata or {})}))
    return set_weights_mode(path)


def load_lm(path: str | Path, device: str | torch.device = "cpu", expected_meta: dict | None = None) -> nn.Module:
    """Rebuild a model of any family from a .safetensors file or a checkpoint folder. The header's
    model_config holds the resolved widths, so nothing is re-sized. `expected_meta` (e.g. a
    tokenizer_sha256) refuses another model's weights, naming what differs. Strict: every tensor
    must match."""
    path = Path(path)
    file = path / WEIGHTS_FILE if path.is_dir() else path
    if not file.is_file():
        raise PipelineInputError(f"{file}: no such weights file; train the model first")
    meta = read_metadata(file)
    kind = meta.get("model_kind", "")
    family = meta.get("family") or ("recurrent" if kind.startswith("recurrent") else kind)
    if "model_config" not in meta or "vocab_size" not in meta or family not in FAMILIES:
        raise PipelineInputError(
            f"{file}: the safetensors header lacks family/model_kind, model_config or vocab_size; "
            "not a language-model checkpoint of this pipeline"
        )
    if expected_meta is not None:
        check_compatible(meta, expected_meta, file)
    # A checkpoint is only ever written of a built model: its widths are the resolved ones.
    settings = SETTINGS[family](**{**json.loads(meta["model_config"]), "param_budget": None})
    model = build_model(family, settings, int(meta["vocab_size"])).to(device)
    load_weights_into(model, file)
    return model


# --------------------------------------------------------------------------------------------------
# Training, samples, attention kernel


def lstm_gate_callback(step: int, model: nn.Module) -> dict[str, float] | None:
    """`step_callback` for `training.train`: the explicit LSTM's mean gate activations since the last log point."""
    stats = model.pop_gate_stats() if isinstance(model, RecurrentLM) else {}
    return stats or None


def attention_backend_report(model: nn.Module, device: torch.device, dtype: torch.dtype, T: int) -> dict:
    """The attention path the model runs on `device`: for `fused`, the SDPA kernel observed running."""
    net = language_net(model)
    if isinstance(net, RecurrentLM):
        return {"implementation": "recurrent", "observed": "recurrent (no attention)", "error": None}
    cfg = net.config
    if cfg.attention == "reference":
        return {"implementation": "reference", "observed": "reference (explicit QKᵀ·softmax·V)", "error": None}
    requested = cfg.sdpa_backend if device.type == "cuda" else "auto"  # pinning applies on CUDA only
    report = detect_sdpa_backend(device, dtype, (1, cfg.n_head, T, cfg.head_dim), requested)
    report["implementation"] = "fused"
    if cfg.sdpa_backend != "auto" and device.type != "cuda":
        report["note"] = (
            f"sdpa_backend={cfg.sdpa_backend!r} is pinned on CUDA only; on {device.type} torch chose the kernel"
        )
    return report


@dataclass
class PreparedLM:
    """A family's model built from its settings, before training: what `train_lm` trains and what
    `finish_lm` measures. The distributed worker prepares it in every rank, and the process that
    launched the ranks prepares it again to load the trained weights into (same settings, same seed)."""

    family: str
    settings: ModelSettings  # resolved (param_budget None)
    model: Transformer | RecurrentLM
    device: torch.device
    dtype: torch.dtype
    block_size: int  # the context trained on
    backend: dict  # attention_backend_report
    header: dict  # checkpoint metadata: family, param_budget, model_meta
    step_callback: Callable[[int, nn.Module], dict[str, float] | None] | None


def prepare_lm(
    family: str,
    model_settings: ModelSettings | dict,
    train_settings: TrainSettings,
    train_data: Blocks,
    vocab_size: int,
    *,
    model_meta: dict | None = None,
) -> PreparedLM:
    """Resolve the settings, build the model (seeded with train_settings.seed, so every run and every
    rank starts from the same weights) and verify the attention kernel before anything trains."""
    settings = resolve_settings(family, model_settings, vocab_size)
    seed_everything(train_settings.seed)  # the same init on every run of these settings
    model = language_net(build_model(family, settings, vocab_size))
    device, _ = resolve_device(train_settings.device)
    dtype = resolve_dtype(train_settings.dtype, device)
    T = context_length(getattr(settings, "block_size", None), train_data.block_size)

    # Verify the attention kernel before training: a pinned backend this GPU cannot run fails now, clearly.
    backend = attention_backend_report(model, device, dtype, T)
    if backend.get("error") and device.type == "cuda":
        raise ConfigError(
            f"{backend['error']}; set sdpa_backend='auto' or pick one of "
            f"{[k for k, ok in backend['available'].items() if ok]}"
        )

    explicit_lstm = (
        isinstance(settings, RecurrentSettings) and settings.cell == "lstm" and settings.lstm_impl == "explicit"
    )
    budget = _as_settings(family, model_settings).param_budget
    header = {"family": family, **({"param_budget": budget} if budget else {}), **(model_meta or {})}
    return PreparedLM(
        family, settings, model, device, dtype, T, backend, header, lstm_gate_callback if explicit_lstm else None
    )


def steps_for_budget(prep: PreparedLM, s: TrainSettings) -> TrainSettings:
    """`s` with max_steps set to the steps that spend s.flops_budget (the model's training FLOPs per
    token × the tokens of one step); `s` itself without a budget. A budget below one step, or one
    that leaves no room after warmup, is an error naming the setting."""
    if s.flops_budget is None:
        return s
    tokens = tokens_per_step(s.batch_size, prep.block_size, s.grad_accum)
    per_step = prep.model.flops_per_token(prep.block_size) * tokens
    steps = int(s.flops_budget // per_step)
    if steps < 1:
        raise ConfigError(
            f"train.flops_budget={s.flops_budget:.3g} is smaller than one step ({per_step:.3g} FLOPs for "
            f"{s.batch_size} × {prep.block_size} tokens of this model)"
        )
    if steps <= s.warmup_steps:
        raise ConfigError(
            f"train.flops_budget={s.flops_budget:.3g} buys {steps} steps, not more than warmup_steps={s.warmup_steps}"
        )
    return s.model_copy(update={"max_steps": steps})


def train_lm(
    family: str,
    model_settings: ModelSettings | dict,
    train_settings: TrainSettings,
    train_data: Blocks,
    val_data: Blocks,
    vocab_size: int,
    out_dir: str | Path,
    *,
    sampling: SamplingSettings | None = None,
    decode: Callable[[list[int]], str] | None = None,
    encode: Callable[[str], list[int]] | None = None,
    log_metrics: Callable[[dict[str, float], int], None] | None = None,
    progress: Callable[[dict[str, float], int, int, float], None] | None = None,
    resume: bool = True,
    model_meta: dict | None = None,
) -> LMResult:
    """Resolve and build the family's model, train it with the shared loop (resuming from
    out_dir/checkpoint), verify the attention kernel, report FLOPs and MFU, sample text, draw figures.

    `decode`/`encode` turn token ids into text and back (the tokenizer's); without `decode` samples
    are space-separated ids. `model_meta` goes into the checkpoint header (e.g. tokenizer_sha256).
    `progress(point, step, max_steps, eta_s)` is called at the loop's log points.
    """
    prep = prepare_lm(family, model_settings, train_settings, train_data, vocab_size, model_meta=model_meta)
    train_settings = steps_for_budget(prep, train_settings)
    result = train(
        prep.model,
        train_data,
        val_data,
        train_settings,
        out_dir,
        log_metrics=log_metrics,
        progress=progress,
        resume=resume,
        model_meta=prep.header,
        step_callback=prep.step_callback,
    )
    return finish_lm(prep, result, val_data, sampling=sampling, decode=decode, encode=encode)


def finish_lm(
    prep: PreparedLM,
    result: TrainResult,
    val_data: Blocks,
    *,
    sampling: SamplingSettings | None = None,
    decode: Callable[[list[int]], str] | None = None,
    encode: Callable[[str], list[int]] | None = None,
    world_size: int = 1,
) -> LMResult:
    """After training (`prep.model` holds the trained weights): FLOPs per token, non-embedding
    parameters, MFU (GPU; per device when `world_size` devices trained), samples and figures."""
    model, device, dtype, T = prep.model, prep.device, prep.dtype, prep.block_size
    notes = list(result.warnings)
    if prep.backend.get("note"):
        notes.append(prep.backend["note"])

    metrics = result.metrics()
    metrics["flops_per_token"] = model.flops_per_token(T)
    metrics["context_length"] = float(T)  # data.context_length's answer: the blocks it trained and was scored on
    metrics["params_non_embedding"] = float(count_parameters(model, non_embedding=True))
    mfu = estimate_mfu(metrics["flops_per_token"], result.tokens_per_s / world_size, device)
    if mfu is not None:
        metrics["mfu"] = mfu
    elif device.type == "cuda":
        notes.append(f"MFU not reported: {torch.cuda.get_device_name(device)} is not in the peak-FLOPs table")

    samples = sample_texts(model, val_data, sampling or SamplingSettings(), device, dtype, decode=decode, encode=encode)

    figures = {"loss_curve": plot_history(result.history, f"{model.model_kind} ({result.params} parameters)")}
    if isinstance(model, Transformer):
        x_vis = torch.from_numpy(val_data.x[:1, : min(32, T)].astype(np.int64)).to(device)  # (1, t)
        figures["attention_maps"] = plot_attention_maps(model, x_vis, decode=decode)
    if any(k in h for h in result.history for k in LSTM_GATES):
        figures["lstm_gates"] = plot_lstm_gates(result.history)
    return LMResult(
        family=prep.family,
        metrics=metrics,
        config=prep.settings,
        weights_path=result.checkpoint_dir / WEIGHTS_FILE,
        checkpoint_dir=result.checkpoint_dir,
        samples=samples,
        attention_backend=prep.backend,
        warnings=notes,
        history=result.history,
        resumed_from_step=result.resumed_from,
        figures=figures,
    )


@torch.no_grad()
def sample_texts(
    model: nn.Module,
    val_data: Blocks,
    sampling: SamplingSettings,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    *,
    decode: Callable[[list[int]], str] | None = None,
    encode: Callable[[str], list[int]] | None = None,
) -> list[str]:
    """`num_samples` continuations: of `sample_prompt` if given (needs `encode`), else of the first
    tokens of successive validation blocks (real text the model has not trained on). Any family:
    the model's `generate(idx, max_new_tokens, temperature, top_k)` draws from torch's RNG, seeded
    with sample_seed in a forked RNG state (training's RNG is left as it was)."""
    s = sampling
    if s.num_samples == 0:
        return []
    if s.sample_prompt:
        if encode is None:
            raise ConfigError(
                "sample_prompt is set but no tokenizer encoder was given; pass encode= or clear sample_prompt"
            )
        ids = encode(s.sample_prompt)
        if not ids:
            raise ConfigError(f"sample_prompt={s.sample_prompt!r} encodes to no tokens; use another prompt")
        prompts = [ids] * s.num_samples
    else:
        rows = np.array([i % val_data.n_blocks for i in range(s.num_samples)])
        x = val_data.batch(rows)[0][:, : s.prompt_tokens].tolist()  # the blocks' first tokens (in memory or sharded)
        prompts = [[t for t in row if t != PAD_ID] or row[:1] for row in x]
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    net = language_net(model)
    was_training = model.training
    model.eval().to(device)
    # Prompts of one length are continued together, one batch: each new token is one forward pass for all
    # of them (the three default samples cost about what one did one after another).
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    texts: list[str] = [""] * len(prompts)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(s.sample_seed)
        for rows_of in groups.values():
            idx = torch.tensor([prompts[i] for i in rows_of], dtype=torch.long, device=device)  # (b, t)
            with autocast_context(device, dtype):
                out = net.generate(idx, s.sample_tokens, temperature=s.temperature, top_k=s.top_k)  # (b, t+n)
            for i, row in zip(rows_of, out.tolist()):
                texts[i] = decode(row)
    model.train(was_training)
    return texts
