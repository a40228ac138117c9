"""Corpus ingestion: read documents from a Wikipedia dump, local files or a Hugging Face dataset,
clean them to plain text, split them by document and save an Arrow dataset.

The default corpus ships inside a dependency: the English Wikipedia sample dump in gensim's test
data (about 200 pages, of which about 100 are articles), so a machine with no network runs it.
"""

from __future__ import annotations

import bz2
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import PipelineInputError

WIKI_SAMPLE_NAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")


class CorpusSettings(BaseModel):
    """Where the documents come from and how they are split."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["wiki_sample", "wiki_dump", "files", "hf"] = Field(
        "wiki_sample",
        description="wiki_sample: the Wikipedia sample dump in gensim's test data; wiki_dump: a "
        "MediaWiki XML dump (.xml or .xml.bz2) at `path`; files: .txt/.jsonl/.parquet file or a "
        "directory of them at `path`; hf: a Hugging Face dataset (`hf_dataset`, needs network).",
    )
    path: Optional[str] = Field(None, description="File or directory for source wiki_dump/files.")
    text_column: str = Field("text", description="Column holding the text in .jsonl/.parquet/hf data.")
    txt_documents: Literal["file", "paragraph"] = Field(
        "paragraph", description="A .txt file is one document ('file') or one per blank-line-separated block."
    )
    hf_dataset: Optional[str] = Field(None, description="Hugging Face dataset id (source hf).")
    hf_config: Optional[str] = Field(None, description="Hugging Face dataset config name.")
    hf_split: str = Field("train", description="Hugging Face split to read.")
    max_documents: Optional[int] = Field(None, description="Keep at most this many documents (None: all).")
    min_chars: int = Field(1, description="Drop documents shorter than this many characters after cleaning.")
    validation_fraction: float = Field(0.1, description="Share of documents held out for validation.")
    seed: int = Field(0, description="Seed of the document-level train/validation split.")

    @model_validator(mode="after")
    def _check(self) -> "CorpusSettings":
        if self.source in ("wiki_dump", "files") and not self.path:
            raise ValueError(f"corpus.path is required when corpus.source is '{self.source}'")
        if self.source == "hf" and not self.hf_dataset:
            raise ValueError("corpus.hf_dataset is required when corpus.source is 'hf'")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"corpus.validation_fraction must be in (0, 1), got {self.validation_fraction}")
        if self.max_documents is not None and self.max_documents < 2:
            raise ValueError("corpus.max_documents must be at least 2 (one train and one validation document)")
        return self


def default_wiki_dump() -> Path:
    """The Wikipedia sample dump shipped in gensim's test data."""
    from gensim.test.utils import datapath

    return Path(datapath(WIKI_SAMPLE_NAME))


# --- MediaWiki markup → plain text -------------------------------------------------------------

_REF = re.compile(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>", re.S | re.I)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_BLANKS = re.compile(r"\n{3,}")
_SPACES = re.compile(r"[ \t]{2,}")
_QUOTES = re.compile(r"'{2,}")  # bold/italic marks left by ill-formed markup


def wiki_to_text(markup: str) -> str:
    """Strip MediaWiki markup: templates and tables go, links become their text, refs are dropped."""
    import mwparserfromhell

    # strip_code keeps the text inside <ref> tags (citations), so remove those first.
    markup = _COMMENT.sub("", _REF.sub("", markup))
    text = mwparserfromhell.parse(markup).strip_code(normalize=True, collapse=True)
    lines = []
    for line in text.splitlines():
        line = _SPACES.sub(" ", _QUOTES.sub("", line)).strip()
        # Leftovers of image/category links and table/section debris carry no prose.
        if line.startswith(("thumb|", "Category:", "File:", "Image:", "[[", "|", "!")):
            continue
        lines.append(line)
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip()


def iter_wiki_articles(path: str | Path) -> Iterator[dict[str, str]]:
    """Main-namespace articles of a MediaWiki XML dump (.xml or .xml.bz2), redirects dropped.

    Yields dicts with `doc_id`, `title` and plain `text`. A truncated or corrupted dump raises
    PipelineInputError naming the file.
    """
    from gensim.corpora.wikicorpus import extract_pages

    path = Path(path)
    if not path.exists():
        raise PipelineInputError(f"Wikipedia dump not found: {path} (set corpus.path to an existing .xml or .xml.bz2 file)")
    opener = bz2.open if path.suffix == ".bz2" else open
    try:
        with opener(path, "rb") as fh:
            for title, markup, pageid in extract_pages(fh, filter_namespaces=("0",)):
                if not markup or markup.lstrip()[:9].lower() == "#redirect":
                    continue
                yield {"doc_id": f"wiki:{pageid}", "title": title, "text": wiki_to_text(markup)}
    except (EOFError, OSError, ValueError) as e:  # bz2 raises EOFError/OSError, expat raises ValueError subclasses
        raise PipelineInputError(
            f"{path}: the dump is truncated or corrupted ({type(e).__name__}: {e}); re-download or point corpus.path at a complete dump"
        ) from e
    except Exception as e:  # xml.etree.ElementTree.ParseError
        if type(e).__name__ == "ParseError":
            raise PipelineInputError(f"{path}: the dump is not well-formed XML ({e}); it may be truncated") from e
        raise


# --- local files --------------------------------------------------------------------------------


def _read_utf8(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PipelineInputError(
            f"{path}: not valid UTF-8 at byte offset {e.start} (byte 0x{data[e.start]:02x}); convert the file to UTF-8"
        ) from e


def _iter_txt(path: Path, mode: str) -> Iterator[dict[str, str]]:
    text = _read_utf8(path)
    if mode == "file":
        yield {"doc_id": f"{path.name}", "title": path.stem, "text": text.strip()}
        return
    for i, block in enumerate(re.split(r"\n\s*\n", text)):
        if block.strip():
            yield {"doc_id": f"{path.name}:{i}", "title": path.stem, "text": block.strip()}


def _iter_jsonl(path: Path, column: str) -> Iterator[dict[str, str]]:
    text = _read_utf8(path)
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PipelineInputError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(row, dict) or column not in row:
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise PipelineInputError(
                f"{path}:{lineno}: no column '{column}' (found {keys}); set corpus.text_column to the text field"
            )
        if not isinstance(row[column], str):
            raise PipelineInputError(f"{path}:{lineno}: column '{column}' is {type(row[column]).__name__}, not text")
        yield {"doc_id": f"{path.name}:{lineno}", "title": str(row.get("title", path.stem)), "text": row[column]}


def _iter_parquet(path: Path, column: str, cache_dir: Optional[Path]) -> Iterator[dict[str, str]]:
    import datasets

    try:
        ds = datasets.Dataset.from_parquet(str(path), cache_dir=str(cache_dir) if cache_dir else None)
    except Exception as e:
        raise PipelineInputError(f"{path}: cannot read as Parquet ({type(e).__name__}: {e})") from e
    if column not in ds.column_names:
        raise PipelineInputError(
            f"{path}: no column '{column}' (found {ds.column_names}); set corpus.text_column to the text column"
        )
    for i, value in enumerate(ds[column]):
        yield {"doc_id": f"{path.name}:{i}", "title": path.stem, "text": value or ""}


def iter_local_files(path: str | Path, settings: CorpusSettings, cache_dir: Optional[Path] = None) -> Iterator[dict[str, str]]:
    path = Path(path)
    if not path.exists():
        raise PipelineInputError(f"corpus.path does not exist: {path}")
    files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES) if path.is_dir() else [path]
    if not files:
        raise PipelineInputError(f"{path}: no {', '.join(TEXT_SUFFIXES)} files in this directory")
    for f in files:
        if f.suffix == ".txt":
            yield from _iter_txt(f, settings.txt_documents)
        elif f.suffix == ".jsonl":
            yield from _iter_jsonl(f, settings.text_column)
        elif f.suffix == ".parquet":
            yield from _iter_parquet(f, settings.text_column, cache_dir)
        else:
            raise PipelineInputError(f"{f}: unsupported file type '{f.suffix}' (use {', '.join(TEXT_SUFFIXES)})")


def iter_hf_dataset(settings: CorpusSettings) -> Iterator[dict[str, str]]:
    """A Hugging Face dataset (needs network or a local HF cache)."""
    import datasets

    ds = datasets.load_dataset(settings.hf_dataset, settings.hf_config, split=settings.hf_split)
    if settings.text_column not in ds.column_names:
        raise PipelineInputError(
            f"{settings.hf_dataset}: no column '{settings.text_column}' (found {ds.column_names}); set corpus.text_column"
        )
    for i, row in enumerate(ds):
        yield {"doc_id": f"{settings.hf_dataset}:{i}", "title": str(row.get("title", "")), "text": row[settings.text_column] or ""}


def iter_documents(settings: CorpusSettings, cache_dir: Optional[Path] = None) -> Iterator[dict[str, str]]:
    if settings.source == "wiki_sample":
        return iter_wiki_articles(default_wiki_dump())
    if settings.source == "wiki_dump":
        return iter_wiki_articles(settings.path)
    if settings.source == "files":
        return iter_local_files(settings.path, settings, cache_dir)
    return iter_hf_dataset(settings)


# --- build, split, save -------------------------------------------------------------------------


@dataclass
class CorpusResult:
    path: Path
    stats: dict[str, Any]
    samples: list[str] = field(default_factory=list)


def corpus_stats(texts: list[str]) -> dict[str, Any]:
    chars = sum(len(t) for t in texts)
    non_ascii = sum(sum(1 for c in t if ord(c) > 127) for t in texts)
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return {
        "documents": len(texts),
        "characters": chars,
        "words": sum(len(t.split()) for t in texts),
        "bytes": sum(len(t.encode("utf-8")) for t in texts),
        "non_ascii_share": non_ascii / max(chars, 1),
        "content_sha256": h.hexdigest(),
    }


def split_documents(n: int, validation_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic document-level split: indices of train and validation documents."""
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(max(1, int(round(n * validation_fraction))), n - 1)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def build_corpus(settings: CorpusSettings, out_dir: str | Path, cache_dir: Optional[Path] = None) -> CorpusResult:
    """Read, clean and split the documents; save a `datasets.DatasetDict` (train/validation) to `out_dir`."""
    import datasets

    datasets.disable_progress_bars()
    docs = []
    for doc in iter_documents(settings, cache_dir):
        if len(doc["text"]) >= max(settings.min_chars, 1):
            docs.append(doc)
            if settings.max_documents and len(docs) >= settings.max_documents:
                break
    where = settings.path or settings.hf_dataset or str(default_wiki_dump())
    if not docs:
        raise PipelineInputError(f"the corpus at {where} is empty (no document with text left after cleaning)")
    if len(docs) < 2:
        raise PipelineInputError(
            f"the corpus at {where} has only one document; a train/validation split by document needs two or more "
            "(for .txt files set corpus.txt_documents to 'paragraph')"
        )
    train_idx, val_idx = split_documents(len(docs), settings.validation_fraction, settings.seed)
    columns = ("doc_id", "title", "text")
    dd = datasets.DatasetDict(
        {
            name: datasets.Dataset.from_dict({c: [docs[i][c] for i in idx] for c in columns})
            for name, idx in (("train", train_idx), ("validation", val_idx))
        }
    )
    out_dir = Path(out_dir)
    dd.save_to_disk(str(out_dir))
    stats = corpus_stats([d["text"] for d in docs])
    stats.update({"train_documents": len(train_idx), "validation_documents": len(val_idx)})
    stats["train_characters"] = sum(len(docs[i]["text"]) for i in train_idx)
    stats["validation_characters"] = sum(len(docs[i]["text"]) for i in val_idx)
    samples = [line for d in docs[:20] for line in d["text"].splitlines() if len(line) > 40][:5]
    return CorpusResult(path=out_dir, stats=stats, samples=[s[:200] for s in samples])


def load_corpus(path: str | Path):
    """The saved `datasets.DatasetDict` with `train` and `validation` splits."""
    import datasets

    path = Path(path)
    if not path.exists():
        raise PipelineInputError(f"corpus folder not found: {path} (materialize `corpus` first)")
    return datasets.load_from_disk(str(path))
