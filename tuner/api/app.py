"""The FastAPI application: ``create_app(settings)``. Engines are made in the lifespan, never at import."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from tuner.api import errors
from tuner.api.authenticate import Authenticate
from tuner.api.limits import BodyLimit
from tuner.api.metrics import StoreCollector
from tuner.api.routes import health, jobs, recommendation, traffic, tune, workers
from tuner.recommendations import RenderCache
from tuner.settings import AuthMode, Settings
from tuner.store.db import make_engine, make_session_factory

log = logging.getLogger("tuner.api")

# Something with start()/stop() run beside the API (the in-process job runner); built from the session factory.
BackgroundFactory = Callable[[Settings, Any], Any]


def create_app(settings: Settings | None = None, *, background: BackgroundFactory | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.db_url)
        factory = make_session_factory(engine)
        app.state.settings = settings
        app.state.session_factory = factory
        app.state.render_cache = RenderCache()  # published recommendations, rendered once per process
        registry = CollectorRegistry()
        registry.register(StoreCollector(factory))
        app.state.registry = registry
        if settings.auth is AuthMode.OPEN:
            log.warning("AUTH IS OFF (TUNER_AUTH=open): every client can tune and read. Use only for local work.")
        runner = background(settings, factory) if background else None
        if runner is not None:
            runner.start()
        try:
            yield
        finally:
            if runner is not None:
                runner.stop()
            engine.dispose()

    app = FastAPI(
        title="spec-tuner",
        version="0.1.0",
        summary="Find the best vLLM speculative-decoding configuration for a model, workload and GPU by measuring it.",
        lifespan=lifespan,
    )
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_traffic_bytes + settings.max_request_overhead_bytes)
    # added last, so outermost: an unauthenticated request is refused before its size is even looked at
    app.add_middleware(Authenticate, open_mode=settings.auth is AuthMode.OPEN, cache_s=settings.token_cache_s)
    for module in (tune, jobs, traffic, recommendation, workers, health):
        app.include_router(module.router)
    _problem_only_errors(app)
    return app


def _problem_only_errors(app: FastAPI) -> None:
    """Errors are problem+json only: FastAPI also lists a response model under application/json, drop that."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = build()  # cached by FastAPI after the first call; the edit below is idempotent
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for code, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    if code[:1] in "45" and errors.PROBLEM in content:
                        content.pop("application/json", None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise the schema
