"""The sharded route: the default corpus split into 16 dump shards, one dynamic partition per shard
added by the sensor (evaluated without a daemon), each partition materialized in process; one
memory-mapped view over every shard's blocks that the training loop and a language-model asset
read; a shard appearing later; corrupt and missing shards."""

import bz2
import json
import math
import re
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
from cli import manifest, materializations, mlflow_runs, step_errors

from components.core.data import IGNORE_INDEX, ShardedBlocks, TokenBlocks
from components.core.errors import PipelineInputError
from components.core.labels import LabelSettings, build_labels, load_labels, pack_blocks, token_stream
from components.core.shards import list_shards, shard_key, split_wiki_dump
from components.core.tokenizer import load_tokenizer

N_SHARDS = 16
TOKENIZER = {"vocab_size": 512, "sample_shards": 2}
BLOCK = 32
LM = {  # a few steps of a small Transformer
    "model": {"param_budget": 60000, "n_layer": 2, "block_size": BLOCK},
    "train": {
        "max_steps": 4,
        "batch_size": 8,
        "eval_interval": 4,
        "eval_batches": 2,
        "log_interval": 2,
        "warmup_steps": 1,
    },
    "sampling": {"num_samples": 1, "sample_tokens": 8},
}


# --- the view, against one array ----------------------------------------------------------------


def test_sharded_view_indexes_like_the_concatenated_blocks():
    """Shards of different lengths (one shorter than a block): the view's blocks, crops (also
    nested and uneven), batches and indexing equal TokenBlocks over the concatenated arrays."""
    rng = np.random.default_rng(0)
    shards = [pack_blocks(rng.integers(4, 500, n), 8, 512) for n in (50, 3, 17, 64)]
    view = ShardedBlocks([(b.x, b.y, None) for b in shards])
    whole = TokenBlocks(np.concatenate([b.x for b in shards]), np.concatenate([b.y for b in shards]))
    for v, w in [
        (view, whole),
        (view.crop(4), whole.crop(4)),
        (view.crop(3), whole.crop(3)),
        (view.crop(4).crop(2), whole.crop(4).crop(2)),
    ]:
        assert (v.n_blocks, v.block_size, v.n_targets) == (w.n_blocks, w.block_size, w.n_targets)
        assert np.array_equal(np.asarray(v.x), w.x) and np.array_equal(np.asarray(v.y), w.y)
        idx = rng.integers(0, w.n_blocks, 9)
        for a, b in zip(v.batch(idx), w.batch(idx)):
            assert np.array_equal(a.numpy(), b.numpy())
        assert np.array_equal(v.x[idx[0], 1:3], w.x[idx[0], 1:3]) and np.array_equal(v.y[-1], w.y[-1])
        assert np.array_equal(v.x[2:5], w.x[2:5]) and v.x.shape == w.x.shape and v.x.dtype == w.x.dtype
        assert v.drop_empty().n_blocks == w.drop_empty().n_blocks and v.max_token_id() <= w.max_token_id()
    assert view.max_token_id() == whole.max_token_id()
    with pytest.raises(IndexError):
        view.x[whole.n_blocks]


def test_shard_config_file_passes_the_config_classes():
    import yaml

    from pipelines.defs.shards import SHARD_CONFIG, ShardLabelsConfig, ShardTokenizerConfig

    ops = yaml.safe_load(SHARD_CONFIG.read_text())["ops"]
    assert set(ops) == {"shard_tokenizer", "label_shards"}
    ShardTokenizerConfig(**ops["shard_tokenizer"]["config"]), ShardLabelsConfig(**ops["label_shards"]["config"])


def test_shard_keys_are_safe_and_unique(tmp_path):
    assert shard_key("a b/c(1).jsonl") == "a_b_c_1_.jsonl" and shard_key("x...y.txt") == "x..y.txt"
    (tmp_path / "sub").mkdir()
    for name in ("b.txt", "a.jsonl", "notes.md", ".hidden.txt", "sub/c.parquet"):
        (tmp_path / name).write_text("x")
    assert list(list_shards(tmp_path)) == [
        "a.jsonl",
        "b.txt",
        "sub_c.parquet",
    ]  # sorted; other types and hidden files are not shards
    (tmp_path / "sub_c.parquet").write_text("x")
    with pytest.raises(
        PipelineInputError, match=r"sub/c.parquet and .*sub_c.parquet map to the same shard key 'sub_c.parquet'"
    ):
        list_shards(tmp_path)


# --- the route through Dagster ------------------------------------------------------------------


class Route:
    """The instance, the shard folder and the sensor's ticks so far."""

    def __init__(self, state: Path, folder: Path):
        from components.orchestration.shards import ShardFolder
        from pipelines.definitions import defs

        self.defs, self.state, self.folder = defs, state, folder
        self.inst = dg.DagsterInstance.ephemeral()
        self.resources = {**defs.resources, "shards": ShardFolder(path=str(folder))}
        self.sensor = defs.resolve_sensor_def("shard_sensor")
        self.cursor = None
        self.ticks: list[dg.SensorResult] = []

    def tick(self) -> dg.SensorResult:
        ctx = dg.build_sensor_context(
            instance=self.inst, cursor=self.cursor, resources=self.resources, definitions=self.defs
        )
        result = self.sensor(ctx)
        for req in result.dynamic_partitions_requests or []:  # what the daemon does with them
            self.inst.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        self.cursor = result.cursor
        self.ticks.append(result)
        return result

    def run(
        self, request: dg.RunRequest, ops: dict | None = None, raise_on_error: bool = True
    ) -> dg.ExecuteInProcessResult:
        """Execute a run request as the daemon would: the job's assets, the request's partition."""
        job = self.defs.resolve_job_def(request.job_name)
        selection = list(job.asset_layer.executable_asset_keys)
        return self.materialize(selection, request.partition_key, ops, raise_on_error)

    def materialize(self, selection, partition_key=None, ops=None, raise_on_error=True) -> dg.ExecuteInProcessResult:
        result = dg.materialize(
            list(self.defs.assets) + list(self.defs.asset_checks),
            selection=selection,
            partition_key=partition_key,
            resources=self.resources,
            instance=self.inst,
            run_config={"ops": ops or {}},
            raise_on_error=False,
        )
        if raise_on_error:
            assert result.success, "\n".join(step_errors(self.inst, result.run_id))
        return result


@pytest.fixture(scope="module")
def route(tmp_path_factory):
    """The sensor finds 16 shards, the tokenizer is trained once, then every partition and the view."""
    base = tmp_path_factory.mktemp("shards")
    mp = pytest.MonkeyPatch()
    mp.setenv("PIPELINE_STATE_DIR", str(base / "state"))
    from components.core.corpus import default_wiki_dump

    split_wiki_dump(default_wiki_dump(), base / "incoming", N_SHARDS, prefix="wiki")
    r = Route(base / "state", base / "incoming")
    first = r.tick()
    r.run(first.run_requests[0], {"shard_tokenizer": {"config": TOKENIZER}})
    second = r.tick()
    r.ingest_runs = [r.run(req, {"label_shards": {"config": {"block_size": BLOCK}}}) for req in second.run_requests]
    third = r.tick()
    r.combine = r.run(third.run_requests[0])
    yield r
    mp.undo()


def test_sensor_adds_a_partition_per_shard_and_requests_its_runs(route):
    first, second, third = route.ticks[:3]
    keys = [f"wiki-{i:05d}.xml.bz2" for i in range(N_SHARDS)]
    assert list(first.dynamic_partitions_requests[0].partition_keys) == keys
    assert [q.job_name for q in first.run_requests] == ["shard_tokenizer_job"]  # the tokenizer first, once
    assert [q.partition_key for q in second.run_requests] == keys and {q.job_name for q in second.run_requests} == {
        "shard_ingest"
    }
    assert not second.dynamic_partitions_requests and [q.job_name for q in third.run_requests] == ["combine_shards"]
    assert route.inst.get_materialized_partitions(dg.AssetKey("label_shards")) == set(keys)
    tok = manifest(
        route.inst,
        route.inst.get_latest_materialization_event(dg.AssetKey("shard_tokenizer")).run_id,
        "shard_tokenizer",
    )
    assert tok["trained_on"]["shards"] == keys[:2]  # the bounded sample: the first shards by key
    # Nothing more to do until a shard appears or changes.
    assert not route.tick().run_requests


def test_sharded_blocks_equal_the_unsharded_route(route):
    """Per shard: exactly what the default route's packing makes of that shard's documents. Over
    all shards, in key order: the default route's (input, target) pairs over the same documents,
    minus the one pair per shard boundary that would cross from a shard into the next."""
    from components.orchestration.io import latest_materializations

    combined = manifest(route.inst, route.combine.run_id, "sharded_labels")
    train, val, meta = load_labels(combined["path"])
    assert isinstance(train, ShardedBlocks) and train.n_shards == N_SHARDS == meta["n_shards"]
    tok_path = (
        route.inst.get_latest_materialization_event(dg.AssetKey("shard_tokenizer"))
        .asset_materialization.metadata["tokenizer_path"]
        .value
    )
    tok = load_tokenizer(tok_path)
    keys = [s["key"] for s in meta["shards"]]
    records = latest_materializations(route.inst, dg.AssetKey("corpus_shards"), keys)
    import datasets

    texts = {
        k: datasets.load_from_disk(
            json.loads(Path(records[k].asset_materialization.metadata["manifest_path"].value).read_text())["path"]
        )["train"]["text"]
        for k in keys
    }
    start, real_x, real_y, n_tokens = 0, [], [], []
    for i, shard in enumerate(meta["shards"]):
        k, n = shard["key"], shard["train_blocks"]
        got_x, got_y = train.x[start : start + n], train.y[start : start + n]
        if i in (0, 1, 2, N_SHARDS - 1):  # a few shards (tokenizing costs): each exactly as packed alone
            expected = pack_blocks(token_stream(tok, texts[k]), BLOCK, meta["vocab_size"])
            assert np.array_equal(got_x, expected.x) and np.array_equal(got_y, expected.y), k
        targets = shard["train_targets"]
        real_x.append(got_x.reshape(-1)[:targets])
        real_y.append(got_y.reshape(-1)[:targets])
        n_tokens.append(shard["train_tokens"])
        start += n
    assert start == train.n_blocks and train.n_targets == meta["train_targets"] == sum(n_tokens) - N_SHARDS
    # The default route's labels (build_labels, streamed) over the same documents in the same order.
    whole = build_labels(
        {"train": [t for k in keys for t in texts[k]], "validation": texts[keys[0]][:1]},
        tok_path,
        LabelSettings(block_size=BLOCK),
        route.state.parent / "unsharded",
    )
    ref_train, _, ref_meta = load_labels(whole.path)
    assert ref_meta["train_tokens"] == sum(n_tokens)
    crossing = np.cumsum(n_tokens)[:-1] - 1  # the pair (last [EOS] of a shard, first token of the next)
    keep = np.setdiff1d(np.arange(ref_meta["train_targets"]), crossing)
    assert np.array_equal(np.concatenate(real_x), ref_train.x.reshape(-1)[keep])
    assert np.array_equal(np.concatenate(real_y), ref_train.y.reshape(-1)[keep])
    assert (
        ref_train.n_blocks <= train.n_blocks <= ref_train.n_blocks + N_SHARDS - 1
    )  # at most one padded tail per shard
    assert val.n_blocks == meta["validation_blocks"] >= N_SHARDS and np.all(val.y[:, 0] != IGNORE_INDEX)


def test_training_loop_reads_the_view_as_one_array(route):
    """The training loop on the memory-mapped view gives exactly the losses it gives on the same
    blocks concatenated in memory."""
    import torch

    from components.core.device import seed_everything
    from components.core.models.recurrent import RecurrentLM, RecurrentSettings
    from components.core.train_settings import TrainSettings
    from components.core.training import train

    train_view, val_view, meta = load_labels(manifest(route.inst, route.combine.run_id, "sharded_labels")["path"])
    whole = [TokenBlocks(np.asarray(v.x), np.asarray(v.y)) for v in (train_view, val_view)]
    s = TrainSettings(
        max_steps=6,
        batch_size=8,
        lr=1e-2,
        warmup_steps=1,
        eval_interval=3,
        eval_batches=2,
        log_interval=1,
        device="cpu",
        seed=3,
    )
    losses = []
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i, (tr, va) in enumerate([(train_view, val_view), tuple(whole)]):
            seed_everything(0)
            model = RecurrentLM(
                RecurrentSettings(cell="rnn", n_embd=16, hidden_size=24, block_size=16), meta["vocab_size"]
            )
            result = train(model, tr, va, s, route.state.parent / f"train{i}")
            losses.append([(h["step"], h.get("train/loss"), h.get("val/loss")) for h in result.history])
    finally:
        torch.set_num_threads(n)
    assert losses[0] == losses[1] and all(math.isfinite(loss) for _, loss, _ in losses[0] if loss is not None)


def test_language_model_trains_on_the_sharded_labels(route):
    """A defs.yaml language model whose `labels` is `sharded_labels` trains on the view (config, no code)."""
    result = route.materialize(["transformer_shards_lm"], ops={"transformer_shards_lm": {"config": LM}})
    lm = manifest(route.inst, result.run_id, "transformer_shards_lm")
    assert lm["inputs"]["labels"] == route.combine.run_id and math.isfinite(lm["metrics"]["val/loss"])
    # Its run config is checked against the sharded labels' block size, not the default route's.
    bad = {**LM, "model": {**LM["model"], "block_size": 2 * BLOCK}}
    failed = route.materialize(
        ["transformer_shards_lm"], ops={"transformer_shards_lm": {"config": bad}}, raise_on_error=False
    )
    assert not failed.success
    assert f"model.block_size={2 * BLOCK} exceeds sharded_labels.block_size={BLOCK}" in "\n".join(
        step_errors(route.inst, failed.run_id)
    )


@pytest.mark.slow  # two torchrun processes
def test_torchrun_trains_on_the_sharded_labels(route):
    """The same asset under 2 gloo processes: each rank checks every shard's files against their
    recorded hashes (files of the same name in every shard's folder) and trains on the view."""
    ddp = {**LM, "train": {**LM["train"], "launcher": "torchrun", "nproc_per_node": 2}}
    result = route.materialize(
        ["transformer_shards_lm"], ops={"transformer_shards_lm": {"config": ddp}}, raise_on_error=False
    )
    assert result.success, "\n".join(step_errors(route.inst, result.run_id))
    lm = manifest(route.inst, result.run_id, "transformer_shards_lm")
    assert lm["launch"]["world_size"] == 2 and math.isfinite(lm["metrics"]["val/loss"])


def test_missing_shard_file_is_named(route, tmp_path):
    """A token file a manifest lists but that is gone: the view and the IO manager name it."""
    from components.core.manifests import from_json
    from components.orchestration.io import verify_files

    combined = manifest(route.inst, route.combine.run_id, "sharded_labels")
    meta = json.loads((Path(combined["path"]) / "meta.json").read_text())
    gone = tmp_path / "gone_train_x.npy"
    meta["shards"][3]["files"]["train_x"]["path"] = str(gone)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        PipelineInputError, match=rf"label shard 'wiki-00003.xml.bz2': token file {re.escape(str(gone))} is missing"
    ):
        load_labels(tmp_path)
    files = dict(combined["files"])
    files["wiki-00003.xml.bz2/train_x"] = {**files["wiki-00003.xml.bz2/train_x"], "path": str(gone)}
    with pytest.raises(
        PipelineInputError,
        match=rf"`sharded_labels`'s wiki-00003.xml.bz2/train_x file {re.escape(str(gone))} is missing",
    ):
        verify_files(from_json({**combined, "files": files}, where="sharded_labels"), "sharded_labels")


def test_a_shard_appearing_later_becomes_a_new_partition(route):
    """A new file in the folder: one new partition, one run for it alone; then a new combined view."""
    rows = [{"text": "A late shard about the history of " + w + ". " * 40} for w in ("Rome", "Paris", "Kyoto", "Lima")]
    tmp = route.folder / ".late.jsonl.partial"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tick = route.tick()
    assert not tick.run_requests and not tick.dynamic_partitions_requests  # a hidden file is not a shard yet
    tmp.rename(route.folder / "wiki-00016.jsonl")  # complete: renamed into place
    tick = route.tick()
    assert list(tick.dynamic_partitions_requests[0].partition_keys) == ["wiki-00016.jsonl"]
    assert [(q.job_name, q.partition_key) for q in tick.run_requests] == [("shard_ingest", "wiki-00016.jsonl")]
    route.run(tick.run_requests[0], {"label_shards": {"config": {"block_size": BLOCK}}})
    again = route.tick()
    assert [q.job_name for q in again.run_requests] == ["combine_shards"]
    route.run(again.run_requests[0])
    _, _, meta = load_labels(
        manifest(
            route.inst,
            route.inst.get_latest_materialization_event(dg.AssetKey("sharded_labels")).run_id,
            "sharded_labels",
        )["path"]
    )
    assert meta["n_shards"] == N_SHARDS + 1 and meta["shards"][-1]["key"] == "wiki-00016.jsonl"


# --- bad shards ---------------------------------------------------------------------------------


def _bad_shards(folder: Path) -> dict[str, str]:
    """key → the part of the error message that names the fault."""
    folder.mkdir()
    good = bz2.compress(
        b"<mediawiki><page><title>A</title><ns>0</ns><id>1</id><revision><text>Some text "
        b"here.</text></revision></page></mediawiki>"
    )
    (folder / "truncated.xml.bz2").write_bytes(good[: len(good) // 2])
    (folder / "rows.jsonl").write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": broken\n')
    (folder / "latin1.txt").write_bytes("first paragraph\n\nsecond caf\xe9 paragraph\n".encode("latin-1"))
    at = re.escape(str(folder))
    return {
        "truncated.xml.bz2": rf"{at}/truncated.xml.bz2: the dump is truncated or corrupted \(stopped after reading \d+ "
        rf"of its \d+ bytes\)",
        "rows.jsonl": rf"{at}/rows.jsonl:3: invalid JSON",
        "latin1.txt": rf"{at}/latin1.txt: not valid UTF-8 at byte offset 27 \(line 3",
    }


def test_a_corrupt_shard_fails_its_partition_and_records_nothing(route, tmp_path):
    bad = Route(route.state, tmp_path / "bad")
    expected = _bad_shards(bad.folder)
    bad.tick()  # adds the three partitions
    for key, message in expected.items():
        result = bad.materialize(["corpus_shards"], partition_key=key, raise_on_error=False)
        errors = "\n".join(step_errors(bad.inst, result.run_id))
        assert not result.success and re.search(message, errors), (key, errors)
        assert not materializations(bad.inst, result.run_id)
        assert not (
            route.state / "artifacts" / "corpus_shards" / result.run_id
        ).exists()  # no folder, not even a partial one
    assert bad.inst.get_materialized_partitions(dg.AssetKey("corpus_shards")) == set()
    _, runs = mlflow_runs(route.state)
    failed = [
        r
        for r in runs
        if r.data.tags.get("dagster.asset_key") == "corpus_shards" and r.data.tags.get("dagster.partition") in expected
    ]
    assert sorted(r.data.tags["dagster.partition"] for r in failed) == sorted(expected) and {
        r.info.status for r in failed
    } == {"FAILED"}
