"""Why did a run slow down: compare a window with the baseline before it, rank the causes found.

Every candidate cause is scored in **seconds of the window it accounts for**, so the ranking reads as
"this explains 62% of the lost time" (docs/explain.md gives each formula). The lost time is the
window's length times the drop in the job's tokens/s against the baseline. Causes that cost no
measurable time (a loss spike, an Xid with no slowdown) are still listed, after the timed ones.
A rank's slowdown is charged to its GPU's throttling when that GPU throttled, else to the rank as a
straggler, in both cases net of the rank's own extra data wait (which is inside step time); slower
checkpoint saves are charged to storage when the probe on the run's hosts slowed too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from babysitter.explain.alerts import FiredAlert, fired_query, run_alerts
from babysitter.explain.fabric import check_fabric
from babysitter.explain.integrity import CAUSES as INTEGRITY_CAUSES
from babysitter.explain.integrity import TEAMS as INTEGRITY_TEAMS
from babysitter.explain.integrity import integrity_causes
from babysitter.explain.queries import ExplainQueries
from babysitter.explain.slowdown import attribute_episode
from babysitter.generate.config import GenerateConfig
from babysitter.generate.rules import LIKELY_CAUSES
from babysitter.ledger.slowcause import Episode
from babysitter.prom import PromClient, Sample, finite

__all__ = ["CAUSES", "TEAMS", "Cause", "Evidence", "Explanation", "explain"]

#: Every cause ``explain`` checks, in the order untimed causes are listed.
CAUSES: dict[str, str] = {
    "gpu_throttling": "GPU throttling (thermal, power, HW slowdown) on a rank's GPU",
    "straggler": "a straggler rank or host",
    "gpu_fault": "an Xid or a lost GPU (and the restart that followed)",
    "restart": "a restart (downtime, lost progress, startup, checkpoint load)",
    "hang": "a hang (no step for far longer than a step takes)",
    "data_wait": "input-pipeline (data wait) growth",
    "checkpoint": "checkpoint saves overlapping the window or getting slower",
    "storage": "storage probe latency on the checkpoint path",
    "phase": "an eval or other marked phase",
    "job_size": "a changed job size or config (ranks, tokens per step)",
    "loss": "loss spikes or non-finite loss",
    **INTEGRITY_CAUSES,
    "fabric": "InfiniBand/RoCE port errors, flaps or downs, or PCIe trouble on a slow or stalled run's hosts",
}
#: Who acts on each cause: ``infra`` (hardware, hosts, storage) or ``training`` (the job and its code);
#: the causes the alerts' likely-cause rule names take their team from it, so a page and explain agree.
TEAMS: dict[str, str] = {
    "restart": "infra",
    "hang": "infra",
    "storage": "infra",
    "job_size": "training",
    "loss": "training",
    **INTEGRITY_TEAMS,
    "fabric": "infra",
    **dict(LIKELY_CAUSES),
}
_RESTART_CAUSES = ("downtime", "lost_progress", "startup", "checkpoint_load")
#: A cause another one includes when both are there (the GPU fault's line counts its restart).
_COVERED_BY = {"restart": "gpu_fault"}
#: Ledger badput during which a run does not step (or steps that another cause is charged with).
_NOT_STEPPING = (*_RESTART_CAUSES, "hang", "checkpoint_save", "eval", "phase")
_PHASE_CAUSES = ("eval", "phase")
#: A change in ranks or tokens per step smaller than this is noise.
_CONFIG_CHANGE = 0.05
#: The storage probe counts as slower when its mean write + fsync grew this many times...
_STORAGE_FACTOR = 2.0
#: ...and by at least this many seconds.
_STORAGE_MIN_SECONDS = 0.1
#: A loss above this many times its baseline median is a spike.
_LOSS_SPIKE = 1.5
#: A rank this much slower than the window's median rank is measured against its peers.
_PEER_RATIO = 1.1
_RESTART_TEXT = "of downtime, lost progress, startup and load"


@dataclass(frozen=True)
class Evidence:
    """One series behind a cause: what it is, its value in the window and in the baseline."""

    what: str
    value: float | None
    baseline: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    query: str = ""


@dataclass
class Cause:
    """One cause found: a line to read, the seconds of the window it accounts for, its evidence."""

    key: str
    text: str
    seconds: float
    team: str
    share: float | None = None
    ranks: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)


@dataclass
class Explanation:
    """The answer for one run and window: the drop, the ranked causes, what else was checked."""

    run: str
    cluster: str
    start: float
    end: float
    baseline_seconds: float
    tokens_per_second: float | None
    baseline_tokens_per_second: float | None
    mfu: float | None
    baseline_mfu: float | None
    lost_seconds: float
    causes: list[Cause]
    checked: dict[str, str]
    queries: dict[str, str] = field(default_factory=dict)
    #: Seconds of the window and of the baseline the run had series in (a young run covers less).
    window_covered: float | None = None
    baseline_covered: float | None = None
    #: The ledger's badput by cause in the baseline (why a slow baseline hides a loss).
    baseline_badput: dict[str, float] = field(default_factory=dict)
    #: The ledger's lost progress in the window: steps computed again, whose tokens tokens/s counts.
    window_lost_progress: float = 0.0
    #: Alerts that fired about the run in the window (name: where), whatever cause they back.
    alerts: list[str] = field(default_factory=list)
    #: How the rules' names were chosen (the loaded rules' profile or rate window), when it was read.
    rules: str = ""
    #: The ledger's slowdown in the window and what caused it (explain/slowdown.py); empty when none.
    slowdown: dict[str, Any] = field(default_factory=dict)

    @property
    def window_seconds(self) -> float:
        """Length of the window explained."""
        return self.end - self.start

    @property
    def accounted_seconds(self) -> float:
        """Seconds of the window the timed causes account for, together."""
        return sum(c.seconds for c in self.causes if c.seconds > 0)

    @property
    def top(self) -> Cause | None:
        """The cause ranked first, None when nothing was found."""
        return self.causes[0] if self.causes else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        data = asdict(self)
        data["window_seconds"] = self.window_seconds
        data["accounted_seconds"] = self.accounted_seconds
        data["nothing_found"] = not self.causes
        data["headline"] = self.headline()
        return data

    def headline(self) -> str:
        """The lost time and what the causes account for, or why the two differ."""
        lost, accounted = self.lost_seconds, self.accounted_seconds
        covered = self.window_covered if self.window_covered is not None else self.window_seconds
        young = ""
        if covered < self.window_seconds - 1:
            young = (
                f" (the run has series only in the last {covered:.0f} s of the {self.window_seconds:.0f} s)"
            )
        if not self.baseline_tokens_per_second:
            text = (
                f"no baseline to measure a loss against: no tokens of the run in the "
                f"{_dur(self.baseline_seconds)} before the window{young}"
            )
            if accounted:
                text += f"; the causes below are what the window itself holds, ~{accounted:.0f} s"
            return text
        text = f"~{lost:.0f} s of {covered:.0f} s lost{young}"
        if not self.causes:
            return text
        slack = max(1.0, 0.02 * covered)
        if accounted <= lost * 1.1 + slack:
            text += f"; the causes below account for ~{accounted:.0f} s"
            if accounted < 0.9 * lost - slack:
                text += f", ~{lost - accounted:.0f} s not accounted for"
            return text
        why = "the baseline was no faster"
        booked = {c: v for c, v in self.baseline_badput.items() if v >= slack}
        base_covered = self.baseline_covered if self.baseline_covered is not None else self.baseline_seconds
        redone = self.window_lost_progress
        if redone >= slack and accounted - redone <= lost * 1.1 + slack:
            why = (
                f"{redone:.0f} s of them are lost progress: steps computed again after a restart, whose "
                "tokens tokens/s counts"
            )
        elif booked:
            top = sorted(booked.items(), key=lambda kv: -kv[1])[:3]
            why = "the baseline lost time too (" + ", ".join(f"{c} {v:.0f} s" for c, v in top) + ")"
        elif base_covered < self.baseline_seconds - 1:
            why = f"the baseline holds only {base_covered:.0f} s of the run"
        return (
            f"{text}, but the causes below cost ~{accounted:.0f} s: more than the drop against the "
            f"baseline shows, because {why}"
        )

    def lines(self) -> list[str]:
        """The person-readable answer, one cause per line with its evidence below it."""
        where = f" (cluster {self.cluster})" if self.cluster else ""
        span = f"{_hhmm(self.start)}-{_hhmm(self.end)} UTC"
        head = f"run {self.run}{where}, {span} vs the {_dur(self.baseline_seconds)} before:"
        parts = []
        if self.tokens_per_second is not None and self.baseline_tokens_per_second:
            change = self.tokens_per_second / self.baseline_tokens_per_second - 1
            parts.append(
                f"tokens/s {change:+.0%} "
                f"({self.tokens_per_second:.4g} vs {self.baseline_tokens_per_second:.4g})"
            )
        if self.mfu is not None and self.baseline_mfu is not None:
            parts.append(f"MFU {self.mfu:.1%} vs {self.baseline_mfu:.1%}")
        parts.append(self.headline())
        out = [f"{head} {', '.join(parts)}"]
        if self.rules:
            out.append(f"(rules: {self.rules})")
        if self.slowdown:
            where = f" {self.slowdown['where']}" if self.slowdown.get("where") else ""
            out.append(
                f"the ledger booked {self.slowdown['seconds']:.0f} s of slowdown in the window (steps beyond "
                f"the ideal step time): {self.slowdown['cause']}{where}"
            )
            out.extend(f"     {line}" for line in self.slowdown.get("evidence", []))
        if not self.causes:
            out.append("nothing found. Checked: " + "; ".join(f"{k}: {v}" for k, v in self.checked.items()))
            return out
        for i, cause in enumerate(self.causes, start=1):
            share = f"{cause.share:.0%}, " if cause.share is not None and cause.seconds > 0 else ""
            cost = f"{share}{cause.seconds:.0f} s" if cause.seconds > 0 else "no time measured"
            out.append(f"{i}. [{cost}; {cause.team}] {cause.text}")
            out.extend(f"     {_evidence(e)}" for e in cause.evidence)
        out.append("also checked, nothing found: " + ", ".join(self.checked) if self.checked else "")
        return [line for line in out if line]


#: Labels an evidence line shows (the rest are in the JSON).
_WHERE = (
    "rank",
    "instance",
    "gpu",
    "xid",
    "path",
    "cause",
    "reason",
    "device",
    "port",
    "counter",
    "pci_address",
    "pg",
    "op",
)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _evidence(e: Evidence) -> str:
    where = " ".join(f"{k}={e.labels[k]}" for k in _WHERE if k in e.labels)
    before = "" if e.baseline is None else f" (baseline {_num(e.baseline)})"
    return f"{e.what}: {_num(e.value)}{before}{f' [{where}]' if where else ''}"


def _hhmm(t: float, seconds: bool = False) -> str:
    """HH:MM (UTC; HH:MM:SS with ``seconds``) of a Unix time from Prometheus; "?" for one no clock can
    show (a series' value)."""
    try:
        return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return "?"


def _dur(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _scalar(samples: list[Sample]) -> float | None:
    values = [v for s in samples if (v := finite(s.value)) is not None]
    return values[0] if values else None


def _by(samples: list[Sample], *keys: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for s in samples:
        value = finite(s.value)
        if value is not None:
            out[tuple(s.labels.get(k, "") for k in keys)] = value
    return out


def _by1(samples: list[Sample], key: str) -> dict[str, float]:
    return {k[0]: v for k, v in _by(samples, key).items()}


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


def _ghz(hz: float | None) -> str:
    return "?" if hz is None else f"{hz / 1e9:.2f} GHz"


class _Asker:
    """Runs the queries, remembering each under a name for the JSON output."""

    def __init__(self, client: PromClient) -> None:
        self.client = client
        self.queries: dict[str, str] = {}

    def __call__(self, name: str, expr: str, at: float) -> list[Sample]:
        self.queries[name] = expr
        return self.client.query(expr, at)


def explain(
    client: PromClient,
    run: str,
    *,
    end: float | None = None,
    window: float = 1800.0,
    baseline: float = 3600.0,
    cluster: str = "",
    cfg: GenerateConfig | None = None,
    rules: str = "",
) -> Explanation:
    """Explain run ``run`` over ``[end - window, end]`` against ``[end - window - baseline, end - window]``.

    ``cfg`` names the recording rules as generated (:func:`babysitter.explain.rules.config_from_rules`
    reads it from a Prometheus); ``rules`` says how it was chosen, for the answer. Raises
    :class:`~babysitter.prom.PromError` when Prometheus fails a query, ValueError for a bad window.
    """
    if not window > 0 or not baseline > 0:
        raise ValueError("the window and the baseline must be positive")
    t1 = time.time() if end is None else end
    q = ExplainQueries(run, cluster, cfg or GenerateConfig())
    answer = _Scan(q, _Asker(client), end=t1, window=window, baseline=baseline).run()
    answer.rules = rules
    return answer


class _Scan:
    """One explanation's state: what was read, and each cause's check."""

    def __init__(self, q: ExplainQueries, ask: _Asker, *, end: float, window: float, baseline: float) -> None:
        self.q, self.ask = q, ask
        self.t0, self.t1, self.W, self.B = end - window, end, window, baseline
        self.causes: list[Cause] = []
        #: Causes listed only because their alert fired, their own check having seen nothing.
        self._alert_only: set[int] = set()
        self.checked: dict[str, str] = {}
        self.min_seconds = max(1.0, 0.02 * window)

    # ------------------------------------------------------------------------------------------- read

    def _pair(self, name: str, make: Callable[[float], str]) -> tuple[list[Sample], list[Sample]]:
        """``make(range)`` over the window (at its end) and over the baseline (at the window's start)."""
        return self.ask(name, make(self.W), self.t1), self.ask(f"{name}_baseline", make(self.B), self.t0)

    def _covered(self, name: str, seconds: float, at: float) -> float:
        """Seconds of the range ending at ``at`` in which the run had series (from its first sample).

        Looked for over twice the range: a run killed right at the range's start has no series for
        its first seconds, yet is not young (the live bench's kill read "series only in the last 5 s")."""
        first = _scalar(self.ask(name, self.q.first_seen(2 * seconds), at))
        if first is None:
            return seconds
        step = min(self.q.step_seconds, max(1.0, seconds / 60))
        if first <= at - seconds + step:
            return seconds  # there from the start (the subquery's first step)
        # From the first sample: increase() extrapolates half a scrape interval before it, which
        # this leaves out (a few percent of the rate for a run only minutes old).
        return max(1.0, min(seconds, at - first))

    def run(self) -> Explanation:
        q, W, B = self.q, self.W, self.B
        tok_w, tok_b = (_scalar(x) for x in self._pair("tokens", q.tokens))
        fl_w, fl_b = (_scalar(x) for x in self._pair("model_flops", q.model_flops))
        pk_w, pk_b = (_scalar(x) for x in self._pair("peak", q.peak))
        # Rates over the part of each range the run existed in: a run that began inside the baseline
        # (or the window) is not slow for the time before it existed.
        self.Wc = self._covered("first_seen", W, self.t1)
        self.Bc = self._covered("first_seen_baseline", B, self.t0)
        self.scale = self.Wc / self.Bc
        rate_w = None if tok_w is None else tok_w / self.Wc
        rate_b = None if tok_b is None else tok_b / self.Bc
        lost = self.Wc * max(0.0, 1 - rate_w / rate_b) if rate_w is not None and rate_b else 0.0
        mfu_w = fl_w / (self.Wc * pk_w) if fl_w is not None and pk_w else None
        mfu_b = fl_b / (self.Bc * pk_b) if fl_b is not None and pk_b else None
        self.lost = lost
        self._ranks_and_gpus()
        self._fired()
        self._restarts()
        self._data_wait()
        self._slow_ranks()
        check_fabric(self, cause=Cause, evidence=Evidence, team=TEAMS["fabric"])
        self._checkpoints()
        self._phases()
        self._job_size()
        self._loss()
        integrity_causes(self, Cause, Evidence)
        self._alerts_back_causes()
        slowdown = self._slowdown()
        alert_only = {id(self.causes[i]) for i in self._alert_only}
        timed = [c for c in self.causes if c.seconds >= self.min_seconds]
        untimed = [c for c in self.causes if c.seconds < self.min_seconds]
        for c in untimed:
            c.seconds = 0.0
        timed.sort(key=lambda c: -c.seconds)
        order = list(CAUSES)
        # Untimed: a cause its own check found in the window (a throttle reason active) before one
        # listed only because its alert fired while its check saw nothing there (an exit alert still
        # firing from a restart before the window: the demo's throttle was explained as that restart).
        untimed.sort(key=lambda c: (id(c) in alert_only, order.index(c.key)))
        total = max(lost, sum(c.seconds for c in timed))
        for c in timed:
            c.share = min(1.0, c.seconds / total) if total > 0 else None
        found = {c.key for c in self.causes}
        checked = {k: v for k, v in self.checked.items() if k not in found}
        return Explanation(
            run=q.run,
            cluster=q.cluster,
            start=self.t0,
            end=self.t1,
            baseline_seconds=B,
            tokens_per_second=rate_w,
            baseline_tokens_per_second=rate_b,
            mfu=mfu_w,
            baseline_mfu=mfu_b,
            lost_seconds=lost,
            causes=timed + untimed,
            checked=checked,
            queries=dict(self.ask.queries),
            window_covered=self.Wc,
            baseline_covered=self.Bc,
            baseline_badput={c: v for c, v in self.badput_baseline.items() if v > 0},
            window_lost_progress=self.badput_window.get("lost_progress", 0.0),
            alerts=[f"{a.name}: {a.where()}" for a in self.fired],
            slowdown=slowdown,
        )

    # ------------------------------------------------------------------------------------------ alerts

    def _fired(self) -> None:
        """The alerts that fired about the run (its label, its GPUs, its hosts) in the window."""
        q = self.q
        hosts = {lab.get("instance", "") for lab in self.gpu.values()} - {""}
        samples = self.ask("alerts_fired", fired_query(self.W), self.t1)
        self.fired: list[FiredAlert] = run_alerts(
            samples,
            run=q.run,
            cluster_label=q.cfg.cluster_label,
            cluster=q.cluster,
            gpus=self.gpu,
            hosts=hosts,
        )

    def _alerts_back_causes(self) -> None:
        """A cause whose alert fired is never "nothing found": it is listed (untimed when its check
        measured no time), with the alert and what the check saw; a found cause gains the alert."""
        by_cause: dict[str, list[FiredAlert]] = {}
        for alert in self.fired:
            by_cause.setdefault(alert.cause, []).append(alert)
        found = {c.key: c for c in self.causes}
        for key, host in _COVERED_BY.items():  # a restart after an Xid is the GPU fault's, not its own
            if key in by_cause and host in found:
                by_cause.setdefault(host, []).extend(by_cause.pop(key))
        for key, alerts in by_cause.items():
            evidence = [
                Evidence(
                    f"{a.name} firing (fraction of the window)",
                    a.fraction,
                    labels=a.labels,
                    query=self.ask_q("alerts_fired"),
                )
                for a in alerts
            ]
            if key in found:
                found[key].evidence.extend(evidence)
                continue
            names = sorted({a.name for a in alerts})
            where = "; ".join(sorted({a.where() for a in alerts}))
            seen = self.checked.pop(key, "")
            if seen:
                self._alert_only.add(len(self.causes))
            self.causes.append(
                Cause(
                    key,
                    f"{' and '.join(names)} fired in the window ({where}); no time measured: {seen}"
                    if seen
                    else f"{' and '.join(names)} fired in the window ({where})",
                    0.0,
                    TEAMS.get(key, "infra"),
                    evidence=evidence,
                )
            )

    def _ranks_and_gpus(self) -> None:
        q = self.q
        gpus = self.ask("rank_gpu", q.rank_gpu(self.W + self.B), self.t1)
        self.gpu: dict[str, dict[str, str]] = {s.labels.get("rank", ""): s.labels for s in gpus}
        self.uuid_ranks: dict[str, list[str]] = {}
        for rank, labels in self.gpu.items():
            self.uuid_ranks.setdefault(labels.get("uuid", ""), []).append(rank)
        # Medians over the range of the rule's rate-window means: a hang's one stuck step (28 s among
        # 0.1 s steps) stays in the rate window for its length and skewed a short range's mean (the
        # demo's throttle read "2.7x" for 1.43x).
        mean_w, mean_b = (_by1(x, "rank") for x in self._pair("rank_step_median", q.rank_step_median))
        self.mean_w, self.mean_b = mean_w, mean_b
        self.median_b = statistics.median(mean_b.values()) if mean_b else None
        self.median_w = statistics.median(mean_w.values()) if mean_w else None
        self.ratio_w = _by1(self.ask("rank_step_ratio", q.rank_step_ratio(self.W), self.t1), "rank")
        # Lockstep runs: the in-process score from collective arrival (step times are equal there).
        self.score_w = _by1(self.ask("straggler_score", q.straggler_score(self.W), self.t1), "rank")
        self.lag_w = _by1(self.ask("collective_lag", q.collective_lag(self.W), self.t1), "rank")
        hosts = self.ask("rank_host", q.rank_host(self.W + self.B), self.t1)
        self.host: dict[str, dict[str, str]] = {s.labels.get("rank", ""): s.labels for s in hosts}

    def _where(self, rank: str) -> str:
        labels = self.gpu.get(rank)
        if labels:
            return f"rank {rank} (host {labels.get('instance', '?')}, GPU {labels.get('gpu', '?')})"
        placed = self.host.get(rank)
        if placed:
            uuid = f", {placed['uuid']}" if placed.get("uuid") else ""
            return f"rank {rank} (host {placed.get('instance', '?')}{uuid})"
        return f"rank {rank}"

    # ----------------------------------------------------------------------------------------- causes

    def _restarts(self) -> None:
        q, W, B = self.q, self.W, self.B
        now = _by1(self.ask("badput", q.badput_last(W), self.t1), "cause")
        before = _by1(self.ask("badput_before", q.badput_last(B), self.t0), "cause")
        first = _by1(self.ask("badput_baseline_start", q.badput_last(B), self.t0 - B), "cause")
        grew = {c: max(0.0, v - before.get(c, 0.0)) for c, v in now.items()}
        self.badput_window = grew
        self.badput_baseline = {c: max(0.0, v - first.get(c, 0.0)) for c, v in before.items()}
        r_now = _scalar(self.ask("restarts", q.restarts_last(W), self.t1))
        r_before = _scalar(self.ask("restarts_before", q.restarts_last(B), self.t0)) or 0.0
        r_first = _scalar(self.ask("restarts_baseline_start", q.restarts_last(B), self.t0 - B)) or 0.0
        restarts = max(0.0, (r_now or 0.0) - r_before)
        restarts_before = max(0.0, r_before - r_first)
        restart_seconds = sum(grew.get(c, 0.0) for c in _RESTART_CAUSES)
        # A cause is what the window has more of than the baseline: restarts as usual are not one
        # (only the baseline's restarts count against it, not the run's first startup).
        usual = sum(self.badput_baseline.get(c, 0.0) for c in _RESTART_CAUSES) if restarts_before else 0.0
        restart_seconds = max(0.0, restart_seconds - usual * self.scale)
        more_restarts = restarts > restarts_before * self.scale
        restart_ev = [
            Evidence(f"ledger badput {c} in the window", grew[c], query=self.ask_q("badput"))
            for c in _RESTART_CAUSES
            if grew.get(c, 0.0) > 0
        ]
        if restarts:
            restart_ev.insert(0, Evidence("restarts in the window", restarts, query=self.ask_q("restarts")))
        xids = self.ask("xid_new", q.xid_new(W, B), self.t1)
        lost = self.ask("gpu_lost", q.gpu_lost(W, B), self.t1)
        lost_since = _by1(self.ask("gpu_lost_since", q.gpu_lost_since(W, B), self.t1), "uuid")
        faults: list[str] = []
        ranks: set[str] = set()
        hosts: set[str] = set()
        gpus: set[str] = set()
        ev: list[Evidence] = []
        for sample in xids:
            lab = sample.labels
            uuid = lab.get("uuid", "")
            rs = self.uuid_ranks.get(uuid, [])
            ranks.update(rs)
            hosts.add(lab.get("instance", "?"))
            gpus.add(uuid)
            faults.append(
                f"Xid {lab.get('xid', '?')} ({lab.get('action', '?')}) x{sample.value:g} on host "
                f"{lab.get('instance', '?')} GPU {lab.get('gpu', '?')} "
                f"(rank {', '.join(sorted(rs, key=_rank_order)) or '?'})"
            )
            ev.append(Evidence("new Xid errors", sample.value, labels=lab, query=self.ask_q("xid_new")))
        for sample in lost:
            lab = sample.labels
            uuid = lab.get("uuid", "")
            since = lost_since.get(uuid)
            gpus.add(uuid)
            hosts.add(lab.get("instance", "?"))
            ranks.update(self.uuid_ranks.get(uuid, []))
            when = f" since {_hhmm(since)}" if since else ""
            faults.append(
                f"GPU {lab.get('gpu', '?')} on host {lab.get('instance', '?')} lost (gpu_up 0){when}"
            )
            ev.append(Evidence("GPU lost (min of up)", 0.0, labels=lab, query=self.ask_q("gpu_lost")))
        then = ""
        if restarts:
            then = f"; {restarts:g} restart(s) followed, {restart_seconds:.0f} s {_RESTART_TEXT}"
        if faults:
            self.causes.append(
                Cause(
                    "gpu_fault",
                    "; ".join(faults) + then,
                    restart_seconds,
                    TEAMS["gpu_fault"],
                    ranks=sorted(ranks, key=_rank_order),
                    hosts=sorted(hosts),
                    gpus=sorted(gpus),
                    evidence=ev + restart_ev,
                )
            )
        else:
            self.checked["gpu_fault"] = "no new Xid and no lost GPU on the run's GPUs"
            if (restarts and more_restarts) or restart_seconds >= self.min_seconds:
                self.causes.append(
                    Cause(
                        "restart",
                        f"the run restarted {restarts:g} time(s): {restart_seconds:.0f} s {_RESTART_TEXT}"
                        " (no Xid or lost GPU on its GPUs)",
                        restart_seconds,
                        TEAMS["restart"],
                        evidence=restart_ev,
                    )
                )
            else:
                self.checked["restart"] = (
                    "no restart and no restart badput in the window"
                    if not restarts
                    else f"{restarts:g} restart(s), no more than the baseline's {restarts_before:g}"
                )
        hang = max(0.0, grew.get("hang", 0.0) - self.badput_baseline.get("hang", 0.0) * self.scale)
        culprits = self.ask("culprit", q.culprit(W), self.t1)
        if hang >= self.min_seconds or culprits:
            waiting = self.ask("waiting", q.waiting(W), self.t1)
            named, ev = _culprits(culprits, waiting, self.ask_q("culprit"), self.ask_q("waiting"))
            booked = (
                f"the run hung for {grew.get('hang', 0.0):.0f} s (ledger badput hang)"
                if hang >= self.min_seconds
                else ""
            )
            self.causes.append(
                Cause(
                    "hang",
                    "; ".join(part for part in (booked or "the run hangs in a collective", named) if part),
                    hang,
                    TEAMS["hang"],
                    ranks=sorted({s.labels.get("rank", "?") for s in culprits}, key=_rank_order),
                    hosts=sorted({s.labels.get("instance", "?") for s in culprits}),
                    gpus=sorted({s.labels["uuid"] for s in culprits if s.labels.get("uuid")}),
                    evidence=[
                        *(
                            [
                                Evidence(
                                    "ledger badput hang in the window",
                                    grew.get("hang", 0.0),
                                    self.badput_baseline.get("hang", 0.0) * self.scale,
                                    query=self.ask_q("badput"),
                                )
                            ]
                            if booked
                            else []
                        ),
                        *ev,
                    ],
                )
            )
        else:
            self.checked["hang"] = (
                "no hang booked by the ledger"
                if not grew.get("hang")
                else "no more hang than in the baseline (ledger badput hang)"
            ) + ", no rank a hung collective waited for"

    def _slowdown(self) -> dict[str, Any]:
        """The window's slowdown (the ledger's counter) split like ``report --prometheus`` splits an
        episode: the culprit rank, then its GPU, PCIe links and fabric."""
        booked = self.badput_window.get("slowdown", 0.0)
        if booked < self.min_seconds:
            return {}
        asked = iter(range(1 << 30))

        def ask(expr: str, at: float) -> list[Sample]:
            return self.ask(f"slowdown_{next(asked)}", expr, at)

        window = Episode(0, round(self.t0 * 1e6), round(self.t1 * 1e6), round(booked * 1e6), 0, 0, 0, 0)
        slow = _scalar(self.ask("slowdown_seconds", self.q.slowdown_growing(self.W), self.t1))
        coverage = min(1.0, slow / self.Wc) if slow else 1.0
        found = attribute_episode(self.q, ask, window, coverage=coverage)
        return {
            "seconds": booked,
            "cause": found.cause,
            "where": found.where(),
            "rank": found.rank,
            "host": found.host,
            "gpu": found.gpu,
            "evidence": list(found.evidence),
        }

    def ask_q(self, name: str) -> str:
        """The query last run under ``name`` (for the evidence)."""
        return self.ask.queries.get(name, "")

    def _data_wait(self) -> None:
        q, W = self.q, self.W
        w, b = (_by1(x, "rank") for x in self._pair("data_wait", q.data_wait))
        self.extra_wait = {r: max(0.0, v - b.get(r, 0.0) * self.scale) for r, v in w.items()}
        if not self.extra_wait:
            self.checked["data_wait"] = "no data-wait counters"
            return
        rank = max(self.extra_wait, key=lambda r: self.extra_wait[r])
        extra = self.extra_wait[rank]
        if extra < self.min_seconds:
            self.checked["data_wait"] = (
                f"data wait did not grow (worst rank {rank}: {w.get(rank, 0.0) / W:.1%} of the window)"
            )
            return
        frac_w, frac_b = w[rank] / self.Wc, b.get(rank, 0.0) / self.Bc
        spread = "every rank" if min(self.extra_wait.values()) >= 0.5 * extra else f"rank {rank}"
        self.causes.append(
            Cause(
                "data_wait",
                f"input pipeline: {spread} waited for data {frac_w:.0%} of the window vs {frac_b:.0%} before "
                f"(+{extra:.0f} s on rank {rank})",
                extra,
                TEAMS["data_wait"],
                ranks=[rank] if spread != "every rank" else sorted(self.extra_wait, key=_rank_order),
                evidence=[
                    Evidence("data wait fraction", frac_w, frac_b, {"rank": rank}, self.ask_q("data_wait"))
                ],
            )
        )

    def _slow_ranks(self) -> None:
        q, W = self.q, self.W
        cfg = q.cfg
        th_w, th_b = (_by(x, "rank", "reason") for x in self._pair("throttle", q.throttle))
        since = _by(self.ask("throttled_since", q.throttled_since(W), self.t1), "rank", "reason")
        clock_w, clock_b = (_by1(x, "rank") for x in self._pair("sm_clock", q.sm_clock))
        temp_w = _by1(self.ask("temperature", q.temperature(W), self.t1), "rank")
        straggling = _by1(self.ask("straggling_since", q.straggling_since(W), self.t1), "rank")
        throttled: dict[str, list[str]] = {}
        #: Ranks whose GPU began throttling inside the window: seconds from then to the window's end.
        stretch: dict[str, float] = {}
        for (rank, reason), frac in th_w.items():
            if th_b.get((rank, reason), 0.0) >= cfg.throttle_fraction:
                continue
            began = since.get((rank, reason))
            # Began after the run's part of the window did (a throttle late in the window, or one
            # that came after a young run's start): timed over the stretch since, not the whole window.
            start = self.t1 - self.Wc
            late = self.t1 - began if began is not None and began > start + 0.05 * self.Wc else None
            if late is not None and late < self.min_seconds:
                continue
            if frac >= cfg.throttle_fraction or (late and frac * self.Wc >= cfg.throttle_fraction * late):
                throttled.setdefault(rank, []).append(reason)
                if late:
                    stretch[rank] = max(stretch.get(rank, 0.0), late)
        median_extra = statistics.median(self.extra_wait.values()) if self.extra_wait else 0.0
        # A slow rank slows the steps, not a hang, a restart's downtime, startup and lost progress, or
        # a checkpoint or eval: those are their own causes' time (the ledger's), so only the stepping
        # part of the window is charged (before, a throttle spanning a hang was charged the hang too).
        away = sum(self.badput_window.get(c, 0.0) for c in _NOT_STEPPING)
        stepping = max(0.0, 1 - away / self.Wc)
        late_step: dict[str, float] = {}
        full_step: dict[str, float] = {}
        base_of: dict[str, str] = {}

        def late_excess(rank: str, seconds: float) -> float:
            """The slowdown of a rank over the last ``seconds`` of the window (medians: a stuck step
            in the rules' rate window skews a short stretch's mean), against its peers when slower
            than them, else against the baseline's median step time (or the window before it)."""
            ratio = _by1(self.ask("late_step_ratio", q.rank_step_ratio_median(seconds), self.t1), "rank").get(
                rank
            )
            extra = self.extra_wait.get(rank, 0.0) * seconds / self.Wc
            if ratio is not None and ratio >= _PEER_RATIO:
                slowdown, own = ratio, max(0.0, extra - median_extra * seconds / self.Wc)
                late_step[rank] = ratio
            else:
                mine = _by1(self.ask("late_step", q.rank_step_median(seconds), self.t1), "rank").get(rank)
                base = self.median_b
                before = self.t1 - seconds - self.t0
                if base is None and before >= self.min_seconds:
                    earlier = self.ask("before_late_step", q.rank_step_median(before), self.t1 - seconds)
                    base = _by1(earlier, "rank").get(rank)
                slowdown, own = (mine / base if mine and base else 1.0), extra
                if mine and base:
                    late_step[rank] = slowdown
            return max(0.0, seconds * stepping * (1 - 1 / slowdown) - own) if slowdown > 1 else 0.0

        def excess(rank: str) -> float:
            """Seconds of the window this rank's slowness costs, net of its own extra data wait.

            A rank slower than its peers (1.1x the window's median rank) is measured against them,
            which leaves out what slowed every rank alike (data wait, a uniform cause); a rank in step
            with its peers against the run's baseline median step time."""
            ratio = max(self.ratio_w.get(rank, 1.0), self.score_w.get(rank, 1.0))
            extra = self.extra_wait.get(rank, 0.0)
            if ratio >= _PEER_RATIO:
                slowdown, own = ratio, max(0.0, extra - median_extra)
            else:
                mine, base = self.mean_w.get(rank), self.median_b
                began = first_throttle(rank)
                if base is None and began is not None and began - self.t0 >= self.min_seconds:
                    # No baseline (a young run): the window before its GPU began throttling.
                    earlier = self.ask("before_throttle_step", q.rank_step_median(began - self.t0), began)
                    base = _by1(earlier, "rank").get(rank)
                    base_of[rank] = "its step time before the throttle"
                slowdown, own = (mine / base if mine and base else 1.0), extra
                if mine and base:
                    full_step[rank] = slowdown
            return max(0.0, self.Wc * stepping * (1 - 1 / slowdown) - own) if slowdown > 1 else 0.0

        def first_throttle(rank: str) -> float | None:
            return min((t for (r, _), t in since.items() if r == rank), default=None)

        best: tuple[float, str] | None = None
        for rank in throttled:
            sec = late_excess(rank, stretch[rank]) if rank in stretch else excess(rank)
            if best is None or sec > best[0]:
                best = (sec, rank)
        if best is not None:
            sec, rank = best
            reasons = sorted(throttled[rank])
            first = min((since[(rank, r)] for r in reasons if (rank, r) in since), default=None)
            ratio = self.ratio_w.get(rank)
            against = base_of.get(rank, "the run's baseline")
            step_part = (
                f"step time {ratio:.1f}x the median rank"
                if ratio and ratio >= _PEER_RATIO
                else f"step time {full_step[rank]:.1f}x {against}"
                if rank in full_step
                else "step time unknown"
            )
            if rank in stretch:
                late = stretch[rank]
                step_part = (
                    f"step time {late_step[rank]:.1f}x in the last {late:.0f} s of the window, since its "
                    f"GPU began throttling"
                    if rank in late_step
                    else f"step time unknown over the last {late:.0f} s of the window, since its GPU began "
                    "throttling"
                )

            if rank in straggling:
                step_part += f" since {_hhmm(straggling[rank])}"
            clock = (
                f", SM clock {_ghz(clock_w.get(rank))}"
                + (f" vs {_ghz(clock_b.get(rank))}" if rank in clock_b else "")
                if rank in clock_w
                else ""
            )
            temp = f", {temp_w[rank]:.0f} C" if rank in temp_w else ""
            others = sorted(set(throttled) - {rank}, key=_rank_order)
            also = f" (also throttled: rank {', '.join(others)})" if others else ""
            lab = self.gpu.get(rank, {})
            self.causes.append(
                Cause(
                    "gpu_throttling",
                    f"{self._where(rank)} {step_part}; that GPU reports {' + '.join(reasons)}"
                    f"{f' since {_hhmm(first, self.W < 3600)}' if first else ''}{clock}{temp}{also}",
                    sec,
                    TEAMS["gpu_throttling"],
                    ranks=sorted(throttled, key=_rank_order),
                    hosts=sorted({self.gpu.get(r, {}).get("instance", "?") for r in throttled}),
                    gpus=sorted({self.gpu.get(r, {}).get("uuid", "?") for r in throttled}),
                    evidence=[
                        *(
                            Evidence(
                                f"{reason} active (fraction of the window)",
                                th_w[(rank, reason)],
                                th_b.get((rank, reason)),
                                lab,
                                self.ask_q("throttle"),
                            )
                            for reason in reasons
                        ),
                        Evidence(
                            "SM clock (Hz)", clock_w.get(rank), clock_b.get(rank), lab, self.ask_q("sm_clock")
                        ),
                        Evidence(
                            "step time / median rank",
                            ratio,
                            None,
                            {"rank": rank},
                            self.ask_q("rank_step_ratio"),
                        ),
                    ],
                )
            )
        else:
            before = sorted({r for (r, _), f in th_b.items() if f >= cfg.throttle_fraction}, key=_rank_order)
            self.checked["gpu_throttling"] = (
                f"rank {', '.join(before)}'s GPU throttled in the baseline too: no change to explain"
                if before
                else f"no rank's GPU throttled over {cfg.throttle_fraction:.0%} of the window "
                f"({len(self.gpu)} ranks joined to a GPU)"
                if self.gpu
                else "no rank joined to a GPU (train_info without uuid, or no GPU series)"
            )
        # A rank is slow by its step time over the median rank's, or, in lockstep runs (where step
        # times are equal), by its straggler score: its own work between collectives (flight recorder).
        stragglers = {
            r: max(self.ratio_w.get(r, 0.0), self.score_w.get(r, 0.0))
            for r in {*self.ratio_w, *self.score_w}
            if max(self.ratio_w.get(r, 0.0), self.score_w.get(r, 0.0)) >= cfg.straggler_ratio
            and r not in throttled
        }
        if not stragglers:
            self.checked["straggler"] = (
                f"no rank over {cfg.straggler_ratio:g}x the median rank's step time "
                f"or, where scored, its work between collectives ({len(self.score_w)} ranks scored)"
            )
            return
        rank = max(stragglers, key=lambda r: stragglers[r])
        sec = excess(rank)
        when = f" since {_hhmm(straggling[rank])}" if rank in straggling else ""
        hosts = sorted(
            {
                self.gpu.get(r, {}).get("instance", "") or self.host.get(r, {}).get("instance", "")
                for r in stragglers
            }
            - {""}
        )
        others = sorted(set(stragglers) - {rank}, key=_rank_order)
        also = f" (also slow: rank {', '.join(others)})" if others else ""
        step_ratio, score, lag = self.ratio_w.get(rank), self.score_w.get(rank), self.lag_w.get(rank)
        if score is not None and score >= cfg.straggler_ratio and score >= (step_ratio or 0.0):
            what = f"works {score:.1f}x as long as the median rank between collectives (flight recorder)"
            if lag is not None and lag > 0:
                what += f"; the others wait {lag * 1000:.0f} ms for it at each collective"
            if step_ratio is not None and step_ratio < cfg.straggler_ratio:
                what += f"; its step time is {step_ratio:.1f}x the median (lockstep makes them equal)"
        else:
            what = f"step time {stragglers[rank]:.1f}x the median rank{when}"
        evidence = [
            Evidence(
                "step time / median rank", step_ratio, None, {"rank": rank}, self.ask_q("rank_step_ratio")
            )
        ]
        if score is not None:
            evidence.append(
                Evidence(
                    "straggler score (work between collectives / median rank)",
                    score,
                    None,
                    {"rank": rank},
                    self.ask_q("straggler_score"),
                )
            )
        if lag is not None:
            evidence.append(
                Evidence(
                    "collective lag behind the median rank (s)",
                    lag,
                    None,
                    {"rank": rank},
                    self.ask_q("collective_lag"),
                )
            )
        placed = self.host.get(rank, {})
        self.causes.append(
            Cause(
                "straggler",
                f"{self._where(rank)} {what}; its GPU reports no throttling{also}",
                sec,
                TEAMS["straggler"],
                ranks=sorted(stragglers, key=_rank_order),
                hosts=hosts,
                gpus=[placed["uuid"]] if placed.get("uuid") else [],
                evidence=evidence,
            )
        )

    def _checkpoints(self) -> None:
        q, W, B = self.q, self.W, self.B
        sec_w, sec_b = (_scalar(x) or 0.0 for x in self._pair("save_seconds", q.save_seconds))
        n_w, n_b = (_scalar(x) or 0.0 for x in self._pair("saves", q.saves))
        n_w, n_b = round(n_w), round(n_b)
        mean_w = sec_w / n_w if n_w else None
        mean_b = sec_b / n_b if n_b else None
        usual = sec_b * self.scale
        more = max(0.0, (sec_w if mean_b is None else n_w * mean_b) - usual)
        slower = max(0.0, n_w * (mean_w - mean_b)) if mean_w is not None and mean_b is not None else 0.0
        # Saves that blocked no more of the window than the baseline's rate did are no cause, however
        # many there were (more saves, each faster): the charge is at most the growth.
        growth = max(0.0, sec_w - usual)
        probe = self.ask("storage", q.storage(W, W + B), self.t1)
        probe_b = _by(self.ask("storage_baseline", q.storage(B, W + B), self.t0), "instance", "path")
        slow_paths = []
        for s in probe:
            key = (s.labels.get("instance", ""), s.labels.get("path", ""))
            before = probe_b.get(key)
            if (
                before is not None
                and s.value >= _STORAGE_FACTOR * before
                and s.value - before >= _STORAGE_MIN_SECONDS
            ):
                slow_paths.append((key, s.value, before))
        ev = [
            Evidence("blocking save seconds in the window", sec_w, usual, query=self.ask_q("save_seconds")),
            Evidence("saves", float(n_w), n_b * self.scale, query=self.ask_q("saves")),
        ]
        if mean_w is not None:
            ev.append(Evidence("mean save seconds", mean_w, mean_b))
        if slow_paths:
            (host, path), now, before = max(slow_paths, key=lambda item: item[1] / item[2])
            saves = (
                f"; checkpoint saves {mean_w:.0f} s vs {mean_b:.0f} s before"
                if slower > 0 and mean_w and mean_b
                else ""
            )
            self.causes.append(
                Cause(
                    "storage",
                    f"storage probe on {host} {path}: write + fsync {now:.2f} s vs {before:.2f} s before"
                    f"{f' ({len(slow_paths)} host/path pairs slower)' if len(slow_paths) > 1 else ''}{saves}",
                    min(slower, growth),
                    TEAMS["storage"],
                    hosts=sorted({h for (h, _), _, _ in slow_paths}),
                    evidence=[
                        Evidence(
                            "probe write + fsync seconds",
                            v,
                            b,
                            {"instance": h, "path": p},
                            self.ask_q("storage"),
                        )
                        for (h, p), v, b in slow_paths
                    ]
                    + ev,
                )
            )
            growth = max(0.0, growth - slower)
            slower = 0.0
        else:
            self.checked["storage"] = (
                f"the storage probe on the run's hosts did not slow ({len(probe)} host/path pairs)"
            )
        sec = min(more + slower, growth)
        if sec < self.min_seconds:
            self.checked["checkpoint"] = (
                f"{n_w} saves blocked {sec_w:.0f} s of the window, no more than the baseline's "
                f"{usual:.0f} s per window"
                if growth <= 0
                else f"{n_w} saves blocked {sec_w:.0f} s of the window (the baseline's rate: {usual:.0f} s), "
                f"under the {self.min_seconds:.0f} s that count"
            )
            return
        parts = [
            f"{n_w} checkpoint saves blocked {sec_w:.0f} s of the window (before: {usual:.0f} s per window)"
        ]
        if slower > 0 and mean_w is not None and mean_b is not None:
            parts.append(f"each slower: {mean_w:.0f} s vs {mean_b:.0f} s")
        self.causes.append(Cause("checkpoint", "; ".join(parts), sec, TEAMS["checkpoint"], evidence=ev))

    def _phases(self) -> None:
        """Eval and other marked phases, from the ledger's badput (kept by the central tier)."""
        found: dict[str, tuple[float, float]] = {}
        for cause in _PHASE_CAUSES:
            now = self.badput_window.get(cause, 0.0)
            before = self.badput_baseline.get(cause, 0.0) * self.scale
            if now - before >= self.min_seconds:
                found[cause] = (now, before)
        if not found:
            self.checked["phase"] = "no eval or marked phase took more time than before (ledger badput)"
            return
        self.causes.append(
            Cause(
                "phase",
                "marked phases: "
                + ", ".join(f"{p} {v:.0f} s (before: {b:.0f} s per window)" for p, (v, b) in found.items()),
                sum(v - b for v, b in found.values()),
                TEAMS["phase"],
                evidence=[
                    Evidence(f"ledger badput {p} seconds", v, b, {"cause": p}, self.ask_q("badput"))
                    for p, (v, b) in found.items()
                ],
            )
        )

    def _job_size(self) -> None:
        q, W, B = self.q, self.W, self.B
        ranks_w = _scalar(self.ask("ranks", q.ranks(), self.t1))
        ranks_b = _scalar(self.ask("ranks_baseline", q.ranks(), self.t0))
        st_w, st_b = (_scalar(x) for x in self._pair("rank_steps", q.rank_steps))
        tok_w = _scalar(self.ask("tokens", q.tokens(W), self.t1))
        tok_b = _scalar(self.ask("tokens_baseline", q.tokens(B), self.t0))
        # Per rank-step, so that a job that lost ranks is not counted twice (fewer ranks, fewer
        # tokens/step), and a rank whose series end in the window (a stopped process its agent cannot
        # scrape) loses steps with its tokens: tokens over the most steps any rank did, divided by the
        # ranks reporting, read such a hang as a smaller batch (422 vs 512 tokens/step in a gloo run).
        tps_w = tok_w / st_w if tok_w is not None and st_w else None
        tps_b = tok_b / st_b if tok_b is not None and st_b else None
        parts, sec, ev = [], 0.0, []
        if ranks_w and ranks_b and abs(ranks_w / ranks_b - 1) >= _CONFIG_CHANGE:
            parts.append(f"{ranks_w:g} ranks vs {ranks_b:g} before")
            sec += W * max(0.0, 1 - ranks_w / ranks_b)
            ev.append(Evidence("ranks reporting", ranks_w, ranks_b, query=self.ask_q("ranks")))
        if tps_w and tps_b and abs(tps_w / tps_b - 1) >= _CONFIG_CHANGE:
            parts.append(f"{tps_w:.4g} tokens/step per rank vs {tps_b:.4g} before")
            sec += W * max(0.0, 1 - tps_w / tps_b)
            ev.append(Evidence("tokens per step per rank", tps_w, tps_b))
        if not parts or sec < self.min_seconds:
            self.checked["job_size"] = (
                f"same ranks ({ranks_w or 0:g}) and tokens per step"
                if not parts
                else "the job changed but did not shrink: " + ", ".join(parts)
            )
            return
        self.causes.append(
            Cause("job_size", "the job changed: " + ", ".join(parts), sec, TEAMS["job_size"], evidence=ev)
        )

    def _loss(self) -> None:
        q, W, B = self.q, self.W, self.B
        nonfinite = _scalar(self.ask("nonfinite", q.nonfinite(W), self.t1)) or 0.0
        top = _scalar(self.ask("loss_max", q.loss_max(W), self.t1))
        median = _scalar(self.ask("loss_median_baseline", q.loss_median(B), self.t0))
        parts, ev = [], []
        if nonfinite >= 0.5:
            parts.append(f"{nonfinite:.0f} non-finite loss values")
            ev.append(Evidence("non-finite losses in the window", nonfinite, query=self.ask_q("nonfinite")))
        if top is not None and median and top > _LOSS_SPIKE * median:
            parts.append(f"loss spiked to {top:.3g} (baseline median {median:.3g})")
            ev.append(Evidence("highest loss", top, median, query=self.ask_q("loss_max")))
        if not parts:
            self.checked["loss"] = "no non-finite loss, no loss above 1.5x its baseline median"
            return
        self.causes.append(Cause("loss", "; ".join(parts), 0.0, TEAMS["loss"], evidence=ev))


def _culprits(
    culprits: list[Sample], waiting: list[Sample], culprit_query: str, waiting_query: str
) -> tuple[str, list[Evidence]]:
    """The culprits of a hang as the stall page names them, and the evidence: culprit and waiting ranks."""
    parts: list[str] = []
    evidence: list[Evidence] = []
    for sample in sorted(culprits, key=lambda s: _rank_order(s.labels.get("rank", ""))):
        lab = sample.labels
        seq = f"#{sample.value:.0f}" if finite(sample.value) is not None else "#?"
        at = f"{lab.get('op', '?')} {seq} of group {lab.get('pg', '?')}"
        victims = sorted(
            (w.labels.get("rank", "?") for w in waiting if w.labels.get("pg") == lab.get("pg")),
            key=_rank_order,
        )
        listed = ", ".join(victims[:8]) + (f" ({len(victims)} in all)" if len(victims) > 8 else "")
        who = f"rank{'s' if len(victims) != 1 else ''} {listed} wait{'s' if len(victims) == 1 else ''}"
        uuid = f", {lab['uuid']}" if lab.get("uuid") else ""
        where = f"rank {lab.get('rank', '?')} on host {lab.get('instance', '?')}{uuid}"
        reason = lab.get("reason", "")
        if reason == "behind":
            parts.append(f"{where} never reached {at}; {who} in it")
        elif reason == "gone":
            parts.append(f"{where} is gone (exited, or its host went away) while {who} in {at}")
        else:
            parts.append(f"{where} stopped answering its node agent while {who} in {at}")
        evidence.append(
            Evidence(f"culprit ({reason}): collective it holds up", sample.value, None, lab, culprit_query)
        )
    for sample in sorted(waiting, key=lambda s: _rank_order(s.labels.get("rank", "")))[:8]:
        evidence.append(Evidence("waiting in collective", sample.value, None, sample.labels, waiting_query))
    return "; ".join(parts), evidence
