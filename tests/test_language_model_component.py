import pytest

from components.core.errors import PipelineInputError
from components.orchestration.language_model import (
    LanguageModelTrainConfig, RecurrentModelConfig, check_same_tokenizer, training_identity, with_defaults,
)


def test_labels_from_another_tokenizer_are_refused():
    labels = {"path": "/state/labels/run1", "tokenizer_sha256": "a" * 64}
    tokenizer = {"path": "/state/tokenizer/run2/tokenizer.json", "sha256": "b" * 64}
    with pytest.raises(PipelineInputError, match=r"built with tokenizer aaaaaaaaaaaa.*current tokenizer is bbbbbbbbbbbb.*Re-materialize `labels`"):
        check_same_tokenizer(labels, tokenizer)
    check_same_tokenizer(labels, {**tokenizer, "sha256": "a" * 64})


def test_component_defaults_become_config_defaults():
    cls = with_defaults("RnnModel", RecurrentModelConfig, {"cell": "rnn", "hidden_size": 64}, "test")
    cfg = cls()
    assert cfg.cell == "rnn" and cfg.hidden_size == 64 and cfg.n_layer == RecurrentModelConfig().n_layer
    with pytest.raises(ValueError, match="dropout"):
        with_defaults("Bad", RecurrentModelConfig, {"dropout": 2.0}, "test")


def test_the_checkpoint_key_ignores_how_a_training_is_launched():
    labels = {"files": {"train_x": {"sha256": "1" * 64}}}
    tokenizer = {"sha256": "a" * 64}

    def key(**train):
        settings = {"model": {"n_layer": 2}, "train": LanguageModelTrainConfig(**train).model_dump(), "sampling": {}}
        return training_identity("transformer_lm", "transformer", settings, labels, tokenizer)

    inprocess = key(batch_size=8)
    assert key(batch_size=8, launcher="torchrun", nproc_per_node=2, strategy="fsdp") == inprocess
    assert key(batch_size=16) != inprocess  # what is trained: another checkpoint
    assert training_identity("transformer_lm", "transformer", {"model": {}, "train": {"batch_size": 8}}, labels, {"sha256": "b" * 64}) != \
        training_identity("transformer_lm", "transformer", {"model": {}, "train": {"batch_size": 8}}, labels, tokenizer)
