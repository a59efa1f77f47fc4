"""A reduced run of the search benchmark (benchmarks/search_benchmark.py): four scenarios, two seeds.

Two from the simulated engine or papers, two whose physics is not the simulated engine's
(benchmarks/search_physics.py). Per level, what ``GET /recommendation?concurrency=`` would return lands within
2% of that level's true optimum at 85% of the levels or more (the full benchmark's target is 90%, over many
more levels); what would be deployed for all ranges never loses to off at levels carrying most of the
weight, and every level where it loses beyond noise is in ``outcome.deployed_losses``; the search launches at
most half the grid (median).
"""

import functools
import statistics

from benchmarks.search_benchmark import LOSS, Run, level_optima, run_ours
from benchmarks.search_scenarios import physics_scenarios, scenarios

REDUCED = ("code-eagle3-c1-vs-off-c256", "published-e3-sglang-h100", "knee-192-e3-dm", "kv-16k-e3")
SEEDS = (0, 1)


@functools.cache
def runs(name: str) -> tuple[int, tuple[Run, ...]]:
    sc = next(s for s in scenarios() + physics_scenarios() if s.name == name)
    return sc.space.grid_size, tuple(run_ours(sc, seed) for seed in SEEDS)


def test_per_range_answers_land_within_two_percent_of_each_levels_optimum():
    hits = sum(r.levels.hits for name in REDUCED for r in runs(name)[1])
    total = sum(r.levels.total for name in REDUCED for r in runs(name)[1])
    assert hits / total >= 0.85, (hits, total)


def test_the_deployed_config_never_loses_where_most_of_the_weight_is_and_says_where_it_loses():
    for name in REDUCED:
        sc = next(s for s in scenarios() + physics_scenarios() if s.name == name)
        for r in runs(name)[1]:
            truth = sc.truth(r.deployed) or {}
            losing = {label for label in level_optima(sc) if truth.get(label, 0.0) < 1.0 - LOSS}
            assert len(losing) <= len(level_optima(sc)) / 2, (name, r.deployed.label(), losing)
            said = set(r.outcome.deployed_losses)
            # measured losses beyond noise are named; a true loss inside the noise may go unmeasured
            assert said <= set(level_optima(sc)) and all(truth.get(lb, 0.0) < 1.0 for lb in said)


def test_median_search_launches_at_most_half_the_grid():
    ratios = [statistics.median(r.trials for r in rs) / grid for grid, rs in map(runs, REDUCED)]
    assert statistics.median(ratios) <= 0.5


def test_suite_has_ten_scenarios_three_from_papers_and_three_physics_families_one_held_out():
    all_ = scenarios()
    assert len(all_) >= 10 and sum(s.kind == "published" for s in all_) >= 3
    phys = physics_scenarios()
    assert len({s.family for s in phys if not s.held_out}) >= 3 and any(s.held_out for s in phys)
    assert all(s.held_out for s in phys[-sum(s.held_out for s in phys) :])  # the held-out family runs last
