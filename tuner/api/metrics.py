"""Prometheus collector reading the store at scrape time, so jobs and trials of every runner process count."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from tuner.domain import JobStatus, TrialStatus
from tuner.store.models import JobRow, TrialRow

DURATION_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)


class StoreCollector(Collector):
    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        with self._factory() as s:
            jobs = dict(s.execute(select(JobRow.status, func.count()).group_by(JobRow.status)).all())
            trials = s.execute(
                select(TrialRow.engine, TrialRow.status, TrialRow.failure_class, func.count()).group_by(
                    TrialRow.engine, TrialRow.status, TrialRow.failure_class
                )
            ).all()
            durations = s.execute(
                select(TrialRow.engine, TrialRow.duration_s).where(TrialRow.duration_s.is_not(None))
            ).all()
            gpu_seconds = s.execute(
                select(TrialRow.engine, TrialRow.purpose, func.sum(TrialRow.gpu_seconds))
                .where(TrialRow.gpu_seconds.is_not(None))
                .group_by(TrialRow.engine, TrialRow.purpose)
            ).all()
        g = GaugeMetricFamily("tuner_jobs", "Tune jobs by status", labels=["status"])
        for st in JobStatus:
            g.add_metric([st.value], jobs.get(st.value, 0))
        yield g
        run = CounterMetricFamily(
            "tuner_trials_run", "Finished trials by engine and status", labels=["engine", "status"]
        )
        failed = CounterMetricFamily(
            "tuner_trials_failed", "Failed trials by failure class", labels=["engine", "class"]
        )
        agg_run: dict[tuple[str, str], int] = {}
        agg_fail: dict[tuple[str, str], int] = {}
        running = 0
        for engine, status, cls, n in trials:
            if not TrialStatus(status).is_finished():
                running += n
                continue
            agg_run[(engine or "", status)] = agg_run.get((engine or "", status), 0) + n
            if cls:
                agg_fail[(engine or "", cls)] = agg_fail.get((engine or "", cls), 0) + n
        for (engine, status), n in sorted(agg_run.items()):
            run.add_metric([engine, status], n)
        for (engine, cls), n in sorted(agg_fail.items()):
            failed.add_metric([engine, cls], n)
        yield run
        yield failed
        yield GaugeMetricFamily("tuner_trials_running", "Trials running now", value=running)
        h = HistogramMetricFamily("tuner_trial_duration_seconds", "Trial wall time", labels=["engine"])
        by_engine: dict[str, list[float]] = {}
        for engine, d in durations:
            if d is not None:  # none is: the query leaves them out, the row's type cannot say so
                by_engine.setdefault(engine or "", []).append(float(d))
        for engine, values in sorted(by_engine.items()):
            buckets = [(str(b), sum(v <= b for v in values)) for b in DURATION_BUCKETS] + [("+Inf", len(values))]
            h.add_metric([engine], buckets, sum_value=sum(values))
        yield h
        gs = CounterMetricFamily(
            "tuner_trial_gpu_seconds",
            "GPU-seconds held by finished trials (wall time x GPUs; simulated seconds for engine=simulated)",
            labels=["engine", "purpose"],
        )
        for engine, purpose, total in sorted(gpu_seconds, key=lambda r: (r[0] or "", r[1] or "")):
            gs.add_metric([engine or "", purpose or ""], float(total or 0.0))
        yield gs
