"""Where the shards of a sharded corpus are, and how each is read: one resource that the shard
assets and the sensor that watches the folder share, so they never disagree."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import dagster as dg
from pydantic import BaseModel, Field

from components.core.shards import ShardReadSettings, list_shards

from .state import state_root

SHARD_DIR_ENV = "PIPELINE_SHARD_DIR"
SHARD_GROUP = "shards"  # the asset group of the sharded route (left out of the whole-graph jobs)
SHARD_PARTITIONS_NAME = "corpus_shards"  # the name the instance keeps the partitions under (typed: str, not Optional)
SHARD_PARTITIONS = dg.DynamicPartitionsDefinition(name=SHARD_PARTITIONS_NAME)  # one partition per shard file


class ShardFolder(dg.ConfigurableResource, ShardReadSettings):
    """The folder of corpus shards (.txt / .jsonl / .parquet files, MediaWiki .xml / .bz2 dumps) and
    how each shard's documents are read and split into train/validation."""

    path: Optional[str] = Field(
        default=None,
        description=f"Folder of shard files (searched recursively). Default: ${SHARD_DIR_ENV}, else <state>/shards.",
    )

    def folder(self) -> Path:
        return Path(self.path or os.environ.get(SHARD_DIR_ENV) or state_root() / "shards")

    def read_settings(self) -> BaseModel:
        """A `ShardReadSettings` (a model built at import time, so typed by its base here)."""
        return ShardReadSettings(**self.model_dump(include=set(ShardReadSettings.model_fields)))

    def shards(self) -> dict[str, Path]:
        """key → file of every shard now in the folder (an empty dict while the folder does not exist)."""
        folder = self.folder()
        return list_shards(folder) if folder.exists() or folder.is_symlink() else {}
