"""A small typed client of spec-tuner's REST API, and the one place that follows a job to its end.

Every error the API answers is problem+json (RFC 9457); :class:`ApiError` carries its title, detail and
field errors so a caller can print them instead of a traceback. A server that cannot be reached is a
:class:`ServerUnreachable`. The ``tuner`` client commands (``tuner/client_cli.py``) and ``tuner demo`` use it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# The job states after which nothing changes (tuner.domain.JobStatus.is_finished); kept as strings here so the
# client needs nothing of the service's domain.
FINISHED = frozenset({"succeeded", "failed", "cancelled"})
UNFINISHED_TRIAL = frozenset({"queued", "running"})
BUDGETED = frozenset({"baseline", "search"})  # what budget.max_trials counts; confirmation runs come on top


class ClientError(Exception):
    """Something a user should read: printed as one message, never as a traceback."""


class ServerUnreachable(ClientError):
    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"cannot reach the spec-tuner server at {server}: {reason}")
        self.server = server


@dataclass
class ApiError(ClientError):
    """A non-2xx answer, read from its problem+json body (or the bare status when the body is not one)."""

    status: int
    title: str
    detail: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    correlation_id: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message())

    @classmethod
    def from_response(cls, resp: httpx.Response) -> ApiError:
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            text = resp.text.strip()[:500] or None
            return cls(resp.status_code, resp.reason_phrase or f"HTTP {resp.status_code}", text)
        detail = body.get("detail")
        if not isinstance(detail, str) and detail is not None:  # FastAPI's own 422 shape, should one slip by
            detail = json.dumps(detail)
        errors = body.get("errors")
        return cls(
            resp.status_code,
            str(body.get("title") or resp.reason_phrase or f"HTTP {resp.status_code}"),
            detail,
            [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else [],
            body.get("correlation_id"),
        )

    def message(self) -> str:
        lines = [f"{self.title} ({self.status})" + (f": {self.detail}" if self.detail else "")]
        for e in self.errors:
            where = e.get("field") or e.get("item")
            what = e.get("message") or ""
            lines.append(f"  {where}: {what}" if where is not None else f"  {what}")
        if self.correlation_id:
            lines.append(f"  correlation id: {self.correlation_id} (the line in the server's log)")
        return "\n".join(lines)


class TunerClient:
    """The REST API as typed calls. Bodies and answers are the API's JSON, as plain dicts."""

    def __init__(self, server: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def __enter__(self) -> TunerClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnreachable(self.server, str(exc) or type(exc).__name__) from None
        if resp.status_code >= 400:
            raise ApiError.from_response(resp)
        return resp

    def health(self) -> bool:
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def upload_traffic(self, path: Path) -> dict[str, Any]:
        """POST /traffic with a file as it is (JSONL, JSON or ShareGPT); the server parses and checks it."""
        try:
            content = path.read_bytes()
        except OSError as exc:
            raise ClientError(f"traffic file {path}: {exc.strerror or exc}") from None
        kind = "application/json" if path.suffix == ".json" else "application/x-ndjson"
        return self._request("POST", "/traffic", content=content, headers={"content-type": kind}).json()

    def submit(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._request("POST", "/tune", json=body, headers=headers).json()

    def job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/tune/{job_id}").json()

    def trials(self, job_id: str) -> list[dict[str, Any]]:
        return self._request("GET", f"/tune/{job_id}/trials").json()

    def jobs(self, *, limit: int = 20, status: str | None = None) -> list[dict[str, Any]]:
        """The team's jobs, newest first (GET /tune)."""
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        return self._request("GET", "/tune", params=params).json()

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._request("POST", f"/tune/{job_id}/cancel").json()

    def recommendation(self, model: str, **params: Any) -> dict[str, Any]:
        query = {"model": model} | {k: v for k, v in params.items() if v is not None}
        return self._request("GET", "/recommendation", params=query).json()

    def workers(self) -> list[dict[str, Any]]:
        """The workers the server has seen, most recent first, with what each reported (GET /workers)."""
        return self._request("GET", "/workers").json()

    def report(self, job_id: str) -> bytes:
        """The job's self-contained HTML report (GET /tune/{id}/report)."""
        return self._request("GET", f"/tune/{job_id}/report", headers={"accept": "text/html"}).content


@dataclass(frozen=True)
class JobSnapshot:
    """One look at a job while it is followed: the job and its trials as the API answered them."""

    job: dict[str, Any]
    trials: list[dict[str, Any]]

    @property
    def finished(self) -> bool:
        return self.job["status"] in FINISHED

    @property
    def budget(self) -> int | None:
        value = (self.job.get("progress") or {}).get("max_trials")
        return int(value) if isinstance(value, int) else None

    @property
    def done(self) -> int:
        """Trials finished, failed ones too, of every purpose (the baseline and confirmations as well)."""
        p = self.job.get("progress") or {}
        return int(p.get("trials_finished") or 0)

    @property
    def search_done(self) -> int:
        """Trials finished that the budget counts: the baseline and the search's (confirmation runs come on
        top). Without the trials (a job list), every finished trial."""
        if not self.trials:
            return self.done
        return sum(1 for t in self._finished() if t.get("purpose") in BUDGETED)

    @property
    def other_done(self) -> dict[str, int]:
        """Finished trials beyond the budget, by purpose (confirm)."""
        out: dict[str, int] = {}
        for t in self._finished():
            if t.get("purpose") not in BUDGETED:
                out[t.get("purpose", "?")] = out.get(t.get("purpose", "?"), 0) + 1
        return out

    @property
    def running(self) -> list[dict[str, Any]]:
        return [t for t in self.trials if t["status"] == "running"]

    def _finished(self) -> list[dict[str, Any]]:
        return [t for t in self.trials if t["status"] not in UNFINISHED_TRIAL]


def follow(
    client: TunerClient,
    job_id: str,
    *,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[JobSnapshot]:
    """Poll a job until it finishes, yielding a snapshot per poll (the first look and the last included).

    The trials are read while the job runs (to name the trial in progress) and once at the end. Past
    ``timeout_s`` it raises :class:`ClientError`. Following is read-only: closing the generator (Ctrl-C in the
    caller) leaves the job running.
    """
    deadline = time.monotonic() + timeout_s if timeout_s is not None else None
    while True:
        job = client.job(job_id)
        queued = job["status"] == "queued"
        snapshot = JobSnapshot(job, [] if queued else client.trials(job_id))
        yield snapshot
        if snapshot.finished:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise ClientError(f"job {job_id} is still {job['status']} after {timeout_s:.0f} s")
        sleep(poll_s)
