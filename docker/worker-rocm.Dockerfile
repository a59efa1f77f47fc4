# A spec-tuner worker on AMD Instinct GPUs, built on AMD's official ROCm vLLM image. vLLM, PyTorch and
# ROCm come from the base image; only spec-tuner (and Ray, for the Ray executor) are added. Pin the base
# to the tag (or digest) you validated: recommendations are keyed by the vLLM version it reports.
#   docker build -f docker/worker-rocm.Dockerfile --build-arg BASE_IMAGE=rocm/vllm:<tag> -t spec-tuner-worker:rocm .
ARG BASE_IMAGE=rocm/vllm:latest
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
# The base image's Python already has vLLM; installing into it keeps one interpreter for both.
# The local project (its dependencies are bounded in pyproject.toml) and Ray at the cluster's exact version.
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir . "ray[default]==2.60.0" \
    && mkdir -p /var/lib/spec-tuner

# GPU access comes from the devices the runtime passes (/dev/kfd, /dev/dri) and the video/render groups.
# Visibility: set HIP_VISIBLE_DEVICES (not ROCR_VISIBLE_DEVICES alone, which Ray refuses) or TUNER_GPUS.
CMD ["tuner", "worker"]
