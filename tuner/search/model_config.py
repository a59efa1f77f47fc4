"""Reading a model's ``config.json`` without the network; its traits are read by ``tuner.domain.model_traits``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.domain.model_traits import MTP_KEYS, ModelTraits, model_traits

__all__ = ["MTP_KEYS", "ModelTraits", "default_hf_cache", "model_traits", "read_model_config"]


def default_hf_cache() -> Path:
    """The hub cache huggingface_hub uses: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/...``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def read_model_config(
    model: str,
    *,
    supplied: Mapping[str, Any] | None = None,
    hf_cache: Path | None = None,
    revision: str | None = None,
) -> dict[str, Any] | None:
    """The model's ``config.json`` as a dict, or None when it is nowhere local. Never uses the network.

    Looked up in order: ``model`` as a local directory (``<model>/config.json``); the Hugging Face cache
    (``models--org--name/snapshots/<rev>/config.json``, preferring ``refs/<revision or main>``, else the
    newest snapshot); then ``supplied`` (a config sent with the request).
    """
    local = Path(model).expanduser()
    if (local / "config.json").is_file():
        return _load(local / "config.json")
    found = _from_hf_cache(model, hf_cache or default_hf_cache(), revision)
    if found is not None:
        return found
    return dict(supplied) if supplied else None


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _from_hf_cache(model: str, cache: Path, revision: str | None) -> dict[str, Any] | None:
    if "/" not in model or model.startswith(("/", ".", "~")):
        return None
    repo = cache / ("models--" + model.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / (revision or "main")
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip() / "config.json"
        if pinned.is_file():
            return _load(pinned)
    if revision and (snapshots / revision / "config.json").is_file():
        return _load(snapshots / revision / "config.json")
    configs = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return _load(configs[0]) if configs else None
