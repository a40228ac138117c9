"""Fail fast: the whole run config is validated when any step of the run starts, before anything
trains, and every problem is listed at once.

Dagster checks names and types at launch; the config classes' own rules (ranges, cross-field
checks) run only when a step builds its config, which for a late step can be many minutes into a
run. Here every section of the run config goes through its asset's config class, and the limits
between assets are checked: a context length cannot exceed the labels' block size. So is what the
machine allows: a torchrun training's world size must fit its cores or GPUs and divide the batch.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterable, Mapping

import dagster as dg
from pydantic import ValidationError

from components.core.data import context_problems
from components.core.distributed import LaunchSettings, world_size_problems
from components.core.errors import ConfigError
from components.core.lm import explicit_settings_win
from components.core.models.recurrent import RecurrentSettings
from components.core.models.transformer import TransformerSettings
from components.core.train_settings import TrainSettings

LABELS = "labels"


def config_classes(assets_defs: Iterable[dg.AssetsDefinition]) -> dict[str, type]:
    """Op name → the config class its asset function takes (`config: ...`)."""
    out: dict[str, type] = {}
    for a in assets_defs:
        if a.computation is None:  # an upstream outside the run's selection, seen as a spec
            continue
        fn = getattr(a.op.compute_fn, "decorated_fn", None)
        if fn is None:
            continue
        param = inspect.signature(fn).parameters.get("config")
        if param is not None and isinstance(param.annotation, type):
            out[a.op.name] = param.annotation
    return out


def _format(err: ValidationError, op: str) -> list[str]:
    return [f"ops.{op}.config.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()]


def check_run_config(
    ops: dict[str, Any], classes: dict[str, type], labels_block_size: int | None, labels_name: str = LABELS
) -> list[str]:
    """Every problem of the run config `ops` (the `ops:` mapping), as 'where: what' lines
    (`labels_block_size`: that of the labels asset `labels_name` the ops read)."""
    problems: list[str] = []
    built: dict[str, Any] = {}
    for op, cls in classes.items():
        section = (ops.get(op) or {}).get("config", {}) or {}
        try:
            built[op] = cls(**section)
        except ValidationError as e:
            problems += _format(e, op)
        except (ValueError, TypeError) as e:
            problems.append(f"ops.{op}.config: {e}")
        else:
            train = getattr(built[op], "train", None)
            if isinstance(train, LaunchSettings) and isinstance(train, TrainSettings):
                problems += world_size_problems(train, train, where=f"ops.{op}.config.train")
    if LABELS in built:
        labels_block_size = built[LABELS].block_size
    if labels_block_size is None:
        return problems
    for op, cfg in built.items():
        train = getattr(cfg, "train", None)
        model = getattr(cfg, "model", None)
        if isinstance(model, (RecurrentSettings, TransformerSettings)) and isinstance(train, TrainSettings):
            # A language model: the settings it trains with, by the rule its asset applies (lm.explicit_settings_win).
            family = "recurrent" if isinstance(model, RecurrentSettings) else "transformer"
            defaults = classes[op]()
            try:
                m, _, _ = explicit_settings_win(family, model, defaults.model, train, defaults.train)
                {"recurrent": RecurrentSettings, "transformer": TransformerSettings}[family](**m.model_dump())
            except ConfigError as e:  # names its fields (model.…, train.…)
                problems.append(f"ops.{op}.config: {e}")
                continue
            except ValidationError as e:
                problems += [f"ops.{op}.config.model: {x['msg']}" for x in e.errors()]
                continue
        # The rule the training applies (data.context_length), checked before anything trains.
        problems += [
            p.replace("labels.block_size", f"{labels_name}.block_size")
            for p in context_problems(getattr(model, "block_size", None), labels_block_size, where=f"ops.{op}.config.")
        ]
        seq_len = getattr(cfg, "seq_len", None)
        if isinstance(seq_len, int) and seq_len > labels_block_size:
            problems.append(
                f"ops.{op}.config.seq_len={seq_len} exceeds {labels_name}.block_size={labels_block_size}: lower it or "
                f"raise {labels_name}.block_size"
            )
    return problems


def _recorded_labels_block_size(instance: dg.DagsterInstance, key: str = LABELS) -> int | None:
    event = instance.get_latest_materialization_event(dg.AssetKey(key))
    if event is None:
        return None
    materialization = event.asset_materialization
    value = materialization.metadata.get("block_size") if materialization is not None else None
    return int(value.value) if isinstance(value, dg.IntMetadataValue) and value.value is not None else None


def other_labels(assets_defs: Iterable[dg.AssetsDefinition]) -> dict[str, str]:
    """Op name → the labels asset it reads, for the ops whose input `labels` is not `labels` (a
    language model trained on `sharded_labels`)."""
    out = {}
    for a in assets_defs:
        if a.computation is None:
            continue
        key = a.keys_by_input_name.get("labels")
        if key is not None and key != dg.AssetKey(LABELS):
            out[a.op.name] = key.to_user_string()
    return out


def validate_run_config(context: dg.AssetExecutionContext) -> None:
    """Raise ConfigError listing every problem of this run's config (see `check_run_config`). An op
    that reads other labels than `labels` is checked against those labels' recorded block size."""
    selected = context.run.asset_selection  # None or empty: the job's whole graph
    executed = [
        a for a in context.job_def.asset_layer.asset_graph.assets_defs if not selected or set(a.keys) & selected
    ]
    classes = config_classes(executed)  # the assets this run executes
    raw = (context.run.run_config or {}).get("ops")
    ops: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    elsewhere = other_labels(executed)
    main = {op: cls for op, cls in classes.items() if op not in elsewhere}
    labels_block = None if LABELS in main else _recorded_labels_block_size(context.instance)
    problems = check_run_config(ops, main, labels_block)
    for op, key in elsewhere.items():
        if op in classes:
            problems += check_run_config(
                ops, {op: classes[op]}, _recorded_labels_block_size(context.instance, key), key
            )
    if problems:
        raise ConfigError(
            f"the run config has {len(problems)} problem(s); nothing was trained:\n"
            + "\n".join(f"- {p}" for p in problems)
        )
