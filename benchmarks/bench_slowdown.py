"""``tracker.step()`` before and after the slowdown accounting, interleaved, in fresh processes.

Two measurements, each in a fresh process per round, the two source trees alternating (and which goes
first alternating) so that the load of a shared machine hits both alike; the result is the ratio of
each round's pair, and the median of those ratios:

* ``plain``: what ``benchmarks/bench_tracker.py`` measures for babysitter (no ledger, no pacing): the
  per-call cost of ``tracker.step()`` and the loop average, ``--steps`` steps each.
* ``ledger``: the hot path with everything the change added off it running: a ledger (the fold hands
  each step's tokens over, the writer decides each step's slowdown), housekeeping every 0.2 s and a
  scrape every 0.25 s (the ideal step time, the deviation, the rolling goodput), with steps paced at
  1 kHz by a busy loop that holds the GIL (the worst case for the threads off the hot path; a 1 ms
  step is far faster than LLM training's). Per-call cost of ``step()`` over ``--paced`` steps.

    .venv/bin/python benchmarks/bench_slowdown.py --before /work/main/src [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = r"""
import gc, json, sys, tempfile, threading, time
sys.path.insert(0, sys.argv[1])
from prometheus_client import generate_latest
import babysitter
mode, steps = sys.argv[2], int(sys.argv[3])
clock = time.perf_counter_ns
scrapes = [0]
if mode == "plain":
    tracker = babysitter.watch(run="bench", tokens_per_step=4096, flops_per_token=6e9, peak_flops=1e15,
                               port=-1, ledger=False)
else:
    tracker = babysitter.watch(run="bench", tokens_per_step=4096, flops_per_token=6e9, peak_flops=1e15,
                               port=-1, run_dir=tempfile.mkdtemp(), flush_interval=0.2, hang_timeout=None)
    stop = threading.Event()
    def scrape():
        while not stop.wait(0.25):
            generate_latest(tracker.registry)
            scrapes[0] += 1
    threading.Thread(target=scrape, daemon=True).start()
step = tracker.step
samples = [0] * steps
gc.collect()
if mode == "plain":
    for i in range(steps):
        t0 = clock()
        step()
        samples[i] = clock() - t0
    t0 = clock()
    for _ in range(steps):
        step()
    loop = (clock() - t0) / steps
else:
    pace = 1_000_000  # 1 ms a step
    nxt = clock()
    for i in range(steps):
        t0 = clock()
        step()
        samples[i] = clock() - t0
        nxt += pace
        while clock() < nxt:
            pass
    loop = 0.0
    stop.set()
tracker.close()
samples.sort()
print(json.dumps({"median": samples[len(samples) // 2], "p99": samples[int(0.99 * len(samples))],
                  "loop": loop, "scrapes": scrapes[0]}))
"""


def run(src: str, mode: str, steps: int) -> dict[str, float]:
    argv = [sys.executable, "-c", WORKER, src, mode, str(steps)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True, help="the src directory of the tree to compare with")
    parser.add_argument("--after", default=str(HERE.parent / "src"), help="this tree's src (default)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200_000, help="plain: steps per measurement")
    parser.add_argument("--paced", type=int, default=5_000, help="ledger: 1 ms steps per measurement")
    args = parser.parse_args()
    for mode, steps in (("plain", args.steps), ("ledger", args.paced)):
        pairs = []
        for k in range(args.rounds):
            order = [("before", args.before), ("after", args.after)]
            if k % 2:
                order.reverse()
            got = {name: run(src, mode, steps) for name, src in order}
            pairs.append(got)
            b, a = got["before"], got["after"]
            print(
                f"{mode} round {k + 1}: before median {b['median']} p99 {b['p99']} loop {b['loop']:.0f} | "
                f"after median {a['median']} p99 {a['p99']} loop {a['loop']:.0f} ns"
                + (f" (scrapes {b['scrapes']}/{a['scrapes']})" if mode == "ledger" else ""),
                flush=True,
            )
        for key in ("median", "p99", "loop") if mode == "plain" else ("median", "p99"):
            ratios = [p["after"][key] / p["before"][key] for p in pairs]
            print(
                f"{mode} {key}: after/before median ratio {statistics.median(ratios):.3f} "
                f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})",
                flush=True,
            )


if __name__ == "__main__":
    main()
