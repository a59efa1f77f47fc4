"""Search benchmark: spec-tuner's planner against grid, random search and plain TPE on known optima.

Run from the repository root:

    .venv/bin/python -m benchmarks.search_benchmark            # all scenarios, 3 seeds, prints the table
    .venv/bin/python -m benchmarks.search_benchmark --check    # and exits 1 if a target is missed

Per scenario and seed: spec-tuner (``tune``) runs until its stopping rule (budget = the grid size); the grid
runs every configuration once; random search and plain TPE (Optuna's TPESampler, multivariate, group, on
the same conditional parameters, no extrapolation) get as many trials as spec-tuner's search used. Each picks
the configuration with the best *measured* objective; regret is 1 - true(pick) / true(optimum) on the
noise-free truth (the weighted geometric mean of per-level speedups over off). Confirmation runs are
spec-tuner's only; they are reported but not counted as search trials (the grid confirms nothing).

spec-tuner's regret is reported twice: for its static pick (``outcome.best``, comparable with the grid's),
and for what it would deploy (``outcome.deployed``: the per-batch-size schedule when one was kept, else the
static pick). Both are against the best *static* configuration, so a schedule that beats every static
config has a negative deployed regret.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from benchmarks.search_scenarios import REQUESTS, Scenario, physics_scenarios, scenarios
from tuner.domain import Budget, Method, ModelRef, SpecConfig, TrialSpec
from tuner.search import tune

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def true_objective(sc: Scenario, spec: SpecConfig) -> float | None:
    per_level = sc.truth(spec)
    if per_level is None:
        return None
    return math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in per_level.values()))


_OPTIMA: dict[str, tuple[tuple[float, SpecConfig], dict[str, float]]] = {}


def _optima(sc: Scenario) -> tuple[tuple[float, SpecConfig], dict[str, float]]:
    """The true static optimum (objective, config) and each level's own true optimum."""
    if sc.name in _OPTIMA:
        return _OPTIMA[sc.name]
    best = max(((true_objective(sc, s), s) for s in sc.space.grid()), key=lambda t: t[0] or 0.0)
    per_level: dict[str, float] = {}
    for spec in sc.space.grid():
        for label, v in (sc.truth(spec) or {}).items():
            per_level[label] = max(per_level.get(label, 0.0), v)
    _OPTIMA[sc.name] = (best[0] or 1.0, best[1]), per_level
    return _OPTIMA[sc.name]


def optimum(sc: Scenario) -> tuple[float, SpecConfig]:
    return _optima(sc)[0]


def level_optima(sc: Scenario) -> dict[str, float]:
    return _optima(sc)[1]


@dataclass
class Levels:
    """Per-level judgement of one run: each level's answer against that level's true optimum."""

    total: int = 0
    hits: int = 0  # the per-range answer within 2% of the level's optimum
    worst_miss: float = 0.0  # 1 - true(answer) / optimum, worst level
    deployed_hits: int = 0  # the deployed (all-ranges) config within 2% of the level's optimum
    deployed_loses: int = 0  # the deployed config more than 1% slower than off at a level
    deployed_worst_vs_off: float = 0.0  # 1 - true(deployed) at its worst level (> 0: slower than off)
    deployed_loss_share: float = 0.0  # the share of the levels (equal weights) where it is slower than off


def judge_levels(sc: Scenario, answers: dict[str, SpecConfig | None], deployed: SpecConfig | None) -> Levels:
    optima = level_optima(sc)
    out = Levels()
    dep = sc.truth(deployed) if deployed is not None else None
    for label, best in optima.items():
        out.total += 1
        spec = answers.get(label)
        got = (sc.truth(spec) or {}).get(label, 0.0) if spec is not None else 0.0
        miss = 1.0 - got / best
        out.hits += miss <= HIT
        out.worst_miss = max(out.worst_miss, miss)
        d = dep.get(label, 0.0) if dep is not None else 0.0
        out.deployed_hits += 1.0 - d / best <= HIT
        out.deployed_loses += d < 1.0 - LOSS
        out.deployed_worst_vs_off = max(out.deployed_worst_vs_off, 1.0 - d)
    out.deployed_loss_share = out.deployed_loses / out.total if out.total else 0.0
    return out


HIT = 0.02  # within 2% of the level's optimum
LOSS = 0.01  # slower than off beyond 1%: a loss, not noise


@dataclass
class Run:
    trials: int
    confirm: int
    regret: float
    pick: SpecConfig
    worse_than_off: bool
    deployed_regret: float | None = None
    deployed: SpecConfig | None = None
    deployed_worse_than_off: bool = False
    levels: Levels | None = None


Measured = list[tuple[SpecConfig, dict[str, float] | None]]


def _measure_all(sc: Scenario, specs: Sequence[SpecConfig], seed: int) -> Measured:
    """Run each spec once on a noisy engine; per-level speedups from measured throughput vs the baseline."""
    engine = sc.engine(seed)
    base = engine(TrialSpec(model=ModelRef(sc.space.model), spec=SpecConfig(), levels=sc.levels, requests=REQUESTS))
    out: Measured = [(SpecConfig(), {lv.label: 1.0 for lv in sc.levels})]
    for spec in specs:
        if spec.is_off:
            continue
        r = engine(
            TrialSpec(
                model=ModelRef(sc.space.model),
                spec=spec,
                levels=sc.levels,
                requests=REQUESTS,
                reference_outputs=base.reference_outputs,
            )
        )
        out.append((spec, _per_level_vs(r, base)))
    return out


def _per_level_vs(r, base) -> dict[str, float] | None:
    if r.status.value != "succeeded":
        return None
    return {lr.level.label: lr.output_throughput / base.level(lr.level.label).output_throughput for lr in r.levels}


def _geo(per_level: dict[str, float] | None) -> float | None:
    if per_level is None:
        return None
    return math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in per_level.values()))


def _from_measured(sc: Scenario, measured: Measured, trials: int) -> Run:
    """A baseline method's answers: the best measured static config, and per level the best measured there."""
    ok = [(spec, pl) for spec, pl in measured if pl is not None]
    pick = max(ok, key=lambda t: _geo(t[1]) or -1)[0]
    answers = {lv.label: max(ok, key=lambda t, lb=lv.label: t[1][lb])[0] for lv in sc.levels}
    run = _score(sc, pick, trials)
    run.levels = judge_levels(sc, answers, pick)
    return run


def _score(sc: Scenario, pick: SpecConfig, trials: int, confirm: int = 0) -> Run:
    opt, _ = optimum(sc)
    t = true_objective(sc, pick) or 0.0
    return Run(trials, confirm, 1 - t / opt, pick, t < 1.0 - 1e-9)


def run_ours(sc: Scenario, seed: int) -> Run:
    report = tune(
        sc.space,
        sc.engine(seed),
        model=ModelRef(sc.space.model),
        requests=REQUESTS,
        levels=sc.levels,
        budget=Budget(max_trials=sc.space.grid_size),
        seed=seed,
        confirm_runs=3,
    )
    search = sum(1 for p, _ in report.history if p.purpose != "confirm")
    confirm = sum(1 for p, _ in report.history if p.purpose == "confirm")
    run = _score(sc, report.outcome.best, search, confirm)
    opt, _ = optimum(sc)
    run.deployed = report.outcome.deployed
    td = true_objective(sc, run.deployed) or 0.0  # None: cannot run, as bad as it gets
    run.deployed_regret = 1 - td / opt
    run.deployed_worse_than_off = td < 1.0 - 1e-9
    answers = {w.level: w.spec for w in report.outcome.per_level_winners}
    run.levels = judge_levels(sc, answers, run.deployed)
    run.outcome = report.outcome  # type: ignore[attr-defined]
    return run


def run_grid(sc: Scenario, seed: int) -> Run:
    return _from_measured(sc, _measure_all(sc, sc.space.grid(), seed), sc.space.grid_size)


def run_random(sc: Scenario, seed: int, n: int) -> Run:
    rng = random.Random(seed)
    grid = [s for s in sc.space.grid() if not s.is_off]
    chosen = rng.sample(grid, min(len(grid), max(0, n - 1)))
    return _from_measured(sc, _measure_all(sc, chosen, seed), n)


def run_tpe(sc: Scenario, seed: int, n: int) -> Run:
    engine = sc.engine(seed)
    model = ModelRef(sc.space.model)
    base = engine(TrialSpec(model=model, spec=SpecConfig(), levels=sc.levels, requests=REQUESTS))
    sampler = optuna.samplers.TPESampler(
        seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=4
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    options = sc.space.options
    study.enqueue_trial({"arm": "off"})
    seen: dict[str, tuple[SpecConfig, dict[str, float] | None]] = {}
    launched = 0
    attempts = 0
    while launched < n and attempts < 50 * n:
        attempts += 1
        trial = study.ask()
        arm = trial.suggest_categorical("arm", [o.key for o in options])
        opt = sc.space.option(arm)
        if opt.method is Method.OFF:
            spec = SpecConfig()
        else:
            k = trial.suggest_categorical(f"k:{arm}", list(opt.depths))
            lookup = None
            if opt.lookups:
                label = trial.suggest_categorical(f"lookup:{arm}", [f"{a}-{b}" for a, b in opt.lookups])
                lookup = tuple(int(x) for x in label.split("-"))
            spec = opt.spec(int(k), lookup)
        key = spec.key()
        if key not in seen:  # a repeat costs nothing new: TPE is told the value it already has
            launched += 1
            if spec.is_off:
                seen[key] = (spec, {lv.label: 1.0 for lv in sc.levels})
            else:
                r = engine(
                    TrialSpec(
                        model=model,
                        spec=spec,
                        levels=sc.levels,
                        requests=REQUESTS,
                        reference_outputs=base.reference_outputs,
                    )
                )
                seen[key] = (spec, _per_level_vs(r, base))
        v = _geo(seen[key][1])
        if v is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, math.log(v))
    measured = list(seen.values())
    if SpecConfig().key() not in seen:
        measured.insert(0, (SpecConfig(), {lv.label: 1.0 for lv in sc.levels}))
    return _from_measured(sc, measured, n)


def run(seeds: Sequence[int], only: Sequence[str] | None = None, suite: str = "all") -> list[dict]:
    pool = {"sim": scenarios, "physics": physics_scenarios}
    chosen = [sc for name in (("sim", "physics") if suite == "all" else (suite,)) for sc in pool[name]()]
    rows = []
    for sc in chosen:
        if only and sc.name not in only:
            continue
        opt, opt_spec = optimum(sc)
        ours = [run_ours(sc, s) for s in seeds]
        n = round(statistics.median(r.trials for r in ours))
        grid = [run_grid(sc, s) for s in seeds]
        rnd = [run_random(sc, s, n) for s in seeds]
        tpe = [run_tpe(sc, s, n) for s in seeds]

        def hits(runs: Sequence[Run]) -> int:
            return sum(r.levels.hits for r in runs)

        rows.append(
            {
                "scenario": sc.name,
                "kind": sc.kind,
                "family": sc.family or sc.kind,
                "held_out": sc.held_out,
                "grid": sc.space.grid_size,
                "optimum": opt_spec.label(),
                "optimum_value": opt,
                "ours_trials": statistics.median(r.trials for r in ours),
                "ours_confirm": statistics.median(r.confirm for r in ours),
                "ours_all_launches": statistics.median(r.trials + r.confirm for r in ours),
                "ours_regret": max(r.regret for r in ours),
                "ours_regret_median": statistics.median(r.regret for r in ours),
                "ours_deployed_regret": max(r.deployed_regret for r in ours),
                "ours_deployed_regret_median": statistics.median(r.deployed_regret for r in ours),
                "ours_deployed_worst_seed": seeds[max(range(len(ours)), key=lambda i: ours[i].deployed_regret)],
                "ours_deployed": ours[0].deployed.label(),
                "ours_pick": ours[0].pick.label(),
                "ours_worse_than_off": any(r.worse_than_off or r.deployed_worse_than_off for r in ours),
                "grid_regret": statistics.median(r.regret for r in grid),
                "random_regret": statistics.median(r.regret for r in rnd),
                "tpe_regret": statistics.median(r.regret for r in tpe),
                "levels": sum(r.levels.total for r in ours),
                "ours_hits": hits(ours),
                "ours_worst_miss": max(r.levels.worst_miss for r in ours),
                "deployed_hits": sum(r.levels.deployed_hits for r in ours),
                "deployed_loses": sum(r.levels.deployed_loses for r in ours),
                "deployed_worst_vs_off": max(r.levels.deployed_worst_vs_off for r in ours),
                "deployed_loss_share": max(r.levels.deployed_loss_share for r in ours),
                "grid_hits": hits(grid),
                "random_hits": hits(rnd),
                "tpe_hits": hits(tpe),
                "notes": [n for n in ours[0].outcome.notes if n.startswith("per-level")],
                "residual": statistics.median(_note_share(r, "residual RMS") for r in ours),
                "pred_error": statistics.median(_note_share(r, "error RMS") for r in ours),
            }
        )
    return rows


def _note_share(run: Run, key: str) -> float:
    """A percentage the outcome's step-cost note states after ``key`` (0 when absent)."""
    for note in run.outcome.notes:  # type: ignore[attr-defined]
        if key in note:
            return float(note.split(key, 1)[1].split("%")[0]) / 100
    return 0.0


def level_table(rows: Sequence[dict]) -> str:
    """Per-level answers: what ``GET /recommendation?concurrency=`` returns, and the deployed config."""
    head = (
        "| scenario | family | grid | search launches (all) | per-range within 2% | worst level miss | deployed "
        "within 2% | deployed slower than off | grid | random | plain TPE | model residual, prediction error (RMS) |\n"
        + "|---" * 12
        + "|"
    )
    lines = [head]
    for r in rows:
        n = r["levels"]
        lines.append(
            f"| {r['scenario']} | {r['family']}{' (held out)' if r['held_out'] else ''} | {r['grid']} | "
            f"{r['ours_trials']:g} ({r['ours_all_launches']:g}) | {r['ours_hits']}/{n} | "
            f"{r['ours_worst_miss']:.1%} | {r['deployed_hits']}/{n} | {r['deployed_loses']}/{n} "
            f"(worst {r['deployed_worst_vs_off']:+.1%}) | {r['grid_hits']}/{n} | {r['random_hits']}/{n} | "
            f"{r['tpe_hits']}/{n} | {r['residual']:.1%}, {r['pred_error']:.1%} |"
        )
    return "\n".join(lines)


def level_summary(rows: Sequence[dict], title: str) -> str:
    if not rows:
        return ""
    n = sum(r["levels"] for r in rows)

    def share(key: str) -> str:
        return f"{sum(r[key] for r in rows)}/{n} ({sum(r[key] for r in rows) / n:.0%})"

    search = [r["ours_trials"] / r["grid"] for r in rows]
    every = [r["ours_all_launches"] / r["grid"] for r in rows]
    return (
        f"{title}: per-range answers within 2% of the level's optimum {share('ours_hits')} (grid "
        f"{share('grid_hits')}, random {share('random_hits')}, plain TPE {share('tpe_hits')} at the same "
        f"launches); worst level miss {max(r['ours_worst_miss'] for r in rows):.1%}. Deployed config within 2% "
        f"{share('deployed_hits')}, slower than off by more than 1% at {share('deployed_loses')} (worst "
        f"{max(r['deployed_worst_vs_off'] for r in rows):+.1%}). Search launches / grid: median "
        f"{statistics.median(search):.0%}, worst {max(search):.0%} (median "
        f"{statistics.median(r['ours_trials'] for r in rows):g} launches); all launches, confirmations "
        f"included: median {statistics.median(every):.0%}, worst {max(every):.0%}."
    )


def table(rows: Sequence[dict]) -> str:
    head = (
        "| scenario | src | grid trials | spec-tuner trials (+confirm) | trials / grid | static pick regret median "
        "(worst) | deployed regret median (worst, seed) | grid regret | random @ same trials | plain TPE @ same "
        "trials | true static optimum | spec-tuner deploys (seed 0) |\n" + "|---" * 12 + "|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {'paper' if r['kind'] == 'published' else 'sim'} | {r['grid']} | "
            f"{r['ours_trials']:g} (+{r['ours_confirm']:g}) | {r['ours_trials'] / r['grid']:.0%} | "
            f"{r['ours_regret_median']:.1%} ({r['ours_regret']:.1%}) | "
            f"{r['ours_deployed_regret_median']:.1%} ({r['ours_deployed_regret']:.1%}, "
            f"s{r['ours_deployed_worst_seed']}) | {r['grid_regret']:.1%} | "
            f"{r['random_regret']:.1%} | {r['tpe_regret']:.1%} | "
            f"{r['optimum']} ({r['optimum_value']:.2f}x) | {r['ours_deployed']} |"
        )
    ratio = statistics.median(r["ours_trials"] / r["grid"] for r in rows)
    worst = max(rows, key=lambda r: r["ours_deployed_regret"])
    lines.append("")
    lines.append(
        f"Median trials / grid: {ratio:.0%}. Worst spec-tuner regret over all seeds: static pick "
        f"{max(r['ours_regret'] for r in rows):.1%}, deployed {worst['ours_deployed_regret']:.1%} "
        f"({worst['scenario']}, seed {worst['ours_deployed_worst_seed']}); scenarios whose median regret exceeds "
        f"2%: static {sum(r['ours_regret_median'] > 0.02 for r in rows)}, deployed "
        f"{sum(r['ours_deployed_regret_median'] > 0.02 for r in rows)}. "
        f"Median regret: grid {statistics.median(r['grid_regret'] for r in rows):.1%}, random "
        f"{statistics.median(r['random_regret'] for r in rows):.1%}, plain TPE "
        f"{statistics.median(r['tpe_regret'] for r in rows):.1%}, spec-tuner static pick "
        f"{statistics.median(r['ours_regret_median'] for r in rows):.1%}, deployed "
        f"{statistics.median(r['ours_deployed_regret_median'] for r in rows):.1%}. "
        f"Recommended or deployed worse than off: {sum(r['ours_worse_than_off'] for r in rows)} scenario(s)."
    )
    return "\n".join(lines)


def check(rows: Sequence[dict]) -> list[str]:
    """The targets. Simulated and published scenarios: median search trials / grid <= 25%; per scenario, median
    regret <= 2% for the static pick and what would be deployed; nothing recommended or deployed worse than
    off. Per level, on every suite (the held-out family included): per-range answers within 2% of the level's
    optimum at >= 90% of levels; the deployed config never slower than off by more than 1% at most (over half)
    of a run's levels (where it is slower at fewer, the outcome says so: ``deployed_losses``); search launches
    <= 25% of the grid and all launches <= 50% (medians)."""
    problems = []
    old = [r for r in rows if r["kind"] != "physics"]
    if old:
        ratio = statistics.median(r["ours_trials"] / r["grid"] for r in old)
        if ratio > 0.25:
            problems.append(f"median trials / grid {ratio:.0%} > 25%")
    for r in old:
        if r["ours_regret_median"] > 0.02:
            problems.append(f"{r['scenario']}: median regret {r['ours_regret_median']:.1%} > 2%")
        if r["ours_deployed_regret_median"] > 0.02:
            problems.append(f"{r['scenario']}: median deployed regret {r['ours_deployed_regret_median']:.1%} > 2%")
        if r["ours_worse_than_off"]:
            problems.append(f"{r['scenario']}: recommended or deployed a config worse than off")
    for title, group in _groups(rows):
        n = sum(r["levels"] for r in group)
        hit = sum(r["ours_hits"] for r in group) / n
        if hit < 0.9:
            problems.append(f"{title}: per-range answers within 2% at {hit:.0%} of levels < 90%")
        worst = max(group, key=lambda r: r["deployed_loss_share"])
        if worst["deployed_loss_share"] > 0.5:
            problems.append(
                f"{title}: the deployed config is slower than off at {worst['deployed_loss_share']:.0%} of the "
                f"levels in a run of {worst['scenario']} (most of the weight)"
            )
        search = statistics.median(r["ours_trials"] / r["grid"] for r in group)
        every = statistics.median(r["ours_all_launches"] / r["grid"] for r in group)
        if search > 0.25:
            problems.append(f"{title}: median search launches / grid {search:.0%} > 25%")
        if every > 0.5:
            problems.append(f"{title}: median launches with confirmations / grid {every:.0%} > 50%")
    return problems


def _groups(rows: Sequence[dict]) -> list[tuple[str, list[dict]]]:
    groups = [
        ("simulated + published", [r for r in rows if r["kind"] != "physics"]),
        ("physics families", [r for r in rows if r["kind"] == "physics" and not r["held_out"]]),
        ("held-out family", [r for r in rows if r["held_out"]]),
    ]
    return [(t, g) for t, g in groups if g]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--suite", choices=("all", "sim", "physics"), default="all")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    t0 = time.time()
    rows = run(range(args.seeds), args.only, args.suite)
    old = [r for r in rows if r["kind"] != "physics"]
    if old:
        print(table(old))
        print()
    print(level_table(rows))
    print()
    for title, group in _groups(rows):
        print(level_summary(group, title))
        print()
    print(f"{len(rows)} scenarios x {args.seeds} seeds in {time.time() - t0:.0f} s")
    problems = check(rows)
    for p in problems:
        print("MISSED:", p)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
