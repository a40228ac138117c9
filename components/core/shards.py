"""A corpus given as many files or dump shards, ingested one shard at a time.

A shard is one file of a folder: `.txt`, `.jsonl`, `.parquet` (read as `corpus.source: files`
reads them) or a MediaWiki XML dump, `.xml` or `.bz2` (as `corpus.source: wiki_dump`). Each shard
has a key derived from its path inside the folder (`shard_key`: characters other than letters,
digits, `.`, `_`, `-` become `_`); shards are ordered by key, so name them with zero-padded numbers.
Hidden files (a leading `.`) and other file types are not shards: write a shard under a hidden or
other name and rename it when complete, so that nobody reads half a file.

Per shard, the default route's core functions run unchanged on that shard alone:
`build_corpus` (read, clean, split its documents into train/validation, Arrow) and `build_labels`
(tokenize, pack next-token blocks, `.npy`). So memory is bounded by the largest shard (the readers
and writers stream within it), not by the corpus. The tokenizer is trained once, on the train split
of a bounded sample of shards (`train_shard_tokenizer`: the first N by key).

`combine_label_shards` lists every shard's token files in one `meta.json` (nothing is copied);
`labels.load_labels` on that folder returns one memory-mapped view over all of them
(`data.ShardedBlocks`).

What the sharded route guarantees against the default route: a shard's blocks are exactly what
`build_labels` (= `pack_blocks(token_stream(...))`) makes of that shard's documents alone. Seen
through the view, in key order, the real (input, target) pairs are those of the default route's one
stream over the same documents in the same order, minus the pairs that would cross from one shard
into the next (one per shard boundary and split: a shard's last [EOS] predicts nothing); each shard
ends with its own padded tail block (fewer than `block_size` padded positions).
"""

from __future__ import annotations

import bz2
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

from pydantic import BaseModel, ConfigDict, create_model

from .artifacts import read_json, write_json
from .corpus import CorpusResult, CorpusSettings, build_corpus, check_path, iter_texts, load_corpus
from .errors import PipelineInputError
from .labels import SPLITS, LabelSettings, LabelsResult, build_labels
from .tokenizer import TokenizerReport, TokenizerSettings, evaluate_tokenizer, train_tokenizer

TEXT_SHARD_SUFFIXES = (".txt", ".jsonl", ".parquet")
DUMP_SHARD_SUFFIXES = (".xml", ".bz2")
SHARD_SUFFIXES = TEXT_SHARD_SUFFIXES + DUMP_SHARD_SUFFIXES
SHARDED_FORMAT = "sharded-labels-v1"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_DOTS = re.compile(r"\.{3,}")  # Dagster refuses "..." in a partition key

# How a shard's documents are read and split: the fields of the corpus settings that apply to a
# single file (the source and path come from the shard itself).
_READ_FIELDS = ("text_column", "txt_documents", "min_chars", "validation_fraction", "seed")
# (annotation, FieldInfo) per field; typed Any because create_model's keyword parameters cannot be told apart from
# field definitions in a ** expansion
_READ_FIELD_DEFINITIONS: dict[str, Any] = {
    k: (CorpusSettings.model_fields[k].annotation, CorpusSettings.model_fields[k]) for k in _READ_FIELDS
}
ShardReadSettings = create_model(
    "ShardReadSettings",
    __config__=ConfigDict(extra="forbid"),
    __doc__="How each shard's documents are read and split into train/validation (as in `corpus`).",
    **_READ_FIELD_DEFINITIONS,
)


def shard_key(relative: str | Path) -> str:
    """The partition key of the shard at `relative` (its path inside the shard folder)."""
    key = _DOTS.sub("..", _UNSAFE.sub("_", Path(relative).as_posix()))
    if not key or key in (".", ".."):
        raise PipelineInputError(f"{relative}: cannot derive a shard key from this name")
    return key


def list_shards(folder: str | Path) -> dict[str, Path]:
    """key → path of every shard in `folder` (searched recursively), sorted by key.

    Two files whose names map to one key are an error naming both."""
    folder = Path(folder)
    check_path(folder)
    if not folder.is_dir():
        raise PipelineInputError(f"{folder}: the shard folder is a file; point it at a directory of shards")
    found: dict[str, Path] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or p.suffix not in SHARD_SUFFIXES or p.is_dir():
            continue
        key = shard_key(rel)
        if key in found:
            raise PipelineInputError(f"{found[key]} and {p} map to the same shard key '{key}'; rename one of them")
        found[key] = p
    return dict(sorted(found.items()))


def shard_corpus_settings(path: str | Path, read: BaseModel) -> CorpusSettings:
    """The corpus settings that read the one shard at `path`."""
    path = Path(path)
    source = "wiki_dump" if path.suffix in DUMP_SHARD_SUFFIXES else "files"
    return CorpusSettings(source=source, path=str(path), **read.model_dump())


def build_corpus_shard(
    path: str | Path, read: BaseModel, out_dir: str | Path, cache_dir: Path | None = None
) -> CorpusResult:
    """`build_corpus` on one shard: its documents cleaned and split into train/validation (Arrow).
    A corrupt shard raises PipelineInputError naming the file (and line or offset)."""
    path = Path(path)
    if path.suffix not in SHARD_SUFFIXES:
        raise PipelineInputError(f"{path}: not a shard (use {', '.join(SHARD_SUFFIXES)})")
    return build_corpus(shard_corpus_settings(path, read), out_dir, cache_dir=cache_dir)


def build_label_shard(
    corpus_path: str | Path, tokenizer_path: str | Path, settings: LabelSettings, out_dir: str | Path
) -> LabelsResult:
    """`build_labels` on one shard's documents. A split shorter than one block is allowed here (it
    makes one padded block): what must hold at least one block is the whole corpus, not a shard."""
    dd = load_corpus(corpus_path)
    return build_labels({s: dd[s]["text"] for s in SPLITS}, tokenizer_path, settings, out_dir, require_full_block=False)


def train_shard_tokenizer(
    shards: Mapping[str, Path], read: BaseModel, settings: TokenizerSettings, scratch: str | Path
) -> tuple[Any, TokenizerReport, dict[str, Any]]:
    """Train a tokenizer on the train split of `shards` (the bounded sample; each read and split as
    `build_corpus_shard` does, in a temporary folder under `scratch`) and evaluate it on their
    validation split. Returns (tokenizer, report, what it was trained on)."""
    if not shards:
        raise PipelineInputError("no shards to train the tokenizer on: put shard files in the shard folder first")
    with tempfile.TemporaryDirectory(dir=scratch, prefix="shard-tokenizer-") as tmp:
        folders, stats = [], {"shards": list(shards), "documents": 0, "train_characters": 0}
        for i, (_key, path) in enumerate(shards.items()):
            result = build_corpus_shard(path, read, Path(tmp) / f"{i:06d}", cache_dir=Path(tmp) / "cache")
            folders.append(result.path)
            stats["documents"] += result.stats["documents"]
            stats["train_characters"] += result.stats["train_characters"]

        def texts(split: str) -> Iterator[str]:
            for folder in folders:
                yield from iter_texts(load_corpus(folder)[split]["text"])

        tok = train_tokenizer(texts("train"), settings)
        report = evaluate_tokenizer(tok, texts("validation"), requested_vocab_size=settings.vocab_size)
    return tok, report, stats


# --- one view over every shard's token files -------------------------------------------------------

_SAME = ("block_size", "vocab_size", "tokenizer_sha256", "x_dtype", "pad_id", "eos_id", "ignore_index")


def combine_label_shards(shards: Mapping[str, str | Path], out_dir: str | Path) -> LabelsResult:
    """Write `out_dir/meta.json` naming every shard's token files (path and size; nothing is copied),
    in key order, with the totals. Every shard must come from the same tokenizer and block size."""
    if not shards:
        raise PipelineInputError("no label shards to combine: materialize some partitions of the shard assets first")
    first: dict[str, Any] | None = None
    entries = []
    totals = {f"{s}_{k}": 0 for s in SPLITS for k in ("tokens", "targets", "blocks")}
    for key in sorted(shards):
        folder = Path(shards[key])
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            raise PipelineInputError(f"label shard '{key}': {meta_path} is missing; re-materialize that partition")
        meta: dict[str, Any] = read_json(meta_path)
        if first is None:
            first = meta
        differs = [k for k in _SAME if meta.get(k) != first.get(k)]
        if differs:
            raise PipelineInputError(
                f"label shard '{key}' ({folder}) differs from shard '{entries[0]['key']}' in {differs} "
                f"({[meta.get(k) for k in differs]} vs {[first.get(k) for k in differs]}): rebuild the shards with one "
                f"tokenizer and block size"
            )
        files = {}
        for split in SPLITS:
            for xy in ("x", "y"):
                p = folder / f"{split}_{xy}.npy"
                if not p.is_file():
                    raise PipelineInputError(
                        f"label shard '{key}': token file {p} is missing; re-materialize that partition"
                    )
                files[f"{split}_{xy}"] = {"path": str(p.resolve()), "bytes": p.stat().st_size}
        entry = {"key": key, "files": files, **{k: meta[k] for k in totals}}
        for k in totals:
            totals[k] += int(meta[k])
        entries.append(entry)
    assert first is not None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    combined = {
        "format": SHARDED_FORMAT,
        **{k: first[k] for k in _SAME},
        **totals,
        "n_shards": len(entries),
        "shards": entries,
    }
    write_json(out_dir / "meta.json", combined)
    return LabelsResult(path=out_dir, meta=combined)


# --- splitting a dump into shards ----------------------------------------------------------------


def _dump_lines(path: Path) -> Iterator[str]:
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        yield from fh


def split_wiki_dump(path: str | Path, out_dir: str | Path, n_shards: int, prefix: str = "shard") -> list[Path]:
    """Split a MediaWiki XML dump into `n_shards` smaller, complete dumps
    `out_dir/<prefix>-00000.xml.bz2`, … of whole consecutive pages (about equal bytes each; the
    header repeated in each), as a dump's own multistream parts are. Streams: two passes, one page
    in memory. Each file appears complete (written under a hidden name, then renamed)."""
    path, out_dir = Path(path), Path(out_dir)
    if n_shards < 1:
        raise ValueError("n_shards must be at least 1")
    sizes: list[int] = []  # pass 1: the size of every page
    for line in _dump_lines(path):
        if line.lstrip().startswith("<page>"):
            sizes.append(0)
        if sizes:
            sizes[-1] += len(line)
    if len(sizes) < n_shards:
        raise PipelineInputError(f"{path}: {len(sizes)} pages cannot make {n_shards} shards")
    total, before, owner = sum(sizes), 0, []
    for s in sizes:  # a page goes to the shard its middle falls in
        owner.append(min(n_shards - 1, int((before + s / 2) / total * n_shards)))
        before += s
    out_dir.mkdir(parents=True, exist_ok=True)
    header: list[str] = []
    paths = [out_dir / f"{prefix}-{i:05d}.xml.bz2" for i in range(n_shards)]
    current, page = -1, -1
    fh = None
    for line in _dump_lines(path):
        if line.lstrip().startswith("<page>"):
            page += 1
            if owner[page] != current:
                if fh is not None:
                    fh.write("</mediawiki>\n")
                    fh.close()
                    _publish(paths[current])
                current = owner[page]
                fh = bz2.open(_hidden(paths[current]), "wt", encoding="utf-8")
                fh.writelines(header)
        if page < 0:
            header.append(line)
        elif fh is not None and not line.lstrip().startswith("</mediawiki>"):
            fh.write(line)
    if fh is not None:
        fh.write("</mediawiki>\n")
        fh.close()
        _publish(paths[current])
    return [p for p in paths if p.exists()]


def _hidden(p: Path) -> Path:
    return p.with_name(f".{p.name}.partial")


def _publish(p: Path) -> None:
    _hidden(p).replace(p)
