import dataclasses

import pytest
from stubs import stub_manifest

from components.core import manifests as M
from components.core.errors import PipelineInputError
from components.orchestration.language_model import (
    LanguageModelTrainConfig,
    RecurrentModelConfig,
    TransformerModelConfig,
    check_same_tokenizer,
    training_identity,
    with_defaults,
)


def test_labels_from_another_tokenizer_are_refused():
    labels = stub_manifest(M.Labels, path="/state/labels/run1", tokenizer_sha256="a" * 64)
    tokenizer = stub_manifest(M.Tokenizer, path="/state/tokenizer/run2/tokenizer.json", sha256="b" * 64)
    with pytest.raises(
        PipelineInputError,
        match=r"built with tokenizer aaaaaaaaaaaa.*current tokenizer is bbbbbbbbbbbb.*Re-materialize `labels`",
    ):
        check_same_tokenizer(labels, tokenizer)
    check_same_tokenizer(labels, dataclasses.replace(tokenizer, sha256="a" * 64))


def test_component_defaults_become_config_defaults():
    cls = with_defaults("RnnModel", RecurrentModelConfig, {"cell": "rnn", "hidden_size": 64}, "test")
    cfg = cls()
    assert cfg.cell == "rnn" and cfg.hidden_size == 64 and cfg.n_layer == RecurrentModelConfig().n_layer
    with pytest.raises(ValueError, match="dropout"):
        with_defaults("Bad", RecurrentModelConfig, {"dropout": 2.0}, "test")


def test_the_checkpoint_key_ignores_how_a_training_is_launched():
    labels = stub_manifest(M.Labels, files={"train_x": M.FileRecord(path="x", bytes=1, sha256="1" * 64)})
    tokenizer = stub_manifest(M.Tokenizer, sha256="a" * 64)

    def key(**train):
        settings = {"model": {"n_layer": 2}, "train": LanguageModelTrainConfig(**train).model_dump(), "sampling": {}}
        return training_identity("transformer_lm", "transformer", settings, labels, tokenizer)

    inprocess = key(batch_size=8)
    assert key(batch_size=8, launcher="torchrun", nproc_per_node=2, strategy="fsdp") == inprocess
    assert key(batch_size=16) != inprocess  # what is trained: another checkpoint
    other_tokenizer = stub_manifest(M.Tokenizer, sha256="b" * 64)
    assert training_identity(
        "transformer_lm", "transformer", {"model": {}, "train": {"batch_size": 8}}, labels, other_tokenizer
    ) != training_identity(
        "transformer_lm", "transformer", {"model": {}, "train": {"batch_size": 8}}, labels, tokenizer
    )


def component_config(name: str, **run):
    """The asset's config as a run config `run` makes it: the component's defs.yaml defaults, then `run`."""
    from pathlib import Path

    import yaml

    attrs = yaml.safe_load((Path(__file__).resolve().parents[1] / "pipelines/defs" / name / "defs.yaml").read_text())[
        "attributes"
    ]
    model_cls = with_defaults(
        "M",
        {"transformer": TransformerModelConfig, "recurrent": RecurrentModelConfig}[attrs["family"]],
        attrs.get("architecture", {}),
        name,
    )
    train_cls = with_defaults("T", LanguageModelTrainConfig, attrs.get("training", {}), name)
    return attrs["family"], model_cls, train_cls, model_cls(**run.get("model", {})), train_cls(**run.get("train", {}))


def test_an_explicit_width_is_never_resized_by_the_default_budget():
    """transformer_lm's defs.yaml sets param_budget; a run config's own n_embd builds the model at that
    width (the budget off, and said so), and both written is an error naming both fields."""
    from components.core.errors import ConfigError
    from components.core.lm import explicit_settings_win, resolve_settings

    family, model_cls, train_cls, model, train = component_config(
        "transformer_lm", model={"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 32}
    )
    assert model.param_budget  # the component's default budget is there
    m, _, notes = explicit_settings_win(family, model, model_cls(), train, train_cls())
    assert resolve_settings(family, m, 512).n_embd == 32 and any("param_budget" in n for n in notes)
    # n_head=3 does not divide 32: refused as with param_budget: null, not resized into a fit.
    _, _, _, model3, _ = component_config("transformer_lm", model={"n_embd": 32, "n_head": 3})
    m3, _, _ = explicit_settings_win(family, model3, model_cls(), train, train_cls())
    with pytest.raises(ValueError, match="n_embd=32 must be divisible by n_head=3"):
        resolve_settings(family, m3, 512)
    # Both written: an error naming both.
    _, _, _, both, _ = component_config("transformer_lm", model={"n_embd": 32, "param_budget": 60000})
    with pytest.raises(ConfigError, match=r"model\.n_embd=32 and model\.param_budget=60000 are both set"):
        explicit_settings_win(family, both, model_cls(), train, train_cls())
    # The budget alone still sizes the width (configs/tiny.yaml), and the defaults alone change nothing.
    _, _, _, budget, _ = component_config("transformer_lm", model={"param_budget": 60000})
    mb, _, notes_b = explicit_settings_win(family, budget, model_cls(), train, train_cls())
    assert notes_b == [] and resolve_settings(family, mb, 512).n_embd != model_cls().n_embd
    assert explicit_settings_win(family, model_cls(), model_cls(), train, train_cls())[2] == []
    # The recurrent family: an explicit hidden_size turns rnn_lm's default budget off.
    rfam, rcls, rtrain_cls, rmodel, rtrain = component_config("rnn_lm", model={"hidden_size": 40})
    rm, _, _ = explicit_settings_win(rfam, rmodel, rcls(), rtrain, rtrain_cls())
    assert resolve_settings(rfam, rm, 512).hidden_size == 40


def test_explicit_steps_turn_the_default_flops_budget_off():
    """The default run's models train to an equal FLOPs budget (defs.yaml); a run config that writes
    max_steps (configs/tiny.yaml: 30) trains those steps, the budget off and said so, instead of the
    thousands of steps 5.5e12 FLOPs buy a tiny model; both written is an error naming both."""
    from components.core.errors import ConfigError
    from components.core.lm import explicit_settings_win

    family, model_cls, train_cls, model, train = component_config("rnn_lm", train={"max_steps": 30})
    assert train_cls().flops_budget == 5.5e12  # the default run's budget
    _, t, notes = explicit_settings_win(family, model, model_cls(), train, train_cls())
    assert t.flops_budget is None and t.max_steps == 30
    assert notes == [
        "train.max_steps=30 is set: the default train.flops_budget=5.5e+12 is off (as with flops_budget: null)"
    ]
    # The defaults alone keep the budget; both written is refused.
    _, t0, notes0 = explicit_settings_win(family, model_cls(), model_cls(), train_cls(), train_cls())
    assert t0.flops_budget == 5.5e12 and notes0 == []
    *_, both = component_config("rnn_lm", train={"max_steps": 30, "flops_budget": 1e12})
    with pytest.raises(ConfigError, match=r"train\.max_steps=30 and train\.flops_budget=1e\+12 are both set"):
        explicit_settings_win(family, model, model_cls(), both, train_cls())
    # 200, the training loop's own default, written is written too (the component's default is None)
    assert train_cls().max_steps is None
    *_, two_hundred = component_config("rnn_lm", train={"max_steps": 200})
    _, t200, notes200 = explicit_settings_win(family, model, model_cls(), two_hundred, train_cls())
    assert t200.flops_budget is None and t200.max_steps == 200 and len(notes200) == 1


def test_the_run_config_check_applies_the_same_rule():
    """The check every step runs first (validation.check_run_config) judges a language model by the
    settings it will train with: the issue's config passes, an n_head that does not divide the
    explicit n_embd is named, and both a width and a budget are refused naming both fields."""
    from components.orchestration.validation import check_run_config, config_classes
    from pipelines.definitions import defs

    classes = {k: v for k, v in config_classes(defs.assets).items() if k in ("transformer_lm", "rnn_lm")}

    def problems(model):
        return check_run_config({"transformer_lm": {"config": {"model": model}}}, classes, 128)

    assert problems({"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 32}) == []
    (odd,) = problems({"n_layer": 2, "n_embd": 32, "n_head": 3, "block_size": 32})
    assert "transformer_lm" in odd and "n_embd=32 must be divisible by n_head=3" in odd
    (both,) = problems({"n_embd": 32, "param_budget": 60000})
    assert "model.n_embd=32 and model.param_budget=60000 are both set" in both
    assert problems({"param_budget": 60000, "n_layer": 2, "block_size": 32}) == []  # configs/tiny.yaml's kind
    both_steps = {"rnn_lm": {"config": {"train": {"max_steps": 30, "flops_budget": 1e12}}}}
    (steps,) = check_run_config(both_steps, classes, 128)
    assert steps.startswith("ops.rnn_lm.config: train.max_steps=30 and train.flops_budget=1e+12 are both set")
    assert check_run_config({"rnn_lm": {"config": {"train": {"max_steps": 30}}}}, classes, 128) == []
    both_200 = {"rnn_lm": {"config": {"train": {"max_steps": 200, "flops_budget": 1e12}}}}
    (steps_200,) = check_run_config(both_200, classes, 128)
    assert "train.max_steps=200 and train.flops_budget=1e+12 are both set" in steps_200
