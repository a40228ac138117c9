"""The loader MLflow calls for the models this project logs (`mlflow.pyfunc.load_model(...)`).

A logged model is an export folder (components/core/export/folder.py: `model.safetensors` with the
config in its header, `config.json`, `tokenizer.json`, `generation_config.json`) plus MLflow's
`MLmodel` file, whose pyfunc flavour names this module as `loader_module`. Nothing is pickled:
loading reads the safetensors weights and the tokenizer, and needs this project installed.
Imports neither Dagster nor MLflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ExportedLanguageModel:
    """`predict(prompts)` continues each prompt: a list of strings, or a table with a `prompt` column."""

    def __init__(self, folder: str | Path):
        from components.core.export.folder import load_export

        self.folder = Path(folder)
        self.loaded = load_export(self.folder)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> list[str]:
        from components.core.export.generation import generate

        params = params or {}
        if hasattr(model_input, "columns"):  # a pandas DataFrame, as MLflow passes it under the signature
            prompts = []
            for cell in model_input["prompt"]:  # {"prompt": [a, b]} arrives as one row holding the list
                prompts += (
                    [str(p) for p in cell]
                    if isinstance(cell, (list, tuple)) or hasattr(cell, "tolist")
                    else [str(cell)]
                )
        elif isinstance(model_input, str):
            prompts = [model_input]
        else:
            prompts = [str(p) for p in model_input]
        return [
            generate(
                self.folder,
                p,
                max_new_tokens=params.get("max_new_tokens"),
                temperature=params.get("temperature"),
                seed=params.get("seed"),
                loaded=self.loaded,
            ).text
            for p in prompts
        ]


def _load_pyfunc(data_path: str) -> ExportedLanguageModel:
    return ExportedLanguageModel(data_path)
