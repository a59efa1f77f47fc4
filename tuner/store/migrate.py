"""Alembic, driven programmatically: `tuner db upgrade` and the tests use this, not alembic.ini."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config


def _migrations_dir() -> Path:
    """The top-level migrations/ of a source checkout, else the copy a wheel ships as ``tuner._migrations``."""
    checkout = Path(__file__).resolve().parents[2] / "migrations"
    if (checkout / "env.py").exists():
        return checkout
    return Path(__file__).resolve().parents[1] / "_migrations"


MIGRATIONS_DIR = _migrations_dir()
VERSION_TABLE = "tuner_alembic_version"  # Optuna keeps Alembic's default alembic_version for itself


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """Only ``tuner_*`` tables are ours; Optuna's (studies, trials, ...) are left to Optuna."""
    if type_ == "table":
        return name is not None and name.startswith("tuner_")
    return True


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    finally:
        engine.dispose()
