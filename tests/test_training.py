"""The shared training loop: schedule, clipping, exact resume, divergence, checkpoints (and their
integrity), progress, the data-parallel batch split, bad input."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from components.core.checkpoint import (
    STATE_FILE,
    WEIGHTS_FILE,
    CheckpointMismatchError,
    load_checkpoint,
    load_model_weights,
    load_weights_into,
    read_metadata,
)
from components.core.data import IGNORE_INDEX, TokenBlocks
from components.core.device import resolve_device, seed_everything
from components.core.errors import ConfigError, PipelineInputError
from components.core.labels import pack_blocks, token_stream
from components.core.models import count_parameters
from components.core.models.recurrent import RecurrentLM, RecurrentSettings
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.tokenizer import TokenizerSettings, train_tokenizer
from components.core.train_settings import Parallel, TrainSettings
from components.core.train_step import batch_indices, evaluate, lr_at
from components.core.training import TrainingDivergedError, train

V = 512
TOK_HASH = "a" * 64


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def blocks(wiki_texts):
    """Real labels: Wikipedia articles through a 512-token BPE, packed in blocks of 32."""
    tok = train_tokenizer(wiki_texts[:20], TokenizerSettings(vocab_size=V))
    train_b = pack_blocks(token_stream(tok, wiki_texts[:12]), 32, V)
    val_b = pack_blocks(token_stream(tok, wiki_texts[20:23]), 32, V)
    return train_b, val_b


def tiny_model(cell="rnn", seed=0, **kw) -> RecurrentLM:
    seed_everything(seed)
    return RecurrentLM(RecurrentSettings(cell=cell, n_embd=32, hidden_size=48, **kw), V)


def quick(**kw) -> TrainSettings:
    base = dict(
        max_steps=12,
        batch_size=8,
        lr=1e-2,
        min_lr=1e-3,
        warmup_steps=3,
        eval_interval=6,
        eval_batches=2,
        log_interval=1,
        device="cpu",
        seed=7,
    )
    base.update(kw)
    return TrainSettings(**base)


def train_losses(history):
    return [h["train/loss"] for h in history if "train/loss" in h]


def test_lr_warmup_then_cosine_to_min():
    s = TrainSettings(max_steps=100, lr=1.0, min_lr=0.1, warmup_steps=10)
    lrs = [lr_at(i, s) for i in range(120)]
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11]))  # rising during warmup
    assert lrs[10] == pytest.approx(1.0)  # peak right after warmup
    assert all(a >= b for a, b in zip(lrs[10:100], lrs[11:101]))  # then only down
    assert lrs[55] == pytest.approx(0.55)  # half-way down the cosine: (lr + min_lr) / 2
    assert lrs[100] == lrs[119] == pytest.approx(0.1)
    assert lr_at(50, TrainSettings(max_steps=100, lr=1.0, min_lr=0.1, warmup_steps=0, lr_decay_steps=50)) == 0.1


def test_settings_are_validated_with_the_field_named():
    with pytest.raises(ValidationError, match="grad_clip"):
        TrainSettings(grad_clip=-1.0)
    with pytest.raises(ValidationError, match="min_lr"):
        TrainSettings(lr=1e-3, min_lr=1e-2)
    with pytest.raises(ValidationError, match="grad_accum"):
        TrainSettings(grad_accum=0)
    with pytest.raises(ValidationError, match="lr"):
        TrainSettings(lr=float("nan"))
    with pytest.raises(ValidationError, match="beta2"):
        TrainSettings(beta2=1.0)
    with pytest.raises(ValidationError, match="device"):
        TrainSettings(device="tpu")
    with pytest.raises(ValidationError, match="lerning_rate"):
        TrainSettings(lerning_rate=1.0)  # extra fields are refused, not ignored
    with pytest.raises(ValidationError, match="need compile: true"):
        TrainSettings(compile_options={"cpp_wrapper": True})
    with pytest.raises(ValidationError, match="cpp_wraper"):
        TrainSettings(compile=True, compile_options={"cpp_wraper": True})  # a misspelt inductor option
    with pytest.raises(ValidationError, match="must be a bool, number or string"):
        TrainSettings(compile=True, compile_options={"cpp_wrapper": [True]})
    assert TrainSettings(compile=True, compile_options={"cpp_wrapper": True}).compile_options == {"cpp_wrapper": True}


@pytest.mark.slow
def test_compiled_training_with_the_cpp_wrapper_follows_eager(tmp_path, blocks):
    # The Transformer trained through torch.compile with inductor's C++ wrapper (the float32 CPU recipe of
    # benchmarks/train_throughput.py; its embedding lookup stays eager) takes the same steps as eager,
    # within float rounding.
    train_b, val_b = blocks
    cfg = TransformerSettings(n_layer=2, n_head=2, n_embd=32, block_size=32, pos_encoding="rope")
    runs = {}
    # float32 on every CPU kind (with AMX, `auto` would train under bf16 autocast, where compiled and eager
    # kernels round differently).
    for name, kw in (
        ("eager", {"dtype": "float32"}),
        ("cpp", {"dtype": "float32", "compile": True, "compile_options": {"cpp_wrapper": True}}),
    ):
        seed_everything(0)
        model = Transformer(cfg, V)
        res = train(model, train_b, val_b, quick(max_steps=6, eval_interval=0, **kw), tmp_path / name)
        runs[name] = (train_losses(res.history), res.val_loss, model)
    (le, ve, me), (lc, vc, mc) = runs["eager"], runs["cpp"]
    assert len(le) == len(lc) == 6 and le[-1] < le[0]
    assert lc == pytest.approx(le, rel=1e-4) and vc == pytest.approx(ve, rel=1e-4)
    for (name, a), b in zip(me.named_parameters(), mc.parameters()):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4, msg=name)


def test_training_reduces_loss_and_logs_shared_names(tmp_path, blocks):
    train_b, val_b = blocks
    model = tiny_model("lstm")
    logged, progress = [], []
    r = train(
        model,
        train_b,
        val_b,
        quick(max_steps=30, lr=3e-2, eval_interval=10, log_interval=5),
        tmp_path,
        log_metrics=lambda m, step: logged.append((step, m)),
        progress=lambda point, step, max_steps, eta: progress.append((point, step, max_steps, eta)),
    )
    losses = train_losses(r.history)
    assert losses[-1] < math.log(V) - 0.8, losses  # from chance, ln(512) = 6.24, down clearly
    assert r.val_loss < math.log(V) - 0.7 and r.val_ppl == pytest.approx(math.exp(r.val_loss))
    assert r.steps == 30 and r.params == count_parameters(model) and r.tokens_per_s > 0
    assert [s for s, _ in logged] == [5, 10, 15, 20, 25, 30]
    # progress sees the same points, with the steps to go and an ETA that falls to 0 at the end
    assert [(p, s) for p, s, _, _ in progress] == [(m, s) for s, m in logged]
    assert all(n == 30 for _, _, n, _ in progress) and progress[0][3] > 0 and progress[-1][3] == 0
    names = set().union(*(m for _, m in logged))
    assert {"train/loss", "val/loss", "val/ppl", "tokens_per_s", "grad_norm", "lr"} <= names
    assert (
        set(r.metrics()) >= {"train/loss", "val/loss", "val/ppl", "train/tokens_per_s_mean"}
        and "tokens_per_s" not in r.metrics()
    )
    assert json.loads((tmp_path / "history.json").read_text()) == r.history
    from components.core.device import cpu_has_native_bf16

    assert r.device == "cpu" and r.dtype == ("bfloat16" if cpu_has_native_bf16() else "float32")  # auto


def test_evaluate_is_the_mean_over_real_targets(blocks):
    _, val_b = blocks
    model = tiny_model()
    n = 5
    got = evaluate(model, val_b, batch_size=2, max_batches=None, device="cpu")
    # Batching does not change it: a mean over tokens, not over batches (up to float32 rounding of
    # each batch's mean, which differs with the batch).
    assert got == pytest.approx(evaluate(model, val_b, batch_size=3, max_batches=None, device="cpu"), rel=1e-6)
    x, y = val_b.batch(np.arange(n))
    with torch.no_grad():
        logits, _ = model(x)
    want = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=IGNORE_INDEX).item()
    assert evaluate(model, val_b, batch_size=n, max_batches=1, device="cpu") == pytest.approx(want, rel=1e-6)


def test_the_validation_batch_is_apart_from_the_training_batch(tmp_path, blocks):
    """A small training batch evaluates in batches of eval_batch_size: the same model scores the same on
    the whole split at any size, and a capped evaluation counts its batches in that size."""
    train_b, val_b = blocks
    runs = {
        e: train(
            tiny_model(),
            train_b,
            val_b,
            quick(batch_size=2, eval_batch_size=e, eval_batches=None, max_steps=4),
            tmp_path / f"e{e}",
        )
        for e in (None, 7)
    }
    full = int((np.asarray(val_b.y) != IGNORE_INDEX).sum())
    assert runs[None].metrics()["val/targets"] == runs[7].metrics()["val/targets"] == full
    assert runs[7].metrics()["val/loss"] == pytest.approx(runs[None].metrics()["val/loss"], rel=1e-6)
    capped = train(
        tiny_model(),
        train_b,
        val_b,
        quick(batch_size=2, eval_batch_size=3, eval_batches=1, max_steps=2),
        tmp_path / "capped",
    )
    assert capped.metrics()["val/targets"] == int((np.asarray(val_b.y[:3]) != IGNORE_INDEX).sum()) < full


def test_clipping_bound_is_respected(tmp_path, blocks):
    train_b, val_b = blocks
    clip = 0.05
    r = train(
        tiny_model(), train_b, val_b, quick(lr=0.5, grad_clip=clip, optimizer="sgd", max_steps=8), tmp_path / "on"
    )
    pts = [h for h in r.history if "grad_norm" in h]
    assert len(pts) == 8
    assert any(h["grad_norm"] > 2 * clip for h in pts)  # clipping was actually needed ...
    assert all(h["grad_norm_clipped"] <= clip * (1 + 1e-5) for h in pts)  # ... and held
    off = train(
        tiny_model(), train_b, val_b, quick(lr=0.5, grad_clip=0.0, optimizer="sgd", max_steps=3), tmp_path / "off"
    )
    assert all(h["grad_norm_clipped"] == pytest.approx(h["grad_norm"]) for h in off.history if "grad_norm" in h)


def test_resume_gives_the_same_loss_curve(tmp_path, blocks):
    train_b, val_b = blocks
    # Dropout and gradient accumulation on, and the interruption falls between two log points,
    # so the sampler, the dropout RNG, the optimizer moments and the partial log sums must all resume.
    s = quick(max_steps=12, log_interval=4, eval_interval=4, grad_accum=2)
    full = train(tiny_model("lstm", dropout=0.2), train_b, val_b, s, tmp_path / "full")

    part = train(tiny_model("lstm", dropout=0.2), train_b, val_b, s, tmp_path / "cut", stop_after_steps=6)
    assert part.steps == 6 and read_metadata(part.checkpoint_dir)["step"] == "6"
    # A new process would build the model afresh (with another init): the checkpoint must win.
    resumed_model = tiny_model("lstm", seed=123, dropout=0.2)
    resumed = train(resumed_model, train_b, val_b, s, tmp_path / "cut")
    assert resumed.resumed_from == 6 and resumed.steps == 12
    assert train_losses(resumed.history) == train_losses(full.history)  # identical, not approximately
    assert [h["val/loss"] for h in resumed.history if "val/loss" in h] == [
        h["val/loss"] for h in full.history if "val/loss" in h
    ]
    w_full, _ = load_model_weights(full.checkpoint_dir)
    w_res, _ = load_model_weights(resumed.checkpoint_dir)
    assert all(torch.equal(w_full[k], w_res[k]) for k in w_full)

    # Resuming a finished run trains no further.
    again = train(tiny_model("lstm", dropout=0.2), train_b, val_b, s, tmp_path / "cut")
    assert again.steps == 12 and train_losses(again.history) == train_losses(full.history)


class NaNAfter(RecurrentLM):
    """A real RNN LM whose training loss turns NaN from its `bad_from`-th training forward on
    (as a numerical blow-up would), to check how the loop stops."""

    def __init__(self, *a, bad_from: int, **kw):
        super().__init__(*a, **kw)
        self.bad_from, self.calls = bad_from, 0

    def forward(self, idx, targets=None):
        logits, loss = super().forward(idx, targets)
        if self.training:
            self.calls += 1
            if self.calls >= self.bad_from and loss is not None:
                loss = loss * float("nan")
        return logits, loss


def test_nan_loss_stops_with_a_clear_error_and_keeps_the_last_good_checkpoint(tmp_path, blocks):
    train_b, val_b = blocks
    seed_everything(0)
    model = NaNAfter(RecurrentSettings(cell="rnn", n_embd=32, hidden_size=48), V, bad_from=8)
    with pytest.raises(TrainingDivergedError, match=r"step 8: loss nan .*last good checkpoint \(step 6\)") as e:
        train(model, train_b, val_b, quick(checkpoint_interval=3), tmp_path)
    assert e.value.step == 8 and len(train_losses(e.value.history)) == 7
    meta = read_metadata(tmp_path / "checkpoint")
    assert meta["step"] == "6"
    weights, _ = load_model_weights(tmp_path / "checkpoint")
    assert all(torch.isfinite(w).all() for w in weights.values())
    # The weights in memory never took the NaN update either.
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_resume_refuses_another_model_naming_the_field(tmp_path, blocks):
    train_b, val_b = blocks
    s = quick(max_steps=2, eval_interval=0)
    train(tiny_model(), train_b, val_b, s, tmp_path, model_meta={"tokenizer_sha256": TOK_HASH})
    bigger = RecurrentLM(RecurrentSettings(cell="rnn", n_embd=32, hidden_size=64), V)
    with pytest.raises(CheckpointMismatchError, match=r"model_config\.hidden_size: checkpoint 48 != now 64"):
        train(
            bigger,
            train_b,
            val_b,
            s.model_copy(update={"max_steps": 4}),
            tmp_path,
            model_meta={"tokenizer_sha256": TOK_HASH},
        )
    with pytest.raises(CheckpointMismatchError, match="model_kind"):
        train(tiny_model("lstm"), train_b, val_b, s, tmp_path, model_meta={"tokenizer_sha256": TOK_HASH})
    with pytest.raises(CheckpointMismatchError, match="tokenizer_sha256"):
        train(tiny_model(), train_b, val_b, s, tmp_path, model_meta={"tokenizer_sha256": "b" * 64})
    # resume=False starts afresh and replaces the checkpoint.
    r = train(bigger, train_b, val_b, s, tmp_path, resume=False, model_meta={"tokenizer_sha256": TOK_HASH})
    assert r.resumed_from == 0 and json.loads(read_metadata(r.checkpoint_dir)["model_config"])["hidden_size"] == 64


def test_checkpoint_round_trip_with_tied_weights(tmp_path, blocks):
    train_b, val_b = blocks
    seed_everything(0)
    cfg = RecurrentSettings(cell="lstm", n_embd=32, hidden_size=48, tie_weights=True)
    model = RecurrentLM(cfg, V)
    r = train(
        model, train_b, val_b, quick(max_steps=3, eval_interval=0), tmp_path, model_meta={"tokenizer_sha256": TOK_HASH}
    )
    state, meta = load_model_weights(r.checkpoint_dir)
    assert meta["model_kind"] == "recurrent-lstm" and meta["tokenizer_sha256"] == TOK_HASH and meta["step"] == "3"
    assert RecurrentSettings.model_validate_json(meta["model_config"]) == cfg
    # Tied matrices are stored once; loading restores both the values and the tie.
    fresh = RecurrentLM(RecurrentSettings.model_validate_json(meta["model_config"]), int(meta["vocab_size"]))
    load_weights_into(fresh, r.checkpoint_dir)
    assert fresh.lm_head.weight is fresh.wte.weight
    x, _ = val_b.batch(np.arange(4))
    model.eval(), fresh.eval()
    with torch.no_grad():
        assert torch.equal(model(x)[0], fresh(x)[0])
    # The optimizer state loads with weights_only=True and holds the step.
    st = load_checkpoint(r.checkpoint_dir, fresh)
    assert st["step"] == 3 and "optimizer" in st and "sampler_state" in st


def test_bad_input_is_refused(tmp_path, blocks):
    train_b, val_b = blocks
    with pytest.raises(ConfigError, match=r"model.block_size=64 exceeds labels.block_size=32: the labels. blocks are "):
        train(tiny_model(block_size=64), train_b, val_b, quick(), tmp_path)
    # The context has one owner, the model: the training refuses a block size of its own, naming it.
    with pytest.raises(ValueError, match=r"train.block_size is not a training setting.*model.block_size"):
        quick(block_size=16)
    # Labels from a tokenizer with a bigger vocabulary than the model's.
    foreign = TokenBlocks(np.full((4, 32), V + 5, dtype=np.uint16), np.full((4, 32), V + 5, dtype=np.int32))
    with pytest.raises(PipelineInputError, match="different tokenizer"):
        train(tiny_model(), foreign, val_b, quick(), tmp_path)
    empty = TokenBlocks(np.zeros((3, 32), np.uint16), np.full((3, 32), IGNORE_INDEX, np.int32))
    with pytest.raises(PipelineInputError, match="no targets"):
        train(tiny_model(), train_b, empty, quick(), tmp_path)


def test_cropped_block_size_and_device_resolution(tmp_path, blocks):
    train_b, val_b = blocks
    r = train(tiny_model(block_size=16), train_b, val_b, quick(max_steps=2, batch_size=4), tmp_path)
    assert r.steps == 2 and r.step_ms > 0
    dev, warn = resolve_device("cpu")
    assert dev.type == "cpu" and warn is None
    if not torch.cuda.is_available():
        assert "no CUDA" in resolve_device("auto")[1]
        with pytest.raises(ConfigError, match="device='cuda'"):
            resolve_device("cuda")
        with pytest.raises(ConfigError, match="float16"):
            train(tiny_model(), train_b, val_b, quick(dtype="float16"), tmp_path / "fp16")


def test_a_tampered_checkpoint_is_refused_naming_the_files(tmp_path, blocks):
    """The weights' header and train_state.pt must be of one save: a copy of another step's weights
    (or another model's) next to the train state is refused before anything is loaded."""
    from safetensors.torch import load_file, save_file

    train_b, val_b = blocks
    s = quick(max_steps=12, eval_interval=0, log_interval=2)
    meta = {"tokenizer_sha256": TOK_HASH}
    train(tiny_model(), train_b, val_b, s, tmp_path / "early", stop_after_steps=3, model_meta=meta)
    train(tiny_model(), train_b, val_b, s, tmp_path / "late", stop_after_steps=9, model_meta=meta)
    early, late = tmp_path / "early" / "checkpoint", tmp_path / "late" / "checkpoint"
    state = torch.load(early / STATE_FILE, weights_only=True)
    assert state["step"] == 3 and state["metadata"]["tokenizer_sha256"] == TOK_HASH
    assert json.loads(state["metadata"]["model_config"])["hidden_size"] == 48

    (early / WEIGHTS_FILE).write_bytes((late / WEIGHTS_FILE).read_bytes())  # step-9 weights, step-3 state
    with pytest.raises(CheckpointMismatchError, match=rf"{WEIGHTS_FILE} says step 9 but .*{STATE_FILE} says step 3"):
        train(tiny_model(), train_b, val_b, s, tmp_path / "early", model_meta=meta)

    # The identity too: the header rewritten to another vocabulary hash at the right step.
    header = read_metadata(late)
    save_file(
        load_file(str(late / WEIGHTS_FILE)), str(late / WEIGHTS_FILE), metadata={**header, "tokenizer_sha256": "b" * 64}
    )
    with pytest.raises(
        CheckpointMismatchError, match=r"says tokenizer_sha256='bbbb.*train_state.pt says tokenizer_sha256='aaaa"
    ):
        load_checkpoint(late, tiny_model())
    untouched = tiny_model(seed=5)
    before = [p.clone() for p in untouched.parameters()]
    with pytest.raises(CheckpointMismatchError):
        load_checkpoint(late, untouched)
    assert all(torch.equal(a, b) for a, b in zip(before, untouched.parameters()))  # refused before loading


def test_ranks_split_one_global_batch():
    """The data-parallel seam: every rank draws the same global batch and trains on its own slice;
    the draw does not depend on the world size, so a resume into another world size sees the same blocks."""
    world = 3
    draws = [batch_indices(np.random.default_rng(7), 100, 12, Parallel(rank=r, world_size=world)) for r in range(world)]
    glob = np.random.default_rng(7).integers(0, 100, size=12)
    assert [len(d) for d in draws] == [4, 4, 4] and np.array_equal(np.concatenate(draws), glob)
    # One process draws exactly what the loop always drew: the trajectory of world_size 1 is unchanged.
    assert np.array_equal(
        batch_indices(np.random.default_rng(7), 100, 4, Parallel()), np.random.default_rng(7).integers(0, 100, size=4)
    )
    assert Parallel().is_main and not Parallel(rank=1, world_size=2).is_main
    with pytest.raises(ConfigError, match="rank=2"):
        Parallel(rank=2, world_size=2)


def flip_tensor_bits(path, mask: int) -> None:
    """XOR `mask` into a float32 in the middle of a safetensors file's data (past its header)."""
    import struct

    raw = bytearray(path.read_bytes())
    header = 8 + struct.unpack("<Q", raw[:8])[0]
    at = header + (len(raw) - header) // 2 // 4 * 4
    (value,) = struct.unpack("<I", raw[at : at + 4])
    raw[at : at + 4] = struct.pack("<I", value ^ mask)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("mask", [0x0000_0003, 0x4000_0000], ids=["mantissa", "exponent"])
def test_a_corrupted_checkpoint_is_refused_on_resume_naming_the_file(tmp_path, blocks, mask):
    """Flipped bits in the weights' tensor data (the header and the step intact): the resume is refused,
    naming the file, calling it corrupt and offering to start over; nothing is loaded into the model,
    and resume=False does start over."""
    from components.core.checkpoint import CheckpointCorruptError

    train_b, val_b = blocks
    s = quick(max_steps=6, eval_interval=0)
    meta = {"tokenizer_sha256": TOK_HASH}
    train(tiny_model(), train_b, val_b, s, tmp_path, stop_after_steps=3, model_meta=meta)
    weights = tmp_path / "checkpoint" / WEIGHTS_FILE
    flip_tensor_bits(weights, mask)
    assert read_metadata(weights)["step"] == "3"  # still a readable file of the right step
    with pytest.raises(CheckpointCorruptError, match=rf"{weights} is corrupt.*sha256.*resume=False") as e:
        train(tiny_model(), train_b, val_b, s, tmp_path, model_meta=meta)
    assert "start over with resume=false" in str(e.value).lower()
    untouched = tiny_model(seed=5)
    before = [p.clone() for p in untouched.parameters()]
    with pytest.raises(CheckpointCorruptError):
        load_checkpoint(tmp_path / "checkpoint", untouched)
    assert all(torch.equal(a, b) for a, b in zip(before, untouched.parameters()))
    # The train state is covered too.
    r = train(tiny_model(), train_b, val_b, s, tmp_path, resume=False, stop_after_steps=3, model_meta=meta)
    assert r.resumed_from == 0
    state_file = tmp_path / "checkpoint" / STATE_FILE
    raw = bytearray(state_file.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    state_file.write_bytes(bytes(raw))
    with pytest.raises((CheckpointCorruptError, PipelineInputError), match=rf"{state_file}"):
        train(tiny_model(), train_b, val_b, s, tmp_path, model_meta=meta)


def test_weights_files_share_one_mode(tmp_path, blocks):
    """Every .safetensors file the project writes is 0644 like its neighbours (safetensors alone
    writes 0600): checkpoints and saved models here, export folders in tests/test_export.py."""
    import os

    from components.core.artifacts import WEIGHTS_MODE
    from components.core.lm import save_lm

    train_b, val_b = blocks
    model = tiny_model()
    r = train(model, train_b, val_b, quick(max_steps=1, eval_interval=0), tmp_path / "run")
    files = [r.checkpoint_dir / WEIGHTS_FILE, save_lm(model, tmp_path / "saved" / WEIGHTS_FILE)]
    modes = {f.name: oct(os.stat(f).st_mode & 0o777) for f in files}
    assert WEIGHTS_MODE == 0o644 and set(modes.values()) == {"0o644"}, modes
    assert oct(os.stat(r.checkpoint_dir / STATE_FILE).st_mode & 0o777) == "0o644"  # its neighbour
