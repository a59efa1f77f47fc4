"""Requests per second of ``GET /recommendation`` against ``GET /healthz`` on the same single-core server.

    python -m benchmarks.recommendation_rate [--seconds 8] [--rounds 3] [--concurrency 16]
                                             [--server-core 0] [--client-core 1] [--check]

A ``tuner demo --engine simulated`` job fills a fresh SQLite store (about 4 s), a read token is made, and
``tuner serve --no-runner`` (uvicorn, one process) is pinned to ``--server-core``. A closed-loop aiohttp client
pinned to ``--client-core`` keeps ``--concurrency`` requests in flight for ``--seconds`` per endpoint,
alternating healthz and the recommendation (with ``concurrency=8``: the per-range answer) for ``--rounds``
rounds, so both see the same machine. Every response must be a 200. ``--check`` exits 1 when the median
recommendation rate is below 0.5 of healthz's or below 400 req/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TUNER = Path(sys.executable).with_name("tuner")
DEMO_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pinned(core: int | None, argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *argv] if core is not None else argv


async def _load(url: str, headers: dict[str, str], seconds: float, concurrency: int) -> tuple[int, float]:
    import aiohttp

    done = 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=concurrency)) as s:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with s.get(url) as r:
                    await r.read()
                    if r.status != 200:
                        raise SystemExit(f"{url}: HTTP {r.status}")
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--server-core", type=int, default=0)
    p.add_argument("--client-core", type=int, default=1)
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="rec-rate-") as tmp:
        env = os.environ | {"TUNER_DATA_DIR": tmp, "TUNER_IN_PROCESS_RUNNER": "false", "TUNER_AUTH": "tokens"}
        env.pop("TUNER_DATABASE_URL", None)
        subprocess.run([str(TUNER), "demo", "--engine", "simulated"], env=env, check=True, capture_output=True)
        token = subprocess.run(
            [str(TUNER), "token", "create", "--name", "bench", "--scope", "read"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()[-1]
        port = _free_port()
        server = subprocess.Popen(
            _pinned(
                args.server_core, [str(TUNER), "serve", "--no-runner", "--port", str(port), "--log-level", "warning"]
            ),
            env=env,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    time.sleep(0.1)
            if args.client_core is not None:
                os.sched_setaffinity(0, {args.client_core})
            headers = {"Authorization": f"Bearer {token}"}
            urls = {
                "healthz": f"{base}/healthz",
                "recommendation": f"{base}/recommendation?model={DEMO_MODEL}&engine=simulated&concurrency=8",
            }
            asyncio.run(_load(urls["recommendation"], headers, 1.0, args.concurrency))  # warm-up, checks a 200
            rates: dict[str, list[float]] = {k: [] for k in urls}
            for _ in range(args.rounds):
                for name, url in urls.items():
                    n, wall = asyncio.run(_load(url, headers, args.seconds, args.concurrency))
                    rates[name].append(n / wall)
        finally:
            server.terminate()
            server.wait(30)

    health = statistics.median(rates["healthz"])
    rec = statistics.median(rates["recommendation"])
    ratio = rec / health
    print(json.dumps({"rates": rates, "healthz": health, "recommendation": rec, "ratio": ratio}, indent=2))
    print(f"healthz {health:.0f} req/s, recommendation {rec:.0f} req/s: ratio {ratio:.2f}")
    if args.check and (ratio < 0.5 or rec < 400):
        print("FAIL: the recommendation needs >= 0.5 of healthz and >= 400 req/s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
