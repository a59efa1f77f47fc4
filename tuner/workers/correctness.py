"""The correctness gate: greedy outputs of a fixed prompt subset against the job's no-speculation outputs.

Speculative decoding with standard rejection sampling is lossless, so at temperature 0 a speculative trial
should reproduce the baseline's tokens; numerics of batched verification can still flip near-ties, which
is why the gate compares common prefixes against a threshold instead of demanding identity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import httpx

from tuner.domain import CorrectnessReport, RequestComparison, TrafficRequest, TrialSpec
from tuner.workers.replay import ReplaySettings, build_request


async def greedy_outputs(
    client: httpx.AsyncClient, base_url: str, requests: Sequence[TrafficRequest], settings: ReplaySettings
) -> tuple[tuple[int, ...], ...]:
    """Output token ids of each request at temperature 0, one request at a time (no batching effects)."""
    outputs: list[tuple[int, ...]] = []
    settings = dataclasses.replace(settings, return_token_ids=True)
    for req in requests:
        path, body = build_request(dataclasses.replace(req, temperature=0.0), settings, stream=False)
        resp = await client.post(base_url + path, json=body, timeout=settings.request_timeout_s)
        resp.raise_for_status()
        choice = resp.json()["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise RuntimeError("the server returned no token_ids (return_token_ids unsupported)")
        outputs.append(tuple(int(t) for t in ids))
    return tuple(outputs)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def ungated_reason(spec: TrialSpec) -> str | None:
    """Why this speculative trial's outputs cannot be compared with a reference, or None when they can."""
    if spec.correctness_prompts <= 0 or not spec.requests:
        return "no correctness prompts (correctness_prompts is 0 or the traffic is empty): outputs not compared"
    if not spec.reference_outputs:
        return "no reference outputs (no-speculation greedy outputs) were given: outputs not compared"
    return None


def not_gated(reason: str, threshold: float = 0.5) -> CorrectnessReport:
    """The report of a speculative trial whose outputs were not compared: says so instead of passing."""
    return CorrectnessReport(threshold=threshold, not_gated=reason)


def compare(
    outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]], threshold: float = 0.5
) -> CorrectnessReport:
    """Per-request common prefix and identity; passes when the median prefix fraction >= ``threshold``.

    Nothing to compare (either side empty) is reported as not gated rather than as a pass.
    """
    comparisons = tuple(
        RequestComparison(
            index=i,
            common_prefix=common_prefix(out, ref),
            output_len=len(out),
            reference_len=len(ref),
            identical=tuple(out) == tuple(ref),
        )
        for i, (out, ref) in enumerate(zip(outputs, reference, strict=False))
    )
    if not comparisons:
        return not_gated("no outputs to compare", threshold)
    report = CorrectnessReport(comparisons=comparisons, threshold=threshold)
    return dataclasses.replace(report, passed=report.median_prefix_fraction >= threshold)
