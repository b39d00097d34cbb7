"""Which rank the others wait for: the arrival score from flight-recorder times, robust to host clocks.

At a straggler round every rank contributes, for the same sampled collectives of the default process
group, the time it enqueued each (its arrival); one element-wise MAX ``all_reduce`` gives every rank,
per collective, the latest arrival (when the collective could complete) and the earliest. From those:

* **gap** of a rank before collective N: its arrival at N minus the latest arrival at N-1. It could
  not leave N-1 before that, so the gap is the time it spent on its own work between the two. Only
  pairs where *every* rank arrived at N after N-1 could complete count (a sync boundary: a blocking
  all_reduce, the wait at the end of DDP's backward); inside async chains (DDP's buckets issued
  during backward) a gap says nothing about work and the pair is left out, for every rank alike.
* **score**: a rank's mean gap over the median rank's (1.4 for a rank whose work takes 40% longer).
  In lockstep training every rank's step time is the same, so step times cannot say this. The mean is
  trimmed (the highest and lowest tenth of the pairs, at least one each): a rank stopped for a minute
  (SIGSTOP, a hang that TrainingStalled pages) or paused once (GC, a save) has one huge gap, and a
  round samples the last :data:`PAIRS` pairs, so with fewer collectives than that per round the same
  pair sits in several rounds in a row - untrimmed, it would name the resumed rank a straggler for
  those rounds. A straggler is slow at every pair, which trimming keeps.
* **wait** of a rank at N: the latest arrival minus its own. **lag**: the median rank's mean wait
  minus its own (means trimmed of the highest and lowest tenth), i.e. how much later than the median
  rank it arrives at a collective, on average; the others wait about that long for it at each one.

Host clocks. Times from different hosts are compared, so each rank first subtracts its clock's offset
from the median rank's clock. The offset is measured every round: the round's ``all_gather`` completes
at one instant on every rank (when the last rank joins), and a callback on its future stamps that
instant on each rank's own clock; the offset is the median over the last rounds of the rank's stamp
minus the median rank's (a callback waits for the GIL, so one stamp can be late by milliseconds; the
median of nine is not). Until three rounds were stamped no arrival score is given. Waits and gaps use
corrected times only, so an offset of a few milliseconds (NTP) or of tens does not move the score
(``tests/test_arrival.py`` shows an uncorrected 25 ms offset flagging a healthy rank, and the
correction clearing it).

On NCCL the recorder's enqueue time is the host's, not the GPU's (the host runs ahead of the device).
There the arrival value is ``-duration_ms`` (``TORCH_NCCL_ENABLE_TIMING=1``): a collective's GPU time
includes its wait for the slowest peer, so the MAX of ``-duration`` is the shortest (the slowest
rank's) and a rank's wait is its duration minus the shortest; durations are measured on each GPU, so
no clock is compared. Gaps need times, so on NCCL only the lag is computed (not run on a GPU yet).

Pure arithmetic on Python floats: the straggler monitor calls it at a round (every N steps), a few
hundred operations, and never per step.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "MIN_OFFSET_ROUNDS",
    "MIN_PAIRS",
    "PAIRS",
    "PAYLOAD",
    "SYNC_TOLERANCE",
    "ClockOffsets",
    "RoundResult",
    "arrival_scores",
    "evaluate",
    "payload",
    "sample_seqs",
]

#: Collective pairs (N-1, N) sampled per round.
PAIRS = 32
#: Floats in one rank's MAX all_reduce payload: four per sampled collective.
PAYLOAD = 8 * PAIRS
#: A round needs this many sync-boundary pairs for a score.
MIN_PAIRS = 4
#: Seconds the earliest arrival at N may precede the latest at N-1 and still count as a sync boundary
#: (back-to-back collectives; clock corrections are good to a fraction of a millisecond).
SYNC_TOLERANCE = 0.002
#: Rounds of completion stamps the clock offsets are the median of, and the fewest that count.
OFFSET_ROUNDS = 9
MIN_OFFSET_ROUNDS = 3
_MISSING = (-math.inf, -math.inf, math.inf, math.inf)


def sample_seqs(x: int, previous: tuple[int, int] | None, round_index: int, capacity: int) -> list[int]:
    """The sequence numbers a round samples: ``(N-1, N)`` for :data:`PAIRS` values of N up to ``x``.

    ``x`` is the newest collective of the default group enqueued before the round was issued, the same
    on every rank of a lockstep job (every rank runs the same collectives per step); ``previous`` is
    ``(round, x)`` of an earlier round, so the samples spread over the collectives of one round (but
    within half the recorder's ``capacity``, which must still hold them). A deterministic jitter
    varies which collective of a step is sampled, so a job with a fixed pattern per step (weight and
    bias all-reduces) is not always sampled at the same place of it. The same inputs give the same
    list on every rank; where ranks disagree the payload's checks void the slot.
    """
    if x < 2:
        return []
    per_round = 1
    if previous is not None and round_index > previous[0] and x > previous[1]:
        per_round = (x - previous[1]) // (round_index - previous[0])
    stride = max(1, min(per_round // PAIRS, max(1, capacity // 2) // PAIRS))
    seqs: list[int] = []
    for j in range(PAIRS):
        n = x - j * stride - (j * 7919 + round_index * 104729) % stride
        if n < 2:
            break
        seqs += [n - 1, n]
    return seqs


def payload(
    seqs: Sequence[int], arrivals: Mapping[int, float], offset: float
) -> tuple[list[float], list[float]]:
    """This rank's MAX all_reduce payload (:data:`PAYLOAD` floats) and its own corrected arrivals.

    Per sampled collective: ``(a, -a, seq, -seq)`` with ``a`` the arrival minus this rank's clock
    offset; the reduced ``-a`` is minus the earliest arrival, and the reduced ``seq`` and ``-seq`` are
    the largest and minus the smallest sequence number any rank put in the slot, so a slot that any
    rank filled differently (or not at all: infinities) is void on every rank.
    """
    out: list[float] = []
    own: list[float] = []
    for seq in seqs:
        value = arrivals.get(seq)
        if value is None or not math.isfinite(value):
            out.extend(_MISSING)
            own.append(math.nan)
            continue
        corrected = value - offset
        out.extend((corrected, -corrected, float(seq), -float(seq)))
        own.append(corrected)
    while len(out) < PAYLOAD:
        out.extend(_MISSING)
    return out[:PAYLOAD], own


def _trimmed_mean(values: list[float]) -> float:
    """The mean without the highest and lowest tenth, at least one each from three values on (one GC
    pause or one stop must not make a lag or a straggler); NaN if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    cut = max(1, len(ordered) // 10) if len(ordered) >= 3 else 0
    kept = ordered[cut : len(ordered) - cut]
    return sum(kept) / len(kept)


@dataclass(frozen=True)
class RoundResult:
    """What one rank takes from a reduced round: its trimmed mean gap (NaN: no score this round), its
    trimmed mean wait (NaN: none), and how many sync-boundary pairs there were (the same on every
    rank)."""

    gap: float
    wait: float
    pairs: int


def evaluate(
    reduced: Sequence[float], seqs: Sequence[int], own: Sequence[float], *, gaps: bool = True
) -> RoundResult:
    """Gaps and waits of this rank from the reduced payload (``gaps=False``: waits only, for NCCL)."""
    valid: list[bool] = []
    for i, seq in enumerate(seqs):
        t, neg_min, seq_max, neg_seq_min = reduced[4 * i : 4 * i + 4]
        valid.append(
            seq_max == seq
            and neg_seq_min == -seq
            and math.isfinite(t)
            and math.isfinite(neg_min)
            and math.isfinite(own[i])
        )
    waits = [max(0.0, reduced[4 * i] - own[i]) for i in range(len(seqs)) if valid[i]]
    wait = _trimmed_mean(waits)
    if not gaps:
        return RoundResult(math.nan, wait, 0)
    found: list[float] = []
    for j in range(len(seqs) // 2):
        before, after = 2 * j, 2 * j + 1
        if not (valid[before] and valid[after]):
            continue
        latest_before = reduced[4 * before]
        earliest_after = -reduced[4 * after + 1]
        if earliest_after < latest_before - SYNC_TOLERANCE:
            continue  # some rank enqueued N before N-1 could complete: not a sync boundary
        found.append(max(0.0, own[after] - latest_before))
    pairs = len(found)
    return RoundResult(_trimmed_mean(found) if pairs >= MIN_PAIRS else math.nan, wait, pairs)


def arrival_scores(
    gaps: Sequence[float], waits: Sequence[float]
) -> tuple[list[float | None], list[float | None]]:
    """Per rank: score (mean gap over the median rank's) and lag (seconds later than the median
    rank); None where the round gives none (a rank without a result voids the whole round)."""
    scores: list[float | None] = [None] * len(gaps)
    lags: list[float | None] = [None] * len(waits)
    if gaps and all(math.isfinite(g) and g >= 0 for g in gaps):
        reference = statistics.median(gaps)
        if reference > 1e-5:  # 10 us of work per pair: below it, no work to compare
            scores = [g / reference for g in gaps]
    if waits and all(math.isfinite(w) for w in waits):
        reference = statistics.median(waits)  # the median rank's mean wait
        lags = [reference - w for w in waits]
    return scores, lags


class ClockOffsets:
    """Each rank's clock offset from the median rank's, from rounds' completion stamps."""

    def __init__(self, keep: int = OFFSET_ROUNDS) -> None:
        self._keep = keep
        self._samples: list[deque[float]] = []
        self.rounds = 0

    def add(self, stamps: Sequence[float]) -> bool:
        """One round's completion stamps (seconds, each on its rank's clock); False if any is missing."""
        if not stamps or not all(math.isfinite(s) for s in stamps):
            return False
        if len(self._samples) != len(stamps):
            self._samples = [deque(maxlen=self._keep) for _ in stamps]
        reference = statistics.median(stamps)
        for queue, stamp in zip(self._samples, stamps, strict=True):
            queue.append(stamp - reference)
        self.rounds += 1
        return True

    def offset(self, rank: int) -> float:
        """Seconds rank ``rank``'s clock is ahead of the median rank's (0 until stamped)."""
        if rank >= len(self._samples) or not self._samples[rank]:
            return 0.0
        return statistics.median(self._samples[rank])

    @property
    def settled(self) -> bool:
        """Whether enough rounds were stamped to trust the offsets."""
        return self.rounds >= MIN_OFFSET_ROUNDS
