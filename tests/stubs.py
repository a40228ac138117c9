"""Typed manifests for tests that stand in for an upstream asset: the fields the test gives, every
other required field filled with an empty value of its type."""

from __future__ import annotations

import dataclasses
import typing

from components.core import manifests as M

EMPTY = {int: 0, float: 0.0, str: "", bool: False}


def stub_manifest(cls: type[M.Manifest], **fields) -> M.Manifest:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in fields and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            fields[f.name] = EMPTY[hints[f.name]]
    return cls(**fields)
