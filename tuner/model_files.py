"""What the API can learn about a model from files it may read, before any server starts: its context length
and, with its tokenizer, exact prompt lengths. Only local models under the configured model roots are read."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("tuner")

TokenCounter = Callable[[str], int]


def under_roots(name: str, roots: Sequence[str]) -> bool:
    """Whether the local path ``name`` (symlinks resolved) lies in one of ``roots`` or is one."""
    path = Path(name).expanduser().resolve()
    allowed = [Path(r).expanduser().resolve() for r in roots]
    return any(path == r or r in path.parents for r in allowed)


def local_dir(name: str, roots: Sequence[str]) -> Path | None:
    """The model's directory when ``name`` is a local path under one of ``roots``; else None."""
    path = Path(name).expanduser()
    return path.resolve() if path.is_dir() and under_roots(name, roots) else None


def context_length(
    serving_args: Mapping[str, Any], hf_config: Mapping[str, Any] | None, model_dir: Path | None
) -> int | None:
    """The context a trial's server will have: the job's ``max_model_len``, else the model's own."""
    if isinstance(serving_args.get("max_model_len"), int):
        return int(serving_args["max_model_len"])
    config = hf_config
    if config is None and model_dir is not None and (model_dir / "config.json").is_file():
        try:
            config = json.loads((model_dir / "config.json").read_text())
        except (OSError, ValueError):
            config = None
    value = (config or {}).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


def token_counter(model_dir: Path | None) -> TokenCounter | None:
    """Exact token counts from the model's ``tokenizer.json`` (the ``tokenizers`` library), if it has one."""
    if model_dir is None or not (model_dir / "tokenizer.json").is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    except Exception as exc:  # an unreadable tokenizer only means the lengths cannot be checked here
        log.warning("cannot read %s/tokenizer.json: %s", model_dir, exc)
        return None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)
