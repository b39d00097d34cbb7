"""What handing values to a framework's loggers costs (``integrations/_logged.py``).

Two measurements on a real tracker with a goodput ledger in a temporary directory:

1. **One log call** (``LoggedValues.values()``, on the training thread at the framework's log
   cadence): a tracker snapshot plus a few divisions, after ``--steps-per-log`` steps each time.
2. **One goodput computation** (``Tracker.goodput()``: the ledger's accounting, which the callbacks
   run on the housekeeping thread, at most every ``GOODPUT_REFRESH_SECONDS``) with N steps in the
   ledger, all younger than its 60 s settle time (the worst case: none classified and cached yet).

    .venv/bin/python benchmarks/bench_logged.py [--calls 300] [--steps-per-log 50] \
        [--ledger-steps 1000,5000,15000] [--out benchmarks/results/logged.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import babysitter
from babysitter.integrations._logged import LoggedValues
from babysitter.ledger.writer import ENV_FLUSH
from machine import cpu_model


def _tracker(run_dir: str) -> babysitter.Tracker:
    return babysitter.watch(
        run="bench-logged",
        port=-1,
        run_dir=run_dir,
        peak_flops=1e12,
        flops_per_token=1e6,
        tokens_per_step=4096,
        hang_timeout=None,
        flush_interval=3600,  # housekeeping by hand: nothing competes with the timed calls
    )


def log_calls(calls: int, steps_per_log: int) -> list[float]:
    """Seconds per ``values()`` call, each after ``steps_per_log`` steps."""
    with tempfile.TemporaryDirectory() as run_dir:
        tracker = _tracker(run_dir)
        try:
            logged = LoggedValues(tracker)
            out = []
            for _ in range(calls):
                for _ in range(steps_per_log):
                    tracker.step()
                t0 = time.perf_counter()
                logged.values()
                out.append(time.perf_counter() - t0)
            return out
        finally:
            tracker.close()


def goodput_seconds(ledger_steps: int, repeats: int = 5) -> tuple[float, float, float | None]:
    """Seconds of the first ``Tracker.goodput()`` that saw the steps, the median of the next
    ``repeats``, and the value, with ``ledger_steps`` fresh steps in the ledger."""
    with tempfile.TemporaryDirectory() as run_dir:
        tracker = _tracker(run_dir)
        try:
            for _ in range(ledger_steps):
                tracker.step()
            tracker.housekeep()  # hand the steps to the ledger
            deadline = time.monotonic() + 30
            value: float | None = None
            first = 0.0
            while (value is None or value == 0.0) and time.monotonic() < deadline:
                time.sleep(0.05)  # the writer books them in the background
                t0 = time.perf_counter()
                value = tracker.goodput()
                first = time.perf_counter() - t0
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                value = tracker.goodput()
                times.append(time.perf_counter() - t0)
            return first, statistics.median(times), value
        finally:
            tracker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--steps-per-log", type=int, default=50)
    parser.add_argument("--ledger-steps", default="1000,5000,15000")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault(ENV_FLUSH, "0.05")  # the ledger books steps quickly (read by each writer)
    calls = sorted(log_calls(args.calls, args.steps_per_log))
    sizes = [int(n) for n in args.ledger_steps.split(",")]
    goodput = {n: goodput_seconds(n) for n in sizes}
    load = os.getloadavg()[0]
    lines = [
        "# Logged values benchmark",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {cpu_model()}, {os.cpu_count()} logical CPUs (shared with other work, load {load:.1f}), "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
        f"- Command: `.venv/bin/python benchmarks/bench_logged.py --calls {args.calls} "
        f"--steps-per-log {args.steps_per_log} --ledger-steps {args.ledger_steps}`",
        "",
        f"## One log call (`LoggedValues.values()`, training thread), every {args.steps_per_log} steps",
        "",
        "| calls | median µs | p90 µs | max µs |",
        "|---:|---:|---:|---:|",
        f"| {len(calls)} | {statistics.median(calls) * 1e6:.0f} | {calls[int(len(calls) * 0.9)] * 1e6:.0f} "
        f"| {calls[-1] * 1e6:.0f} |",
        "",
        "## One goodput computation (`Tracker.goodput()`, housekeeping thread), fresh steps in the ledger",
        "",
        "| steps in the ledger | first ms | then, median ms | goodput read |",
        "|---:|---:|---:|---:|",
        *(
            f"| {n} | {first * 1e3:.1f} | {seconds * 1e3:.1f} | {'-' if value is None else f'{value:.3f}'} |"
            for n, (first, seconds, value) in goodput.items()
        ),
        "",
        "A log call is a tracker snapshot (what a scrape reads); it runs once per `log_every_n_steps` "
        "(Lightning) or `logging_steps` (Hugging Face) on rank 0. The goodput computation grows with "
        "the steps younger than the ledger's settle time, which is why the callbacks never run it on "
        "the training thread and refresh it at most every 10 s.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
