from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.orm import Session

from tuner.auth import hash_token, principal_for
from tuner.store import migrate
from tuner.store.models import Base

OURS = {t.name for t in Base.metadata.sorted_tables}


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.parametrize("empty_db_url", ["sqlite", "postgresql"], indirect=True)
def test_empty_to_head_and_round_trip(empty_db_url: str) -> None:
    assert migrate.current(empty_db_url) is None
    migrate.upgrade(empty_db_url)
    assert OURS <= _tables(empty_db_url)
    assert all(t.startswith("tuner_") for t in OURS)
    head = migrate.current(empty_db_url)
    assert head is not None
    migrate.downgrade(empty_db_url, "base")
    assert not (_tables(empty_db_url) & OURS)
    assert migrate.current(empty_db_url) is None
    migrate.upgrade(empty_db_url)
    assert migrate.current(empty_db_url) == head


@pytest.mark.parametrize("empty_db_url", ["sqlite", "postgresql"], indirect=True)
def test_optuna_tables_live_beside_ours_without_drift(empty_db_url: str) -> None:
    import optuna

    migrate.upgrade(empty_db_url)
    optuna.storages.RDBStorage(empty_db_url)  # Optuna creates its own tables and its own alembic_version
    tables = _tables(empty_db_url)
    assert {"studies", "trials", "alembic_version", "tuner_alembic_version"} <= tables
    engine = create_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"include_object": migrate.include_object, "version_table": migrate.VERSION_TABLE}
            )
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []  # our migrations describe exactly our models, and Optuna's tables are ignored
    migrate.upgrade(empty_db_url)  # idempotent with Optuna present
    migrate.downgrade(empty_db_url, "base")
    assert "studies" in _tables(empty_db_url)  # downgrading ours never touches Optuna's


@pytest.mark.parametrize("empty_db_url", ["sqlite", "postgresql"], indirect=True)
def test_rows_made_before_teams_belong_to_the_default_team(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0001")
    engine = create_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tuner_api_tokens (name, token_hash, scopes, created_at) "
                    "VALUES ('old', :h, '[\"read\"]', CURRENT_TIMESTAMP)"
                ),
                {"h": hash_token("stk_old")},
            )
            conn.execute(
                text(
                    "INSERT INTO tuner_traffic_samples (id, fingerprint, workload_class, request_count, stats, "
                    "created_at) VALUES ('s1', 'fp', 'text', 1, '{}', CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO tuner_jobs (id, model, hardware, engine, traffic_id, objective, slo, levels, budget, "
                    "spec, status, idempotency_key, request_fingerprint, cancel_requested, attempts, created_at) "
                    "VALUES ('j1', 'm', 'auto', 'vllm', 's1', 'throughput', '{}', '[]', '{}', '{}', 'queued', 'k1', "
                    "'fp', false, 0, CURRENT_TIMESTAMP)"
                )
            )
        migrate.upgrade(empty_db_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT team FROM tuner_jobs")).scalar() == "default"
            assert conn.execute(text("SELECT team FROM tuner_traffic_samples")).scalar() == "default"
            assert conn.execute(text("SELECT idempotency_key FROM tuner_jobs")).scalar() == "default/k1"
        with Session(engine) as s:
            principal = principal_for(s, "stk_old")
            assert principal is not None and principal.team == "default" and principal.scopes == {"read"}
        migrate.downgrade(empty_db_url, "0001")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT idempotency_key FROM tuner_jobs")).scalar() == "k1"
    finally:
        engine.dispose()
