"""Code versions of assets: what Dagster compares with the version recorded at the last
materialization, so the UI marks an asset whose code changed since ("code version changed").

An asset's version is a hash of what decides its result:
- the source of the module that defines its compute function (`pipelines/defs/recurrent.py`; for a
  language model, `components/orchestration/language_model.py`), module-level helpers included;
- every module of the framework-free core (`components/core/...`) that this module imports,
  followed transitively through the core's own imports (the model, the training loop, the study);
- the defaults of its run config (for a `defs.yaml` language model: the instance's architecture and
  training settings), since the same launch then computes something else.

Left out on purpose: the orchestration plumbing every asset shares (stage, tracking, IO manager),
which moves files and logs but does not change results, so editing it does not mark the whole
graph as changed. Whitespace and comments count (a source hash, not an AST).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

from .state import PROJECT_ROOT

CORE = "components.core"


@functools.cache
def _module_file(name: str) -> Path | None:
    """The source file of module `name` inside this project, without importing it."""
    parts = name.split(".")
    base = PROJECT_ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(PROJECT_ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.MULTILINE)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)", re.MULTILINE)


@functools.cache
def _imports(path: Path) -> tuple[str, ...]:
    """Absolute names of the modules `path` imports, at module level or inside functions (relative
    imports resolved; `from m import x` gives m and m.x, which counts when x is a module). A
    line scan, not a parse: ~50× cheaper, and an import-like line in a docstring only adds a module."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    text = path.read_text(encoding="utf-8")
    names: list[str] = []
    for m in _FROM.finditer(text):
        target = m.group(1)
        level = len(target) - len(target.lstrip("."))
        if level:
            base = package[: len(package) - (level - 1)]
            target = ".".join([*base, target[level:]] if target[level:] else base)
        names.append(target)
        names += [f"{target}.{n.split()[0]}" for n in m.group(2).strip("()").replace("\n", ",").split(",") if n.strip()]
    for m in _IMPORT.finditer(text):
        names += [n.strip() for n in m.group(1).split(",")]
    return tuple(names)


@functools.cache
def core_closure(path: Path) -> tuple[Path, ...]:
    """The core modules `path` reaches through imports (transitively within components.core)."""
    seen: dict[Path, None] = {}
    todo = [path]
    while todo:
        for name in _imports(todo.pop()):
            if name == CORE or name.startswith(CORE + "."):
                # a package's __init__ runs on import too
                for i in range(2, len(name.split(".")) + 1):
                    f = _module_file(".".join(name.split(".")[:i]))
                    if f is not None and f not in seen and f != path:
                        seen[f] = None
                        todo.append(f)
    return tuple(sorted(seen))


@functools.cache
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_version(fn: Any, config_defaults: Any = None) -> str:
    """The code version of an asset whose compute function is `fn` (see the module docstring)."""
    file = inspect.getsourcefile(fn)
    if file is None:
        raise TypeError(f"{fn!r} has no source file to take a code version of")
    source = Path(file).resolve()
    h = hashlib.sha256()
    for f in (source, *core_closure(source)):
        h.update(f"{f.relative_to(PROJECT_ROOT)}:{_file_digest(f)}\n".encode())
    h.update(json.dumps(config_defaults, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def asset_code_version(assets_def: Any) -> str:
    """`code_version` of a Dagster AssetsDefinition (its op's function and config defaults)."""
    op = assets_def.op
    fn = getattr(op.compute_fn, "decorated_fn", op.compute_fn)
    field = op.config_field
    defaults = field.default_value if field is not None and field.default_provided else None
    return code_version(fn, defaults)
