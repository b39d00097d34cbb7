"""How often to checkpoint: the interval that maximises expected goodput, from measured inputs.

Three inputs, all measured: the blocking save cost ``C``, the restart cost ``R`` (downtime + startup +
checkpoint load) and the interruption rate ``lambda``. Young's first-order optimum is
``T = sqrt(2 C / lambda)``; Daly's higher-order one (Daly 2006, eq. 37) is used as the advice:

    T = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C    (C < 2M, M = 1 / lambda), else M

Expected goodput at an interval ``T`` follows Daly's exponential-failure model (failures may strike
during a save or a restart too): ``T / (M e^(R/M) (e^((T + C)/M) - 1))``. Meta's
``E[ETTR] ~ (1 - lambda (R + T/2)) / (1 + C/T)`` is its first-order form (:func:`ettr_meta`).

Not enough data: ``lambda`` comes from the run's own interruptions while it has seen at least
:data:`MIN_INTERRUPTIONS`; below that, from the cluster's interruptions per GPU-hour times the job's
GPUs when given, else from the run's few events flagged as insufficient (no advice at all with none).
Every rate carries its exact (Garwood) Poisson 95% interval, and the advice its range over it.

The math is pure (no I/O, no clock); :func:`advise_timeline` reads the inputs from a ledger timeline.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from babysitter.ledger.accounting import Accounting
from babysitter.ledger.timeline import Incarnation, Timeline

__all__ = [
    "EXACT_MAX_EVENTS",
    "MIN_INTERRUPTIONS",
    "Advice",
    "ClusterRate",
    "LedgerInputs",
    "RateEstimate",
    "RateSource",
    "advise",
    "advise_inputs",
    "advise_timeline",
    "daly_interval",
    "ettr_meta",
    "expected_goodput",
    "ledger_inputs",
    "optimal_interval",
    "parse_cluster_rate",
    "poisson_interval",
    "young_interval",
]

#: Fewer interruptions than this in the run's own ledger: its rate is too uncertain to act on alone
#: (with 5 events the 95% interval on the rate spans 0.32x..2.3x the estimate, the advice 0.66x..1.8x).
MIN_INTERRUPTIONS = 5

#: Saves and save intervals the inputs average over (the most recent ones: storage changes).
RECENT = 50

US = 1_000_000

RateSource = Literal["run", "cluster", "run-insufficient"]


def young_interval(save_seconds: float, rate_per_second: float) -> float:
    """Young's first-order optimum ``sqrt(2 C / lambda)`` (seconds of work between saves)."""
    return math.sqrt(2.0 * save_seconds / rate_per_second)


def daly_interval(save_seconds: float, rate_per_second: float) -> float:
    """Daly's higher-order optimum (Daly 2006, eq. 37): Young's with its correction, minus ``C``."""
    c, m = save_seconds, 1.0 / rate_per_second
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def expected_goodput(
    interval: float, save_seconds: float, restart_seconds: float, rate_per_second: float
) -> float:
    """Expected fraction of wall time that becomes kept progress when saving every ``interval`` seconds
    of work (Daly's model: exponential failures, which may also strike during saves and restarts)."""
    t, c, r, lam = interval, save_seconds, restart_seconds, rate_per_second
    if t <= 0:
        return 0.0
    if lam <= 0:
        return t / (t + c)
    m = 1.0 / lam
    try:
        wall = m * math.exp(r / m) * math.expm1((t + c) / m)
    except OverflowError:
        return 0.0
    return t / wall if wall > 0 else 0.0


def ettr_meta(interval: float, save_seconds: float, restart_seconds: float, rate_per_second: float) -> float:
    """Meta's first-order expected effective training time ratio ``(1 - lambda (R + T/2)) / (1 + C/T)``."""
    t = interval
    return max(0.0, (1.0 - rate_per_second * (restart_seconds + t / 2.0)) / (1.0 + save_seconds / t))


def optimal_interval(save_seconds: float, restart_seconds: float, rate_per_second: float) -> float:
    """The interval that maximises :func:`expected_goodput` exactly (golden-section search), to check
    Daly's closed form against."""
    lo, hi = 1e-9, 1.0 / rate_per_second * 4.0 + save_seconds
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)

    def f(t: float) -> float:
        return expected_goodput(t, save_seconds, restart_seconds, rate_per_second)

    fa, fb = f(a), f(b)
    for _ in range(200):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
        else:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
    return (lo + hi) / 2.0


def _poisson_cdf(n: int, mu: float) -> float:
    """P(X <= n) for X ~ Poisson(mu)."""
    if mu <= 0:
        return 1.0
    log_mu = math.log(mu)
    return min(1.0, sum(math.exp(-mu + k * log_mu - math.lgamma(k + 1)) for k in range(n + 1)))


#: Above this many events the interval comes from the Wilson-Hilferty approximation of the Gamma
#: quantiles (relative error < 0.1% there) instead of bisection on the CDF, whose cost grows with n.
EXACT_MAX_EVENTS = 200


def _exact_bounds(events: int, tail: float) -> tuple[float, float]:
    """Garwood bounds on the Poisson mean by bisection on the CDF: P(X <= n; upper) = tail,
    P(X >= n; lower) = tail."""

    def solve(n: int, target: float) -> float:
        lo, hi = 0.0, max(10.0, 2.0 * n + 20.0 * math.sqrt(n + 1.0))
        for _ in range(100):
            mid = (lo + hi) / 2.0
            if _poisson_cdf(n, mid) > target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2.0

    upper = solve(events, tail)
    lower = 0.0 if events == 0 else solve(events - 1, 1.0 - tail)
    return lower, upper


def _wilson_hilferty_bounds(events: int, tail: float) -> tuple[float, float]:
    """The same bounds from Wilson-Hilferty's chi-square quantiles: chi2_p(k) / 2 with k = 2n and
    2n + 2."""
    z = statistics.NormalDist().inv_cdf(1.0 - tail)

    def half_chi2(k: float, zp: float) -> float:
        c = 2.0 / (9.0 * k)
        return k * (1.0 - c + zp * math.sqrt(c)) ** 3 / 2.0

    return half_chi2(2.0 * events, -z), half_chi2(2.0 * events + 2.0, z)


def poisson_interval(events: int, exposure: float, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) two-sided interval on a Poisson rate: ``events`` seen in ``exposure`` units.

    The bounds are the Gamma quantiles ``Gamma(n, 1)_{a/2}`` and ``Gamma(n + 1, 1)_{1 - a/2}`` over the
    exposure: by bisection on the Poisson CDF (no SciPy) up to :data:`EXACT_MAX_EVENTS` events, by
    Wilson-Hilferty above. ValueError for a bad argument.
    """
    if events < 0 or not exposure > 0 or not 0 < confidence < 1:
        raise ValueError(
            f"need events >= 0, exposure > 0, 0 < confidence < 1: {events}, {exposure}, {confidence}"
        )
    tail = (1.0 - confidence) / 2.0
    bounds = _exact_bounds if events <= EXACT_MAX_EVENTS else _wilson_hilferty_bounds
    lower, upper = bounds(events, tail)
    return lower / exposure, upper / exposure


@dataclass(frozen=True)
class RateEstimate:
    """An interruption rate of this job, per hour, with its 95% interval and where it came from."""

    per_hour: float
    low: float
    high: float
    #: Interruptions counted and the hours they were counted over (GPU-hours for the cluster's).
    events: int
    exposure_hours: float
    source: RateSource

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class ClusterRate:
    """The cluster's measured interruptions over its GPU-hours (from its other runs, a provider's SLA
    report, ``sum(increase(train_restarts_total[30d]))`` over GPU-hours...)."""

    interruptions: int
    gpu_hours: float

    def __post_init__(self) -> None:
        if self.interruptions < 0 or not (math.isfinite(self.gpu_hours) and self.gpu_hours > 0):
            raise ValueError(
                "a cluster rate needs interruptions >= 0 and gpu_hours > 0, "
                f"got {self.interruptions}/{self.gpu_hours}"
            )


def parse_cluster_rate(text: str) -> ClusterRate:
    """``"INTERRUPTIONS/GPU_HOURS"`` (e.g. ``"12/40000"``) as a :class:`ClusterRate`; ValueError when
    malformed, so a bad setting fails at setup."""
    head, sep, tail = text.strip().partition("/")
    try:
        if not sep:
            raise ValueError
        return ClusterRate(int(head), float(tail))
    except ValueError:
        raise ValueError(f"a cluster rate is INTERRUPTIONS/GPU_HOURS (e.g. 12/40000), got {text!r}") from None


@dataclass(frozen=True)
class Advice:
    """The advice and everything it rests on (None where a quantity is not measured yet)."""

    #: C: mean blocking time of the recent successful saves, and how many there were.
    save_seconds: float | None
    saves: int
    #: R: mean downtime + startup + checkpoint load per restart, and the restarts it was measured on.
    restart_seconds: float | None
    restarts: int
    rate: RateEstimate | None
    #: The run's current interval: median wall time from a save's end to the next save's begin.
    current_interval_seconds: float | None
    recommended_interval_seconds: float | None
    #: The advice at the rate's 95% bounds: (at the high rate, at the low rate).
    recommended_range: tuple[float, float] | None
    expected_goodput_current: float | None
    expected_goodput_recommended: float | None
    #: The rate rests on enough interruptions (the run's own, or the cluster's).
    sufficient: bool
    #: One sentence on the data behind the advice (what is missing, which rate is used).
    note: str

    @property
    def gain(self) -> float | None:
        """Expected goodput gained by switching to the advice (None when either side is unknown)."""
        if self.expected_goodput_current is None or self.expected_goodput_recommended is None:
            return None
        return self.expected_goodput_recommended - self.expected_goodput_current

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        out = dict(self.__dict__)
        out["rate"] = None if self.rate is None else self.rate.to_json()
        span = self.recommended_range
        # JSON has no infinity: an unbounded end (a rate whose lower bound is 0) is null.
        out["recommended_range"] = None if span is None else [x if math.isfinite(x) else None for x in span]
        out["gain"] = self.gain
        return out


def _rate(
    interruptions: int, exposure_hours: float, gpus: int | None, cluster: ClusterRate | None
) -> tuple[RateEstimate | None, bool, str]:
    """The rate to use, whether it is sufficient, and why."""
    own = None
    if exposure_hours > 0:
        low, high = poisson_interval(interruptions, exposure_hours)
        own = RateEstimate(interruptions / exposure_hours, low, high, interruptions, exposure_hours, "run")
    if own is not None and interruptions >= MIN_INTERRUPTIONS:
        return own, True, f"rate from the run's {interruptions} interruptions in {exposure_hours:.1f} h"
    seen = f"{interruptions} interruption(s) in {exposure_hours:.1f} h (fewer than {MIN_INTERRUPTIONS})"
    if cluster is not None and gpus:
        low, high = poisson_interval(cluster.interruptions, cluster.gpu_hours)
        per = cluster.interruptions / cluster.gpu_hours
        rate = RateEstimate(
            per * gpus, low * gpus, high * gpus, cluster.interruptions, cluster.gpu_hours, "cluster"
        )
        enough = cluster.interruptions >= MIN_INTERRUPTIONS
        why = f"{seen}: cluster rate {cluster.interruptions}/{cluster.gpu_hours:g} GPU-h x {gpus} GPUs" + (
            "" if enough else f", itself from fewer than {MIN_INTERRUPTIONS} interruptions"
        )
        return rate, enough, why
    if own is None or interruptions == 0:
        hint = "" if cluster is not None else "; give the cluster's rate (--cluster-rate) for advice"
        if cluster is not None and not gpus:
            hint = "; the job's GPU count is unknown, so the cluster rate cannot be scaled"
        return None, False, f"no advice: {seen}{hint}"
    return (
        RateEstimate(own.per_hour, own.low, own.high, own.events, own.exposure_hours, "run-insufficient"),
        False,
        f"insufficient data: {seen}; the advice rests on them alone",
    )


def advise(
    *,
    save_seconds: float | None,
    saves: int,
    restart_seconds: float | None,
    restarts: int,
    interruptions: int,
    exposure_hours: float,
    current_interval_seconds: float | None,
    gpus: int | None = None,
    cluster: ClusterRate | None = None,
) -> Advice:
    """The advice from measured inputs (the pure part; see the module docstring for the rules)."""
    rate, sufficient, note = _rate(interruptions, exposure_hours, gpus, cluster)
    recommended = span = now = then = None
    if save_seconds is None:
        note = f"no advice: no completed checkpoint save yet; {note}"
        sufficient = False
    elif rate is not None and rate.per_hour > 0:
        c, r = save_seconds, restart_seconds or 0.0
        lam = rate.per_hour / 3600.0
        recommended = daly_interval(c, lam)
        span = (
            daly_interval(c, rate.high / 3600.0),
            daly_interval(c, rate.low / 3600.0) if rate.low > 0 else math.inf,
        )
        then = expected_goodput(recommended, c, r, lam)
        if current_interval_seconds is not None:
            now = expected_goodput(current_interval_seconds, c, r, lam)
    return Advice(
        save_seconds=save_seconds,
        saves=saves,
        restart_seconds=restart_seconds,
        restarts=restarts,
        rate=rate,
        current_interval_seconds=current_interval_seconds,
        recommended_interval_seconds=recommended,
        recommended_range=span,
        expected_goodput_current=now,
        expected_goodput_recommended=then,
        sufficient=sufficient,
        note=note,
    )


def _save_inputs(incs: list[Incarnation]) -> tuple[list[float], list[float]]:
    """Durations of successful saves and the gaps between consecutive ones (seconds, file order)."""
    durations: list[float] = []
    gaps: list[float] = []
    for inc in incs:
        prev_end: int | None = None
        for span in inc.checkpoints:
            if span.op != "save" or span.end is None or not span.ok:
                continue
            durations.append(max(0, span.end - span.begin) / US)
            if prev_end is not None:
                gaps.append(max(0, span.begin - prev_end) / US)
            prev_end = span.end
    return durations, gaps


@dataclass(frozen=True)
class LedgerInputs:
    """What the advice needs, as read from a ledger (see :func:`ledger_inputs`)."""

    save_seconds: float | None
    saves: int
    restart_seconds: float | None
    interruptions: int
    exposure_hours: float
    current_interval_seconds: float | None
    gpus: int | None


def ledger_inputs(timeline: Timeline, totals: Accounting, *, gpus: int | None = None) -> LedgerInputs:
    """The advice's inputs from a run's ledger: ``timeline`` and its accounting ``totals``.

    An interruption is a restart after an incarnation that did not end cleanly (killed or error); a
    restart after a clean end (a planned stop) is not, and its downtime is left out of the exposure.
    ``gpus`` defaults to the newest incarnation's recorded world size.
    """
    incs = timeline.incarnations
    durations, gaps = _save_inputs(incs)
    recent = durations[-RECENT:]
    interruptions, down_us, planned_us = 0, 0, 0
    for prev, inc in pairwise(incs):
        gap = max(0, inc.begin - max(prev.begin, min(prev.last_t, inc.begin)))
        if prev.end is not None and prev.end.clean:
            planned_us += gap
        else:
            interruptions += 1
            down_us += gap
    bad = totals.badput_us
    per_start = (bad.get("startup", 0) + bad.get("checkpoint_load", 0)) / max(1, totals.incarnations) / US
    restart = per_start + (down_us / interruptions / US if interruptions else 0.0)
    if gpus is None and incs:
        size = incs[-1].start.info.get("world_size")
        gpus = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
    return LedgerInputs(
        save_seconds=statistics.fmean(recent) if recent else None,
        saves=len(recent),
        restart_seconds=restart if incs else None,
        interruptions=interruptions,
        exposure_hours=max(0, totals.wall_us - planned_us) / US / 3600.0,
        current_interval_seconds=statistics.median(gaps[-RECENT:]) if gaps else None,
        gpus=gpus,
    )


def advise_inputs(inputs: LedgerInputs, cluster: ClusterRate | None = None) -> Advice:
    """The advice from a ledger's inputs (pure: no ledger access, so callers can drop their locks)."""
    return advise(
        save_seconds=inputs.save_seconds,
        saves=inputs.saves,
        restart_seconds=inputs.restart_seconds,
        restarts=inputs.interruptions,
        interruptions=inputs.interruptions,
        exposure_hours=inputs.exposure_hours,
        current_interval_seconds=inputs.current_interval_seconds,
        gpus=inputs.gpus,
        cluster=cluster,
    )


def advise_timeline(
    timeline: Timeline,
    totals: Accounting,
    *,
    gpus: int | None = None,
    cluster: ClusterRate | None = None,
) -> Advice:
    """The advice for a run from its ledger (:func:`ledger_inputs`, then :func:`advise_inputs`)."""
    return advise_inputs(ledger_inputs(timeline, totals, gpus=gpus), cluster)
