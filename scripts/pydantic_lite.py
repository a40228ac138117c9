"""A small stand-in for the part of pydantic v2 that the core's settings classes use, for the GPU
check alone: the lent GPU machine's image has torch but no pydantic, and installs nothing.

`scripts/gpu_check.py` installs it as `pydantic` only when the real one cannot be imported, so on a
machine with pydantic (every developer's, CI's) nothing changes. It builds the same settings
objects from the same class definitions: fields with defaults (copied per instance), `Field`
constraints (ge/gt/le/lt, allow_inf_nan), `Literal` choices, `extra="forbid"`, field validators
(before/after, with `info.field_name`), model validators (before/after), `model_fields`,
`model_dump`, `model_dump_json`, `model_copy` and `model_validate`. It does not coerce types beyond
int → float and does not validate nested containers' items: the check passes its settings as
literals of the right types. A bad value raises `ValidationError` (a ValueError), naming the field.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import typing
from typing import Any

VERSION = "0-lite"
_MISSING = object()


class ValidationError(ValueError):
    pass


class PydanticUndefinedType:
    pass


class FieldInfo:
    def __init__(
        self,
        default: Any = _MISSING,
        *,
        default_factory=None,
        description: str | None = None,
        ge=None,
        gt=None,
        le=None,
        lt=None,
        allow_inf_nan: bool = True,
        annotation: Any = None,
        **_: Any,
    ):
        self.default, self.default_factory, self.description = default, default_factory, description
        self.ge, self.gt, self.le, self.lt, self.allow_inf_nan = ge, gt, le, lt, allow_inf_nan
        self.annotation = annotation

    def is_required(self) -> bool:
        return self.default is _MISSING and self.default_factory is None

    def get_default(self) -> Any:
        if self.default_factory is not None:
            return self.default_factory()
        return copy.deepcopy(self.default)


def Field(default: Any = _MISSING, **kw: Any) -> FieldInfo:  # noqa: N802 - pydantic's name
    if default is Ellipsis:
        default = _MISSING
    return FieldInfo(default, **kw)


def ConfigDict(**kw: Any) -> dict:  # noqa: N802 - pydantic's name
    return dict(kw)


class ValidationInfo:
    def __init__(self, field_name: str | None, data: dict):
        self.field_name, self.data = field_name, data


class _Decorated:
    def __init__(self, func, kind: str, fields: tuple[str, ...], mode: str):
        self.func = func.__func__ if isinstance(func, (classmethod, staticmethod)) else func
        self.kind, self.fields, self.mode = kind, fields, mode


def field_validator(*fields: str, mode: str = "after", **_: Any):
    return lambda f: _Decorated(f, "field", fields, mode)


def model_validator(*, mode: str):
    return lambda f: _Decorated(f, "model", (), mode)


def _call(func, cls_or_self, value, info):
    n = len(inspect.signature(func).parameters)
    return func(cls_or_self, value, info) if n >= 3 else func(cls_or_self, value)


def _check_type(name: str, annotation: Any, value: Any) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        if value not in args:
            raise ValidationError(f"{name}: {value!r} is not one of {list(args)}")
        return value
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        if value is None and type(None) in args:
            return None
        for a in (a for a in args if a is not type(None)):
            try:
                return _check_type(name, a, value)
            except ValidationError:
                continue
        raise ValidationError(f"{name}: {value!r} does not match {annotation}")
    if annotation is bool and not isinstance(value, bool):
        raise ValidationError(f"{name}: {value!r} is not a bool")
    if annotation is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValidationError(f"{name}: {value!r} is not an int")
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValidationError(f"{name}: {value!r} is not a number")
        return float(value)
    if annotation is str and not isinstance(value, str):
        raise ValidationError(f"{name}: {value!r} is not a str")
    if origin in (list, tuple, dict) and not isinstance(value, origin):
        raise ValidationError(f"{name}: {value!r} is not a {origin.__name__}")
    return value


def _check_constraints(name: str, f: FieldInfo, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if isinstance(value, float) and not f.allow_inf_nan and not math.isfinite(value):
        raise ValidationError(f"{name}: {value!r} is not finite")
    for bound, ok, word in (
        (f.ge, lambda v, b: v >= b, ">="),
        (f.gt, lambda v, b: v > b, ">"),
        (f.le, lambda v, b: v <= b, "<="),
        (f.lt, lambda v, b: v < b, "<"),
    ):
        if bound is not None and not ok(value, bound):
            raise ValidationError(f"{name}: {value!r} must be {word} {bound}")


class BaseModel:
    model_config: dict = {}
    model_fields: dict[str, FieldInfo] = {}
    _validators: list[_Decorated] = []

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        hints = typing.get_type_hints(cls)
        fields: dict[str, FieldInfo] = {}
        for klass in reversed(cls.__mro__):
            fields.update(getattr(klass, "model_fields", {}) if klass is not cls else {})
        validators = [v for k in reversed(cls.__mro__[1:]) for v in vars(k).values() if isinstance(v, _Decorated)]
        for value in list(vars(cls).values()):
            if isinstance(value, _Decorated):
                validators.append(value)
        for name in cls.__dict__.get("__annotations__", {}):
            if (
                name.startswith("_")
                or name in ("model_config", "model_fields")
                or typing.get_origin(hints.get(name)) is typing.ClassVar
            ):
                continue
            raw = cls.__dict__.get(name, _MISSING)
            f = raw if isinstance(raw, FieldInfo) else FieldInfo(raw)
            f.annotation = hints.get(name)
            fields[name] = f
            if raw is not _MISSING:
                delattr(cls, name)
        cls.model_fields, cls._validators = fields, validators

    def __init__(self, **data: Any) -> None:
        cls = type(self)
        for v in cls._validators:
            if v.kind == "model" and v.mode == "before":
                data = v.func(cls, data)
        if cls.model_config.get("extra") == "forbid":
            extra = sorted(set(data) - set(cls.model_fields))
            if extra:
                raise ValidationError(f"{cls.__name__}: extra fields not permitted: {extra}")
        values: dict[str, Any] = {}
        for name, f in cls.model_fields.items():
            if name in data:
                value = data[name]
            elif f.is_required():
                raise ValidationError(f"{cls.__name__}.{name}: field required")
            else:
                value = f.get_default()
            info = ValidationInfo(name, values)
            for v in cls._validators:
                if v.kind == "field" and v.mode == "before" and name in v.fields:
                    value = _call(v.func, cls, value, info)
            value = _check_type(f"{cls.__name__}.{name}", f.annotation, value)
            _check_constraints(f"{cls.__name__}.{name}", f, value)
            for v in cls._validators:
                if v.kind == "field" and v.mode != "before" and name in v.fields:
                    try:
                        value = _call(v.func, cls, value, info)
                    except (ValueError, AssertionError) as e:
                        raise ValidationError(f"{cls.__name__}.{name}: {e}") from e
            values[name] = value
        object.__setattr__(self, "__dict__", values)
        for v in cls._validators:
            if v.kind == "model" and v.mode == "after":
                try:
                    v.func(self)
                except (ValueError, AssertionError) as e:
                    raise ValidationError(f"{cls.__name__}: {e}") from e

    @classmethod
    def model_validate(cls, obj: Any) -> "BaseModel":
        return obj if isinstance(obj, cls) else cls(**dict(obj))

    def model_dump(self, **_: Any) -> dict:
        def dump(v: Any) -> Any:
            if isinstance(v, BaseModel):
                return v.model_dump()
            if isinstance(v, (list, tuple)):
                return type(v)(dump(x) for x in v)
            if isinstance(v, dict):
                return {k: dump(x) for k, x in v.items()}
            return v

        return {k: dump(getattr(self, k)) for k in type(self).model_fields}

    def model_dump_json(self, **_: Any) -> str:
        return json.dumps(self.model_dump())

    def model_copy(self, *, update: dict | None = None, deep: bool = False) -> "BaseModel":
        new = copy.deepcopy(self) if deep else copy.copy(self)
        object.__setattr__(new, "__dict__", {**new.__dict__, **(update or {})})
        return new

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and self.model_dump() == other.model_dump()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.model_dump().items())})"


def create_model(name: str, __base__: type = BaseModel, **fields: Any) -> type:
    annotations, namespace = {}, {}
    for key, spec in fields.items():
        annotation, default = spec if isinstance(spec, tuple) else (type(spec), spec)
        annotations[key] = annotation
        namespace[key] = default
    namespace["__annotations__"] = annotations
    return type(name, (__base__,), namespace)
