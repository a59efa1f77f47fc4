"""The study's storage through transient errors: a failed call is retried, and a call whose commit went
through before the connection dropped is not repeated (no second trial, no double tell)."""

from __future__ import annotations

from collections.abc import Callable

import optuna
import psycopg
import pytest
from optuna.trial import TrialState
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from tuner.search.storage import RetryingRDBStorage


def _drop_once(storage: RetryingRDBStorage, moment: str) -> Callable[[], int]:
    """Fail the next commit like a server restart: before it (nothing stored) or after it (stored, but the
    client never heard). Returns how many times it fired."""
    fired = {"n": 0, "armed": True}

    def boom(session: object) -> None:
        if fired["armed"]:
            fired["armed"] = False
            fired["n"] += 1
            raise OperationalError("COMMIT", {}, psycopg.OperationalError("server closed the connection"))

    event.listen(storage.scoped_session.session_factory, moment, boom)
    return lambda: fired["n"]


@pytest.fixture
def study(db_url: str) -> optuna.Study:
    storage = RetryingRDBStorage(db_url, retry_s=30)
    return optuna.create_study(storage=storage, study_name="s", load_if_exists=True)


@pytest.mark.parametrize("moment", ["before_commit", "after_commit"])
def test_a_dropped_commit_creates_one_trial_and_tells_once(study: optuna.Study, moment: str) -> None:
    storage = study._storage._backend  # type: ignore[attr-defined]
    fired = _drop_once(storage, moment)
    trial = study.ask()
    assert fired() == 1
    assert len(study.get_trials()) == 1

    study.enqueue_trial({"x": 1.0}, user_attrs={"k": "v"})
    fired2 = _drop_once(storage, moment)
    popped = study.ask()
    assert fired2() == 1
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING, TrialState.RUNNING]
    assert popped.user_attrs == {"k": "v"}

    fired3 = _drop_once(storage, moment)
    study.tell(trial, 1.0)
    assert fired3() == 1
    study.tell(popped, state=TrialState.FAIL)
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.COMPLETE, TrialState.FAIL]
    assert study.get_trials()[0].value == 1.0


def test_a_lasting_error_is_raised_after_the_retries(db_url: str) -> None:
    storage = RetryingRDBStorage(db_url, retry_s=0.5)
    study = optuna.create_study(storage=storage, study_name="t")

    def boom(session: object) -> None:
        raise OperationalError("COMMIT", {}, psycopg.OperationalError("connection refused"))

    event.listen(storage.scoped_session.session_factory, "before_commit", boom)
    with pytest.raises(Exception, match="commit|connection"):
        study.set_user_attr("a", 1)


@pytest.mark.parametrize("moment", ["before_commit", "after_commit"])
def test_a_dropped_commit_stores_a_trials_attrs_once(study: optuna.Study, moment: str) -> None:
    from optuna.storages._rdb import models

    storage = study._storage._backend  # type: ignore[attr-defined]
    trial = study.ask()
    fired = _drop_once(storage, moment)
    storage.set_trial_user_attrs(trial._trial_id, {"result": {"a": [1, 2]}, "c1.output_tok_s": 12.5})
    assert fired() == 1
    storage.set_trial_user_attrs(trial._trial_id, {"c1.output_tok_s": 13.0})  # an update, not a second row
    assert study.get_trials()[0].user_attrs == {"result": {"a": [1, 2]}, "c1.output_tok_s": 13.0}
    with storage.scoped_session() as session:
        keys = [row.key for row in session.query(models.TrialUserAttributeModel).all()]
    assert sorted(keys) == ["c1.output_tok_s", "result"]
