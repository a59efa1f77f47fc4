"""Search: from a model's config to a confirmed speculative-decoding recommendation.

The only package that imports Optuna. Public names are re-exported here; the modules are private.
"""

from tuner.domain import mtp_depths
from tuner.search._space import ExcludedMethod, MethodOptions, SearchSpace, build_space
from tuner.search.catalog import DEFAULT_CATALOG, DraftCatalog, DraftEntry
from tuner.search.compat import DEFAULT_RULES, CompatRule, load_rules
from tuner.search.cost_model import StepModel, TokenCurve
from tuner.search.extrapolation import AcceptanceCurve
from tuner.search.levels import default_levels
from tuner.search.library import TuneReport, tune
from tuner.search.model_config import ModelTraits, model_traits, read_model_config
from tuner.search.objective import level_metric
from tuner.search.planner import OptunaPlanner
from tuner.search.schedule import batch_ranges, build_schedule

__all__ = [
    "DEFAULT_CATALOG",
    "DEFAULT_RULES",
    "AcceptanceCurve",
    "CompatRule",
    "DraftCatalog",
    "DraftEntry",
    "ExcludedMethod",
    "MethodOptions",
    "ModelTraits",
    "OptunaPlanner",
    "SearchSpace",
    "StepModel",
    "TokenCurve",
    "TuneReport",
    "batch_ranges",
    "build_schedule",
    "build_space",
    "default_levels",
    "level_metric",
    "load_rules",
    "model_traits",
    "mtp_depths",
    "read_model_config",
    "tune",
]
