"""Writes kvconform's tiny models as config-only folders vLLM can build from.

One writer for scheduler and engine modes: a :class:`~kvconform.model.tiny_model.TinyModel`
becomes a ``transformers`` config (``AutoConfig.for_model``) saved under kvconform's
cache, keyed by the shape and the transformers version, written once and shared by
processes (a folder another process finished first is kept). No weights: the
scheduler needs only the config, and the engine loads dummy weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from kvconform.model.tiny_model import ARCHITECTURES, TinyModel
from kvconform.paths import cache_dir


def model_folder(model: TinyModel) -> Path:
    """The folder of ``model``'s config, written once under kvconform's cache."""
    import transformers

    key = json.dumps({**model.to_json(), "transformers": transformers.__version__}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = cache_dir("tiny-models")
    folder = root / f"{model.architecture}-{digest}"
    if (folder / "config.json").exists():
        return folder
    config = transformers.AutoConfig.for_model(ARCHITECTURES[model.architecture], **model.config())
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".staging-"))
    try:
        config.save_pretrained(staging)
        path = staging / "config.json"
        data = json.loads(path.read_text())
        # transformers 5 does not write `architectures` from a bare config; vLLM
        # needs it to pick the model class (and the EAGLE draft's).
        data["architectures"] = [model.architecture]
        data.update(model.extra)
        path.write_text(json.dumps(data, indent=1))
        try:
            os.replace(staging, folder)
        except OSError:
            pass  # another process wrote it first (pytest-xdist); theirs is the same
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
