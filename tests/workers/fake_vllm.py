"""A stand-in for ``vllm serve``, started by the real runner from its argv (it reads ``--port`` and whether a
``--speculative-config`` was given). What a POST does depends on ``FAKE_VLLM_MODE``:

- ``die``: prints an EngineDeadError and exits the process (a crash mid-run);
- ``reject``: answers HTTP 400 (request errors);
- ``serve``: speaks the protocol the runner uses: streaming and non-streaming ``/v1/completions`` and
  ``/v1/chat/completions`` with ``token_ids`` and usage, and ``/metrics`` counters that follow what it served.
  Outputs are recorded token ids from the JSON file ``FAKE_VLLM_OUTPUTS`` (see data/divergent_outputs.json),
  looked up by prompt: its ``baseline`` set without a speculative config, its ``speculative`` set with one
  (``FAKE_VLLM_SPECULATIVE_SET`` picks another set). Under a speculative config each SSE chunk carries
  ``FAKE_VLLM_TOKENS_PER_STEP`` tokens (default 2: one accepted draft token plus the bonus token) and the
  spec-decode counters count one draft of K per decode step (not the prefill's first token), as vLLM does;
  with ``FAKE_VLLM_EMPTY_EVERY=n`` every n-th decode step proposes nothing (an ngram step without a match):
  one token and no draft counted.
"""

from __future__ import annotations

import http.server
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

MODE = os.environ.get("FAKE_VLLM_MODE", "reject")
STEP_S = float(os.environ.get("FAKE_VLLM_STEP_S", "0.002"))
LABELS = '{engine="0",model_name="fake"}'


def _spec_config(argv: list[str]) -> dict[str, Any] | None:
    if "--speculative-config" not in argv:
        return None
    return dict(json.loads(argv[argv.index("--speculative-config") + 1]))


SPEC = _spec_config(sys.argv)
K = int(SPEC["num_speculative_tokens"]) if SPEC else 0
PER_STEP = max(1, min(K + 1, int(os.environ.get("FAKE_VLLM_TOKENS_PER_STEP", "2")))) if SPEC else 1
EMPTY_EVERY = int(os.environ.get("FAKE_VLLM_EMPTY_EVERY", "0"))


def _outputs() -> dict[str, list[int]]:
    path = os.environ.get("FAKE_VLLM_OUTPUTS")
    if not path:
        return {}
    data = json.loads(Path(path).read_text())
    chosen = os.environ.get("FAKE_VLLM_SPECULATIVE_SET", "speculative") if SPEC else "baseline"
    return dict(zip(data["prompts"], data[chosen], strict=True))


OUTPUTS = _outputs()


class Counters:
    """vLLM's counters and gauges, updated as requests are served."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, float] = {
            "vllm:generation_tokens_total": 0.0,
            "vllm:request_success_total": 0.0,
            "vllm:num_preemptions_total": 0.0,
        }
        if SPEC:
            for name in ("drafts", "draft_tokens", "accepted_tokens"):
                self.values[f"vllm:spec_decode_num_{name}_total"] = 0.0
        self.per_pos = [0.0] * K
        self.running = 0

    def step(self, tokens: int, drafted: bool) -> None:
        with self.lock:
            self.values["vllm:generation_tokens_total"] += tokens
            if drafted:
                self.values["vllm:spec_decode_num_drafts_total"] += 1
                self.values["vllm:spec_decode_num_draft_tokens_total"] += K
                self.values["vllm:spec_decode_num_accepted_tokens_total"] += tokens - 1
                for pos in range(tokens - 1):
                    self.per_pos[pos] += 1

    def render(self) -> bytes:
        with self.lock:
            lines = []
            for name, value in self.values.items():
                lines += [f"# TYPE {name} counter", f"{name}{LABELS} {value}"]
            if SPEC:
                name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
                lines.append(f"# TYPE {name} counter")
                lines += [
                    f'{name}{{engine="0",model_name="fake",position="{p}"}} {v}' for p, v in enumerate(self.per_pos)
                ]
            for name, value in (
                ("vllm:num_requests_running", self.running),
                ("vllm:num_requests_waiting", 0),
                ("vllm:kv_cache_usage_perc", 0.01 * self.running),
            ):
                lines += [f"# TYPE {name} gauge", f"{name}{LABELS} {float(value)}"]
            return ("\n".join(lines) + "\n").encode()


COUNTERS = Counters()


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/version":
            self._send(200, json.dumps({"version": "0.0-fake"}).encode())
        elif self.path == "/metrics":
            self._send(200, COUNTERS.render() if MODE == "serve" else b"", "text/plain")
        else:
            self._send(200, b"")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if MODE == "die":
            print("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", flush=True)
            os._exit(1)
        if MODE == "serve":
            self._serve(json.loads(body))
            return
        self._send(400, json.dumps({"error": {"message": "This model's maximum context length is 512"}}).encode())

    def _serve(self, req: dict[str, Any]) -> None:
        chat = self.path == "/v1/chat/completions"
        prompt = req["messages"][-1]["content"] if chat else req["prompt"]
        if prompt not in OUTPUTS:
            self._send(400, json.dumps({"error": {"message": f"no recorded output for {prompt[:40]!r}"}}).encode())
            return
        ids = OUTPUTS[prompt][: int(req.get("max_tokens") or 16)]
        steps = _steps(ids)
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(ids)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        with COUNTERS.lock:
            COUNTERS.running += 1
        try:
            if req.get("stream"):
                self._stream(steps, chat, usage)
            else:
                for step, drafted in steps:
                    time.sleep(STEP_S)
                    COUNTERS.step(len(step), drafted)
                choice = {"index": 0, "token_ids": ids, "finish_reason": "length"}
                choice.update(
                    {"message": {"role": "assistant", "content": _text(ids)}} if chat else {"text": _text(ids)}
                )
                self._send(200, json.dumps({"choices": [choice], "usage": usage}).encode())
        finally:
            with COUNTERS.lock:
                COUNTERS.running -= 1
                COUNTERS.values["vllm:request_success_total"] += 1

    def _stream(self, steps: list[tuple[list[int], bool]], chat: bool, usage: dict[str, int]) -> None:
        # HTTP/1.0 without a length: the body ends when the connection closes, as a plain SSE stream may.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, (step, drafted) in enumerate(steps):
            time.sleep(STEP_S)
            COUNTERS.step(len(step), drafted)
            finish = "length" if i == len(steps) - 1 else None
            choice: dict[str, Any] = {"index": 0, "token_ids": step, "finish_reason": finish}
            choice.update({"delta": {"content": _text(step)}} if chat else {"text": _text(step)})
            self._event({"choices": [choice]})
        self._event({"choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, data: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


def _steps(ids: list[int]) -> list[tuple[list[int], bool]]:
    """The tokens of each engine step and whether it drafted: the prefill's first token (no draft), then decode
    steps of PER_STEP tokens after a draft, or of one token when the step proposed nothing."""
    out, i, n = [(ids[:1], False)], 1, 0
    while i < len(ids):
        n += 1
        empty = not SPEC or bool(EMPTY_EVERY and n % EMPTY_EVERY == 0)
        width = 1 if empty else PER_STEP
        out.append((ids[i : i + width], not empty))
        i += width
    return out


def _text(ids: list[int]) -> str:
    return "".join(f" t{t}" for t in ids)


if __name__ == "__main__":
    port = int(sys.argv[sys.argv.index("--port") + 1])
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
