"""Checkpoint advisor accuracy: the advice against the empirical optimum, over many seeds.

The Monte-Carlo of ``tests/test_advisor.py`` (``tests/advisor_sim.py``: 20 s steps, 120 s blocking saves,
3 min downtime + 1 min startup + 1 min load per restart, a failure per hour on average, 300 h per
run) for several seeds: each seed simulates the same failure times at every interval of the grid,
writes the ledgers, accounts them with the real reader, fits 1/goodput over the grid for the empirical
optimum, and asks the advisor (from the ledger of the run that saved every 30 min) for its interval.
Prints a Markdown block for benchmarks/results/advisor.md.

    .venv/bin/python benchmarks/bench_advisor.py [--seeds 10] [--hours 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from advisor_sim import Scenario, failure_times, fit_optimum, simulate
from babysitter.ledger.advisor import advise_timeline, daly_interval, optimal_interval
from babysitter.ledger.summary import summarize

GRID = (20, 28, 36, 44, 52, 64, 76, 90)


def one(sc: Scenario, seed: int, base: Path) -> tuple[float, float, int, float]:
    """(advice, empirical optimum, failures, goodput gain at the advice's grid point over 30 min)."""
    fails = failure_times(sc, seed)
    points, advice, restarts = [], None, 0
    for k in GRID:
        run = base / f"s{seed}k{k}"
        run.mkdir()
        simulate(sc, k, fails, run / "babysitter-ledger.jsonl")
        summary = summarize(run, now=0.0, keep_points=False)
        points.append((k * sc.step, summary.totals.goodput))
        if k == GRID[-1]:
            advice = advise_timeline(summary.timeline, summary.totals)
            restarts = summary.totals.restarts
    assert advice is not None
    assert advice.recommended_interval_seconds is not None
    t = advice.recommended_interval_seconds
    near = min(points, key=lambda p: abs(p[0] - t))
    return t, fit_optimum(points), restarts, near[1] - points[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--hours", type=float, default=300.0)
    args = parser.parse_args()
    sc = Scenario(horizon=args.hours * 3600.0)
    lam = 1 / sc.mtbf
    rows = []
    began = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.seeds + 1):
            rows.append((seed, *one(sc, seed, Path(tmp))))
    cpu = time.process_time() - began
    print(
        f"Scenario: {sc}; model optimum {optimal_interval(sc.save, sc.restart, lam):.0f} s, Daly's "
        f"{daly_interval(sc.save, lam):.0f} s at the true rate. CPU {cpu:.1f} s for {args.seeds} seeds.\n"
    )
    print(
        "| seed | failures | advice (s) | empirical optimum (s) | error | goodput at the advice - at 30 min |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    errors = []
    for seed, advice, best, restarts, gain in rows:
        err = advice / best - 1
        errors.append(err)
        print(f"| {seed} | {restarts} | {advice:.0f} | {best:.0f} | {err:+.1%} | {gain * 100:+.1f} points |")
    mean_abs = statistics.fmean(abs(e) for e in errors)
    print(
        f"\nmean |error| {mean_abs:.1%}, max |error| {max(abs(e) for e in errors):.1%}, "
        f"mean error {statistics.fmean(errors):+.1%}"
    )


if __name__ == "__main__":
    main()
