"""Peak memory and throughput of the ingest stage (corpus → tokenizer → labels) as the corpus grows.

The default corpus (the articles of the Wikipedia sample dump) is written out as a .jsonl file, one
article per line, repeated 1×, 10× and 50×, plus a single-line variant: the 10× text as one line
(and the 1× text as a second line, so that a train/validation split by document exists). Each
variant runs in a fresh Python process through the same core calls as the `corpus`, `tokenizer`
and `labels` assets, with the default settings. Peak resident memory (VmHWM) is read per stage,
the peak being reset before each stage through /proc/self/clear_refs; memory-mapped Arrow and .npy
files count as they are paged in.

    .venv/bin/python benchmarks/ingest_memory.py --out benchmarks/results/ingest_memory_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPEATS = (1, 10, 50)


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def run_variant(input_path: Path, work: Path) -> dict:
    """The ingest stage on one input file, as the assets call it; runs inside the child process."""
    from components.core.corpus import CorpusSettings, build_corpus, load_corpus
    from components.core.labels import LabelSettings, build_labels
    from components.core.tokenizer import TokenizerSettings, evaluate_tokenizer, train_tokenizer

    stages: dict[str, dict] = {}

    def measure(name: str, fn):
        reset_peak()
        t0 = time.perf_counter()
        out = fn()
        stages[name] = {"seconds": round(time.perf_counter() - t0, 2), "peak_rss_mb": round(peak_rss_mb(), 1)}
        return out

    corpus = measure(
        "corpus", lambda: build_corpus(CorpusSettings(source="files", path=str(input_path)), work / "corpus", cache_dir=work / "cache")
    )
    dd = load_corpus(corpus.path)
    settings = TokenizerSettings()

    def tokenizer():
        tok = train_tokenizer(dd["train"]["text"], settings)
        tok.save(str(work / "tokenizer.json"))
        return evaluate_tokenizer(tok, dd["validation"]["text"])

    report = measure("tokenizer", tokenizer)
    labels = measure(
        "labels",
        lambda: build_labels({s: dd[s]["text"] for s in ("train", "validation")}, work / "tokenizer.json", LabelSettings(), work / "labels"),
    )
    return {
        "stages": stages,
        "documents": corpus.stats["documents"],
        "tokens": labels.meta["train_tokens"] + labels.meta["validation_tokens"],
        "bytes_per_token": round(report.bytes_per_token, 3),
    }


def write_inputs(folder: Path) -> dict[str, Path]:
    from components.core.corpus import default_wiki_dump, iter_wiki_articles

    texts = [d["text"] for d in iter_wiki_articles(default_wiki_dump())]
    lines = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    paths = {}
    for n in REPEATS:
        paths[f"{n}x"] = folder / f"wiki_{n}x.jsonl"
        paths[f"{n}x"].write_text(lines * n, encoding="utf-8")
    one_line = " ".join(" ".join(t.split()) for t in texts)
    paths["10x_single_line"] = folder / "wiki_10x_single_line.txt"
    paths["10x_single_line"].write_text(" ".join([one_line] * 10) + "\n\n" + one_line + "\n", encoding="utf-8")
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the JSON here (default: print only)")
    ap.add_argument("--variants", nargs="*", help="run only these (1x 10x 50x 10x_single_line)")
    ap.add_argument("--child", nargs=2, metavar=("INPUT", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_variant(Path(args.child[0]), Path(args.child[1]))))
        return

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = write_inputs(Path(tmp))
        for name, path in inputs.items():
            if args.variants and name not in args.variants:
                continue
            work = Path(tmp) / f"work_{name}"
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(path), str(work)], cwd=ROOT, capture_output=True, text=True
            )
            seconds = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            mb = path.stat().st_size / 1e6
            work_seconds = sum(s["seconds"] for s in r["stages"].values())
            results[name] = {
                "input_mb": round(mb, 1),
                **r,
                "peak_rss_mb": max(s["peak_rss_mb"] for s in r["stages"].values()),
                "seconds": round(work_seconds, 1),
                "process_seconds": round(seconds, 1),
                "mb_per_s": round(mb / work_seconds, 2),
            }
            print(name, json.dumps(results[name]), flush=True)
    report = {
        "benchmark": "ingest_memory",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": "CorpusSettings(source='files'), TokenizerSettings() (byte-level BPE, 2048), LabelSettings() (block 256)",
        "results": results,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
