"""The simulated engine's adaptive-verification model against the one public comparison it is fitted to.

    python -m benchmarks.adaptive_calibration [--profile deepseek-v3-mtp] [--workload chat]

vLLM #52362 (DSpark K=7, DeepSeek-V4-Flash, MI350X; docs/published-figures.md) measured fixed K and
adaptive verification: speedup over no speculation 2.54 / 2.37 at c4, 1.64 / 1.74 at c64, 0.88 / 1.50 at
c256. The simulator has no DeepSeek-V4 on MI350X, so what it is fitted to is the ratio adaptive / fixed at
each level; this prints the simulated ratio (noise free, closed loop) beside the published one.
"""

from __future__ import annotations

import argparse

from tuner.domain import ADAPTIVE_FIELD, Method, SpecConfig
from tuner.workers import sim_model
from tuner.workers.sim_profiles import PRESETS, WORKLOADS

PUBLISHED = {4: (2.54, 2.37), 64: (1.64, 1.74), 256: (0.88, 1.50)}  # c: (fixed K=7, adaptive)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="deepseek-v3-mtp", choices=sorted(PRESETS))
    p.add_argument("--workload", default="chat", choices=sorted(WORKLOADS))
    args = p.parse_args()
    model, workload = PRESETS[args.profile], WORKLOADS[args.workload]
    fixed = SpecConfig(Method.DSPARK, 7)
    adaptive = SpecConfig(Method.DSPARK, 7, extra={ADAPTIVE_FIELD: True})
    print(f"profile {args.profile}, workload {args.workload} (simulated: an assumption, not a measurement)\n")
    print("| c | simulated fixed | simulated adaptive | simulated adaptive/fixed | published adaptive/fixed |")
    print("|---|---|---|---|---|")
    for c, (pub_fixed, pub_adaptive) in PUBLISHED.items():
        off = sim_model.closed_loop(model, workload, SpecConfig(), c).request_rate
        f = sim_model.closed_loop(model, workload, fixed, c).request_rate / off
        a = sim_model.closed_loop(model, workload, adaptive, c).request_rate / off
        print(f"| {c} | {f:.2f}x | {a:.2f}x | {a / f:.3f} | {pub_adaptive / pub_fixed:.3f} |")


if __name__ == "__main__":
    main()
