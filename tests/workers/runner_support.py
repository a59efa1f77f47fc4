"""Helpers shared by the trial-runner tests (a plain module: conftest names can clash across folders)."""

from __future__ import annotations

from pathlib import Path

from tuner.workers.process_group import group_members

DATA = Path(__file__).parent / "data"


def assert_group_gone(pgid: int | None) -> None:
    assert pgid is not None, "the runner reported no process group"
    assert group_members(pgid) == [], f"processes of group {pgid} outlived the trial"
