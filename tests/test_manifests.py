"""Typed manifests (`components.core.manifests`): what an asset hands downstream is a dataclass in
code and tagged JSON on disk, read strictly; and the one rule for the context length."""

from __future__ import annotations

import dataclasses
import json

import pytest

from components.core import manifests as M
from components.core.artifacts import file_info, sha256_file, write_json
from components.core.data import context_length, context_problems
from components.core.errors import ConfigError
from components.orchestration.io import read_manifest


def labels_manifest(tmp_path) -> M.Labels:
    arr = tmp_path / "train_x.npy"
    arr.write_bytes(b"\x00" * 64)
    info = file_info(arr)
    return M.Labels(
        path=str(tmp_path),
        tokenizer_sha256="ab" * 32,
        vocab_size=2048,
        block_size=128,
        pad_id=0,
        eos_id=2,
        ignore_index=-100,
        train_tokens=1000,
        train_blocks=8,
        train_targets=992,
        validation_tokens=100,
        validation_blocks=1,
        validation_targets=99,
        files={"train_x": M.FileRecord(path=str(arr), bytes=info["bytes"], sha256=info["sha256"])},
        published=M.Published(metrics={"block_size": 128.0}, warnings=["w"]),
        asset="labels",
        dagster_run_id="r1",
        mlflow_run_id="m1",
    )


def test_a_manifest_round_trips_through_json_with_its_tag(tmp_path):
    m = labels_manifest(tmp_path)
    data = json.loads(json.dumps(m.to_json()))
    assert data["manifest"] == "labels/1" and data["files"]["train_x"]["bytes"] == 64
    back = M.from_json(data, M.Labels)
    assert back == m and isinstance(back.files["train_x"], M.FileRecord)
    assert M.from_json(data) == m  # the tag alone says the class
    assert "files" not in m.body() and m.body()["block_size"] == 128


def test_an_old_foreign_or_damaged_manifest_is_refused_naming_the_field(tmp_path):
    good = labels_manifest(tmp_path).to_json()
    untagged = {k: v for k, v in good.items() if k != "manifest"}
    with pytest.raises(M.ManifestError, match="no `manifest` field: this manifest was written before"):
        M.from_json(untagged, M.Labels, "labels' manifest x.json")
    with pytest.raises(M.ManifestError, match="x.json: field `manifest`: unknown manifest kind 'lables'"):
        M.from_json({**good, "manifest": "lables/1"}, where="x.json")
    with pytest.raises(M.ManifestError, match="'labels/7' is version 7 of `labels`, this pipeline reads version 1"):
        M.from_json({**good, "manifest": "labels/7"})
    tokenizer = {
        "manifest": "tokenizer/1",
        **{k: good[k] for k in M.ENVELOPE},
        "path": "t.json",
        "kind": "bpe",
        "sha256": "s",
        "vocab_requested": 8,
        "vocab_learned": 8,
        "vocab_size": 8,
        "unk_rate": 0.0,
        "chars_per_token": 3.0,
        "bytes_per_token": 3.0,
        "val_tokens": 10,
    }
    assert isinstance(M.from_json(tokenizer), M.Tokenizer)
    with pytest.raises(M.ManifestError, match="a `tokenizer` manifest where a `labels` manifest was expected"):
        M.from_json(tokenizer, M.Labels)
    missing = {k: v for k, v in good.items() if k != "block_size"}
    with pytest.raises(M.ManifestError, match="missing field 'block_size' of a `labels` manifest"):
        M.from_json(missing, M.Labels)
    with pytest.raises(M.ManifestError, match="unexpected field 'blok_size'"):
        M.from_json({**good, "blok_size": 128}, M.Labels)
    with pytest.raises(M.ManifestError, match=r"field `block_size`: expected an integer, got str '128'"):
        M.from_json({**good, "block_size": "128"}, M.Labels)
    with pytest.raises(M.ManifestError, match=r"field `files`\['train_x'\]: missing field 'sha256'"):
        M.from_json({**good, "files": {"train_x": {"path": "p", "bytes": 1}}}, M.Labels)
    # A subclass (one shard's labels) is read where labels are expected; the base is not read as the subclass.
    shard = dataclasses.replace(labels_manifest(tmp_path), asset="label_shards")
    shard = M.LabelShard(**{f.name: getattr(shard, f.name) for f in dataclasses.fields(shard)}, shard="s0")
    assert isinstance(M.from_json(shard.to_json(), M.Labels), M.LabelShard)
    with pytest.raises(M.ManifestError, match="a `labels` manifest where a `label_shard` manifest was expected"):
        M.from_json(good, M.LabelShard)


def test_the_io_manager_reads_a_stored_manifest_typed_and_refuses_an_old_one(tmp_path):
    m = labels_manifest(tmp_path)
    path = write_json(tmp_path / "manifest.json", m.to_json())
    assert read_manifest(path, sha256_file(path), "labels", M.Labels) == m
    old = write_json(tmp_path / "old" / "manifest.json", {k: v for k, v in m.to_json().items() if k != "manifest"})
    with pytest.raises(M.ManifestError, match=r"upstream asset `labels`'s manifest .*old/manifest.json: no `manifest`"):
        read_manifest(old, None, "labels", M.Labels)


def test_context_length_is_the_models_one_setting_with_an_error_naming_both():
    assert context_length(None, 256) == 256  # a recurrent model without one: the labels' whole blocks
    assert context_length(128, 256) == 128  # the model's
    assert context_length(256, 256) == 256
    with pytest.raises(ConfigError, match=r"ops\.t\.config\.model\.block_size=512 exceeds labels\.block_size=256"):
        context_length(512, 256, where="ops.t.config.")
    assert len(context_problems(512, 256)) == 1 and context_problems(256, 256) == []
