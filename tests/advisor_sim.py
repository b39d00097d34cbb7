"""A seeded Monte-Carlo of a run with failures and periodic checkpoints, written as a real ledger.

Simulated clock: a run of fixed-length steps that saves every ``every`` steps (blocking ``save``
seconds); failures arrive as a Poisson process in wall time (during steps, saves and restarts alike);
each one costs ``down`` seconds of downtime, ``startup`` seconds of startup and ``load`` seconds of
checkpoint load, and the steps after the last completed save are computed again. The records go
through the real encoder into a file that the real reader and accounting read back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from test_ledger_helpers import Book

__all__ = ["Scenario", "failure_times", "fit_optimum", "simulate"]


@dataclass(frozen=True)
class Scenario:
    step: float = 20.0
    save: float = 120.0
    down: float = 180.0
    startup: float = 60.0
    load: float = 60.0
    mtbf: float = 3600.0
    horizon: float = 1500 * 3600.0

    @property
    def restart(self) -> float:
        return self.down + self.startup + self.load


def failure_times(sc: Scenario, seed: int) -> list[float]:
    """Failure instants over the horizon (the same for every interval: common random numbers)."""
    rng = random.Random(seed)
    out, t = [], 0.0
    while t < sc.horizon * 1.5:
        t += rng.expovariate(1.0 / sc.mtbf)
        out.append(t)
    return out


def simulate(sc: Scenario, every: int, failures: list[float], path: Path, *, gpus: int = 8) -> Path:
    """Write the ledger of a run that saves every ``every`` steps; returns its path."""
    book = Book()
    fi = 0
    t = 0.0  # wall clock
    saved = 0  # last completed save's step
    first = True
    while True:
        next_fail = failures[fi]
        # An incarnation: downtime (not the first), process start, startup, load.
        pst = t if first else t + sc.down
        while failures[fi] < pst:  # no process runs while down: nothing to interrupt
            fi += 1
        next_fail = failures[fi]
        if next_fail < pst + 1.0:
            fi += 1
            t = next_fail
            continue
        book.start(pst + 1.0, pst=pst)
        book.records[-1] = _with_world_size(book.records[-1], gpus)
        t = pst + sc.startup
        if next_fail < t:
            book.alive(next_fail)
            fi += 1
            t = next_fail
            first = False
            continue
        if saved:
            if next_fail < t + sc.load:
                book.alive(next_fail)
                fi += 1
                t = next_fail
                first = False
                continue
            book.load(t, t + sc.load, saved)
            t += sc.load
        first = False
        step = saved
        ends: list[float] = []
        died = False
        while True:
            if t >= sc.horizon and step == saved:
                break
            end = t + sc.step
            if next_fail < end:
                died = True
                break
            step += 1
            t = end
            ends.append(t)
            if step % every == 0:
                book.steps(step - len(ends) + 1, ends)
                ends = []
                if next_fail < t + sc.save:
                    book.save(t, None, step)
                    died = True
                    break
                book.save(t, t + sc.save, step)
                t += sc.save
                saved = step
                if t >= sc.horizon:
                    break
        if ends:
            book.steps(step - len(ends) + 1, ends)
        if died:
            book.alive(next_fail)
            t = next_fail
            fi += 1
            continue
        book.end(t)
        return book.write(path)


def _with_world_size(record: object, gpus: int) -> object:
    from dataclasses import replace

    return replace(record, info={"world_size": gpus})  # type: ignore[type-var]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a few unknowns)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def fit_optimum(points: list[tuple[float, float]]) -> float:
    """The interval minimising a least-squares fit of ``1/goodput = a/T + b + c T + d T^2`` through the
    measured points (the exponential model's expansion): the empirical optimum, smoothed over the
    grid instead of the noisy argmax of single points."""
    scale = max(t for t, _ in points)
    rows = [[scale / t, 1.0, t / scale, (t / scale) ** 2] for t, _ in points]
    ys = [1.0 / g for _, g in points]
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(4)] for i in range(4)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(4)]
    a, b, c, d = _solve(ata, aty)
    lo, hi = min(t for t, _ in points), scale
    best, best_y = lo, float("inf")
    for i in range(2001):
        t = lo + (hi - lo) * i / 2000
        y = a * scale / t + b + c * t / scale + d * (t / scale) ** 2
        if y < best_y:
            best, best_y = t, y
    return best
