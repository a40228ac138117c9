"""Files as artifacts: hashes, sizes and atomic writes of run-scoped folders."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

WEIGHTS_MODE = 0o644  # every .safetensors file: readable by all, like its neighbours (safetensors writes 0600)


def set_weights_mode(path: str | Path) -> Path:
    """Give a written weights file the one mode of the project's weights (WEIGHTS_MODE), so a model
    folder can be shared or served as it is."""
    os.chmod(path, WEIGHTS_MODE)
    return Path(path)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_dir(path: str | Path) -> str:
    """Hash of every file's relative path and content under `path`, in sorted order."""
    root = Path(path)
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(root)).encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def file_info(path: str | Path) -> dict[str, Any]:
    """Path, size and hash of a file or folder, for metadata."""
    p = Path(path)
    if p.is_dir():
        size = sum(q.stat().st_size for q in p.rglob("*") if q.is_file())
        return {"path": str(p.resolve()), "bytes": size, "sha256": sha256_dir(p)}
    return {"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": sha256_file(p)}


def write_json(path: str | Path, obj: Any) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, p)
    return p


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


@contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces `final`, on error it is removed.

    Downstream readers therefore never see a half-written output folder.
    """
    final = Path(final)
    created = not final.parent.exists()  # e.g. the run folder of a partition's output
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created:
            try:
                final.parent.rmdir()  # only if still empty
            except OSError:
                pass
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
