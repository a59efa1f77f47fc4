"""The wheel's package list (pyproject.toml) names every package in the source tree, so nothing is left out
of an installed build (setuptools' explicit list does not find new packages by itself)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _source_packages() -> set[str]:
    found = set()
    for init in (ROOT / "tuner").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        found.add(".".join(rel.parts))
    for init in (ROOT / "migrations").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT / "migrations")
        found.add(".".join(("tuner._migrations", *rel.parts)))
    return found


def test_package_list_matches_the_source_tree() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    assert listed == _source_packages()
