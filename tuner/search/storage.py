"""Optuna's RDB storage, retried through transient database errors, with writes that are safe to repeat.

A study outlives a database restart: each storage call is retried (``tuner.transient``) while the error is
transient. When the connection drops during COMMIT the first attempt may have gone through, so the calls
whose repeat is not a no-op look first for what it stored:

- a new trial carries a one-off system attribute (``tuner:op:<uuid>``); a retry finds the trial by it
  instead of creating a second one;
- a state change (``tell``, popping a waiting trial) is done when the trial already has that state.

Attribute and parameter writes are upserts (or ignore the duplicate), reads are reads: retried as they are.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from optuna.storages import RDBStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import IntegrityError

from tuner.transient import DEFAULT_RETRY_S, retrying

T = TypeVar("T")
_OP_KEY = "tuner:op:"

# Calls whose repeat is harmless: reads, upserts, and writes RDBStorage itself makes ignore a duplicate.
_REPEATABLE = (
    "create_new_study",  # a repeat raises DuplicatedStudyError: create_study(load_if_exists=True) loads it
    "set_study_user_attr",
    "set_study_system_attr",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "get_trial_user_attrs",
    "get_trial_system_attrs",
    "get_all_studies",
    "_set_trial_param",
    "get_trial_param",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
    "get_trial_id_from_study_id_trial_number",
    "get_trial",
    "get_all_trials",
    "_get_trials",
    "_get_best_trial_id",
    "record_heartbeat",
    "_get_stale_trial_ids",
)


class RetryingRDBStorage(RDBStorage):
    """An ``RDBStorage`` for one planner: every call retried for ``retry_s`` seconds of transient errors."""

    def __init__(self, url: str, *, retry_s: float = DEFAULT_RETRY_S) -> None:
        self._retry_s = retry_s
        # pool_pre_ping: a connection the restart closed is replaced at checkout instead of failing a call
        kwargs: dict[str, Any] = {"pool_pre_ping": True, "hide_parameters": True}
        for attempt in range(3):
            try:
                retrying(lambda: RDBStorage.__init__(self, url, engine_kwargs=kwargs), what="open the Optuna storage")
                return
            except Exception as e:
                # Two processes creating Optuna's tables in a fresh database at once: one wins, the other hits
                # a unique violation; its next attempt finds the tables made.
                if attempt == 2 or not _lost_creation_race(e):
                    raise

    def _retried(self, what: str, call: Callable[[], T], done: Callable[[], T | None] | None = None) -> T:
        attempts = 0

        def once() -> T:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and done is not None:  # the previous attempt's commit may have gone through
                found = done()
                if found is not None:
                    return found
            return call()

        return retrying(once, what=f"Optuna storage: {what}", retry_s=self._retry_s)

    def _create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> FrozenTrial:
        key = f"{_OP_KEY}{uuid.uuid4().hex}"
        template = copy.deepcopy(template_trial) if template_trial is not None else _running_template()
        template.system_attrs = {**template.system_attrs, key: True}

        def stored() -> FrozenTrial | None:
            trials = RDBStorage.get_all_trials(self, study_id, deepcopy=False)
            return next((t for t in trials if key in t.system_attrs), None)

        return self._retried("create a trial", lambda: self._create_once(study_id, template), stored)

    def _create_once(self, study_id: int, template: FrozenTrial) -> FrozenTrial:
        """RDBStorage._create_new_trial without its own retry loop, which repeats a creation whose commit
        may have gone through (ours checks the op key first)."""
        with _create_scoped_session(self.scoped_session) as session:
            # the study row's lock serialises trial numbering, as in RDBStorage
            models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
            row = self._get_prepared_new_trial(study_id, template, session)
            frozen = copy.deepcopy(template)
            frozen.number = row.number
            frozen.datetime_start = row.datetime_start
            frozen._trial_id = row.trial_id
        return frozen

    def set_trial_user_attrs(self, trial_id: int, attrs: Mapping[str, Any]) -> None:
        """Several user attrs of a trial in one transaction: a told result and its figures land together, at
        the cost of one commit instead of one per attr. Upserts, so a retry after a lost commit is harmless."""

        def once() -> None:
            # RDBStorage.set_trial_user_attr's find-or-add for every attr in one session, from the models
            # Optuna 4 and 5 share (its private helper was renamed: docs/optuna-dashboard.md, "Optuna's RDB
            # storage internals"); only the job's one runner writes its trials, so no upsert race.
            with _create_scoped_session(self.scoped_session, True) as session:
                trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
                self.check_trial_is_updatable(trial_id, trial.state)
                for key, value in attrs.items():
                    row = models.TrialUserAttributeModel.find_by_trial_and_key(trial, key, session)
                    if row is None:
                        row = models.TrialUserAttributeModel(trial_id=trial_id, key=key)
                        session.add(row)
                    row.value_json = json.dumps(value)

        self._retried(f"set {len(attrs)} user attrs of trial {trial_id}", once)

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        def stored() -> bool | None:
            # Only the job's one runner changes its trials' states, so the state it asked for is its own.
            return True if RDBStorage.get_trial(self, trial_id).state == state else None

        return self._retried(
            f"set trial {trial_id} {state.name}",
            lambda: RDBStorage.set_trial_state_values(self, trial_id, state, values),
            stored,
        )


def _lost_creation_race(exc: BaseException) -> bool:
    cur: BaseException | None = exc
    while cur is not None:
        if isinstance(cur, IntegrityError):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _running_template() -> FrozenTrial:
    """What RDBStorage creates for ``create_new_trial(study_id)`` with no template: a RUNNING trial, now."""
    return FrozenTrial(
        number=-1,
        state=TrialState.RUNNING,
        value=None,
        datetime_start=datetime.now(),
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs={},
        system_attrs={},
        intermediate_values={},
        trial_id=-1,
    )


def _repeatable(name: str) -> Callable[..., Any]:
    base = getattr(RDBStorage, name)

    def call(self: RetryingRDBStorage, *args: Any, **kwargs: Any) -> Any:
        return self._retried(name, lambda: base(self, *args, **kwargs))

    call.__name__ = name
    call.__doc__ = base.__doc__
    return call


for _name in _REPEATABLE:
    setattr(RetryingRDBStorage, _name, _repeatable(_name))
