"""Corpus ingestion: read documents from a Wikipedia dump, local files or a Hugging Face dataset,
clean them to plain text, split them by document and save an Arrow dataset.

The default corpus ships inside a dependency: the English Wikipedia sample dump in gensim's test
data (about 200 pages, of which about 100 are articles), so a machine with no network runs it.
"""

from __future__ import annotations

import bz2
import hashlib
import json
import os
import re
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Literal, Mapping, Optional, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import ConfigError, PipelineInputError

if TYPE_CHECKING:
    import datasets

WIKI_SAMPLE_NAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")


class CorpusSettings(BaseModel):
    """Where the documents come from and how they are split."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["wiki_sample", "wiki_dump", "files", "hf"] = Field(
        default="wiki_sample",
        description="wiki_sample: the Wikipedia sample dump in gensim's test data; wiki_dump: a "
        "MediaWiki XML dump (.xml or .xml.bz2) at `path`; files: .txt/.jsonl/.parquet file or a "
        "directory of them at `path`; hf: a Hugging Face dataset (`hf_dataset`, needs network).",
    )
    path: Optional[str] = Field(default=None, description="File or directory for source wiki_dump/files.")
    text_column: str = Field(default="text", description="Column holding the text in .jsonl/.parquet/hf data.")
    txt_documents: Literal["file", "paragraph"] = Field(
        default="paragraph", description="A .txt file is one document ('file') or one per blank-line-separated block."
    )
    hf_dataset: Optional[str] = Field(default=None, description="Hugging Face dataset id (source hf).")
    hf_config: Optional[str] = Field(default=None, description="Hugging Face dataset config name.")
    hf_split: str = Field(default="train", description="Hugging Face split to read.")
    max_documents: Optional[int] = Field(
        default=None,
        ge=2,
        description="Keep at most this many documents (None: all); at least 2, one train and one validation document.",
    )
    min_chars: int = Field(
        default=1, ge=1, description="Drop documents shorter than this many characters after cleaning."
    )
    validation_fraction: float = Field(
        default=0.1, gt=0.0, lt=1.0, description="Share of documents held out for validation."
    )
    seed: int = Field(default=0, ge=0, description="Seed of the document-level train/validation split.")

    @model_validator(mode="after")
    def _check(self) -> "CorpusSettings":
        if self.source in ("wiki_dump", "files") and not self.path:
            raise ValueError(f"corpus.path is required when corpus.source is '{self.source}'")
        if self.source == "hf" and not self.hf_dataset:
            raise ValueError("corpus.hf_dataset is required when corpus.source is 'hf'")
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
    PipelineInputError naming the file and how far into it reading got.
    """
    from gensim.corpora.wikicorpus import extract_pages

    path = Path(path)
    check_path(path)
    with open(path, "rb") as raw:
        try:
            with bz2.BZ2File(raw) if path.suffix == ".bz2" else nullcontext(raw) as fh:
                for title, markup, pageid in extract_pages(fh, filter_namespaces=("0",)):  # pyright: ignore[reportArgumentType]
                    if not markup or markup.lstrip()[:9].lower() == "#redirect":
                        continue
                    yield {"doc_id": f"wiki:{pageid}", "title": title, "text": wiki_to_text(markup)}
        except (EOFError, OSError, ValueError) as e:  # bz2 raises EOFError/OSError, expat raises ValueError subclasses
            where = (
                f" (stopped after reading {raw.tell()} of its {path.stat().st_size} bytes)" if not raw.closed else ""
            )
            raise PipelineInputError(
                f"{path}: the dump is truncated or corrupted{where} ({type(e).__name__}: {e}); re-download or point "
                f"corpus.path at a complete dump"
            ) from e
        except Exception as e:  # xml.etree.ElementTree.ParseError
            if type(e).__name__ == "ParseError":
                raise PipelineInputError(f"{path}: the dump is not well-formed XML ({e}); it may be truncated") from e
            raise


# --- local files --------------------------------------------------------------------------------


@dataclass
class ReadReport:
    """What reading left out: files of an unsupported type in a directory and rows with a null text."""

    skipped_files: list[Path] = field(default_factory=list)
    null_rows: int = 0

    def warnings(self, column: str) -> list[str]:
        out = []
        if self.skipped_files:
            names = ", ".join(str(p) for p in self.skipped_files[:10]) + (", …" if len(self.skipped_files) > 10 else "")
            out.append(f"skipped {len(self.skipped_files)} file(s) that are not {'/'.join(TEXT_SUFFIXES)}: {names}")
        if self.null_rows:
            out.append(f"dropped {self.null_rows} row(s) whose '{column}' is null")
        return out


def check_path(path: Path) -> None:
    """Raise PipelineInputError when `path` cannot be read as named: missing, a dangling symlink, a
    symlink loop, or a directory named like a file (`data.txt/`)."""
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except FileNotFoundError as e:
            target = os.readlink(path)
            final = path.resolve(strict=False)
            also = "" if Path(path.parent, target) == final else f" (resolved: {final})"
            raise PipelineInputError(f"{path}: dangling symlink to {target}, which does not exist{also}") from e
        except (RuntimeError, OSError) as e:  # RuntimeError up to Python 3.12, OSError(ELOOP) from 3.13
            raise PipelineInputError(f"{path}: symlink loop ({e})") from e
    elif not path.exists():
        raise PipelineInputError(f"file or folder does not exist: {path}")
    if path.is_dir() and path.suffix in TEXT_SUFFIXES + (".xml", ".bz2"):
        raise PipelineInputError(f"{path}: a directory named like a {path.suffix} file; rename it or point at the file")


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line with its trailing newline) of a UTF-8 file, one line in memory at a time.
    A byte-order mark at the start is dropped and line ends are normalised to "\n" (CRLF, CR); a
    NUL byte is refused, naming where: a file holding one is binary, not text."""
    offset = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw, offset = raw[3:], 3
            nul = raw.find(b"\x00")
            if nul >= 0:
                raise PipelineInputError(
                    f"{path}: a NUL byte at byte offset {offset + nul} (line {lineno}): a binary file, "
                    "not text; remove it from the corpus or convert it to UTF-8 text"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PipelineInputError(
                    f"{path}: not valid UTF-8 at byte offset {offset + e.start} (line {lineno}, byte "
                    f"0x{raw[e.start]:02x}); "
                    "convert the file to UTF-8"
                ) from e
            offset += len(raw)
            yield lineno, line.replace("\r\n", "\n").replace("\r", "\n")


def _iter_txt(path: Path, mode: str) -> Iterator[dict[str, str]]:
    """One document per file, or per block of lines separated by blank (whitespace-only) lines."""
    if mode == "file":
        yield {
            "doc_id": f"{path.name}",
            "title": path.stem,
            "text": "".join(line for _, line in _iter_lines(path)).strip(),
        }
        return
    block: list[str] = []
    index = 0
    for _, line in _iter_lines(path):
        if line.strip():
            block.append(line.removesuffix("\n"))
            continue
        if block:
            yield {"doc_id": f"{path.name}:{index}", "title": path.stem, "text": "\n".join(block).strip()}
            index += 1
            block = []
    if block:
        yield {"doc_id": f"{path.name}:{index}", "title": path.stem, "text": "\n".join(block).strip()}


def _iter_jsonl(path: Path, column: str, report: ReadReport) -> Iterator[dict[str, str]]:
    for lineno, line in _iter_lines(path):
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
        value = row[column]
        if value is None:
            report.null_rows += 1
            continue
        if not isinstance(value, str):
            raise PipelineInputError(
                f"{path}:{lineno}: column '{column}' holds a JSON {type(value).__name__}, not a string; "
                "set corpus.text_column to the text field"
            )
        yield {"doc_id": f"{path.name}:{lineno}", "title": str(row.get("title", path.stem)), "text": value}


def _is_text_type(t) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t)


def _iter_parquet(path: Path, column: str, report: ReadReport) -> Iterator[dict[str, str]]:
    """The rows of a Parquet file, read a batch of rows at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise PipelineInputError(f"{path}: cannot read as Parquet ({type(e).__name__}: {e})") from e
    schema = pf.schema_arrow
    if column not in schema.names:
        raise PipelineInputError(
            f"{path}: no column '{column}' (found {schema.names}); set corpus.text_column to the text column"
        )
    found = schema.field(column).type
    if not _is_text_type(found):
        raise PipelineInputError(
            f"{path}: column '{column}' has type {found}, not string; set corpus.text_column to a text column"
        )
    i = 0
    try:
        for batch in pf.iter_batches(batch_size=256, columns=[column]):
            for value in batch.column(0).to_pylist():
                if value is None:
                    report.null_rows += 1
                else:
                    yield {"doc_id": f"{path.name}:{i}", "title": path.stem, "text": value}
                i += 1
    except pa.ArrowException as e:  # a corrupted page
        raise PipelineInputError(f"{path}: cannot read row {i} onward ({type(e).__name__}: {e})") from e


def list_files(path: Path, report: ReadReport) -> list[Path]:
    """The .txt/.jsonl/.parquet files at `path` (a file, or a directory searched recursively, in
    sorted order); other files of a directory are recorded in `report.skipped_files`."""
    check_path(path)
    if not path.is_dir():
        if path.suffix not in TEXT_SUFFIXES:
            raise PipelineInputError(f"{path}: unsupported file type '{path.suffix}' (use {', '.join(TEXT_SUFFIXES)})")
        return [path]
    files = []
    for p in sorted(path.rglob("*")):
        if p.suffix in TEXT_SUFFIXES:
            check_path(p)
            files.append(p)
        elif not p.is_dir():
            report.skipped_files.append(p)
    if not files:
        others = f" (found only {len(report.skipped_files)} other file(s))" if report.skipped_files else ""
        raise PipelineInputError(f"{path}: no {', '.join(TEXT_SUFFIXES)} files in this directory{others}")
    return files


def iter_local_files(path: str | Path, settings: CorpusSettings, report: ReadReport) -> Iterator[dict[str, str]]:
    for f in list_files(Path(path), report):
        if f.suffix == ".txt":
            yield from _iter_txt(f, settings.txt_documents)
        elif f.suffix == ".jsonl":
            yield from _iter_jsonl(f, settings.text_column, report)
        else:
            yield from _iter_parquet(f, settings.text_column, report)


def iter_hf_dataset(settings: CorpusSettings, report: ReadReport) -> Iterator[dict[str, str]]:
    """A Hugging Face dataset (needs network or a local HF cache)."""
    import datasets

    if settings.hf_dataset is None:
        raise ConfigError("corpus.hf_dataset is required when corpus.source is 'hf'")
    ds = datasets.load_dataset(settings.hf_dataset, settings.hf_config, split=settings.hf_split)
    column = settings.text_column
    if column not in ds.column_names:
        raise PipelineInputError(
            f"{settings.hf_dataset}: no column '{column}' (found {ds.column_names}); set corpus.text_column"
        )
    if not _is_text_type(ds.data.schema.field(column).type):
        raise PipelineInputError(
            f"{settings.hf_dataset}: column '{column}' has type {ds.features[column]}, not string; set "
            f"corpus.text_column"
        )
    rows = cast("Iterable[Mapping[str, Any]]", ds)  # datasets leaves the row type open: name → value
    for i, row in enumerate(rows):
        if row[column] is None:
            report.null_rows += 1
            continue
        yield {"doc_id": f"{settings.hf_dataset}:{i}", "title": str(row.get("title", "")), "text": row[column]}


def iter_documents(settings: CorpusSettings, report: ReadReport) -> Iterator[dict[str, str]]:
    if settings.source == "wiki_sample":
        return iter_wiki_articles(default_wiki_dump())
    if settings.source in ("wiki_dump", "files"):
        if settings.path is None:
            raise ConfigError(f"corpus.path is required when corpus.source is '{settings.source}'")
        if settings.source == "wiki_dump":
            return iter_wiki_articles(settings.path)
        return iter_local_files(settings.path, settings, report)
    return iter_hf_dataset(settings, report)


# --- build, split, save -------------------------------------------------------------------------

COLUMNS = ("doc_id", "title", "text")
BATCH_CHARS = 8 << 20  # documents are written to Arrow in record batches of about this many characters


@dataclass
class CorpusResult:
    path: Path
    stats: dict[str, Any]
    samples: list[str] = field(default_factory=list)


def count_words(text: str, step: int = 1 << 20) -> int:
    """len(text.split()), counted slice by slice so that a huge text never becomes one list of words."""
    n = 0
    for i in range(0, len(text), step):
        piece = text[i : i + step]
        n += len(piece.split())
        if i and not piece[0].isspace() and not text[i - 1].isspace():
            n -= 1  # a word cut by the slice boundary was counted twice
    return n


class _Stats:
    """Corpus statistics gathered one document at a time, in reading order."""

    def __init__(self) -> None:
        self.chars: list[int] = []
        self.words = self.bytes = self.non_ascii = 0
        self.sha = hashlib.sha256()

    def add(self, text: str) -> None:
        data = text.encode("utf-8")
        self.sha.update(data)
        self.sha.update(b"\x00")
        self.chars.append(len(text))
        self.bytes += len(data)
        self.words += count_words(text)
        if not text.isascii():
            self.non_ascii += len(text) - len(text.encode("ascii", "ignore"))

    def result(self, train_idx: np.ndarray, val_idx: np.ndarray) -> dict[str, Any]:
        chars = np.asarray(self.chars, dtype=np.int64)
        return {
            "documents": len(chars),
            "characters": int(chars.sum()),
            "words": self.words,
            "bytes": self.bytes,
            "non_ascii_share": self.non_ascii / max(int(chars.sum()), 1),
            "content_sha256": self.sha.hexdigest(),
            "train_documents": len(train_idx),
            "validation_documents": len(val_idx),
            "train_characters": int(chars[train_idx].sum()),
            "validation_characters": int(chars[val_idx].sum()),
        }


def split_documents(n: int, validation_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic document-level split: indices of train and validation documents."""
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(max(1, int(round(n * validation_fraction))), n - 1)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def _schema():
    import pyarrow as pa

    return pa.schema([(c, pa.string()) for c in COLUMNS])


def _write_documents(
    docs: Iterator[dict[str, str]], settings: CorpusSettings, path: Path
) -> tuple[_Stats, int, list[str]]:
    """Stream the kept documents into an Arrow IPC stream file, a record batch of about BATCH_CHARS
    characters at a time; returns their statistics, how many were too short, and sample lines."""
    import pyarrow as pa

    stats, short, samples = _Stats(), 0, []
    rows: dict[str, list[str]] = {c: [] for c in COLUMNS}
    pending = 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, _schema()) as writer:
        for doc in docs:
            if len(doc["text"]) < settings.min_chars:
                short += 1
                continue
            stats.add(doc["text"])
            if len(stats.chars) <= 20:
                samples += [line[:200] for line in doc["text"].splitlines() if len(line) > 40][: 5 - len(samples)]
            for c in COLUMNS:
                rows[c].append(doc[c])
            pending += len(doc["text"])
            if pending >= BATCH_CHARS:
                writer.write_batch(pa.record_batch([rows[c] for c in COLUMNS], schema=_schema()))
                rows, pending = {c: [] for c in COLUMNS}, 0
            if settings.max_documents and len(stats.chars) >= settings.max_documents:
                break
        if rows["text"]:
            writer.write_batch(pa.record_batch([rows[c] for c in COLUMNS], schema=_schema()))
    return stats, short, samples


def _write_splits(all_path: Path, val_idx: np.ndarray, n: int, train_path: Path, val_path: Path) -> None:
    """Copy the documents of all_path into a train and a validation file, one record batch at a time."""
    import pyarrow as pa

    is_val = np.zeros(n, dtype=bool)
    is_val[val_idx] = True
    start = 0
    with (
        pa.memory_map(str(all_path)) as source,
        pa.OSFile(str(train_path), "wb") as train_sink,
        pa.OSFile(str(val_path), "wb") as val_sink,
        pa.ipc.new_stream(train_sink, _schema()) as train,
        pa.ipc.new_stream(val_sink, _schema()) as val,
    ):
        for batch in pa.ipc.open_stream(source):
            mask = is_val[start : start + batch.num_rows]
            start += batch.num_rows
            train.write_batch(batch.filter(pa.array(~mask)))
            val.write_batch(batch.filter(pa.array(mask)))


def build_corpus(settings: CorpusSettings, out_dir: str | Path, cache_dir: Optional[Path] = None) -> CorpusResult:
    """Read, clean and split the documents; save a `datasets.DatasetDict` (train/validation) to `out_dir`.

    Documents stream through temporary Arrow files in `cache_dir` (default: next to `out_dir`), so
    memory holds one record batch and the largest document, not the corpus. Stats count documents,
    characters, words, bytes and the content hash, and report what was left out: `skipped_files`
    (files of another type in a directory), `dropped_null_rows` (rows whose text is null),
    `dropped_short_documents` (shorter than `min_chars`, empty ones included) and `warnings`.
    """
    import datasets

    datasets.disable_progress_bars()
    out_dir = Path(out_dir)
    scratch = Path(cache_dir) if cache_dir else out_dir.parent
    scratch.mkdir(parents=True, exist_ok=True)
    report = ReadReport()
    with tempfile.TemporaryDirectory(dir=scratch, prefix="corpus-") as tmp:
        tmp = Path(tmp)
        stats, short, samples = _write_documents(iter_documents(settings, report), settings, tmp / "all.arrow")
        n = len(stats.chars)
        where = settings.path or settings.hf_dataset or str(default_wiki_dump())
        if n == 0:
            raise PipelineInputError(f"the corpus at {where} is empty (no document with text left after cleaning)")
        if n < 2:
            fix = (
                "for .txt files set corpus.txt_documents to 'paragraph'"
                if settings.txt_documents == "file"
                else "add documents, or separate a .txt file's documents with a blank line"
            )
            raise PipelineInputError(
                f"the corpus at {where} has only one document; a train/validation split by document needs two or more "
                f"({fix})"
            )
        train_idx, val_idx = split_documents(n, settings.validation_fraction, settings.seed)
        _write_splits(tmp / "all.arrow", val_idx, n, tmp / "train.arrow", tmp / "validation.arrow")
        dd = datasets.DatasetDict(
            {name: datasets.Dataset.from_file(str(tmp / f"{name}.arrow")) for name in ("train", "validation")}
        )
        dd.save_to_disk(str(out_dir))
        del dd
    result = stats.result(train_idx, val_idx)
    result.update(
        skipped_files=len(report.skipped_files),
        dropped_null_rows=report.null_rows,
        dropped_short_documents=short,
        warnings=report.warnings(settings.text_column),
    )
    return CorpusResult(path=out_dir, stats=result, samples=samples)


def load_corpus(path: str | Path) -> datasets.DatasetDict:
    """The saved `datasets.DatasetDict` with `train` and `validation` splits."""
    import datasets

    path = Path(path)
    if not path.exists():
        raise PipelineInputError(f"corpus folder not found: {path} (materialize `corpus` first)")
    dd = datasets.load_from_disk(str(path))
    if not isinstance(dd, datasets.DatasetDict):
        raise PipelineInputError(f"{path} holds one dataset, not a corpus's train and validation splits")
    return dd


def iter_texts(texts: Iterable[str], batch_rows: int = 128) -> Iterator[str]:
    """The strings of `texts`. A `datasets` column (`dataset["text"]`) is read `batch_rows` rows at
    a time: its own iterator formats one row per call, about 100 times slower."""
    if sys.modules.get("datasets") is not None:  # only a loaded `datasets` can have made a column
        import datasets

        if isinstance(texts, datasets.Column) and isinstance(texts.source, datasets.Dataset):
            name = texts.column_name
            batches = texts.source.select_columns([name]).iter(batch_size=batch_rows)
            for batch in cast("Iterator[Mapping[str, list[str]]]", batches):  # untyped in datasets: name → values
                yield from batch[name]
            return
    yield from texts
