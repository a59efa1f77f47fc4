# The spec-tuner API: slim Python, no GPU libraries. Build from the repository root:
#   docker build -f docker/api.Dockerfile -t spec-tuner-api .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TUNER_DATA_DIR=/var/lib/spec-tuner

WORKDIR /opt/spec-tuner
COPY pyproject.toml README.md ./
COPY tuner ./tuner
COPY migrations ./migrations
RUN pip install --no-cache-dir . \
    && useradd --system --create-home --uid 10001 tuner \
    && mkdir -p /var/lib/spec-tuner \
    && chown tuner /var/lib/spec-tuner

USER 10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
# API only: trials run in `tuner worker` processes (worker images) that share the database.
CMD ["tuner", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-runner"]
