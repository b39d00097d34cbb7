"""The slowdown split by cause, as far as the ledger alone can tell.

The slow steps' stretches (:class:`~babysitter.ledger.slowdown.Stretch`) are merged into *episodes*
(stretches of one incarnation less than :data:`MERGE_SECONDS` apart). The ledger holds one kind of
evidence: the straggler exchange's verdicts (rank 0's ``strg`` records: which rank the others waited
for, by collective arrival, with its host and GPU). An episode during which a verdict named a rank is
charged to ``straggler`` (that rank); every other episode is ``unknown``. What slowed the straggler (its
GPU throttling, a degraded PCIe link, fabric errors on its host) is in the node agent's series:
``babysitter report --prometheus`` refines the split (:mod:`babysitter.explain.slowdown`). Without it
the report says the cause is unknown rather than guessing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from babysitter.ledger.slowdown import TOLERANCE, SlowBook, Stretch
from babysitter.ledger.timeline import Timeline

__all__ = ["CAUSES", "MERGE_SECONDS", "Episode", "SlowdownSplit", "split_from_ledger"]

#: The causes slowdown is split into, in display order (``data_stall`` is its own badput cause).
CAUSES: dict[str, str] = {
    "gpu_throttling": "the culprit's GPU throttled (thermal, power, HW slowdown)",
    "pcie": "a PCIe link of the culprit's host trained below its width",
    "fabric": "InfiniBand/RoCE errors or flaps on the culprit's host",
    "straggler": "one rank was slower than the others (collective arrival); its host showed nothing",
    "unknown": "no evidence names a cause",
}
#: Stretches of one incarnation closer than this are one episode.
MERGE_SECONDS = 60.0
#: A verdict made this long after an episode's end still speaks of it (the exchange's median of
#: three rounds lags the slowdown).
_VERDICT_GRACE_SECONDS = 120.0
US = 1_000_000


@dataclass
class Episode:
    """A stretch of slow steps and what caused it."""

    incarnation: int
    begin_us: int
    end_us: int
    excess_us: int
    ideal_us: int
    slow_steps: int
    first_step: int
    last_step: int
    cause: str = "unknown"
    rank: int | None = None
    host: str | None = None
    gpu: str | None = None
    #: What the evidence says, for a person (one line each).
    evidence: list[str] = field(default_factory=list)

    @property
    def factor(self) -> float:
        """How much longer its slow steps took than ideal."""
        return (self.ideal_us + self.excess_us) / self.ideal_us if self.ideal_us else 0.0

    @property
    def slow_share(self) -> float:
        """The share of its span its slow steps took: under 1 where stretches were merged across
        healthy steps (a noisy step 40 s before a throttle makes one episode of both)."""
        span = self.end_us - self.begin_us
        return min(1.0, (self.ideal_us + self.excess_us) / span) if span > 0 else 1.0

    def where(self) -> str:
        """``rank 2 (host n1, GPU GPU-...)``, or "" when no rank is named."""
        if self.rank is None:
            return ""
        parts = [f"host {self.host}" if self.host else "", f"GPU {self.gpu}" if self.gpu else ""]
        inside = ", ".join(p for p in parts if p)
        return f"rank {self.rank}" + (f" ({inside})" if inside else "")

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (times in Unix seconds)."""
        return {
            "incarnation": self.incarnation,
            "start": self.begin_us / US,
            "end": self.end_us / US,
            "seconds": self.excess_us / US,
            "slow_steps": self.slow_steps,
            "factor": round(self.factor, 4),
            "first_step": self.first_step,
            "last_step": self.last_step,
            "cause": self.cause,
            "rank": self.rank,
            "host": self.host,
            "gpu": self.gpu,
            "evidence": list(self.evidence),
        }


@dataclass
class SlowdownSplit:
    """The run's slowdown, split by cause; ``source`` says what the split rests on."""

    total_us: int
    episodes: list[Episode]
    ideal_seconds: float | None
    deviation_seconds: float | None
    #: ``ledger`` (straggler verdicts only) or ``prometheus`` (and the node agents' series).
    source: str = "ledger"
    note: str = ""

    @property
    def by_cause(self) -> dict[str, float]:
        """Seconds of slowdown per cause (every cause listed, zeros included)."""
        out = dict.fromkeys(CAUSES, 0.0)
        for e in self.episodes:
            out[e.cause] = out.get(e.cause, 0.0) + e.excess_us / US
        return out

    def to_json(self, max_episodes: int = 100) -> dict[str, object]:
        """``report --json``'s ``slowdown``: the largest ``max_episodes`` episodes, in time order."""
        largest = sorted(self.episodes, key=lambda e: -e.excess_us)[:max_episodes]
        kept = sorted(largest, key=lambda e: e.begin_us)
        return {
            "seconds": self.total_us / US,
            "ideal_step_seconds": self.ideal_seconds,
            "step_time_deviation_seconds": self.deviation_seconds,
            "tolerance": TOLERANCE,
            "by_cause": self.by_cause,
            "source": self.source,
            "note": self.note,
            "episodes": [e.to_json() for e in kept],
            "episodes_left_out": len(self.episodes) - len(kept),
        }


def _episodes(stretches: list[Stretch]) -> list[Episode]:
    out: list[Episode] = []
    for s in sorted(stretches, key=lambda s: (s.incarnation, s.begin_us)):
        last = out[-1] if out else None
        near = last is not None and s.begin_us - last.end_us < MERGE_SECONDS * US
        if last is not None and near and last.incarnation == s.incarnation:
            last.end_us = max(last.end_us, s.end_us)
            last.excess_us += s.excess_us
            last.ideal_us += s.ideal_us
            last.slow_steps += s.slow_steps
            last.last_step = s.last_step
            continue
        out.append(
            Episode(
                s.incarnation,
                s.begin_us,
                s.end_us,
                s.excess_us,
                s.ideal_us,
                s.slow_steps,
                s.first_step,
                s.last_step,
            )
        )
    return out


def _name_stragglers(timeline: Timeline, episodes: list[Episode]) -> None:
    """Charge an episode to the rank the straggler verdicts named most during it (and a little after)."""
    for e in episodes:
        if e.incarnation >= len(timeline.incarnations):
            continue
        verdicts = timeline.incarnations[e.incarnation].stragglers
        late = e.end_us + round(_VERDICT_GRACE_SECONDS * US)
        named = Counter[tuple[int, str | None, str | None]]()
        scores: dict[int, float] = {}
        active = None
        for t, rank, score, host, gpu in verdicts:
            if t <= e.begin_us:
                active = (rank, score, host, gpu)  # the verdict standing when the episode began
                continue
            if t > late:
                break
            if rank is not None:
                named[(rank, host, gpu)] += 1
                scores[rank] = max(scores.get(rank, 0.0), score)
        if not named and active is not None:
            standing, score, host, gpu = active
            if standing is not None:
                named[(standing, host, gpu)] += 1
                scores[standing] = score
        if not named:
            continue
        (rank, host, gpu), count = named.most_common(1)[0]
        e.cause, e.rank, e.host, e.gpu = "straggler", rank, host, gpu
        e.evidence.append(
            f"the straggler exchange named rank {rank} {count} time(s): its work between collectives took "
            f"up to {scores[rank]:.2f}x the median rank's (collective arrival)"
        )


def split_from_ledger(book: SlowBook, timeline: Timeline) -> SlowdownSplit:
    """The slowdown's episodes, charged to a straggler where the ledger's verdicts name one."""
    episodes = _episodes(book.stretches())
    _name_stragglers(timeline, episodes)
    note = (
        "cause unknown beyond the straggler exchange's verdicts: --prometheus URL checks the GPUs "
        "(throttling), PCIe links and fabric of the culprits"
        if episodes
        else ""
    )
    return SlowdownSplit(
        total_us=book.total_us,
        episodes=episodes,
        ideal_seconds=book.ideal_seconds(),
        deviation_seconds=book.deviation_seconds(),
        note=note,
    )
