"""A reduced run of the search benchmark (benchmarks/search_benchmark.py): three scenarios, two seeds."""

import statistics

import pytest

from benchmarks.search_benchmark import run_ours
from benchmarks.search_scenarios import scenarios

REDUCED = ("code-eagle3-c1-vs-off-c256", "eagle-crashes-at-start", "published-e3-sglang-h100")


@pytest.mark.parametrize("name", REDUCED)
def test_search_lands_near_the_optimum_with_few_trials(name):
    sc = next(s for s in scenarios() if s.name == name)
    runs = [run_ours(sc, seed) for seed in (0, 1)]
    assert statistics.median(r.regret for r in runs) <= 0.02
    assert all(not r.worse_than_off for r in runs)
    assert statistics.median(r.trials for r in runs) <= max(3, sc.space.grid_size / 3)


def test_suite_has_ten_scenarios_three_from_papers():
    all_ = scenarios()
    assert len(all_) >= 10 and sum(s.kind == "published" for s in all_) >= 3
