"""Run by test_resume_kill.py in a subprocess: a tune on a SQLite study, logging each trial it starts."""

import sys
import time

import optuna

from tuner.domain import Budget, Method, ModelRef, TrafficRequest
from tuner.search import build_space, tune
from tuner.workers.simulated import PRESETS, WORKLOADS, SimulatedEngine

LEVELS_C = (1, 8, 32, 128)


def main(url: str, log: str, delay: float) -> None:
    from tests.search.fake_engine import levels

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    engine = SimulatedEngine(PRESETS["llama-3.1-8b"], WORKLOADS["code"], seed=1)

    def evaluator(spec):
        with open(log, "a") as f:
            f.write(f"{spec.number} {spec.spec.key()}\n")
        time.sleep(delay)
        return engine(spec)

    space = build_space(
        "m",
        None,
        hardware="h100",
        vllm_version="0.34.0",
        methods=[Method.EAGLE3, Method.NGRAM],
        drafts={Method.EAGLE3: ["d/eagle3"]},
        ngram_lookups=[(2, 4)],
    )
    report = tune(
        space,
        evaluator,
        model=ModelRef("m"),
        requests=[TrafficRequest(format="completions", prompt="x")],
        levels=levels(*LEVELS_C),
        budget=Budget(max_trials=17),
        storage=url,
        study_name="killed",
    )
    print(report.outcome.best.label())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
