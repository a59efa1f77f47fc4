"""What the ``tuner`` command shows while something runs: a followed job, a trial's stages. On stderr, so
stdout stays the command's answer (a job id, JSON).

On a terminal it is a live rich progress bar; anywhere else (CI logs, a pipe) a line each time the picture
changes, so a log reads as a history rather than a smear of redraws.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tuner.client import JobSnapshot
from tuner.domain import TrialProgress, TrialStage


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def stdout_console() -> Console:
    """For tables on stdout: the terminal's width there, unbounded in a pipe (a log or grep wants whole ids)."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=100_000)


def trial_label(trial: dict[str, Any]) -> str:
    """``ngram k=3`` from a trial (or a recommendation's winner) as the API shows it."""
    spec = trial.get("speculative_config") or trial.get("spec") or {}
    method = spec.get("method") or trial.get("method") or "off"
    if method == "off":
        return "off"
    k = spec.get("num_speculative_tokens")
    return f"{method} k={k}" if k is not None else str(method)


def best_text(best: dict[str, Any] | None) -> str:
    if not best:
        return "no best yet (no baseline)"
    speedup = best.get("speedup") or {}
    mean = speedup.get("mean")
    shown = f"{best.get('label', '?')} {mean:.2f}x" if isinstance(mean, int | float) else str(best.get("label"))
    return "best " + shown + (" [SIMULATED]" if best.get("simulated") else "")


def _seconds_since(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        at = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return (datetime.now(UTC) - (at if at.tzinfo else at.replace(tzinfo=UTC))).total_seconds()


def running_text(trial: dict[str, Any], *, clock: bool = True) -> str:
    """The trial in progress: number, configuration, purpose, and its stage and level when the API says them
    (``phase``/``level`` on a trial; otherwise how long it has run)."""
    text = f"trial {trial['number']} {trial_label(trial)} ({trial.get('purpose', '?')})"
    phase, level = trial.get("phase"), trial.get("level")
    if phase:
        text += f" {phase}" + (f" {level}" if level else "")
    elif clock and (age := _seconds_since(trial.get("started_at"))) is not None:
        text += f" running {age:.0f} s"
    return text


def job_line(snap: JobSnapshot, *, clock: bool = True) -> str:
    """One line for a job: status, trials done of the budget, the trial(s) in progress, the best so far."""
    job = snap.job
    failed = (job.get("progress") or {}).get("trials_failed") or 0
    if snap.trials:
        head = f"{snap.search_done}" + (f"/{snap.budget}" if snap.budget is not None else "") + " trials"
        head += "".join(f", {n} {purpose}" for purpose, n in sorted(snap.other_done.items()))
    else:
        head = f"{snap.done} trials" + (f" (budget {snap.budget})" if snap.budget is not None else "")
    parts = [f"{job['status']}: {head}" + (f" ({failed} failed)" if failed else "")]
    parts += [running_text(t, clock=clock) for t in snap.running]
    if job["status"] == "queued" and job.get("waiting_for"):
        parts.append(job["waiting_for"])
    spent = (job.get("cost") or {}).get("gpu_seconds", job.get("gpu_seconds"))  # the API's cost, where it says
    if isinstance(spent, int | float) and spent:
        parts.append(f"{spent:.0f} GPU-s" + (" (simulated)" if job.get("simulated") else ""))
    parts.append(best_text(job.get("best")))
    return " | ".join(parts)


class JobView:
    """Draws a followed job: ``with JobView(console, job_id) as view: view.update(snapshot)``."""

    def __init__(self, console: Console, job_id: str) -> None:
        self.console = console
        self.job_id = job_id
        self._live = console.is_terminal
        self._progress: Progress | None = None
        self._task: Any = None
        self._last: str | None = None

    def __enter__(self) -> JobView:
        if self._live:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn(f"job {self.job_id[:8]}"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TextColumn("{task.description}", markup=False),  # labels hold brackets: not markup
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("queued", total=None)
        return self

    def update(self, snap: JobSnapshot) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=snap.search_done, total=snap.budget, description=job_line(snap))
            return
        line = job_line(snap, clock=False)  # without the clock, a line only when something happened
        if line != self._last:
            self.console.print(f"job {self.job_id}: {line}", soft_wrap=True, markup=False)
            self._last = line

    def __exit__(self, *_: object) -> None:
        if self._progress is not None:
            self._progress.stop()


class TrialView:
    """A trial's stages as ``tuner trial`` and ``tuner demo`` show them: server starting, ready, level i of n.

    Its :meth:`__call__` is a ``TrialContext.on_progress``."""

    def __init__(self, console: Console, label: str) -> None:
        self.console = console
        self.label = label

    def __call__(self, p: TrialProgress) -> None:
        if p.stage is TrialStage.STARTING:
            text = "server starting"
        elif p.stage is TrialStage.READY:
            text = "server ready" + (f" after {p.startup_s:.1f} s" if p.startup_s is not None else "")
        elif p.stage is TrialStage.MEASURING:
            text = f"level {p.level} of {p.levels} ({p.label})"
        else:
            text = "correctness check"
        self.console.print(f"[dim]{escape(self.label)}:[/dim] {escape(text)}", soft_wrap=True)
