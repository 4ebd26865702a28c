"""Config-only model folders for the Hugging Face ids vLLM's tests name.

Many of vLLM's scheduler and KV-cache tests name a model (``facebook/opt-125m``,
``Qwen/Qwen3-0.6B``, ...) only so that ``ModelConfig`` can read its
``config.json``: layer count, head size, context length. Without network
access that read fails. vLLM itself offers the way around:
``VLLM_MODEL_REDIRECT_PATH`` names a JSON map from model id to a local folder,
and ``ModelConfig`` substitutes the folder for the id. This module writes one
folder per id holding only a ``config.json`` with the model's published values
(shipped with kvconform in ``model_configs.json``; no weights, no tokenizer)
and the map that points at them, under ``<cache>/peer/models/``.

A test that needs more than the configuration (weights, a tokenizer, an image
processor) still fails offline; the baseline records it and deselects it.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from kvconform.paths import cache_dir


def published_configs() -> dict[str, dict[str, Any]]:
    """Model id -> its config.json, as kvconform ships them."""
    text = resources.files("kvconform.peer").joinpath("model_configs.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return {key: value for key, value in data.items() if not key.startswith("_")}


def folder_name(model_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "--", model_id)


def redirect_map(root: Path, configs: dict[str, dict[str, Any]] | None = None) -> Path:
    """Writes the config-only folders under ``root`` and returns the redirect map's path.

    Rewritten when the shipped values change; each file is written to a temporary
    name and renamed, so a concurrent reader sees the old file or the new one.
    """
    configs = published_configs() if configs is None else configs
    root.mkdir(parents=True, exist_ok=True)
    mapping: dict[str, str] = {}
    for model_id, config in sorted(configs.items()):
        folder = root / folder_name(model_id)
        folder.mkdir(exist_ok=True)
        _write_if_changed(folder / "config.json", json.dumps(config, indent=1, sort_keys=True))
        mapping[model_id] = str(folder)
    path = root / "redirect.json"
    _write_if_changed(path, json.dumps(mapping, indent=1, sort_keys=True))
    return path


def default_redirect_map() -> Path:
    return redirect_map(cache_dir("peer", "models"))


def _write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, path)
