"""A reduced run of the search benchmark (benchmarks/search_benchmark.py): three scenarios, two seeds.

Per scenario: the static pick and what would be deployed (``outcome.deployed``, a schedule when one is kept)
land within 2% of the true static optimum (median over seeds), and neither is worse than off. Across the
three: the median search uses at most a quarter of the grid's trials (the search's target, benchmarks/README.md).
"""

import functools
import statistics

import pytest

from benchmarks.search_benchmark import Run, run_ours
from benchmarks.search_scenarios import scenarios

REDUCED = ("code-eagle3-c1-vs-off-c256", "eagle-crashes-at-start", "published-e3-sglang-h100")
SEEDS = (0, 1)


@functools.cache
def runs(name: str) -> tuple[int, tuple[Run, ...]]:
    sc = next(s for s in scenarios() if s.name == name)
    return sc.space.grid_size, tuple(run_ours(sc, seed) for seed in SEEDS)


@pytest.mark.parametrize("name", REDUCED)
def test_search_lands_near_the_optimum_and_deploys_no_worse(name):
    _, rs = runs(name)
    assert statistics.median(r.regret for r in rs) <= 0.02
    assert statistics.median(r.deployed_regret for r in rs) <= 0.02
    assert all(not r.worse_than_off and not r.deployed_worse_than_off for r in rs)


def test_median_search_uses_at_most_a_quarter_of_the_grid():
    ratios = []
    for name in REDUCED:
        grid, rs = runs(name)
        ratios.append(statistics.median(r.trials for r in rs) / grid)
    assert statistics.median(ratios) <= 0.25


def test_suite_has_ten_scenarios_three_from_papers():
    all_ = scenarios()
    assert len(all_) >= 10 and sum(s.kind == "published" for s in all_) >= 3
