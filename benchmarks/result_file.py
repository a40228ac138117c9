"""How a benchmark hands back its result: the JSON on stdout, and into `--out` when given (written
whole or not at all, so an interrupted run never leaves half a result under benchmarks/results/)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def emit(out: dict, path: str | Path | None) -> dict:
    text = json.dumps(out, indent=2)
    print(text)
    if path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_text(text + "\n")
        os.replace(tmp, path)
    return out
