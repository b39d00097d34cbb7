"""Builders for hand-written ledgers: times are seconds after T0, written as integer microseconds."""

from __future__ import annotations

from pathlib import Path

from babysitter.ledger.accounting import Accountant, Accounting
from babysitter.ledger.records import (
    Alive,
    CheckpointBegin,
    CheckpointEnd,
    End,
    Hang,
    PhaseBegin,
    PhaseEnd,
    Progress,
    Record,
    Start,
    encode,
    fence_tag,
)
from babysitter.ledger.timeline import Timeline

__all__ = ["T0", "US", "Book", "s"]

T0 = 1_700_000_000
US = 1_000_000


def s(x: float) -> int:
    """Seconds after T0 as integer microseconds."""
    return (T0 * US) + round(x * US)


class Book:
    """A ledger written by hand, record by record; each line tagged as its writer would tag it (the
    newest start's incarnation, unless :meth:`as_writer` says otherwise)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.tags: list[str | None] = []
        self._n = 0
        self._tag: str | None = None

    def _add(self, record: Record) -> None:
        self.records.append(record)
        self.tags.append(self._tag)

    def start(self, t: float, *, pst: float | None = None) -> Book:
        self._n += 1
        self._tag = fence_tag(f"i{self._n}")
        self._add(
            Start(t=s(t), pst=s(t if pst is None else pst), id=f"i{self._n}", host="h", pid=self._n, run="r")
        )
        return self

    def segment(self, t: float, *, last_step: int, last_end: float, resumed: int | None = 0) -> Book:
        """The current incarnation's continuation start (its writer found the file deleted)."""
        first = next(r for r in reversed(self.records) if isinstance(r, Start))
        count = sum(1 for r in self.records if isinstance(r, Start) and r.id == first.id)
        self._add(
            Start(
                t=s(t),
                pst=first.pst,
                id=first.id,
                host=first.host,
                pid=first.pid,
                run=first.run,
                segment=count,
                last_step=last_step,
                last_end=s(last_end),
                resumed=resumed,
            )
        )
        return self

    def as_writer(self, n: int) -> Book:
        """The following lines are written by incarnation ``n`` (1-based), e.g. a fenced one."""
        self._tag = fence_tag(f"i{n}")
        return self

    def steps(
        self,
        first: int,
        ends: list[float],
        *,
        data_wait: float = 0.0,
        waits: list[float] | None = None,
        tokens: list[int] | None = None,
    ) -> Book:
        """Boundaries; ``data_wait`` is one total for the line (as version 1 wrote it), ``waits`` one
        wait per boundary (version 2), ``tokens`` each boundary's step's tokens."""
        per = None if waits is None else tuple(round(w * US) for w in waits)
        self._add(
            Progress(
                t=s(ends[-1]),
                steps=tuple(range(first, first + len(ends))),
                ends=tuple(s(e) for e in ends),
                data_wait=round(data_wait * US) if per is None else sum(per),
                model_flops=1e15,
                peak_flops=1e15,
                waits=per,
                work=None if tokens is None else tuple(tokens),
            )
        )
        return self

    def save(self, t0: float, t1: float | None, step: int, *, ok: bool = True) -> Book:
        self._add(CheckpointBegin(t=s(t0), op="save", step=step, path=f"/ck/{step}"))
        if t1 is not None:
            self._add(CheckpointEnd(t=s(t1), op="save", step=step, ok=ok, nbytes=100, path=f"/ck/{step}"))
        return self

    def load(self, t0: float, t1: float, step: int, *, ok: bool = True) -> Book:
        self._add(CheckpointBegin(t=s(t0), op="load", step=step, path=None))
        self._add(CheckpointEnd(t=s(t1), op="load", step=step, ok=ok, nbytes=None, path=None))
        return self

    def phase(self, name: str, t0: float, t1: float) -> Book:
        self._add(PhaseBegin(t=s(t0), name=name))
        self._add(PhaseEnd(t=s(t1), name=name))
        return self

    def hang(self, t: float, step: int, since: float) -> Book:
        self._add(Hang(t=s(t), step=step, since=round(since * US)))
        return self

    def alive(self, t: float) -> Book:
        self._add(Alive(t=s(t)))
        return self

    def end(self, t: float, *, clean: bool = True) -> Book:
        self._add(End(t=s(t), clean=clean))
        return self

    def timeline(self) -> Timeline:
        tl = Timeline()
        tl.extend(self.records)
        return tl

    def account(
        self, *, now: float | None = None, live: bool = False, tail: str = "other", hold: bool = False
    ) -> Accounting:
        return Accountant(self.timeline()).totals(
            now=None if now is None else T0 + now, live=live, tail=tail, hold=hold
        )

    def encoded(self) -> list[bytes]:
        """The ledger's lines, as the writer encodes them."""
        return [encode(r, fence=tag) for r, tag in zip(self.records, self.tags, strict=True)]

    def write(self, path: Path) -> Path:
        path.write_bytes(b"".join(self.encoded()))
        return path


def nonzero(acc: Accounting) -> dict[str, float]:
    """Badput causes with time, in seconds, plus productive: the shape known answers are written in."""
    out = {cause: us / US for cause, us in acc.badput_us.items() if us}
    out["productive"] = acc.productive_us / US
    return out


def ramp(first_end: float, n: int, step: float = 1.0) -> list[float]:
    """``n`` boundary times, ``step`` apart, starting at ``first_end``."""
    return [first_end + i * step for i in range(n)]
