"""Assets hand each other small JSON manifests (paths, hashes, headline numbers), never pickles:
the large artifacts are files in run-scoped folders, and the manifest says where they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from components.core.artifacts import read_json, write_json

from .state import state_root


class ManifestIOManager(dg.ConfigurableIOManager):
    def _path(self, key: dg.AssetKey, partition: str | None) -> Path:
        name = "__".join(key.path) + (f"__{partition}" if partition else "")
        return state_root() / "manifests" / f"{name}.json"

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        partition = context.partition_key if context.has_partition_key else None
        write_json(self._path(context.asset_key, partition), obj)

    def load_input(self, context: dg.InputContext) -> Any:
        partition = context.partition_key if context.has_partition_key else None
        path = self._path(context.asset_key, partition)
        if not path.exists():
            raise dg.Failure(
                f"upstream asset `{context.asset_key.to_user_string()}` has no materialization in this state folder "
                f"({path} is missing): materialize it first"
            )
        return read_json(path)
