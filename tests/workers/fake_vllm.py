"""A stand-in for ``vllm serve`` that fails on purpose, for fast tests of the runner's mid-run paths.

Serves /health, /version and an empty /metrics on ``--port``; a POST then, per ``FAKE_VLLM_MODE``:
``die`` prints an EngineDeadError and exits the process, ``reject`` answers HTTP 400.
"""

from __future__ import annotations

import http.server
import json
import os
import sys

MODE = os.environ.get("FAKE_VLLM_MODE", "reject")


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
            self._send(200, b"", "text/plain")
        else:
            self._send(200, b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if MODE == "die":
            print("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", flush=True)
            os._exit(1)
        self._send(400, json.dumps({"error": {"message": "This model's maximum context length is 512"}}).encode())

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    port = int(sys.argv[sys.argv.index("--port") + 1])
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
