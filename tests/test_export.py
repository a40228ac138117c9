"""Export folders: the round trip of every precision, the errors on bad input (corrupted or truncated
weights, shapes that do not fit config.json, a mismatched tokenizer, an unknown scheme), atomic
writes, the load-time comparison, and the generate entry point on an export of the tiny config."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from gensim.test.utils import datapath

from components.core.errors import ConfigError, PipelineInputError
from components.core.export import (
    VARIANTS,
    export_model,
    generate,
    is_quantized_layer,
    load_benchmark,
    load_export,
    logits_of,
    spec_of,
    to_precision,
)
from components.core.export import folder as export_folder
from components.core.labels import LabelSettings, build_labels, load_labels
from components.core.lm import SamplingSettings, load_lm, train_lm
from components.core.tokenizer import TokenizerSettings, train_tokenizer
from components.core.train_settings import TrainSettings

ROOT = Path(__file__).resolve().parents[1]
_BUILT: dict[str, dict] = {}


def tiny_model_settings() -> dict:
    """The Transformer of configs/tiny.yaml: its defs.yaml architecture with tiny's overrides."""
    arch = yaml.safe_load((ROOT / "pipelines/defs/transformer_lm/defs.yaml").read_text())["attributes"]["architecture"]
    tiny = yaml.safe_load((ROOT / "configs/tiny.yaml").read_text())["ops"]["transformer_lm"]["config"]["model"]
    return {**arch, **tiny}


def build_tiny(root: Path) -> dict:
    """A BPE tokenizer, labels and a briefly trained tiny-config Transformer and LSTM on real English
    text (gensim's Lee corpus), through the pipeline's own core calls. Built once per session."""
    if "tiny" in _BUILT:
        return _BUILT["tiny"]
    docs = [d for d in open(datapath("lee_background.cor"), encoding="utf-8").read().split("\n") if d.strip()]
    tok = train_tokenizer(docs, TokenizerSettings(vocab_size=512))
    tok_path = root / "tokenizer.json"
    tok.save(str(tok_path))
    labels = build_labels(
        {"train": docs[:250], "validation": docs[250:]}, tok_path, LabelSettings(block_size=32), root / "labels"
    )
    train, val, meta = load_labels(labels.path)
    ts = TrainSettings(
        max_steps=30,
        batch_size=8,
        eval_interval=0,
        eval_batches=2,
        log_interval=10,
        warmup_steps=5,
        device="cpu",
    )
    out = {
        "tokenizer": tok_path,
        "tokenizer_sha256": meta["tokenizer_sha256"],
        "train": train,
        "val": val,
        "vocab_size": int(meta["vocab_size"]),
    }
    for name, family, settings in (
        ("transformer_lm", "transformer", tiny_model_settings()),
        ("lstm_lm", "recurrent", {"cell": "lstm", "param_budget": 60000}),
    ):
        res = train_lm(
            family,
            settings,
            ts,
            train,
            val,
            out["vocab_size"],
            root / name,
            sampling=SamplingSettings(num_samples=0),
            model_meta={"tokenizer_sha256": meta["tokenizer_sha256"]},
        )
        out[name] = res.weights_path
        out[f"{name}_config"] = res.config.model_dump()
    _BUILT["tiny"] = out
    return out


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    return build_tiny(tmp_path_factory.mktemp("tiny_lm"))


def _export(tiny: dict, variant: str, out: Path, model=None) -> Path:
    model = model if model is not None else load_lm(tiny["transformer_lm"])
    export_model(
        model,
        variant,
        out,
        tokenizer_path=tiny["tokenizer"],
        config=tiny["transformer_lm_config"],
        train_settings={"max_steps": 30},
        provenance={
            "dagster_run_id": "test-run",
            "mlflow_run_id": "test-mlflow",
            "tokenizer_sha256": tiny["tokenizer_sha256"],
            "corpus_content_sha256": "c0ffee",
        },
    )
    return out


@pytest.fixture(scope="module")
def exports(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    model = load_lm(tiny["transformer_lm"])
    return {v: _export(tiny, v, root / v, model) for v in VARIANTS}


def test_round_trip_every_variant(tiny, exports):
    """Each folder alone rebuilds the exported model: the same logits (bit for bit: the stored tensors
    are the ones the layers compute with), the scheme in config.json and in the header, provenance."""
    model = load_lm(tiny["transformer_lm"])
    idx = torch.from_numpy(tiny["val"].x[:2].astype(np.int64))
    for variant, folder in exports.items():
        exported = to_precision(model, variant)
        reloaded, tok, cfg = load_export(folder)
        assert torch.equal(logits_of(exported, idx), logits_of(reloaded, idx)), variant
        assert sorted(p.name for p in folder.iterdir()) == [
            "README.md",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
        ]
        assert cfg["quantization"]["variant"] == variant and cfg["tokenizer_sha256"] == tiny["tokenizer_sha256"]
        assert cfg["provenance"]["dagster_run_id"] == "test-run" and cfg["model_config"]["n_layer"] == 2
        header, _ = export_folder.read_header(folder / "model.safetensors")
        assert header["__metadata__"]["scheme"] == cfg["quantization"]["scheme"]
        gen = json.loads((folder / "generation_config.json").read_text())
        assert gen["eos_token_id"] == 3 and gen["max_new_tokens"] == 64
        assert tok.get_vocab_size() == tiny["vocab_size"]
        assert spec_of(reloaded).variant == variant
        assert any(is_quantized_layer(m) for m in reloaded.modules()) == (variant in ("int8", "nf4", "fp4"))
    sizes = {v: (f / "model.safetensors").stat().st_size for v, f in exports.items()}
    assert sizes["fp16"] < 0.52 * sizes["fp32"] and sizes["nf4"] < sizes["int8"] < sizes["fp32"]


def test_lstm_round_trip(tiny, tmp_path):
    """The recurrent family too: its LSTM rewritten as quantized Linear layers survives the round trip."""
    model = load_lm(tiny["lstm_lm"])
    idx = torch.from_numpy(tiny["val"].x[:2].astype(np.int64))
    for variant in ("bf16", "nf4"):
        q = to_precision(model, variant)
        export_model(
            q,
            variant,
            tmp_path / variant,
            tokenizer_path=tiny["tokenizer"],
            config=tiny["lstm_lm_config"],
            train_settings={},
            provenance={"tokenizer_sha256": tiny["tokenizer_sha256"]},
        )
        reloaded, _, cfg = load_export(tmp_path / variant)
        assert torch.equal(logits_of(q, idx), logits_of(reloaded, idx))
        assert cfg["family"] == "recurrent"
    assert cfg["quantization"]["recurrent_as_linear"] == ["rnn"]


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_corrupted_and_truncated_weights_are_named(exports, tmp_path):
    bad = _copy(exports["nf4"], tmp_path / "flipped")
    w = bad / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(PipelineInputError, match=r"model\.safetensors is corrupted"):
        load_export(bad)

    cut = _copy(exports["fp16"], tmp_path / "cut")
    w = cut / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-1000])
    with pytest.raises(PipelineInputError, match=r"model\.safetensors has \d+ bytes but config\.json records"):
        load_export(cut)
    # Without the recorded size and hash, the header itself says the file is too short.
    with pytest.raises(PipelineInputError, match=r"model\.safetensors is truncated"):
        load_export(cut, verify=False)
    w.write_bytes(w.read_bytes()[:5])
    with pytest.raises(PipelineInputError, match="truncated"):
        load_export(cut, verify=False)


def test_header_shapes_must_match_config(exports, tmp_path):
    bad = _copy(exports["int8"], tmp_path / "wider")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_config"]["n_embd"] += 8
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        PipelineInputError, match=r"model\.safetensors does not match the architecture in .*config\.json.*has shape"
    ):
        load_export(bad)


def test_tokenizer_must_be_the_one_trained_with(tiny, exports, tmp_path):
    other = train_tokenizer(["some other text entirely", "with other words"] * 50, TokenizerSettings(vocab_size=300))
    bad = _copy(exports["fp32"], tmp_path / "other_tok")
    other.save(str(bad / "tokenizer.json"))
    with pytest.raises(PipelineInputError, match=r"tokenizer\.json has SHA-256 .* trained with tokenizer"):
        load_export(bad)
    # Exporting with a tokenizer other than the model's is refused up front, and leaves nothing behind.
    out = tmp_path / "refused"
    with pytest.raises(PipelineInputError, match="trained with tokenizer"):
        export_model(
            load_lm(tiny["transformer_lm"]),
            "fp16",
            out,
            tokenizer_path=bad / "tokenizer.json",
            config=tiny["transformer_lm_config"],
            train_settings={},
            provenance={},
            tokenizer_sha256=tiny["tokenizer_sha256"],
        )
    assert not out.exists() and not list(tmp_path.glob(".refused*"))


def test_unknown_scheme_and_missing_backend(exports, tmp_path, monkeypatch):
    bad = _copy(exports["nf4"], tmp_path / "scheme")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization"]["scheme"] = "gptq-3bit"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ConfigError, match=r"config\.json quantization\.scheme: unknown quantization scheme 'gptq-3bit'"
    ):
        load_export(bad)
    # A bitsandbytes build without the kernels for this device: a clear error naming the variant.
    from components.core.export import precision

    monkeypatch.setitem(precision._PROBED, ("nf4", "cpu"), "bitsandbytes 0.0: RuntimeError: no CPU backend (simulated)")
    with pytest.raises(
        ConfigError, match=r"'nf4' needs bitsandbytes' 4-bit kernels on cpu.*remove 'nf4' from `variants`"
    ):
        load_export(exports["nf4"])


def test_failed_export_leaves_nothing_half_written(tiny, exports, tmp_path, monkeypatch):
    target = _copy(exports["fp16"], tmp_path / "fp16")
    before = (target / "model.safetensors").read_bytes()

    def boom(*a, **k):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(export_folder, "save_weights", boom)
    with pytest.raises(OSError, match="disk full"):
        _export(tiny, "fp16", target)
    # The previous complete export is untouched and no temporary folder is left.
    assert (target / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp16"]


def test_no_pickles_anywhere():
    """Safetensors and JSON only; the one torch.load (the load-time comparison) is weights_only."""
    src = "\n".join(p.read_text() for p in (ROOT / "components/core/export").glob("*.py"))
    src += "\n".join(p.read_text() for p in sorted((ROOT / "components/core/studies").glob("quant*.py")))
    calls = re.findall(r"torch\.load\([^\n]*", src)
    assert calls and all("weights_only=True" in c for c in calls)
    assert "pickle" not in src.replace("unpickle", "").replace("pickles", "")


def test_load_benchmark(exports):
    t = load_benchmark(exports["fp32"] / "model.safetensors", repeats=2, device="cpu")
    assert t["bytes"] > 0 and t["safetensors_mmap_s"] > 0 and t["torch_load_s"] > 0
    assert t["speedup_mmap_vs_torch_load"] > 0


def test_generate_from_tiny_export(exports):
    a = generate(exports["nf4"], "The prime minister", max_new_tokens=8, temperature=0.8, top_k=20, seed=3)
    b = generate(exports["nf4"], "The prime minister", max_new_tokens=8, temperature=0.8, top_k=20, seed=3)
    assert a.text == b.text and a.variant == "nf4" and 0 < a.new_tokens <= 8
    greedy = generate(exports["fp32"], "", max_new_tokens=5, temperature=0)
    assert greedy.prompt_tokens == 1  # an empty prompt starts a new document after [EOS]
    with pytest.raises(ConfigError, match="temperature"):
        generate(exports["fp32"], "x", temperature=-1)


def test_generate_command_line(exports, capsys):
    """The entry point a user runs without Dagster: in-process for the error path, as a real
    subprocess (`python -m components.core generate`) for the output."""
    from components.core.__main__ import generate_main, main

    assert main(["generate", "--model", str(exports["fp16"].parent / "missing")]) == 2
    assert "no such export folder" in capsys.readouterr().err
    assert (
        generate_main(["--model", str(exports["int8"]), "--prompt", "The", "--max-new-tokens", "4", "--seed", "1"]) == 0
    )
    assert capsys.readouterr().out.startswith("The")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.core",
            "generate",
            "--model",
            str(exports["fp32"]),
            "--prompt",
            "The government",
            "--max-new-tokens",
            "6",
            "--temperature",
            "0",
            "--stats",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The government") and "[fp32]" in proc.stderr


def test_generation_is_bounded_and_says_when_the_prompt_is_cut(exports, capsys):
    """max_new_tokens over the stated maximum is refused before anything is generated (library and
    command line); a prompt longer than the model's context is cut to its last tokens, and says so."""
    from components.core.__main__ import generate_main

    cap = export_folder.MAX_NEW_TOKENS
    with pytest.raises(ConfigError, match=rf"max_new_tokens=100000 is over the maximum of {cap}"):
        generate(exports["fp32"], "The", max_new_tokens=100_000)
    assert generate_main(["--model", str(exports["fp32"]), "--prompt", "The", "--max-new-tokens", "100000"]) == 2
    assert f"over the maximum of {cap}" in capsys.readouterr().err
    long_prompt = "The prime minister said that the government would act. " * 20
    out = generate(exports["fp32"], long_prompt, max_new_tokens=2, temperature=0)
    assert out.prompt_tokens == 32 and out.prompt_tokens_dropped > 0  # the tiny model's block_size
    assert generate_main(["--model", str(exports["fp32"]), "--prompt", long_prompt, "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert f"the prompt is {32 + out.prompt_tokens_dropped} tokens" in err and "only its last 32" in err
    short = generate(exports["fp32"], "The", max_new_tokens=2, temperature=0)
    assert short.prompt_tokens_dropped == 0


def test_the_command_line_states_the_bound_it_enforces():
    from components.core import __main__ as cli

    assert cli.MAX_NEW_TOKENS == export_folder.MAX_NEW_TOKENS


def test_export_weights_are_0644_like_their_neighbours(exports):
    modes = {oct(os.stat(f).st_mode & 0o777) for f in exports["fp32"].iterdir() if f.is_file()}
    assert modes == {"0o644"}, modes
