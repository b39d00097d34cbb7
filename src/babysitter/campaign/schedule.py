"""A seeded campaign schedule: which fault, where, when, for how long, with healthy noise between.

A schedule is a pure function of the seed, the cluster's shape, the fault list and the timing of the
profile, so a campaign can be replayed and its JSON says exactly what was played. Faults come one
after another: each lasts long enough for the profile's windows to fire (:func:`duration`), is cleared,
is given time to settle (resolutions, late consequences), and is followed by a quiet stretch in which
healthy noise (an eval phase, a slow but healthy checkpoint save, a planned restart) must not page.
Step-time jitter runs all the time. The settle and quiet times scale with the profile: the shipped
profile's windows are minutes, so its campaign is hours long.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from babysitter.campaign.faults import KINDS, Kind, draw_weights, kind
from babysitter.generate.config import GenerateConfig, parse_duration

__all__ = [
    "NOISE",
    "Fault",
    "Noise",
    "Schedule",
    "Shape",
    "Timing",
    "build_schedule",
    "duration",
    "short",
    "timing_for",
]

#: Healthy noise a quiet stretch may hold: none of it may page.
NOISE = ("eval", "slow_save", "restart")


@dataclass(frozen=True)
class Shape:
    """The simulated cluster: hosts, GPUs per host, ranks (one per host, on its GPU ``rank_gpu``)."""

    hosts: int = 3
    gpus: int = 2
    rank_gpu: int = 0

    @property
    def ranks(self) -> int:
        """One rank per host."""
        return self.hosts


@dataclass(frozen=True)
class Timing:
    """The stack's clocks for a profile (seconds), and the campaign's pace derived from them."""

    profile: str
    scrape: float
    #: Rule groups that page are evaluated this often (their ``interval``); the rest at ``slow_eval``.
    evaluation: float
    slow_eval: float
    #: Alertmanager's group_wait on the pager route and on chat.
    group_wait: float
    chat_wait: float
    #: The Watchdog's repeat interval, and the period after which the external switch pages.
    heartbeat: float
    switch_period: float
    #: The node agents' sentinel and storage probe pass.
    agent_pass: float
    #: How long a scheduler takes to start an interrupted job again.
    restart_delay: float
    #: After a fault is cleared: resolutions and late consequences still belong to it.
    settle: float
    #: Quiet (healthy) time between faults: drawn between these.
    quiet: tuple[float, float]
    warmup: float
    #: The job: seconds per step (before jitter), its jitter (log-normal sigma), seconds between saves.
    step_seconds: float
    jitter: float
    checkpoint_every: float
    #: How much longer than its windows and the pipeline a fault lasts.
    margin: float = 20.0
    #: A remediate policy's ``firing_for`` is played times this: the fast profile's windows are about
    #: a twelfth of the shipped ones (a GPU down for 1m pages at 5s there).
    policy_scale: float = 1.0
    #: How long a hang is held past its page: a real hang lasts until something acts, and the example
    #: policy's stall rule acts once TrainingStalled has fired for 2 minutes (times ``policy_scale``).
    #: tests/test_campaign_schedule.py holds the two together.
    hang_hold: float = 120.0

    @property
    def pipeline(self) -> float:
        """Scrape, evaluation and the pager's group_wait: the most a page waits once its rule is true."""
        return self.scrape + self.evaluation + self.group_wait


def short(t: Timing) -> Timing:
    """``t`` with the least warm-up, settle and quiet time a campaign of a few faults needs (the CI
    campaign): the fast profile's windows are seconds, its resolutions come within ten."""
    return replace(t, warmup=30.0, settle=10.0, quiet=(5.0, 8.0), margin=10.0)


def timing_for(profile: str) -> Timing:
    """The campaign's clocks at ``fast`` (1 s scrapes, the demo's Alertmanager waits) or ``default``
    (exporters/prometheus-scrape.yml's 15 s scrapes, Prometheus's 1 m evaluation default with the
    paging groups at 15 s, exporters/alertmanager.yml's waits, the node agent's default passes)."""
    if profile == "fast":
        return Timing(
            profile="fast",
            scrape=1.0,
            evaluation=1.0,
            slow_eval=1.0,
            group_wait=1.0,
            chat_wait=1.0,
            heartbeat=5.0,
            switch_period=20.0,
            agent_pass=2.0,
            restart_delay=8.0,
            settle=30.0,
            quiet=(30.0, 60.0),
            warmup=75.0,
            step_seconds=0.3,
            jitter=0.1,
            checkpoint_every=15.0,
            policy_scale=1 / 12,
            hang_hold=10.0,
        )
    if profile == "default":
        return Timing(
            profile="default",
            scrape=15.0,
            evaluation=15.0,
            slow_eval=60.0,
            group_wait=10.0,
            chat_wait=30.0,
            heartbeat=60.0,
            switch_period=300.0,
            agent_pass=30.0,
            restart_delay=60.0,
            settle=150.0,
            quiet=(90.0, 180.0),
            warmup=420.0,
            step_seconds=1.0,
            jitter=0.1,
            checkpoint_every=120.0,
        )
    raise ValueError(f"profile is fast or default, got {profile!r}")


def _s(text: str) -> float:
    return float(parse_duration(text))


def duration(k: Kind, cfg: GenerateConfig, t: Timing) -> float:
    """How long fault ``k`` lasts: long enough for its alerts' windows and ``for:`` at ``cfg``, the
    pipeline to the pager, and a margin; then it is cleared."""
    p, margin = t.pipeline, max(t.margin, t.pipeline)
    chat = t.scrape + t.slow_eval + t.chat_wait
    step = t.step_seconds
    by_kind = {
        "xid79": _s(cfg.gpu_down_for) + p,
        "nvlink": chat,
        "aer_fatal": p,
        "xid48": p,
        "row_remap_failure": p,
        "xid119": p,
        "throttle": _s(cfg.throttle_for) + cfg.throttle_fraction * _s(cfg.throttle_window) + chat,
        "pcie_downtrained": _s(cfg.pcie_degraded_for) + chat,
        "ib_flapping": 3 * max(3.0, t.scrape) + p,
        "ib_down": _s(cfg.fabric_port_down_for) + p,
        "symbol_errors": 3 * t.scrape + chat,
        "edac_ue": p,
        "straggler": _s(cfg.straggler_for) + _s(cfg.rate_window) + chat + 10 * step,
        "hang": max(cfg.stall_min_seconds, cfg.stall_step_factor * step)
        + _s(cfg.culprit_silent_for)
        + p
        + t.hang_hold,
        "crash": t.agent_pass + chat,
        "slow_input": _s(cfg.mfu_drop_for) + _s(cfg.rate_window) + chat,
        "slow_storage": _s(cfg.checkpoint_slow_window) / 2 + 2 * t.checkpoint_every + chat,
        "ckpt_deleted": t.agent_pass + _s(cfg.checkpoint_missing_for) + p,
        "ckpt_corrupt": 2 * t.agent_pass + p,
        "nan": p,
        "diverged": 40 * step + p,
        "agent_killed": _s(cfg.target_down_for) + p,
        "alertmanager_down": t.switch_period + t.heartbeat,
        # Alertmanager keeps a silent Prometheus's alerts, Watchdog too, until their endsAt: 4 times
        # the resend delay or the group's interval (Prometheus's rule manager), so the heartbeats go
        # on that long before the switch's period starts to run.
        "prometheus_down": 4 * max(t.evaluation, t.slow_eval) + t.switch_period + t.heartbeat,
    }
    return round(by_kind[k.name] + margin, 1)


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: its kind, when (seconds after the campaign's start), for how long, where
    (``culprit``: host, gpu, rank, device, port, pci_address, controller; what the pages must name)."""

    kind: str
    at: float
    seconds: float
    culprit: dict[str, Any] = field(default_factory=dict)
    #: The window its notifications are counted in ends here (cleared + settle).
    until: float = 0.0

    @property
    def end(self) -> float:
        """When it is cleared."""
        return self.at + self.seconds

    def to_json(self) -> dict[str, Any]:
        """Its JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class Noise:
    """Healthy noise in a quiet stretch: ``eval`` (seconds of eval phase), ``slow_save`` (a save that
    blocks ``seconds`` longer, under the slow-save threshold), ``restart`` (a planned clean restart)."""

    kind: str
    at: float
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Its JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class Schedule:
    """What a campaign plays."""

    seed: int
    profile: str
    shape: Shape
    faults: tuple[Fault, ...]
    noise: tuple[Noise, ...]
    #: Seconds from the start to the end of the last settle.
    length: float

    def to_json(self) -> dict[str, Any]:
        """Its JSON form."""
        return {
            "seed": self.seed,
            "profile": self.profile,
            "shape": asdict(self.shape),
            "faults": [f.to_json() for f in self.faults],
            "noise": [n.to_json() for n in self.noise],
            "length": self.length,
        }


def _culprit(k: Kind, rng: random.Random, shape: Shape) -> dict[str, Any]:
    """Where ``k`` strikes. GPU faults hit a rank's GPU (the process on it dies with it), fabric and
    host faults a host's NIC port, PCIe function or memory controller."""
    host = rng.randrange(shape.hosts)
    if k.area == "gpu" or k.name == "aer_fatal":
        return {"host": host, "gpu": shape.rank_gpu, "rank": host}
    if k.area == "fabric":
        nic = rng.randrange(shape.gpus)
        return {"host": host, "nic": nic, "device": f"mlx5_{nic}", "port": "1"}
    if k.name == "edac_ue":
        return {"host": host, "controller": str(rng.randrange(2))}
    if k.name in ("straggler", "hang", "crash", "nan", "diverged"):
        rank = rng.randrange(1, shape.ranks) if k.name == "diverged" else rng.randrange(shape.ranks)
        return {"rank": rank, "host": rank}  # one rank per host
    if k.name == "agent_killed":
        return {"host": host}
    if k.name == "slow_storage":  # rank 0 saves: it is the one the slow storage holds up
        return {"rank": 0, "host": 0}
    return {}


def build_schedule(
    seed: int,
    cfg: GenerateConfig,
    t: Timing,
    shape: Shape,
    *,
    kinds: Sequence[str] = (),
    draw: int = 0,
    draw_slow: int = 0,
    noise: bool = True,
) -> Schedule:
    """The schedule: every kind in ``kinds`` (default: every kind playable at the profile) once, in a
    seeded order, plus ``draw`` hard faults drawn by Llama 3's counts and ``draw_slow`` slow ones by
    Greyhound's shares; each quiet stretch holds one noise event (seeded) when ``noise``."""
    rng = random.Random(seed)
    chosen = [kind(name) for name in kinds] if kinds else [k for k in KINDS if t.profile not in k.not_at]
    for name in kinds:
        reason = kind(name).not_at.get(t.profile)
        if reason:
            raise ValueError(f"{name} cannot be played at the {t.profile} profile: {reason}")
    order = rng.sample(chosen, len(chosen))
    for table, count in (("llama3", draw), ("greyhound", draw_slow)):
        weights = {n: w for n, w in draw_weights(table).items() if t.profile not in kind(n).not_at}
        if count and weights:
            names = rng.choices(list(weights), weights=list(weights.values()), k=count)
            for name in names:
                order.insert(rng.randrange(len(order) + 1), kind(name))
    faults, noises = [], []
    now = t.warmup
    #: When each host's GPU last failed hard: its GpuXidCritical or GpuEccUncorrectable lasts their
    #: window, and inhibits the next hard fault's page on the same GPU (one page per fault).
    gpu_hit: dict[int, float] = {}
    hold = max(_s(cfg.xid_window), _s(cfg.ecc_window))
    for number, k in enumerate(order):
        seconds = duration(k, cfg, t)
        culprit = _culprit(k, rng, shape)
        if k.area == "gpu" and k.nature == "hard":
            culprit = _spare_gpu(culprit, gpu_hit, now - hold, shape)
            gpu_hit[int(culprit["host"])] = now
        until = now + seconds + t.settle
        faults.append(Fault(k.name, round(now, 1), seconds, culprit, round(until, 1)))
        quiet = rng.uniform(*t.quiet)
        next_at = until + quiet
        if (noise and number < len(order) - 1) or (noise and len(order) == 1):
            # A restart needs the quiet stretch to itself: its stop, the scheduler's delay and the
            # ranks' start (about 30 s on two loaded cores) must be over before the next fault.
            fits = NOISE if quiet >= t.restart_delay + 35.0 else tuple(n for n in NOISE if n != "restart")
            what = fits[rng.randrange(len(fits))]
            at = until + (1.0 if what == "restart" else quiet / 3)
            lasts = _noise_seconds(what, cfg, t)
            noises.append(Noise(what, round(at, 1), lasts))
            # The noise is over before the next fault: a fault played in a 300 s save (shipped seed 2:
            # a NaN loss while no step ran) was never played at all.
            next_at = max(next_at, at + lasts + t.pipeline)
        now = next_at
    return Schedule(seed, t.profile, shape, tuple(faults), tuple(noises), round(now, 1))


def _spare_gpu(culprit: dict[str, Any], hit: dict[int, float], since: float, shape: Shape) -> dict[str, Any]:
    """``culprit`` moved to the next host whose GPU has not failed hard since ``since``, where there is
    one. The GPU that just failed would be drained and repaired on a real cluster (the campaign's
    remediator only plans); a second fault on it within its alerts' window is folded into the first
    page by the inhibit rules (shipped seed 2 lost an Xid 48 to the row-remap failure 6 minutes
    before it, on the same GPU)."""
    host = int(culprit["host"])
    for step in range(shape.hosts):
        candidate = (host + step) % shape.hosts
        if hit.get(candidate, float("-inf")) < since:
            moved = dict(culprit, host=candidate)
            if "rank" in moved:
                moved["rank"] = candidate
            return moved
    return culprit


def _noise_seconds(what: str, cfg: GenerateConfig, t: Timing) -> float:
    """An eval phase longer than the stall threshold (its clock pauses in phases); a save that blocks
    half the slow-save threshold longer; a restart needs none."""
    if what == "eval":
        return round(max(cfg.stall_min_seconds * 1.5, 10 * t.step_seconds), 1)
    if what == "slow_save":
        return round(min(cfg.checkpoint_save_slow_seconds / 2, 4 * t.checkpoint_every), 1)
    return 0.0
