"""The ``tuner`` command (Typer): the service (serve, worker, db, token), the local tools (trial, bench, space,
demo) and the REST API's client (tune, jobs, status, cancel, recommend, report; ``tuner/client_cli.py``)."""

from __future__ import annotations

import getpass
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Literal, TypeVar

import typer

from tuner.client import ClientError
from tuner.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger("tuner")
T = TypeVar("T")

app = typer.Typer(
    name="tuner",
    help="spec-tuner: the service (serve, worker, db, token), local tools (trial, bench, space, demo) and the "
    "client of its REST API (tune, jobs, status, cancel, recommend, report).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # errors are messages (main below); a bug's traceback stays plain
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "alembic", "optuna"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _migrate(settings: Settings) -> None:
    from tuner.store import migrate

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(settings.db_url)


@app.command(help="Run the API (and, by default, an in-process job runner).")
def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    no_runner: Annotated[
        bool, typer.Option("--no-runner", help="API only; run `tuner worker` processes instead")
    ] = False,
    log_level: str = "info",
) -> None:
    import uvicorn

    from tuner.api.app import create_app
    from tuner.wiring import make_runner

    settings = Settings()
    if settings.auto_migrate:
        _migrate(settings)
    background = make_runner if settings.in_process_runner and not no_runner else None
    uvicorn.run(create_app(settings, background=background), host=host, port=port, log_level=log_level)


@app.command(help="Run jobs from the database (several workers may share it).")
def worker(
    once: Annotated[bool, typer.Option("--once", help="run one job and exit")] = False,
    job: Annotated[str | None, typer.Option(help="with --once: this job")] = None,
) -> None:
    from tuner.store.db import make_engine, make_session_factory
    from tuner.wiring import make_runner

    settings = Settings()
    if settings.auto_migrate:
        _migrate(settings)
    engine = make_engine(settings.db_url)
    runner = make_runner(settings, make_session_factory(engine))
    log.info("worker %s polling %s", runner.worker, settings.db_url.split("@")[-1])
    if once:
        print(runner.run_once(job) or "no job to run")
        return
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        runner.stop(timeout=0)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    runner.start()
    stop.wait()
    runner.stop()
    engine.dispose()


class DbAction(StrEnum):
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    CURRENT = "current"


@app.command(help="Database migrations: upgrade [REVISION], downgrade [REVISION], current.")
def db(
    action: Annotated[DbAction, typer.Argument(case_sensitive=False)],
    revision: Annotated[str | None, typer.Argument()] = None,
) -> None:
    from tuner.store import migrate

    settings = Settings()
    if action is DbAction.UPGRADE:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        migrate.upgrade(settings.db_url, revision or "head")
    elif action is DbAction.DOWNGRADE:
        migrate.downgrade(settings.db_url, revision or "-1")
    print(migrate.current(settings.db_url) or "empty")


token_app = typer.Typer(help="API tokens (made and revoked on the database, not through the API).")
app.add_typer(token_app, name="token")


def default_token_name() -> str:
    """``cli-<user>-<UTC date and time>``: a token says who made it and when, so it can be found and revoked
    later (revoke takes the name; a shared default name would revoke everyone's tokens at once)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        user = "unknown"
    return f"cli-{user}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"


def _scopes() -> list[str]:
    from tuner.auth import Scope

    return [s.value for s in Scope]


@token_app.command("create", help="Make a bearer token; it is printed once, on stdout.")
def token_create(
    name: Annotated[str | None, typer.Option(help="what the token is for (default: cli-<user>-<time>)")] = None,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            help="read, tune or admin; repeatable; default: read. admin reads, cancels and deletes every team's "
            "jobs and samples",
        ),
    ] = None,
    team: Annotated[str, typer.Option(help="the team the token works for")] = "default",
) -> None:
    from tuner.auth import create_token

    name = name or default_token_name()
    scopes = scope or ["read"]
    if unknown := sorted(set(scopes) - set(_scopes())):
        raise typer.BadParameter(f"{', '.join(unknown)}: not among {', '.join(_scopes())}", param_hint="--scope")
    secret = _on_store(lambda s: create_token(s, name, scopes, team=team))
    print(f"token {name!r} for team {team}, scopes {', '.join(sorted(scopes))} (shown once):", file=sys.stderr)
    print(secret)


@token_app.command("revoke", help="Revoke every live token of a name.")
def token_revoke(name: Annotated[str, typer.Option(help="the token's name, as `token create` gave it")]) -> None:
    from tuner.auth import revoke_token

    print(f"revoked {_on_store(lambda s: revoke_token(s, name))} token(s)")


def _on_store(use: Callable[[Session], T]) -> T:
    """Run one use case in a transaction on the service's database; a use-case error is a message."""
    from tuner.errors import TunerError
    from tuner.store.db import make_engine, make_session_factory, transaction

    settings = Settings()
    if settings.auto_migrate:  # as serve and worker do: `token create` may be the first command on a machine
        _migrate(settings)
    engine = make_engine(settings.db_url)
    try:
        with transaction(make_session_factory(engine)) as s:
            return use(s)
    except TunerError as e:
        raise ClientError(e.detail) from None
    finally:
        engine.dispose()


@app.command(help="The quickstart: tune a model on sample traffic and print the recommendation.")
def demo(
    model: Annotated[str | None, typer.Option(help="default: Llama-3.1-8B-Instruct (simulated)")] = None,
    engine: Annotated[Literal["auto", "vllm", "simulated"], typer.Option()] = "auto",
    budget: int = 16,
) -> None:
    from tuner.demo import run_demo

    raise typer.Exit(run_demo(Settings(), model=model, engine=engine, budget=budget))


def _register_tools() -> None:
    from tuner import client_cli, space_cli
    from tuner.workers import bench_cli, trial_cli

    space_cli.register(app, Settings)
    trial_cli.register(app, vllm_executable=lambda: Settings().vllm_executable)
    bench_cli.register(app)
    client_cli.register(app)


_register_tools()

# Flags that took several values under argparse (nargs="+"): `--concurrency 1 8`. Click's options take one
# value each, repeated; main() rewrites the first spelling into the second so both keep working.
_LIST_FLAGS: dict[str, frozenset[str]] = {
    "trial": frozenset({"--concurrency", "--rate"}),
    "bench": frozenset({"--concurrency", "--rate"}),
    "space": frozenset({"--methods"}),
    "tune": frozenset({"--concurrency"}),
}


def spread_list_flags(argv: Sequence[str]) -> list[str]:
    """``--concurrency 1 8 --json`` -> ``--concurrency 1 --concurrency 8 --json`` for the commands above."""
    command = next((a for a in argv if not a.startswith("-")), None)
    flags = _LIST_FLAGS.get(command or "", frozenset())
    out: list[str] = []
    current: str | None = None
    taken = 0
    for arg in argv:
        if arg in flags:
            current, taken = arg, 0
            continue
        is_value = not arg.startswith("-") or _is_number(arg)
        if current is not None and is_value:
            out += [current, arg]
            taken += 1
            continue
        if current is not None and taken == 0:
            out.append(current)  # no value: let Click say so
        current = None
        out.append(arg)
    if current is not None and taken == 0:
        out.append(current)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit code. A usage error is Typer's message (exit 2); a client error
    (the API's problem+json, an unreachable server, a bad file or config) is its message on stderr (exit 1).
    Neither is a traceback."""
    args = spread_list_flags(sys.argv[1:] if argv is None else argv)
    try:
        app(args=args, prog_name="tuner")  # standalone: ends in SystemExit with the command's code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except ClientError as e:
        name = next((a for a in args if not a.startswith("-")), None)
        print(f"tuner {name}: {e}" if name else f"tuner: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
