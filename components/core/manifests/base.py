"""What every manifest is: a typed record of one asset's output, stored as JSON.

A manifest is the small JSON an asset hands downstream (paths, sizes, hashes, headline numbers). In
code it is a frozen dataclass, one class per kind of asset output (`Manifest` subclasses in this
package); on disk it is that dataclass's fields plus a `manifest` tag (`"<kind>/<version>"`).

Reading is strict, so that a misspelt, renamed or missing field is found where the manifest is read,
with its name, not later as a `KeyError` in a claim:

- a stored manifest without the tag (written before manifests were typed, or by something else) is
  refused, and so is one of an unknown kind or another version;
- every field of the class must be present, and no other field may be;
- each value must have its field's type (nested dataclasses, `dict[str, X]`, `list[X]`, unions, …).

In code, collections default to empty so that a test can build the part a check reads; on disk
nothing defaults. Rows are typed too (a row dataclass per kind of row, in this package): a study
hands its rows over as plain dicts, and the manifest turns them into their row class when it is
built (`Manifest.__post_init__`), so a key the row class does not know, or a missing one without a
default, fails there with the row's name.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar, Union

from components.core.errors import PipelineInputError
from components.core.rerun import Change

TAG = "manifest"  # the field of a stored manifest that names its kind and version
ENVELOPE = ("asset", "dagster_run_id", "mlflow_run_id", "files", "figures", "published")


class ManifestError(PipelineInputError):
    """A stored manifest that does not match its class: names the manifest, the field and what is wrong."""


@dataclass(frozen=True, kw_only=True)
class FileRecord:
    """A file an output wrote (or recorded), checked by whoever reads the manifest."""

    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class Published:
    """What `Stage.publish` logged, kept for the run's report."""

    metrics: dict[str, float] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    table_rows: dict[str, int] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    mlflow_url: str = ""
    previous_run_id: str = ""  # the Dagster run of this asset's previous materialization ("" for the first)
    changes: list[Change] = field(default_factory=list)  # each figure against that one's

    def __post_init__(self) -> None:
        _type_rows(self)

    def change_of(self, name: str) -> Change | None:
        """The change of metric `name` since the previous materialization (None: not a headline metric)."""
        return next((c for c in self.changes if c.name == name), None)


def _type_rows(self: Any) -> None:
    """Rows handed over as plain dicts become the field's row dataclasses (see the module's notes)."""
    hints = _hints(type(self))
    for f in dataclasses.fields(self):
        value = getattr(self, f.name)
        typed = _typed(value, hints[f.name], f"{type(self).__name__}.{f.name}")
        if typed is not value:
            object.__setattr__(self, f.name, typed)


M = TypeVar("M", bound="Manifest")
KINDS: dict[str, type[Manifest]] = {}


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The envelope every output carries (filled in by `Stage.publish`); subclasses add the body.

    `KIND` names the subclass in stored manifests; `VERSION` changes when a field's meaning does."""

    KIND: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    asset: str = ""
    dagster_run_id: str = ""
    mlflow_run_id: str = ""
    files: dict[str, FileRecord] = field(default_factory=dict)
    figures: dict[str, FileRecord] = field(default_factory=dict)
    published: Published = field(default_factory=Published)

    def __post_init__(self) -> None:
        _type_rows(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("KIND")
        if kind:
            if kind in KINDS and KINDS[kind].__qualname__ != cls.__qualname__:
                raise TypeError(f"manifest kind {kind!r} is taken by {KINDS[kind].__qualname__}")
            KINDS[kind] = cls

    @property
    def tag(self) -> str:
        return f"{self.KIND}/{self.VERSION}"

    def to_json(self) -> dict[str, Any]:
        """The stored form: every field, and the tag."""
        if not self.KIND:
            raise TypeError(f"{type(self).__qualname__} has no KIND: only a subclass of Manifest is stored")
        return {TAG: self.tag, **_plain({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})}

    def body(self) -> dict[str, Any]:
        """The asset's own fields (not the envelope), as stored."""
        data = self.to_json()
        return {k: v for k, v in data.items() if k not in ENVELOPE and k != TAG}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _typed(value: Any, hint: Any, where: str) -> Any:
    """`value` with every plain dict that `hint` declares a dataclass built as that dataclass; other values as
    they are (numbers are not checked here: that is `from_json`'s work on stored manifests)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        rows = [a for a in args if dataclasses.is_dataclass(a)]
        return _typed(value, rows[0], where) if rows and isinstance(value, dict) else value
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return _row(hint, value, where)
    if (origin is list) and args and isinstance(value, (list, tuple)):
        typed = [_typed(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
        return value if isinstance(value, list) and all(a is b for a, b in zip(typed, value)) else typed
    if (origin is dict) and args and isinstance(value, dict):
        typed = {k: _typed(v, args[1], f"{where}[{k!r}]") for k, v in value.items()}
        return value if all(typed[k] is v for k, v in value.items()) else typed
    return value


def _row(cls: Any, data: dict[str, Any], where: str) -> Any:
    """A row dataclass from a study's dict: unknown keys and missing required ones name the row. A key that
    cannot be a field's name (`pass`) is renamed by the class's `ALIASES` (key → field)."""
    aliases = getattr(cls, "ALIASES", {})
    data = {aliases.get(k, k): v for k, v in data.items()}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    extra = sorted(set(data) - set(fields))
    if extra:
        raise TypeError(f"{where}: {cls.__name__} has no field{'s' if len(extra) > 1 else ''} {', '.join(extra)}")
    missing = [
        n
        for n, f in fields.items()
        if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise TypeError(f"{where}: {cls.__name__} needs {', '.join(missing)}")
    hints = _hints(cls)
    return cls(**{k: _typed(v, hints[k], f"{where}.{k}") for k, v in data.items()})


R = TypeVar("R")


def metric_group(cls: type[R], metrics: Mapping[str, float], prefix: str, where: str = "metrics") -> R | None:
    """The metrics logged under `prefix` (MLflow's names: "analogy/accuracy_lo" under "analogy/") as the
    dataclass `cls`, whose fields name them; fields with a default are optional. None when none of its
    required metrics was logged (the group was not measured); ManifestError naming what is missing when
    only some were."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    found = {f.name: metrics[prefix + f.name] for f in fields if prefix + f.name in metrics}
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in found]
    if len(missing) == len(required):
        return None
    if missing:
        raise ManifestError(f"{where}: {', '.join(prefix + n for n in missing)} not logged beside {prefix}…")
    return cls(**found)


def typed_row(cls: type[R], data: Mapping[str, Any], where: str = "row") -> R:
    """The row dataclass `cls` from a study's dict (nested rows typed too): a key `cls` does not know, or a
    required one missing, raises naming it."""
    return _row(cls, dict(data), where)


def typed_rows(cls: type[R], rows: Iterable[Mapping[str, Any]], where: str = "rows") -> list[R]:
    return [typed_row(cls, r, f"{where}[{i}]") for i, r in enumerate(rows)]


def row_dict(row: Any) -> dict[str, Any]:
    """A table row as a dict: a row dataclass as its stored form, a dict as it is."""
    if isinstance(row, dict):
        return row
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        return _plain(row)
    raise TypeError(f"a table row is a dict or a row dataclass, got {type(row).__name__}")


def _plain(value: Any) -> Any:
    """JSON values: dataclasses as dicts, tuples as lists, numpy scalars and arrays as Python's, Paths as strings."""
    if not isinstance(value, type) and dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy / torch scalars and arrays
        return _plain(value.tolist()) if getattr(value, "ndim", 0) else value.item()
    return value


def from_json(data: Any, expected: type[M] = None, where: str = "manifest") -> M:  # type: ignore[assignment]
    """The typed manifest of stored JSON `data`; `expected` (a Manifest class) when the reader knows
    what it reads. `where` names the manifest in errors (asset and path)."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: a manifest is a JSON object, got {type(data).__name__}")
    tag = data.get(TAG)
    if tag is None:
        raise ManifestError(
            f"{where}: no `{TAG}` field: this manifest was written before manifests were typed, or not by this "
            f"pipeline; re-materialize the asset that wrote it"
        )
    kind, _, version = str(tag).partition("/")
    cls = KINDS.get(kind)
    if cls is None:
        known = ", ".join(sorted(KINDS))
        raise ManifestError(f"{where}: field `{TAG}`: unknown manifest kind {kind!r} (known: {known})")
    if version != str(cls.VERSION):
        raise ManifestError(
            f"{where}: field `{TAG}`: {tag!r} is version {version or '(none)'} of `{kind}`, this pipeline reads "
            f"version {cls.VERSION}; re-materialize the asset that wrote it"
        )
    if expected is not None and expected is not Manifest and not issubclass(cls, expected):
        raise ManifestError(
            f"{where}: field `{TAG}`: a `{kind}` manifest where a `{expected.KIND or expected.__name__}` manifest "
            f"was expected (the wrong upstream asset?)"
        )
    return _build(cls, {k: v for k, v in data.items() if k != TAG}, where)


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in data]
    if missing:
        raise ManifestError(
            f"{where}: missing field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
            f"of a `{getattr(cls, 'KIND', '') or cls.__name__}` manifest"
        )
    extra = sorted(set(data) - set(names))
    if extra:
        raise ManifestError(
            f"{where}: unexpected field{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} "
            f"(not a field of `{getattr(cls, 'KIND', '') or cls.__name__}`)"
        )
    return cls(**{n: _check(data[n], hints[n], f"{where}: field `{n}`") for n in names})


def _check(value: Any, hint: Any, where: str) -> Any:
    """`value` as `hint` says (a dataclass built, a float from an int), or ManifestError naming `where`."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        for arm in args:
            try:
                return _check(value, arm, where)
            except ManifestError:
                pass
        raise ManifestError(f"{where}: {_shown(value)} is none of {_name(hint)}")
    if hint is type(None):
        if value is not None:
            raise ManifestError(f"{where}: expected null, got {_shown(value)}")
        return None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ManifestError(f"{where}: expected an object ({hint.__name__}), got {_shown(value)}")
        return _build(hint, value, where)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ManifestError(f"{where}: expected an object, got {_shown(value)}")
        if not args:
            return value
        return {k: _check(v, args[1], f"{where}[{k!r}]") for k, v in value.items()}
    if origin is list or hint is list:
        if not isinstance(value, list):
            raise ManifestError(f"{where}: expected a list, got {_shown(value)}")
        if not args:
            return value
        return [_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ManifestError(f"{where}: expected a number, got {_shown(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ManifestError(f"{where}: expected an integer, got {_shown(value)}")
    if hint in (str, bool):
        if type(value) is not hint:
            raise ManifestError(f"{where}: expected {hint.__name__}, got {_shown(value)}")
        return value
    raise TypeError(f"{where}: manifest field type {hint!r} is not supported")


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '…' if len(text) > 60 else text}"


def _name(hint: Any) -> str:
    return " | ".join(getattr(a, "__name__", str(a)) for a in typing.get_args(hint))
