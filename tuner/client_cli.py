"""The ``tuner`` client commands: tune, jobs, status, cancel, recommend, report, against a running service.

The server and token come from ``--server``/``--token``, ``$TUNER_SERVER``/``$TUNER_TOKEN``, or the client
config file (``tuner/client_config.py``). Answers go to stdout, progress and errors to stderr; an error the API
answers is printed as its problem+json title, detail and field errors, with a non-zero exit.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from tuner.cli_progress import JobView, best_text, job_line, stderr_console, stdout_console, trial_label
from tuner.client import ClientError, JobSnapshot, ServerUnreachable, TunerClient, follow
from tuner.client_config import config_path, resolve

LIST_FLAGS = ("--concurrency",)  # space-separated values, as `tuner trial` takes them
_SAMPLE_ID = re.compile(r"^[0-9a-f]{32}$")

Server = Annotated[
    str | None,
    typer.Option(help="the spec-tuner URL (default: $TUNER_SERVER, the client config file, http://127.0.0.1:8000)"),
]
Token = Annotated[str | None, typer.Option(help="API token (default: $TUNER_TOKEN, else the client config file)")]
JsonOut = Annotated[bool, typer.Option("--json", help="print the API's JSON")]
Poll = Annotated[float, typer.Option(min=0.05, help="seconds between looks at the job")]


@contextmanager
def connected(server: str | None, token: str | None) -> Iterator[TunerClient]:
    cfg = resolve(server, token)
    try:
        with TunerClient(cfg.server, cfg.token) as client:
            yield client
    except ServerUnreachable as exc:
        # say where the URL came from: a stale $TUNER_SERVER or config file is the usual cause
        raise ClientError(f"{exc} (URL from {cfg.source}; set --server, $TUNER_SERVER or {config_path()})") from None


def _emit_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def follow_job(client: TunerClient, job_id: str, *, poll_s: float = 0.5, console: Console | None = None) -> JobSnapshot:
    """Follow a job to its end, drawing it on stderr; the last snapshot. Ctrl-C stops following only: the job
    keeps running and the message says how to pick it up again."""
    console = console or stderr_console()
    last: JobSnapshot | None = None
    try:
        with JobView(console, job_id) as view:
            for last in follow(client, job_id, poll_s=poll_s):
                view.update(last)
    except KeyboardInterrupt:
        console.print(
            f"\nstopped following; job {job_id} keeps running on the server.\n"
            f"  follow it: tuner status {job_id} --wait\n  stop it:   tuner cancel {job_id}",
            markup=False,
        )
        raise typer.Exit(130) from None
    assert last is not None  # follow yields at least once
    return last


def print_outcome(snap: JobSnapshot) -> None:
    """The end of a followed job: what ran, what failed and why, the best, and where the answer is."""
    job = snap.job
    failed = [t for t in snap.trials if t.get("failure_class")]
    print(f"job {job['id']} {job['status']}: {len(snap.trials)} trials, {len(failed)} failed")
    for t in failed:
        print(f"  trial {t['number']} {trial_label(t)}: {t['failure_class']}: {t.get('failure_reason')}")
    if job.get("error"):
        print(f"  error: {job['error']}")
    print(f"  {best_text(job.get('best'))}")
    if job["status"] == "succeeded":
        engine = " --engine simulated" if job.get("simulated") else ""
        hardware = f" --hardware {job['hardware']}" if job.get("hardware") not in (None, "auto") else ""
        print(f"  the answer: tuner recommend --model {job['model']}{hardware}{engine}")
        print(f"  the report: tuner report {job['id']}")


def trials_table(trials: list[dict[str, Any]]) -> Table:
    table = Table("#", "purpose", "config", "status", "s", "failure", box=None, pad_edge=False)
    gpu = any(t.get("gpu_seconds") is not None for t in trials)
    if gpu:
        table.add_column("GPU-s")
    for t in trials:
        failure = f"{t['failure_class']}: {t.get('failure_reason') or ''}" if t.get("failure_class") else ""
        row = [
            str(t["number"]),
            t.get("purpose", ""),
            trial_label(t),
            t["status"],
            f"{t['duration_s']:.1f}" if t.get("duration_s") is not None else "",
            failure[:120],
        ]
        if gpu:
            row.append(f"{t['gpu_seconds']:.0f}" if t.get("gpu_seconds") is not None else "")
        table.add_row(*row)
    return table


def _tune_body(
    job: Path | None,
    model: str,
    traffic_id: str,
    hardware: str | None,
    engine: str | None,
    budget: int | None,
    concurrency: list[int] | None,
    num_requests: int | None,
    hf_config: Path | None,
) -> dict[str, Any]:
    """A POST /tune body: the --job file's, with the flags laid over it."""
    try:
        body: dict[str, Any] = json.loads(job.read_text()) if job else {}
        config = json.loads(hf_config.read_text()) if hf_config else None
    except (OSError, json.JSONDecodeError) as exc:
        raise ClientError(str(exc)) from None
    if not isinstance(body, dict):
        raise ClientError(f"{job}: a POST /tune body is a JSON object")
    body |= {"model": model, "traffic": traffic_id}
    given = {
        "hardware": hardware,
        "engine": engine,
        "concurrency": concurrency or None,
        "num_requests": num_requests,
        "hf_config": config,
    }
    body |= {k: v for k, v in given.items() if v is not None}
    if budget is not None:
        body["budget"] = dict(body.get("budget") or {}) | {"max_trials": budget}
    return body


def register(app: typer.Typer) -> None:
    """Add the client commands to ``app``."""

    @app.command("tune", help="Upload traffic and queue a tune job; --wait follows it to the end.")
    def tune(
        model: Annotated[str, typer.Option(help="HF id, or a path that exists on the workers")],
        traffic: Annotated[
            str, typer.Option(help="a traffic file (JSONL, JSON, ShareGPT), or the id of an uploaded sample")
        ],
        hardware: Annotated[str | None, typer.Option(help="the chip family to run on (default: auto)")] = None,
        engine: Annotated[Literal["vllm", "simulated"] | None, typer.Option(help="default: vllm")] = None,
        budget: Annotated[int | None, typer.Option(help="search trials (the API's default: 12)")] = None,
        concurrency: Annotated[list[int] | None, typer.Option(help="load levels, e.g. --concurrency 1 8 32")] = None,
        num_requests: Annotated[int | None, typer.Option(help="measured requests per level")] = None,
        hf_config: Annotated[Path | None, typer.Option(help="the model's config.json, when workers lack it")] = None,
        job: Annotated[Path | None, typer.Option(help="a POST /tune body (JSON) for everything else")] = None,
        wait: Annotated[bool, typer.Option("--wait", help="follow the job to its end")] = False,
        poll: Poll = 1.0,
        server: Server = None,
        token: Token = None,
        json_out: JsonOut = False,
    ) -> None:
        err = stderr_console()
        with connected(server, token) as client:
            path = Path(traffic).expanduser()
            if not path.exists() and _SAMPLE_ID.match(traffic):
                traffic_id = traffic
            else:
                sample = client.upload_traffic(path)
                traffic_id = sample["id"]
                err.print(
                    f"traffic {traffic_id}: {sample['request_count']} requests, workload {sample['workload_class']}",
                    markup=False,
                )
            body = _tune_body(job, model, traffic_id, hardware, engine, budget, concurrency, num_requests, hf_config)
            created = client.submit(body)
            job_id = created["id"]
            if not wait:
                if json_out:
                    _emit_json(created)
                else:
                    print(job_id)
                err.print(f"job {job_id} {created['status']}; follow it: tuner status {job_id} --wait", markup=False)
                return
            err.print(f"job {job_id} {created['status']} (Ctrl-C stops following, not the job)", markup=False)
            snap = follow_job(client, job_id, poll_s=poll, console=err)
        if json_out:
            _emit_json(snap.job)
        else:
            print_outcome(snap)
        raise typer.Exit(0 if snap.job["status"] == "succeeded" else 1)

    @app.command("jobs", help="List your team's jobs, newest first.")
    def jobs(
        limit: Annotated[int, typer.Option(min=1, max=200)] = 20,
        status: Annotated[
            Literal["queued", "running", "succeeded", "failed", "cancelled"] | None, typer.Option(help="only these")
        ] = None,
        server: Server = None,
        token: Token = None,
        json_out: JsonOut = False,
    ) -> None:
        with connected(server, token) as client:
            listed = client.jobs(limit=limit, status=status)
        if json_out:
            _emit_json(listed)
            return
        if not listed:
            print("no jobs")
            return
        table = Table("id", "status", "model", "hardware", "engine", "trials", "best", "created", box=None)
        for j in listed:
            snap = JobSnapshot(j, [])
            budget = f" (budget {snap.budget})" if snap.budget is not None else ""
            table.add_row(
                j["id"],
                j["status"],
                j["model"],
                j["hardware"],
                j["engine"],
                f"{snap.done}{budget}",
                best_text(j.get("best")).removeprefix("best "),
                str(j.get("created_at") or "")[:19],
            )
        stdout_console().print(table)

    @app.command("status", help="A job's status, progress and trials; --wait follows it to the end.")
    def status(
        job_id: Annotated[str, typer.Argument(metavar="ID", help="the job id")],
        wait: Annotated[bool, typer.Option("--wait", help="follow the job to its end")] = False,
        poll: Poll = 1.0,
        server: Server = None,
        token: Token = None,
        json_out: JsonOut = False,
    ) -> None:
        with connected(server, token) as client:
            if wait:
                snap = follow_job(client, job_id, poll_s=poll)
            else:
                snap = JobSnapshot(client.job(job_id), client.trials(job_id))
        if json_out:
            _emit_json(snap.job | {"trials": snap.trials})
            return
        job = snap.job
        print(f"job {job['id']}: {job['model']} on {job['hardware']} ({job['engine']}, objective {job['objective']})")
        print(f"  {job_line(snap)}")
        if job.get("error"):
            print(f"  error: {job['error']}")
        if snap.trials:
            stdout_console().print(trials_table(snap.trials))

    @app.command("cancel", help="Stop a job (its runner stops the running trials).")
    def cancel(
        job_id: Annotated[str, typer.Argument(metavar="ID", help="the job id")],
        server: Server = None,
        token: Token = None,
        json_out: JsonOut = False,
    ) -> None:
        with connected(server, token) as client:
            job = client.cancel(job_id)
        if json_out:
            _emit_json(job)
        else:
            print(f"job {job['id']}: cancel requested ({job['status']})")

    @app.command("recommend", help="The configuration to deploy for a model, and its `vllm serve` command.")
    def recommend(
        model: Annotated[str, typer.Option(help="the model, as jobs named it")],
        concurrency: Annotated[int | None, typer.Option(help="the answer for this concurrency's range")] = None,
        hardware: Annotated[str | None, typer.Option(help="the chip family")] = None,
        workload: Annotated[
            str | None, typer.Option(help="a workload class, or the id/fingerprint of an uploaded sample")
        ] = None,
        engine: Annotated[
            Literal["vllm", "simulated"] | None, typer.Option(help="simulated answers only when asked for")
        ] = None,
        server: Server = None,
        token: Token = None,
        json_out: JsonOut = False,
    ) -> None:
        with connected(server, token) as client:
            rec = client.recommendation(
                model, concurrency=concurrency, hardware=hardware, workload=workload, engine=engine
            )
        if json_out:
            _emit_json(rec)
        else:
            print_recommendation(rec)

    @app.command("report", help="Save a job's self-contained HTML report.")
    def report(
        job_id: Annotated[str, typer.Argument(metavar="ID", help="the job id")],
        output: Annotated[
            Path | None, typer.Option("--output", "-o", help="where to write it (default: tuner-report-<id>.html)")
        ] = None,
        server: Server = None,
        token: Token = None,
    ) -> None:
        with connected(server, token) as client:
            html = client.report(job_id)
        path = output or Path(f"tuner-report-{job_id}.html")
        try:
            path.write_bytes(html)
        except OSError as exc:
            raise ClientError(f"{path}: {exc.strerror or exc}") from None
        print(path)


def print_recommendation(rec: dict[str, Any]) -> None:
    """A recommendation as people read it: the summary, the config, the `vllm serve` command, the evidence."""
    banner = "=" * 78
    tag = "SIMULATED " if rec["simulated"] else ""
    say = print
    say(banner)
    say(f"{tag}RECOMMENDATION for {rec['model']['name']} on {rec['hardware']} (engine: {rec['engine']})")
    say(banner)
    say(rec["summary"])
    say("--speculative-config " + (json.dumps(rec["speculative_config"]) if rec["speculative_config"] else "(none)"))
    say("deploy: " + rec["deploy_command"])
    if rec.get("acceptance_length"):
        say(f"mean acceptance length: {rec['acceptance_length']:.2f}")
    for w in rec.get("per_level_winners") or []:
        say(f"  best at {w['level']}: {_spec_label(w['spec'])} ({w['speedup']:.2f}x vs no speculation)")
    for note in rec.get("notes") or []:
        say(f"note: {note}")
    say(f"provenance: job {rec['provenance']['job_id']}, trials {rec['provenance']['trial_numbers']}")


def _spec_label(spec: dict[str, Any]) -> str:
    if spec.get("method") in (None, "off"):
        return "off"
    return f"{spec['method']} k={spec.get('num_speculative_tokens')}" + (
        f" schedule={spec['schedule']}" if spec.get("schedule") else ""
    )
