"""How ``v1-run/babysitter-ledger.jsonl`` was made: the real tracker and ledger writer of commit f4a2078
(the last one writing schema version 1), three incarnations of a tiny loop.

    BABYSITTER_LEDGER_FLUSH_SECONDS=0.02 python tests/data/ledger/make_v1_ledger.py OUT_DIR

The first incarnation is killed (``os._exit``, no end record) after a checkpoint and a few more steps,
the second resumes from that checkpoint, waits on a slow loader, runs an eval phase and ends with an
error, the third resumes and ends cleanly. ``v1-report.json`` is ``babysitter report --json`` of that
code on the result.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def loader(slow_every: int) -> Iterator[int]:
    i = 0
    while True:
        i += 1
        if i % slow_every == 0:
            time.sleep(0.03)
        yield i


def incarnation(run_dir: Path, index: int) -> None:
    import babysitter

    tracker = babysitter.watch(
        run_dir=run_dir,
        run="v1-compat",
        port=-1,
        registry_dir=run_dir / "registry",
        tokens_per_step=1000,
        flops_per_token=6.0,
        peak_flops=1e12,
        flush_interval=0.02,
    )
    first = 1
    if index > 0:
        resume = 10 if index == 1 else 20
        with tracker.checkpoint_load(step=resume, path=str(run_dir / f"ck{resume}")):
            time.sleep(0.02)
        first = resume + 1
    data = tracker.data(loader(slow_every=4 if index == 1 else 7))
    for step in range(first, first + 15):
        next(data)
        time.sleep(0.01)
        tracker.step(step=step)
        if step % 10 == 0:
            with tracker.checkpoint_save(step=step, path=str(run_dir / f"ck{step}")) as c:
                time.sleep(0.02)
                c.nbytes = 100
        if index == 1 and step == 15:
            with tracker.phase("eval"):
                time.sleep(0.03)
    time.sleep(0.1)
    if index == 0:
        os._exit(0)  # killed: no end record
    tracker.close(clean=index == 2)


def main() -> int:
    if len(sys.argv) == 3:
        incarnation(Path(sys.argv[1]), int(sys.argv[2]))
        return 0
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for index in range(3):
        subprocess.run([sys.executable, __file__, str(out), str(index)], check=True)
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
