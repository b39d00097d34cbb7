"""A tiny training loop for the fault-injection test: the real tracker, real checkpoints, killed at will.

Run as a script (pytest collects nothing here). It resumes from the newest complete checkpoint file,
trains to ``--total`` steps with a checkpoint every ``--every`` steps, and writes the truth (step ends,
checkpoint save intervals, resume step) to its own log with one unbuffered write per event, so the
parent can compare the ledger with what really happened after a SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def _newest_checkpoint(ckpt_dir: Path) -> int:
    steps = [int(p.name.split("_")[1]) for p in ckpt_dir.glob("step_*") if p.is_file()]
    return max(steps, default=0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--truth", type=Path, required=True)
    ap.add_argument("--total", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--step-seconds", type=float, default=0.04)
    ap.add_argument("--save-seconds", type=float, default=0.12)
    args = ap.parse_args()

    import babysitter

    fd = os.open(args.truth, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(line: str) -> None:
        os.write(fd, f"{line} {time.time():.6f}\n".encode())

    ckpt_dir = args.run_dir / "ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tracker = babysitter.watch(
        run_dir=args.run_dir,
        run="fault-injection",
        port=-1,
        registry_dir=args.run_dir / "registry",
        peak_flops=1e12,
        flops_per_token=6.0,
        tokens_per_step=1000,
        flush_interval=0.02,
    )
    log("start 0")
    resume = _newest_checkpoint(ckpt_dir)
    if resume:
        with tracker.checkpoint_load(step=resume, path=str(ckpt_dir / f"step_{resume}")):
            time.sleep(0.03)
    log(f"resume {resume}")
    for step in range(resume + 1, args.total + 1):
        time.sleep(args.step_seconds)
        tracker.step()
        log(f"step {step}")
        if step % args.every == 0:
            final = ckpt_dir / f"step_{step}"
            log(f"save_begin {step}")
            with tracker.checkpoint_save(step=step, path=str(final)) as handle:
                tmp = ckpt_dir / f".tmp_{step}"
                tmp.write_bytes(b"x" * 1000)
                time.sleep(args.save_seconds)
                tmp.rename(final)
                handle.nbytes = 1000
            log(f"save_end {step}")
    tracker.close()
    log("end 0")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
