"""The ``tuner`` command: serve, worker, db, token, trial, demo."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from tuner.settings import Settings

log = logging.getLogger("tuner")


def _migrate(settings: Settings) -> None:
    from tuner.store import migrate

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(settings.db_url)


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from tuner.api.app import create_app
    from tuner.wiring import make_runner

    if settings.auto_migrate:
        _migrate(settings)
    background = None
    if settings.in_process_runner and not args.no_runner:
        background = make_runner
    app = create_app(settings, background=background)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from tuner.store.db import make_engine, make_session_factory
    from tuner.wiring import make_runner

    if settings.auto_migrate:
        _migrate(settings)
    engine = make_engine(settings.db_url)
    runner = make_runner(settings, make_session_factory(engine))
    log.info("worker %s polling %s", runner.worker, settings.db_url.split("@")[-1])
    if args.once:
        job = runner.run_once(args.job)
        print(job or "no job to run")
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: runner.stop(timeout=0) or stop.set())
    runner.start()
    stop.wait()
    runner.stop()
    engine.dispose()
    return 0


def cmd_db(args: argparse.Namespace, settings: Settings) -> int:
    from tuner.store import migrate

    if args.action == "upgrade":
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        migrate.upgrade(settings.db_url, args.revision or "head")
    elif args.action == "downgrade":
        migrate.downgrade(settings.db_url, args.revision or "-1")
    print(migrate.current(settings.db_url) or "empty")
    return 0


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    from tuner.auth import create_token, revoke_token
    from tuner.errors import TunerError
    from tuner.store.db import make_engine, make_session_factory, transaction

    engine = make_engine(settings.db_url)
    try:
        with transaction(make_session_factory(engine)) as s:
            if args.action == "create":
                print(create_token(s, args.name, args.scope or ["read"], team=args.team))
            else:
                print(f"revoked {revoke_token(s, args.name)} token(s)")
    except TunerError as e:
        print(f"tuner token: {e.detail}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from tuner.demo import run_demo

    return run_demo(settings, model=args.model, engine=args.engine, budget=args.budget)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tuner", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the API (and, by default, an in-process job runner)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--no-runner", action="store_true", help="API only; run `tuner worker` processes instead")
    s.add_argument("--log-level", default="info")
    s.set_defaults(func=cmd_serve)

    w = sub.add_parser("worker", help="run jobs from the database (several workers may share it)")
    w.add_argument("--once", action="store_true", help="run one job and exit")
    w.add_argument("--job", help="with --once: this job")
    w.set_defaults(func=cmd_worker)

    d = sub.add_parser("db", help="database migrations")
    d.add_argument("action", choices=["upgrade", "downgrade", "current"])
    d.add_argument("revision", nargs="?")
    d.set_defaults(func=cmd_db)

    from tuner.auth import Scope
    from tuner.store.models import DEFAULT_TEAM

    t = sub.add_parser("token", help="API tokens")
    t.add_argument("action", choices=["create", "revoke"])
    t.add_argument("--name", default="default", help="what the token is for (revoke takes it); default: default")
    t.add_argument(
        "--scope",
        action="append",
        choices=[sc.value for sc in Scope],
        help="repeatable; default: read. admin reads, cancels and deletes every team's jobs and samples",
    )
    t.add_argument("--team", default=DEFAULT_TEAM, help="the team the token works for (default: default)")
    t.set_defaults(func=cmd_token)

    m = sub.add_parser("demo", help="the quickstart: tune a model on sample traffic and print the recommendation")
    m.add_argument("--model", default=None, help="default: Llama-3.1-8B-Instruct (simulated)")
    m.add_argument("--engine", choices=["auto", "vllm", "simulated"], default="auto")
    m.add_argument("--budget", type=int, default=16)
    m.set_defaults(func=cmd_demo)

    from tuner import space_cli
    from tuner.workers import bench_cli, trial_cli

    space = space_cli.register(sub)
    space.set_defaults(func=space_cli.run)

    trial = trial_cli.register(sub)
    trial.set_defaults(func=lambda a, s: trial_cli.run(a, vllm_executable=s.vllm_executable))
    bench = bench_cli.register(sub)
    bench.set_defaults(func=lambda a, _s: bench_cli.run(a))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "alembic", "optuna"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return int(args.func(args, Settings()) or 0)


if __name__ == "__main__":
    sys.exit(main())
