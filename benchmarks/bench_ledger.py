"""Ledger scale benchmark: a generated 30-day, ~1M-step run with 50 restarts.

Measures the ledger's size, ``babysitter report`` time (JSON, table, PNG), what a restarted writer pays
to read the ledger back, the cost of a scrape, and the writer's cost per step. Prints a Markdown block
for benchmarks/results/ledger.md.

    .venv/bin/python benchmarks/bench_ledger.py [--steps 1000000] [--restarts 50] [--days 30]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from babysitter.ledger import DEFAULT_FILE_NAME, LedgerWriter, summarize
from babysitter.ledger.records import (
    Alive,
    CheckpointBegin,
    CheckpointEnd,
    End,
    PhaseBegin,
    PhaseEnd,
    Progress,
    Record,
    Start,
    encode,
    fence_tag,
)

US = 1_000_000


def generate(
    path: Path, *, steps: int, restarts: int, days: float, flush: float, seed: int = 1
) -> dict[str, float]:
    """Write a realistic ledger: what LedgerWriter writes for such a run (one progress line per flush).

    Data wait per step: 95 % of steps wait 20 us - 2 ms for their batch (a prefetching loader), 5 %
    stall 10 ms - 2 s; every line carries its writer's fencing tag, and is written some time after its
    last boundary (up to a step, at most a flush interval), as the writer's lines are.
    """
    rng = random.Random(seed)
    wall = days * 86400.0
    downtime_total = restarts * 600.0
    startup, load, save, every, eval_every, eval_s = 180.0, 60.0, 40.0, 1000, 5000, 90.0
    # Pick the step time so that the recorded boundaries (kept + recomputed) come to ``steps``.
    busy = wall - downtime_total - (restarts + 1) * (startup + load)
    step_time = busy / (steps * (1 + save / (every * 2.5) + eval_s / (eval_every * 2.5)) * 1.0)
    crash_times = sorted(rng.uniform(0.02, 0.98) * wall for _ in range(restarts))
    t = 1_700_000_000.0
    end_of_run = t + wall
    step = 0
    last_ckpt = 0
    written = 0
    out: list[bytes] = []
    tag: str | None = None

    def put(rec: Record) -> None:
        out.append(encode(rec, fence=None if isinstance(rec, Start) else tag))

    def wait_us() -> int:
        return rng.randrange(20, 2_000) if rng.random() < 0.95 else rng.randrange(10_000, 2_000_000)

    boundaries = 0
    for inc in range(restarts + 1):
        pst = t
        t += 20.0
        incarnation_id = f"{rng.getrandbits(64):016x}"
        tag = fence_tag(incarnation_id)
        put(
            Start(
                t=round(t * US),
                pst=round(pst * US),
                id=incarnation_id,
                host=f"node-{inc % 7}",
                pid=1000 + inc,
                run="bench",
                info={"world_size": 1024, "version": "0.1.0"},
            )
        )
        t += startup - 20.0
        if last_ckpt:
            put(CheckpointBegin(t=round(t * US), op="load", step=last_ckpt, path=f"/ck/{last_ckpt}"))
            t += load
            put(
                CheckpointEnd(
                    t=round(t * US), op="load", step=last_ckpt, ok=True, nbytes=None, path=f"/ck/{last_ckpt}"
                )
            )
        step = last_ckpt
        stop = crash_times[inc] + 1_700_000_000.0 if inc < restarts else end_of_run
        batch_steps: list[int] = []
        batch_ends: list[int] = []
        batch_waits: list[int] = []
        next_flush = t + flush
        peak: float | None = 9.89e14
        while t < stop and boundaries < steps:
            t += step_time * rng.uniform(0.97, 1.03)
            step += 1
            boundaries += 1
            batch_steps.append(step)
            batch_ends.append(round(t * US))
            batch_waits.append(wait_us())
            extra: list[Record] = []
            if step % every == 0:
                extra.append(CheckpointBegin(t=round(t * US), op="save", step=step, path=f"/ck/{step}"))
                t += save
                extra.append(
                    CheckpointEnd(
                        t=round(t * US), op="save", step=step, ok=True, nbytes=1 << 40, path=f"/ck/{step}"
                    )
                )
                last_ckpt = step
            if step % eval_every == 0:
                extra.append(PhaseBegin(t=round(t * US), name="eval"))
                t += eval_s
                extra.append(PhaseEnd(t=round(t * US), name="eval"))
            if t >= next_flush or extra:
                put(
                    Progress(
                        t=round((t + rng.uniform(0.0, min(step_time, flush))) * US),
                        steps=tuple(batch_steps),
                        ends=tuple(batch_ends),
                        data_wait=sum(batch_waits),
                        model_flops=0.45 * 9.89e14 * step_time * len(batch_steps),
                        peak_flops=peak,
                        waits=tuple(batch_waits),
                    )
                )
                peak = None  # like the writer: the peak only when it changes
                batch_steps, batch_ends, batch_waits = [], [], []
                for rec in extra:
                    put(rec)
                next_flush = t + flush
        if batch_steps:
            put(
                Progress(
                    t=round(t * US),
                    steps=tuple(batch_steps),
                    ends=tuple(batch_ends),
                    data_wait=sum(batch_waits),
                    model_flops=0.45 * 9.89e14 * step_time * len(batch_steps),
                    peak_flops=peak,
                    waits=tuple(batch_waits),
                )
            )
        if inc < restarts:
            put(Alive(t=round(t * US)))
            t += rng.uniform(300, 900)  # downtime
        else:
            put(End(t=round(t * US), clean=True))
        if len(out) > 10_000:
            written += _flush(path, out)
    written += _flush(path, out)
    return {"boundaries": boundaries, "step_time": step_time, "bytes": written}


def _flush(path: Path, out: list[bytes]) -> int:
    data = b"".join(out)
    out.clear()
    with path.open("ab") as f:
        f.write(data)
    return len(data)


def timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Result and CPU seconds of this thread (the machine is shared: wall time is noise)."""
    t0 = time.thread_time()
    result = fn(*args, **kwargs)
    return result, time.thread_time() - t0


def cli(run_dir: Path, *extra: str, repeat: int = 3) -> tuple[float, float]:
    """Best wall time and best CPU time (user + sys) of ``repeat`` report runs in a new process."""
    best_wall = best_cpu = float("inf")
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "babysitter", "report", str(run_dir), *extra],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
    return best_wall, best_cpu


def writer_cost(tmp: Path, steps: int = 200_000, per_call: int = 1) -> dict[str, float]:
    """Cost per step of feeding the writer (caller side) and of its batch work (writer thread side)."""
    run_dir = tmp / "writer"
    w = LedgerWriter(run_dir, run="cost", flush_interval=1e6, heartbeat_interval=1e5, stale_after=1e6)
    t = time.time()
    w.incarnation_start(time=t, info={})
    call_s = tick_s = 0.0
    step = 0
    calls_per_flush = 5  # ~1 call per second from the tracker, one flush every 5 s
    calls = 0
    while step < steps:
        batch = [(step + i + 1, t + (step + i + 1) * 0.5) for i in range(per_call)]
        step += per_call
        t0 = time.thread_time()
        w.progress(
            boundaries=batch,
            data_wait_seconds=0.001 * per_call,
            model_flops=1e15,
            peak_flops=1e15,
            data_waits=[0.001] * per_call,
        )
        t1 = time.thread_time()
        call_s += t1 - t0
        calls += 1
        if calls % calls_per_flush == 0:
            w._tick()
            tick_s += time.thread_time() - t1
    w._tick()
    list(w.metrics(["run", "rank"], ["cost", "0"], t + steps * 0.5 + 1))  # classifies the history once
    t0 = time.thread_time()
    for _ in range(20):
        list(w.metrics(["run", "rank"], ["cost", "0"], t + steps * 0.5 + 1))
    scrape = (time.thread_time() - t0) / 20
    w.close(time=t + steps * 0.5 + 2, clean=True)
    return {
        "call_us_per_step": call_s / steps * 1e6,
        "tick_us_per_step": tick_s / steps * 1e6,
        "scrape_ms": scrape * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--restarts", type=int, default=50)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--flush", type=float, default=5.0, help="writer flush interval to emulate (s)")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpname:
        tmp = args.dir or Path(tmpname)
        run_dir = tmp / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        ledger = run_dir / DEFAULT_FILE_NAME
        if ledger.exists():
            ledger.unlink()
        gen, gen_s = timed(
            generate, ledger, steps=args.steps, restarts=args.restarts, days=args.days, flush=args.flush
        )
        size = ledger.stat().st_size
        lines = ledger.read_bytes().count(b"\n")
        summary, summarize_s = timed(summarize, run_dir, keep_points=False)
        json_s = cli(run_dir, "--json")
        table_s = cli(run_dir)
        png_s = cli(run_dir, "--json", "--png", str(tmp / "timeline.png"))
        writer, restart_s = timed(
            LedgerWriter, run_dir, run="bench", flush_interval=1e6, heartbeat_interval=1e5, stale_after=1e6
        )
        t0 = time.perf_counter()
        writer.wait_loaded()
        load_s = time.perf_counter() - t0
        _, first_scrape_s = timed(lambda: list(writer.metrics(["run"], ["bench"], time.time())))
        _, scrape_s = timed(lambda: list(writer.metrics(["run"], ["bench"], time.time())))
        writer.close(time=time.time(), clean=True)
        cost1 = writer_cost(tmp, per_call=1)
        cost4 = writer_cost(tmp, per_call=4)
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    t = summary.totals
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    print(f"""## {when} — {cpu}, {os.cpu_count()} cores (shared), Python {platform.python_version()}, \
load average {load:.1f} at the end

Generated: {args.days:g} days, {gen["boundaries"]:,} step boundaries (step {gen["step_time"]:.2f} s), \
{args.restarts} restarts, checkpoint every 1000 steps, eval every 5000, \
one progress line per {args.flush:g} s (generation {gen_s:.1f} s).

| what | result | target |
|---|---|---|
| ledger size | {size / 1e6:.1f} MB, {lines:,} lines | < 50 MB |
| `report --json`: wall / CPU (new process, best of 3) | {json_s[0]:.2f} s / {json_s[1]:.2f} s | < 5 s |
| `report` (tables): wall / CPU | {table_s[0]:.2f} s / {table_s[1]:.2f} s | < 5 s |
| `report --json --png`: wall / CPU | {png_s[0]:.2f} s / {png_s[1]:.2f} s | |
| `summarize()` in process, CPU (read, fold, account, windows) | {summarize_s:.2f} s | |
| restarted writer: construct (lock; what `watch()` waits for) | {restart_s * 1e3:.1f} ms | |
| restarted writer: background read + classification of the history (wall) | {load_s:.2f} s | |
| restarted writer: first scrape after that | {first_scrape_s * 1e3:.2f} ms | |
| restarted writer: next scrape | {scrape_s * 1e3:.2f} ms | |
| writer, caller side (`progress()`, CPU), 1 boundary per call | {cost1["call_us_per_step"]:.2f} us/step | |
| writer, batch side (drain, encode, fold, write), 1 per call | {cost1["tick_us_per_step"]:.2f} us/step | |
| writer, caller side, 4 boundaries per call | {cost4["call_us_per_step"]:.2f} us/step | |
| writer, batch side, 4 per call | {cost4["tick_us_per_step"]:.2f} us/step | |
| scrape of a live writer after 200k steps | {cost1["scrape_ms"]:.2f} ms | |

Accounting of the generated run: goodput {t.goodput:.3f}, restarts {t.restarts}, \
lost progress {t.badput_seconds["lost_progress"] / 3600:.1f} h, \
downtime {t.badput_seconds["downtime"] / 3600:.1f} h, \
checkpoint saves {t.badput_seconds["checkpoint_save"] / 3600:.1f} h.""")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
