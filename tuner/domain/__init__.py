"""The domain model: what a tune job, a trial and a recommendation are.

Every other package (api, store, search, workers) depends on this package and on nothing of each other. It
imports the standard library, and pydantic for the JSON codec only. Values are frozen dataclasses; JSON
round trips go through :func:`to_jsonable` / :func:`from_jsonable` so the store and the API never hand-roll
the shapes. The public names of its modules are re-exported here: import them from ``tuner.domain``.
"""

from tuner.domain.codec import (
    canonical_json,
    fingerprint,
    from_jsonable,
    to_jsonable,
)
from tuner.domain.contracts import (
    Evaluator,
    Planner,
    Proposal,
    TrialContext,
    TrialSpec,
)
from tuner.domain.job import (
    JobSpec,
    JobStatus,
    Objective,
)
from tuner.domain.methods import (
    DEFAULT_DEPTH_RANGE,
    DRAFT_METHODS,
    METHOD_TRAITS,
    DepthRule,
    DraftNeed,
    Method,
    MethodTraits,
    Proposer,
    mtp_depth_allowed,
    mtp_depths,
)
from tuner.domain.outcome import (
    ConcurrencyRange,
    LevelWinner,
    Recommendation,
    SkippedCandidate,
    Speedup,
    TuneOutcome,
)
from tuner.domain.results import (
    CorrectnessReport,
    Engine,
    Failure,
    FailureClass,
    LatencyStats,
    LevelResult,
    RequestComparison,
    SpecDecodeStats,
    TrialResult,
    TrialStatus,
    percentile,
)
from tuner.domain.serving import (
    SERVING_ARG_TYPES,
    SERVING_ENV_ALLOWED,
    SERVING_ENV_CONFINED_PATHS,
    ModelRef,
    ServingConfig,
    UnsafeArgument,
    argv_value_problem,
    check_argv_value,
    env_name_allowed,
    env_name_problem,
    serve_argv,
)
from tuner.domain.spec_config import (
    SpecConfig,
)
from tuner.domain.versions import (
    Version,
    parse_version,
)
from tuner.domain.workload import (
    SLO,
    Budget,
    LoadKind,
    LoadLevel,
    TrafficFormat,
    TrafficRequest,
)

__all__ = [
    "Budget",
    "ConcurrencyRange",
    "CorrectnessReport",
    "DEFAULT_DEPTH_RANGE",
    "DRAFT_METHODS",
    "DepthRule",
    "DraftNeed",
    "Engine",
    "Evaluator",
    "Failure",
    "FailureClass",
    "JobSpec",
    "JobStatus",
    "LatencyStats",
    "LevelResult",
    "LevelWinner",
    "LoadKind",
    "LoadLevel",
    "METHOD_TRAITS",
    "Method",
    "MethodTraits",
    "ModelRef",
    "Objective",
    "Planner",
    "Proposal",
    "Proposer",
    "Recommendation",
    "RequestComparison",
    "SERVING_ARG_TYPES",
    "SERVING_ENV_ALLOWED",
    "SERVING_ENV_CONFINED_PATHS",
    "SLO",
    "ServingConfig",
    "SkippedCandidate",
    "SpecConfig",
    "SpecDecodeStats",
    "Speedup",
    "TrafficFormat",
    "TrafficRequest",
    "TrialContext",
    "TrialResult",
    "TrialSpec",
    "TrialStatus",
    "TuneOutcome",
    "UnsafeArgument",
    "Version",
    "argv_value_problem",
    "canonical_json",
    "check_argv_value",
    "env_name_allowed",
    "env_name_problem",
    "fingerprint",
    "from_jsonable",
    "mtp_depth_allowed",
    "mtp_depths",
    "parse_version",
    "percentile",
    "serve_argv",
    "to_jsonable",
]
