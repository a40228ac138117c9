"""What each precision costs on the default-sized models: bytes, perplexity, logits, generation speed,
and safetensors vs torch.load — through the same core code the `quantized_models`, `model_export`
and `weights_arithmetic` assets call.

Builds the default pipeline's inputs with the core functions (the Wikipedia sample corpus, the
default byte-level BPE tokenizer, 256-token labels), trains the Transformer and the LSTM exactly as
`pipelines/defs/transformer_lm/defs.yaml` and `lstm_lm/defs.yaml` declare them (≈1 M parameters,
300 steps), then runs `quantize_and_measure` (default `QuantizationSettings`, more timing repeats),
times loading each variant's weights (safetensors memory-mapped / load_file vs torch.load of the
same state dict, weights_only=True) and accounts for every byte of the files (`weights_arithmetic`).
Prints one JSON object (and writes it with --out).

    python benchmarks/quantization_bench.py --out benchmarks/results/quantization_cpu.json
    python benchmarks/quantization_bench.py --steps 50 --workdir /tmp/qb      # quicker; reuses /tmp/qb
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.core.corpus import CorpusSettings, build_corpus, load_corpus  # noqa: E402
from components.core.export.bnb_layers import bnb  # noqa: E402
from components.core.export.generation import load_benchmark  # noqa: E402
from components.core.labels import LabelSettings, build_labels, load_labels  # noqa: E402
from components.core.lm import SamplingSettings, load_lm, train_lm  # noqa: E402
from components.core.studies.quant_export import weights_arithmetic  # noqa: E402
from components.core.studies.quant_settings import QuantizationSettings  # noqa: E402
from components.core.studies.quantization import check_figures, quantize_and_measure  # noqa: E402
from components.core.tokenizer import TokenizerSettings, train_tokenizer  # noqa: E402
from components.core.train_settings import TrainSettings  # noqa: E402

MODELS = {"transformer_lm": "transformer", "lstm_lm": "recurrent"}


def defs_yaml(name: str) -> dict:
    return yaml.safe_load((ROOT / "pipelines/defs" / name / "defs.yaml").read_text())["attributes"]


def build_inputs(work: Path) -> tuple[Path, dict]:
    """Corpus → tokenizer → labels with the default settings (cached in `work`)."""
    labels_dir = work / "labels"
    if (labels_dir / "meta.json").exists():
        return labels_dir, json.loads((labels_dir / "meta.json").read_text())
    corpus = build_corpus(CorpusSettings(), work / "dataset", cache_dir=work / "cache")
    dd = load_corpus(work / "dataset")
    tok = train_tokenizer(dd["train"]["text"], TokenizerSettings())
    tok.save(str(work / "tokenizer.json"))
    labels_yaml = yaml.safe_load((ROOT / "configs/default.yaml").read_text())["ops"]["labels"]["config"]
    result = build_labels(
        {s: dd[s]["text"] for s in ("train", "validation")},
        work / "tokenizer.json",
        LabelSettings(**labels_yaml),
        labels_dir,
    )
    (work / "corpus.json").write_text(json.dumps(corpus.stats, default=str))
    return labels_dir, result.meta


def train_models(work: Path, labels_dir: Path, steps: int | None) -> dict[str, dict]:
    train, val, meta = load_labels(labels_dir)
    out = {}
    for name, family in MODELS.items():
        spec = defs_yaml(name)
        ts = {**spec["training"], "device": "cpu"}
        if steps:
            ts["max_steps"] = steps
        weights = work / name / "checkpoint" / "model.safetensors"
        t0 = time.perf_counter()
        if (
            not weights.exists()
            or json.loads((work / name / "done.json").read_text()).get("max_steps") != ts["max_steps"]
        ):
            res = train_lm(
                family,
                spec["architecture"],
                TrainSettings(**ts),
                train,
                val,
                int(meta["vocab_size"]),
                work / name,
                sampling=SamplingSettings(num_samples=0),
                model_meta={"tokenizer_sha256": meta["tokenizer_sha256"]},
                resume=False,
            )
            weights = res.weights_path
            (work / name / "done.json").write_text(json.dumps({"max_steps": ts["max_steps"], "metrics": res.metrics}))
        out[name] = {
            "weights": weights,
            "train": ts,
            "train_wall_s": time.perf_counter() - t0,
            "train_metrics": json.loads((work / name / "done.json").read_text())["metrics"],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the JSON here too")
    ap.add_argument(
        "--workdir", type=Path, help="keep corpus, labels and trained weights here (reused on the next run)"
    )
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: defs.yaml's)")
    ap.add_argument("--repeats", type=int, default=5, help="timed generations per variant")
    ap.add_argument("--load-repeats", type=int, default=20, help="timed loads per file")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads when > 0")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="quant-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    labels_dir, meta = build_inputs(work)
    trained = train_models(work, labels_dir, args.steps)
    _, val, _ = load_labels(labels_dir)
    models = {name: load_lm(t["weights"]) for name, t in trained.items()}

    settings = QuantizationSettings(repeats=args.repeats, device="cpu")
    t1 = time.perf_counter()
    result = quantize_and_measure(
        models, val, settings, out_dir=work / "variants", log=lambda m: print(m, file=sys.stderr)
    )
    study_s = time.perf_counter() - t1

    loads = {
        name: {v: load_benchmark(p, repeats=args.load_repeats, device="cpu") for v, p in by.items()}
        for name, by in result.weights.items()
    }
    params = {r["model"]: r["params"] for r in result.rows if r["variant"] == "fp32"}
    arith = weights_arithmetic({name: dict(by) for name, by in result.weights.items()}, params)

    keep = (
        "model",
        "variant",
        "scheme",
        "params",
        "quantized_params",
        "memory_bytes",
        "disk_bytes",
        "memory_vs_fp32",
        "disk_vs_fp32",
        "layer_ratio_vs_fp16",
        "layer_ratio_vs_fp16_all",
        "bits_per_quantized_param",
        "val_loss",
        "val_ppl",
        "dppl_pct",
        "logits_max_abs_diff",
        "eval_tokens_per_s",
        "gen_tokens_per_s",
        "cache",
        "greedy_match",
        "quantized",
        "kept_float",
    )
    report = {
        "benchmark": "quantization_bench",
        "what": "default-sized Transformer and LSTM (defs.yaml, ~1 M parameters) at FP32/FP16/BF16 and bitsandbytes "
        "INT8/NF4/FP4 on the CPU",
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "bitsandbytes": bnb().__version__,
            "platform": platform.platform(),
            "processor": platform.processor(),
            "threads": torch.get_num_threads(),
        },
        "data": {
            "tokenizer_vocab": int(meta["vocab_size"]),
            "block_size": int(meta["block_size"]),
            "validation_tokens": int(meta["validation_tokens"]),
        },
        "settings": settings.model_dump(),
        "models": {
            name: {
                "train": t["train"],
                "train_wall_s": t["train_wall_s"],
                "val_loss_after_training": t["train_metrics"].get("val/loss"),
                "config": models[name].config.model_dump(),
            }
            for name, t in trained.items()
        },
        "rows": [{k: r[k] for k in keep} for r in result.rows],
        "checks_transformer": check_figures(result.rows, "transformer_lm"),
        "load_times_s": loads,
        "file_accounting": arith.measured_rows,
        "reference_sizes": arith.reference_rows,
        "study_wall_s": study_s,
        "total_wall_s": time.perf_counter() - t0,
        "notes": [
            "memory_bytes: the weights in memory, each storage once, quantization scales and code books included; "
            "disk_bytes: the variant's .safetensors file.",
            "layer_ratio_vs_fp16: codes + scales of the quantized layers over the same layers in FP16 (the asset "
            "checks' figure); _all adds the fixed per-layer code books.",
            "Quantized variants keep the tied embedding/head, LayerNorms and biases in float32; the LSTM's matrices "
            "are rewritten as Linear layers and quantized.",
            "On a CPU bitsandbytes' 8/4-bit layers save memory, not time: they dequantize (4-bit) or quantize "
            "activations (LLM.int8) on every call.",
            "Generation: greedy, batch 1, gen_tokens new tokens after a prompt from the validation split, median of "
            "repeats; the Transformer generates through its KV cache, the LSTM carries its recurrent state (cache "
            "column).",
        ],
    }
    text = json.dumps(report, indent=2, default=float)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
