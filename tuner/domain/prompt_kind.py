"""What kind of prompt a request carries, read off its text: code, summarisation, maths, writing or chat, and
how repetitive it is. One reader for the traffic statistics (a sample's workload class) and the simulated
engine (its acceptance and n-gram match rates).

Only the first ``SCAN_CHARS`` of a prompt are read: a prompt's kind shows in its opening, and a hostile
megabyte prompt must not cost a megabyte of regex work per request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

SCAN_CHARS = 20_000
CHARS_PER_TOKEN = 4.0  # English and code under the usual BPE tokenizers
CODE_SCORE_MIN = 0.06  # prose scores ~0.01, source code ~0.1 and up

_CODE_CHARS = frozenset("{}();=<>[]_#")
_CODE_WORDS = re.compile(r"\b(def|return|import|class|function|const|let|var|public|void|elif|fn)\b")


def code_score(text: str) -> float:
    """Density of code-like characters and keywords (0 for prose, ~0.1+ for source)."""
    text = text[:SCAN_CHARS]
    if not text:
        return 0.0
    chars = sum(ch in _CODE_CHARS for ch in text) / len(text)
    words = len(_CODE_WORDS.findall(text)) / max(1, len(text.split()))
    lines = text.splitlines()
    indented = sum(line.startswith(("    ", "\t")) for line in lines) / max(1, len(lines))
    return chars + words + 0.05 * indented


def looks_like_code(text: str) -> bool:
    return code_score(text) > CODE_SCORE_MIN


def repetitiveness(text: str, n: int = 4) -> float:
    """Share of word n-grams that occur more than once: what a prompt-lookup (n-gram) drafter can copy."""
    words = text[:SCAN_CHARS].split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    counts: dict[tuple[str, ...], int] = {}
    for g in grams:
        counts[g] = counts.get(g, 0) + 1
    return sum(c for c in counts.values() if c > 1) / len(grams)


def prompt_kind(text: str, output_tokens: int) -> str:
    """One request's kind: code, summarisation (long prompt, short answer, or asked for), math, writing, chat."""
    lower = text.lower()
    prompt = len(text) / CHARS_PER_TOKEN
    if looks_like_code(text):
        return "code"
    if _has(lower, ("summar", "tl;dr", "tldr", "key points")) or (prompt > 1500 and output_tokens < 0.25 * prompt):
        return "summarisation"
    if _has(lower, ("solve", "equation", "prove", "\\frac", "how many", "calculate")) or _digit_share(text) > 0.08:
        return "math"
    if _has(lower, ("write a story", "poem", "essay", "story about", "creative", "fiction")):
        return "writing"
    return "chat"


def _has(text: str, words: Sequence[str]) -> bool:
    return any(w in text for w in words)


def _digit_share(text: str) -> float:
    return sum(ch.isdigit() or ch in "+-*/^=" for ch in text) / max(1, len(text))
