import pytest

from components.core.errors import PipelineInputError
from components.orchestration.language_model import check_same_tokenizer, with_defaults, RecurrentModelConfig


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
