"""The planner's study lives in our own database, beside our tables, on every backend."""

from sqlalchemy import create_engine, inspect

from tests.search.fake_engine import FakeEngine, levels
from tuner.domain import Budget, Method, ModelRef, TrialSpec
from tuner.search import OptunaPlanner, build_space

LEVELS = levels(1, 8, 32)


def test_study_in_the_tuner_database_resumes_and_keeps_tell_idempotent(db_url):
    tables_before = set(inspect(create_engine(db_url)).get_table_names())
    space = build_space(
        "m",
        None,
        hardware="h100",
        vllm_version="0.34.0",
        methods=[Method.NGRAM],
        ngram_lookups=[(2, 4)],
        depth_range=(1, 4),
    )
    engine = FakeEngine()
    first = OptunaPlanner(
        space, LEVELS, storage=db_url, study_name="job-42", budget=Budget(max_trials=4), confirm_runs=1
    )
    p = first.ask()
    result = engine(TrialSpec(model=ModelRef("m"), spec=p.spec, levels=LEVELS, requests=()))
    first.tell(p.number, result)
    second = OptunaPlanner(
        space, LEVELS, storage=db_url, study_name="job-42", budget=Budget(max_trials=4), confirm_runs=1
    )
    second.tell(p.number, result)  # a duplicate tell from another process is ignored
    assert len(second.history()) == 1
    while (q := second.ask()) is not None:
        second.tell(
            q.number,
            engine(
                TrialSpec(
                    model=ModelRef("m"),
                    spec=q.spec,
                    levels=LEVELS,
                    requests=(),
                    reference_outputs=result.reference_outputs,
                )
            ),
        )
    assert second.finished and second.history()[0][0].spec.is_off
    assert sum(1 for pr, _ in second.history() if pr.spec.is_off and pr.purpose == "baseline") == 1
    tables = set(inspect(create_engine(db_url)).get_table_names())
    assert tables_before <= tables and {"studies", "trials"} <= tables
