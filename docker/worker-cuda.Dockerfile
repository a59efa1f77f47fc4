# A spec-tuner worker on NVIDIA GPUs, built on vLLM's official OpenAI-server image.
#   docker build -f docker/worker-cuda.Dockerfile --build-arg BASE_IMAGE=vllm/vllm-openai:<tag> -t spec-tuner-worker:cuda .
ARG BASE_IMAGE=vllm/vllm-openai:latest
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TUNER_DATA_DIR=/var/lib/spec-tuner \
    TUNER_VLLM_PYTHON=python3 \
    HF_HOME=/var/lib/spec-tuner/hf

WORKDIR /opt/spec-tuner
COPY pyproject.toml README.md ./
COPY tuner ./tuner
COPY migrations ./migrations
# The local project (its dependencies are bounded in pyproject.toml) and Ray at the cluster's exact version.
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir . "ray[default]==2.60.0" \
    && mkdir -p /var/lib/spec-tuner

# The base image's entrypoint starts `vllm serve`; the worker starts its own servers per trial.
ENTRYPOINT []
CMD ["tuner", "worker"]
