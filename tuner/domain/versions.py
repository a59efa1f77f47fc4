"""Version strings (vLLM's ``/version``, GPU drivers) as comparable tuples: the one parser."""

from __future__ import annotations

import re

Version = tuple[int, int, int]


def parse_version(text: str | None) -> Version:
    """``"0.32.0+cpu"`` -> ``(0, 32, 0)``; a local suffix after ``+`` and non-numeric parts are dropped,
    missing parts are 0, and None or a string without digits is ``(0, 0, 0)`` (older than any release)."""
    numbers = [int(p) for p in re.findall(r"\d+", (text or "").split("+", 1)[0])[:3]]
    major, minor, patch = (numbers + [0, 0, 0])[:3]
    return (major, minor, patch)
