"""Search tests: Optuna kept quiet, and a small controllable evaluator."""

from __future__ import annotations

import logging
import warnings

import optuna
import pytest

optuna.logging.set_verbosity(optuna.logging.WARNING)
logging.getLogger("optuna").setLevel(logging.WARNING)


@pytest.fixture(autouse=True)
def _quiet_optuna():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield
