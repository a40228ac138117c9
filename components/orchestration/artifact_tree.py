"""The artifacts tree `<state>/artifacts/<asset...>/<run id>/`: its run folders, the leftovers of
processes that died while writing (`.<name>.partial-<pid>`, components.core.artifacts.atomic_dir, and
`.<name>.pruning-<pid>`, a retention's rename), folder sizes and removal. Shared by recovery
(`recovery.py`) and retention (`retention.py`)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from .procs import process_alive
from .state import artifacts_root

LEFTOVER_RE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|pruning)-(?P<pid>\d+)$")
RUN_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def iter_leftovers(root: Path | None = None) -> Iterator[tuple[Path, int]]:
    """(path, pid) of every `.<name>.partial-<pid>` / `.<name>.pruning-<pid>` folder under the
    artifacts tree: beside run folders and (for partitions) one level inside them."""
    for folder, _is_run in walk_artifacts(root or artifacts_root()):
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for e in entries:
            m = LEFTOVER_RE.match(e.name)
            if m:
                yield Path(e.path), int(m.group("pid"))


def walk_artifacts(root: Path) -> Iterator[tuple[Path, bool]]:
    """Asset folders (False) and run folders (True) of the tree `<asset...>/<run id>/`; the content
    of run folders is not walked."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        yield folder, False
        for e in entries:
            if not e.is_dir(follow_symlinks=False) or e.name.startswith("."):
                continue
            if RUN_ID_RE.match(e.name):
                yield Path(e.path), True
            else:
                stack.append(Path(e.path))


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def remove_tree(path: Path) -> int:
    """Remove a folder (or file); returns the bytes freed."""
    if not path.exists() and not path.is_symlink():
        return 0
    size = dir_bytes(path) if path.is_dir() else path.lstat().st_size
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    return size


def remove_dead_leftovers(root: Path | None = None, dry_run: bool = False) -> tuple[list[str], int]:
    removed, freed = [], 0
    for path, pid in iter_leftovers(root):
        if process_alive(pid):
            continue
        removed.append(str(path))
        freed += dir_bytes(path) if dry_run else remove_tree(path)
    return removed, freed
