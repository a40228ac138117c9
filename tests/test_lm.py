"""One driver for every family: RNN, LSTM and Transformer go through the same resolve → build → train →
save/load functions, with samples, figures and the shared metrics; loading never re-sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gensim.test.utils import datapath
from matplotlib.figure import Figure

from components.core.checkpoint import CheckpointMismatchError, read_metadata
from components.core.data import IGNORE_INDEX, TokenBlocks
from components.core.device import resolve_dtype
from components.core.errors import ConfigError
from components.core.lm import (
    FAMILIES,
    SamplingSettings,
    build_model,
    load_lm,
    resolve_settings,
    sample_texts,
    save_lm,
    train_lm,
)
from components.core.models import count_parameters
from components.core.models.recurrent import RecurrentLM
from components.core.models.transformer import Transformer
from components.core.train_settings import TrainSettings
from components.core.train_step import evaluate

pytestmark = pytest.mark.usefixtures("one_thread")

T = 16
# name -> (family, model settings with a parameter budget to resolve)
MODELS = {
    "rnn": ("recurrent", {"cell": "rnn", "n_embd": 16, "hidden_size": 32, "param_budget": 8_000}),
    "lstm": (
        "recurrent",
        {"cell": "lstm", "lstm_impl": "explicit", "n_embd": 16, "hidden_size": 16, "param_budget": 10_000},
    ),
    "transformer": ("transformer", {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": T, "param_budget": 10_000}),
}


@pytest.fixture(scope="module")
def corpus():
    """Character-level blocks of real English text (gensim's Lee news corpus), [PAD]=0."""
    text = open(datapath("lee_background.cor"), encoding="utf-8").read()[:20_000]
    chars = sorted(set(text))
    stoi = {c: i + 1 for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)

    def blocks(a: np.ndarray) -> TokenBlocks:
        n = (len(a) - 1) // T
        return TokenBlocks(a[: n * T].reshape(n, T), a[1 : n * T + 1].astype(np.int32).reshape(n, T))

    split = int(len(ids) * 0.9)
    decode = lambda ids_: "".join(chars[i - 1] if i > 0 else "" for i in ids_)  # noqa: E731
    encode = lambda s: [stoi[c] for c in s]  # noqa: E731
    return blocks(ids[:split]), blocks(ids[split:]), len(chars) + 1, decode, encode


@pytest.mark.parametrize("name", list(MODELS))
def test_every_family_trains_saves_and_loads_through_the_same_functions(name, corpus, tmp_path, monkeypatch):
    train_data, val_data, vocab, decode, encode = corpus
    family, settings = MODELS[name]
    ts = TrainSettings(
        max_steps=4, batch_size=4, eval_interval=0, eval_batches=4, log_interval=2, device="cpu", threads=1
    )
    sampling = SamplingSettings(num_samples=2, sample_tokens=6, sample_prompt="The ")
    progress = []
    res = train_lm(
        family,
        settings,
        ts,
        train_data,
        val_data,
        vocab,
        tmp_path,
        sampling=sampling,
        decode=decode,
        encode=encode,
        model_meta={"tokenizer_sha256": "a" * 64},
        progress=lambda *a: progress.append(a),
    )

    # sized once, before building: the result's settings are resolved, near the budget
    assert res.family == family and res.config.param_budget is None
    assert res.config == resolve_settings(family, settings, vocab)
    m = res.metrics
    assert abs(m["params"] - settings["param_budget"]) / settings["param_budget"] < 0.25
    assert {
        "train/loss",
        "val/loss",
        "val/ppl",
        "train/tokens_per_s_mean",
        "train/step_ms_mean",
        "params",
        "flops_per_token",
    } <= set(m)
    assert m["params_non_embedding"] == m["params"] - vocab * res.config.n_embd
    assert "mfu" not in m and [p[1] for p in progress] == [2, 4]
    assert len(res.samples) == 2 and all(s.startswith("The ") and len(s) == 4 + 6 for s in res.samples)
    assert res.attention_backend["implementation"] == ("recurrent" if family == "recurrent" else "fused")
    assert isinstance(res.figures["loss_curve"], Figure)
    assert ("attention_maps" in res.figures) == (family == "transformer")
    assert ("lstm_gates" in res.figures) == (name == "lstm")  # the explicit LSTM logs its gates
    header = read_metadata(res.weights_path)
    assert header["family"] == family and header["param_budget"] == str(settings["param_budget"])
    assert res.weights_path.parent == res.checkpoint_dir and res.resumed_from_step == 0

    # a rerun resumes the finished checkpoint and trains no further
    again = train_lm(
        family,
        settings,
        ts,
        train_data,
        val_data,
        vocab,
        tmp_path,
        sampling=SamplingSettings(num_samples=0),
        model_meta={"tokenizer_sha256": "a" * 64},
    )
    assert again.resumed_from_step == 4 and again.history == res.history

    # Loading never sizes: the header holds the resolved widths.
    def no_sizing(*args, **kwargs):
        raise AssertionError("sizing ran while loading a checkpoint")

    monkeypatch.setattr("components.core.models.sizing.meta_parameter_count", no_sizing)
    for path in (res.checkpoint_dir, res.weights_path):
        model = load_lm(path)
        assert isinstance(model, RecurrentLM if family == "recurrent" else Transformer) and model.config == res.config
        # the reloaded weights are the trained ones: the same validation loss, exactly
        dtype = resolve_dtype(ts.dtype, torch.device("cpu"))  # as it trained ('auto': bf16 on a CPU with AMX)
        assert evaluate(model, val_data, batch_size=4, max_batches=4, device="cpu", dtype=dtype) == m["val/loss"]
    with pytest.raises(AssertionError, match="sizing ran"):
        resolve_settings(family, settings, vocab)  # (the patch is live)

    # save_lm/load_lm round trip, with the identity checked on request
    saved = save_lm(model, tmp_path / "export" / "model.safetensors", {"tokenizer_sha256": "a" * 64})
    assert (
        count_parameters(load_lm(saved, expected_meta={"tokenizer_sha256": "a" * 64, **_identity(saved)}))
        == m["params"]
    )
    with pytest.raises(CheckpointMismatchError, match="tokenizer_sha256"):
        load_lm(saved, expected_meta={**_identity(saved), "tokenizer_sha256": "b" * 64})


def _identity(path) -> dict:
    meta = read_metadata(path)
    return {k: meta[k] for k in ("model_kind", "model_config", "vocab_size")}


def test_settings_must_be_resolved_and_families_known(corpus):
    _, _, vocab, *_ = corpus
    family, settings = MODELS["lstm"]
    with pytest.raises(ConfigError, match="param_budget=10000 is not resolved"):
        build_model(family, settings, vocab)
    model = build_model(family, resolve_settings(family, settings, vocab), vocab)
    assert isinstance(model, RecurrentLM) and model.config.lstm_impl == "explicit"
    assert resolve_settings("recurrent", {"cell": "rnn"}, vocab).hidden_size == 256  # no budget: unchanged
    assert FAMILIES == ("recurrent", "transformer")
    with pytest.raises(ConfigError, match="family='gru' is unknown; use one of: recurrent, transformer"):
        resolve_settings("gru", {}, vocab)
    with pytest.raises(ValueError, match="n_head"):
        resolve_settings("transformer", {"n_embd": 30, "n_head": 4}, vocab)  # the family's own validators run


def test_sample_prompts_come_from_validation_blocks_without_padding(corpus):
    """Without a prompt text, each sample continues the first tokens of a validation block, [PAD] dropped
    (an all-padding row keeps its first token); a recurrent model samples through the same function."""
    _, _, vocab, *_ = corpus
    model = build_model("recurrent", {"cell": "rnn", "n_embd": 8, "hidden_size": 8}, vocab)
    x = np.zeros((2, T), dtype=np.uint16)
    x[0, :3] = [5, 6, 7]
    blocks = TokenBlocks(x, np.full((2, T), IGNORE_INDEX, dtype=np.int32))
    texts = sample_texts(
        model,
        blocks,
        SamplingSettings(num_samples=2, sample_tokens=3, temperature=0),
        torch.device("cpu"),
        decode=lambda ids: ",".join(map(str, ids)),
    )
    assert texts[0].startswith("5,6,7,") and len(texts[0].split(",")) == 6
    assert texts[1].startswith("0,") and len(texts[1].split(",")) == 4


@pytest.mark.parametrize("name", list(MODELS))
def test_samples_drawn_together_continue_each_prompt_as_alone(name, corpus):
    """Prompts of one length are continued in one batch: greedy, each row is what that prompt alone
    gives (no row sees another's tokens), past the Transformer's context, in the prompts' order."""
    _, val_data, vocab, decode, _ = corpus
    family, settings = MODELS[name]
    torch.manual_seed(0)
    model = build_model(family, resolve_settings(family, settings, vocab), vocab)
    greedy = SamplingSettings(num_samples=3, sample_tokens=2 * T, temperature=0, prompt_tokens=5)
    together = sample_texts(model, val_data, greedy, torch.device("cpu"), decode=decode)
    one_sample = greedy.model_copy(update={"num_samples": 1})
    alone = []
    for row in range(3):
        one = TokenBlocks(val_data.x[row : row + 1], val_data.y[row : row + 1])
        alone += sample_texts(model, one, one_sample, torch.device("cpu"), decode=decode)
    assert together == alone
    assert len(set(together)) == 3  # three different prompts, three different texts


@pytest.mark.parametrize(
    "family,settings",
    [
        ("recurrent", {"cell": "rnn", "n_embd": 16, "hidden_size": 32, "tie_weights": False}),
        ("recurrent", {"cell": "lstm", "n_embd": 16, "hidden_size": 24, "tie_weights": True}),
        ("transformer", {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": T, "pos_encoding": "rope"}),
        (
            "transformer",
            {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": T, "pos_encoding": "learned", "tie_weights": False},
        ),
    ],
)
def test_params_non_embedding_is_params_minus_the_embedding_tables(family, settings):
    """One definition for every family and for model_comparison's accounting: params_non_embedding is
    params minus exactly the token table (V×E) and a learned position table (block_size×E); a tied
    output head is the token table, an untied one counts."""
    from components.core.studies.transformer_probes import parameter_accounting

    vocab = 97
    model = build_model(family, settings, vocab)
    E = settings["n_embd"]
    tables = vocab * E + (T * E if settings.get("pos_encoding") == "learned" else 0)
    assert count_parameters(model, non_embedding=True) == count_parameters(model) - tables
    if family == "transformer":
        a = parameter_accounting(model)
        assert a["non_embedding"] == count_parameters(model, non_embedding=True)
        assert a["non_embedding"] == a["blocks"] + a["components"]["head"]


def test_a_flops_budget_sets_the_steps_so_the_schedule_ends_at_it(tmp_path):
    """Two models of different cost given one FLOPs budget train for different step counts, each
    spending it (to within one step), and each schedule's last step is its decay's end."""
    import numpy as np
    import pytest

    from components.core.data import TokenBlocks
    from components.core.errors import ConfigError
    from components.core.lm import train_lm
    from components.core.train_settings import TrainSettings
    from components.core.train_step import lr_at

    rng = np.random.default_rng(0)
    x = rng.integers(1, 30, size=(64, 16)).astype(np.uint16)
    blocks = TokenBlocks(x, np.roll(x, -1, axis=1).astype(np.int32))
    budget = 1.5e7
    spent = {}
    for name, family, model in (
        ("small", "recurrent", {"cell": "rnn", "n_embd": 8, "hidden_size": 8}),
        ("big", "recurrent", {"cell": "lstm", "n_embd": 16, "hidden_size": 32}),
    ):
        ts = TrainSettings(
            flops_budget=budget, batch_size=4, warmup_steps=1, eval_interval=0, device="cpu", dtype="float32"
        )
        res = train_lm(family, model, ts, blocks, blocks, 30, tmp_path / name)
        per_step = res.metrics["flops_per_token"] * 4 * 16
        spent[name] = res.metrics["steps"]
        assert budget - per_step < res.metrics["steps"] * per_step <= budget
        assert (
            lr_at(int(res.metrics["steps"]), ts.model_copy(update={"max_steps": int(res.metrics["steps"])}))
            == ts.min_lr
        )
    assert spent["small"] > spent["big"]
    with pytest.raises(ConfigError, match="flops_budget"):
        train_lm(
            "recurrent",
            {"cell": "rnn", "n_embd": 8, "hidden_size": 8},
            TrainSettings(flops_budget=10.0, batch_size=4, device="cpu"),
            blocks,
            blocks,
            30,
            tmp_path / "tiny",
        )
