"""Every knob of the generated dashboards and rules, in one object, each with the reason it exists.

``GenerateConfig()`` is what the committed ``dashboards/`` and ``alerts/`` are generated from;
``fast()`` shrinks windows and ``for:`` durations so an end-to-end test (or ``babysitter demo``) sees
alerts fire within seconds against a real Prometheus scraping every second.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from urllib.parse import urlsplit

__all__ = ["DEFAULT_RUNBOOK_BASE_URL", "PROFILES", "GenerateConfig", "fast", "parse_duration", "profile"]

#: The runbook base when none is configured: ``.invalid`` is reserved (RFC 6761) and never resolves,
#: unlike a made-up organisation on a public forge, which anyone could register and fill.
DEFAULT_RUNBOOK_BASE_URL = "https://babysitter-runbooks.invalid/docs/runbooks"

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def parse_duration(text: str) -> int:
    """Seconds in a Prometheus duration made of h/m/s parts (``"1h30m"``); ValueError otherwise."""
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"not a duration (use h/m/s parts, e.g. '1h30m'): {text!r}")
    hours, minutes, seconds = (int(part) if part else 0 for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


@dataclass(frozen=True)
class GenerateConfig:
    """Selectors, thresholds and windows of the generated monitoring; validated on construction."""

    # --- where the series come from -------------------------------------------------------------
    #: Label that tells clusters (providers) apart. On tracker series it is a constant label the user
    #: passes to ``watch(labels=...)``; on node agent series a Prometheus target or external label.
    cluster_label: str = "cluster"
    #: Constant labels that describe a run's model or shape (``watch(labels={"model": ...})``), kept by
    #: every run-level recording rule next to the cluster and run: the scorecard compares MFU of the
    #: same model across clusters by matching them (``--mfu-match 'model="llama3-8b"'``).
    run_labels: tuple[str, ...] = ()
    #: Extra matchers on every tracker series, e.g. ``'job="babysitter"'``; empty matches all.
    tracker_selector: str = ""
    #: Extra matchers on every node agent series (GPU, storage, sentinel, collector health).
    node_selector: str = ""
    #: ``up`` series of training processes scraped directly (not through the node agent).
    tracker_up_selector: str = 'job=~"babysitter-train.*"'
    #: ``up`` series of node agent targets (one per host): the jobs of exporters/prometheus-scrape.yml,
    #: prometheus-slurm.yml and prometheus-kubernetes.yml.
    node_up_selector: str = 'job=~"babysitter-node.*"'
    #: Absolute URL of the runbook directory (docs/runbooks/ as a browser shows it): a page links to
    #: ``<base>/<Alert>.md``. ``babysitter generate`` derives it from the repository URL in
    #: pyproject.toml's ``[project.urls]`` or takes ``--runbook-base-url``; without either it is
    #: ``DEFAULT_RUNBOOK_BASE_URL``, a reserved name that never resolves, so an unconfigured link is
    #: visibly unconfigured instead of pointing at somebody else's site.
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    #: Each alert's runbook link; ``{alert}`` becomes the alert name. A relative pattern is joined to
    #: ``runbook_base_url``; an absolute one is used as it is (``babysitter generate
    #: --runbook-url-pattern https://git.example.org/ml/babysitter/-/blob/main/docs/runbooks/{alert}.md``).
    runbook_url_pattern: str = "{alert}.md"

    # --- evaluation ------------------------------------------------------------------------------
    #: Evaluation interval (group ``interval``) of every rule group with a paging (critical) alert, so
    #: a page does not wait for Prometheus's 1 m default: scrape (15 s) + evaluation (15 s) + the pager
    #: route's group_wait (10 s, exporters/alertmanager.yml) keeps an Xid 79 under 60 s. Other groups
    #: use the server's ``evaluation_interval``.
    page_eval_interval: str = "15s"
    #: Evaluation interval of the group of alerts on a GPU that failed hard (a paging Xid, an
    #: uncorrectable ECC error, a failed row remap) and of a fatal PCIe AER error: scrape 15 s + 5 s +
    #: the pager route's 5 s group_wait pages them within 30 s. The groups read Xid, ECC, row-remap and
    #: AER counters only (the GPU group's heavy throttle and clock windows stay at
    #: ``page_eval_interval``).
    fatal_eval_interval: str = "5s"

    # --- aggregation windows ----------------------------------------------------------------------
    #: Window of the rates the dashboards and recording rules use; at least 4 scrape intervals.
    rate_window: str = "5m"

    # --- training stalled -------------------------------------------------------------------------
    #: A run is stalled after max(stall_min_seconds, stall_step_factor x its mean step time). 60 s and
    #: 6 steps: a run whose steps take under 10 s pages within 2 min (scrape 15 s + evaluation 15 s +
    #: the pager's 10 s); the stall clock pauses during checkpoints and marked phases, so a long save
    #: or eval does not count. It was 240 s and 10 steps (a hang paged after 266-277 s); what the
    #: shorter threshold costs in false pages is measured in benchmarks/results/campaign.md.
    stall_min_seconds: int = 60
    #: How many typical steps of silence count as a stall (long steps of huge models need minutes).
    stall_step_factor: float = 6.0
    #: Window over which the typical (mean) step time is measured; must cover many steps.
    stall_baseline_window: str = "1h"
    #: How far back the last step of a run is remembered once its series vanish (a stopped process
    #: stops answering the node agent); a run silent for longer than this no longer counts as stalled.
    stall_lookback_window: str = "6h"
    #: Extra wait before paging once the threshold is crossed (the threshold already is the grace period).
    stall_for: str = "0s"
    #: During a stall, a rank whose node agent could not fetch its metrics for this long counts as
    #: stopped (a culprit the page names, ``generate/collectives.py``); one failed fetch is noise. Also
    #: how long a registration is still judged after it was last seen (``generate/ranks.py``): at least
    #: one rule evaluation interval, so a rank that served for one scrape is never missed.
    culprit_silent_for: str = "1m"

    #: Window in which a training process that died without unregistering warns.
    trainer_exit_window: str = "10m"

    # --- targets ----------------------------------------------------------------------------------
    #: How long a scrape target may be down before paging (rides out a restart or a short network blip).
    target_down_for: str = "5m"

    # --- distributed tier (per-rack Prometheus agents remote-writing to a central tier) -----------
    #: External label each rack's agent adds to what it sends (exporters/prometheus-agent.yml).
    rack_label: str = "rack"
    #: A rack whose node agents' ``up`` series sent nothing for this long pages: its agent
    #: Prometheus died or cannot reach the central tier. Remote-write lag stays well below it.
    rack_silent_window: str = "3m"
    #: How far back a rack is remembered: a rack silent for longer no longer pages (decommissioned).
    rack_lookback_window: str = "6h"
    #: Extra wait before paging once a rack fell silent.
    rack_silent_for: str = "2m"

    # --- MFU and stragglers -----------------------------------------------------------------------
    #: The run's own MFU baseline: median of its 5-minute MFU over this window.
    mfu_baseline_window: str = "6h"
    #: Fire when MFU falls below (1 - mfu_drop_fraction) x baseline while the run is stepping.
    mfu_drop_fraction: float = 0.2
    #: A drop must last this long (checkpoints and evals dip MFU briefly on purpose).
    mfu_drop_for: str = "30m"
    #: A rank is a straggler when its mean step time exceeds the run's median rank by this factor.
    straggler_ratio: float = 1.2
    #: How long a rank must straggle before the alert fires.
    straggler_for: str = "15m"

    # --- fail-slow ---------------------------------------------------------------------------------
    #: Window over which a run's share of time lost to slow steps (badput ``slowdown``) is measured.
    slowdown_window: str = "30m"
    #: TrainingSlowdown warns when the run lost more than this share of the window to slow steps...
    slowdown_share: float = 0.1
    #: ...for this long (Greyhound: communication fail-slows last 24 minutes on average).
    slowdown_for: str = "15m"

    # --- goodput ----------------------------------------------------------------------------------
    #: Goodput (productive time / wall time) below this over goodput_window warns.
    goodput_target: float = 0.9
    #: Window of the goodput alert (the budget question is daily, not minute by minute).
    goodput_window: str = "24h"
    #: Ignore runs with less wall time than this in the window (startup dominates a young run).
    goodput_min_wall_seconds: int = 3 * 3600
    #: How long goodput must stay low before warning.
    goodput_for: str = "1h"
    #: How long a run's ledger writer may not be writing (waiting for a lock, failing storage, fenced)
    #: before paging; a restart after a crash on another host waits up to ``stale_after`` (60 s).
    ledger_not_writing_for: str = "15m"

    # --- checkpoints ------------------------------------------------------------------------------
    #: Window over which the observed checkpoint interval is measured (saves counted in it).
    checkpoint_interval_window: str = "6h"
    #: A checkpoint is overdue after this many observed intervals without a successful save.
    checkpoint_overdue_factor: float = 2.0
    #: Upper bound on the overdue threshold, also used before any interval was observed.
    checkpoint_overdue_max_seconds: int = 4 * 3600
    #: Extra wait before the overdue alert fires.
    checkpoint_overdue_for: str = "5m"
    #: Window in which any failed save fires the save-failing alert.
    checkpoint_failure_window: str = "30m"
    #: Mean blocking save time above this (seconds) over checkpoint_slow_window warns.
    checkpoint_save_slow_seconds: float = 600.0
    #: Window of the mean save time for the slow-save alert.
    checkpoint_slow_window: str = "2h"
    #: The sentinel reports a missing checkpoint for this long before paging (an in-flight rename).
    checkpoint_missing_for: str = "2m"
    #: The sentinel may be unable to finish a run's checks for this many seconds (since its last complete
    #: check) before warning: one worker killed and restarted at the next pass is noise, a run whose
    #: worker keeps running out of its budget is not.
    checkpoint_check_failing_seconds: int = 600
    #: Seconds between the node agents' checkpoint sentinel passes (their --checkpoint-interval): the
    #: dashboards turn its per-pass digest budget into bytes per second.
    sentinel_pass_seconds: float = 30.0
    #: The advisor's alert: the current interval is off by more than this factor from the advice...
    checkpoint_advice_factor: float = 2.0
    #: ...and the expected goodput at the advice is higher by more than this (0..1)...
    checkpoint_advice_min_gain: float = 0.01
    #: ...for this long (the advice moves slowly; a changed interval needs two saves to show).
    checkpoint_advice_for: str = "2h"

    # --- storage probe ----------------------------------------------------------------------------
    #: Probe write + fsync time (seconds) above which checkpoint storage counts as slow.
    storage_probe_slow_seconds: float = 5.0
    #: Window of the slow-storage alert (average of the probe's samples).
    storage_probe_window: str = "10m"
    #: How long the storage probe must be slow before warning.
    storage_probe_for: str = "10m"
    #: How long a checkpoint directory may fail the probe before warning (a remount takes a moment).
    storage_failing_for: str = "5m"
    #: How long a collector may fail before warning (one bad scrape is noise).
    collector_failing_for: str = "10m"
    #: A host warns when its agent's fetches of a trainer endpoint, or the registrations it refuses, grew
    #: in every such window for ``trainer_failing_for``: one failed fetch or one bad file (counted and
    #: logged once) is noise; a failure that keeps coming back is not.
    trainer_failing_window: str = "10m"
    trainer_failing_for: str = "15m"
    #: How long a run's rank may be claimed on two hosts before warning (a rank restarted elsewhere
    #: overlaps its old host for a scrape at most: the old process is dead before the new one starts).
    claimed_twice_for: str = "5m"

    # --- GPU health -------------------------------------------------------------------------------
    #: Xid window: any new Xid in it fires; also how long an Xid alert stays up after the last one.
    xid_window: str = "15m"
    #: Xid action buckets that page (the GPU or node needs a reset, reboot or drain).
    xid_page_actions: tuple[str, ...] = ("reset_gpu", "reboot", "drain")
    #: Xid action buckets never alerted on (known harmless), the rest warn.
    xid_ignore_actions: tuple[str, ...] = ("ignore",)
    #: How long gpu_up must be 0 before paging.
    gpu_down_for: str = "1m"
    #: ``type`` label value of uncorrectable ECC errors.
    ecc_uncorrected_type: str = "uncorrected"
    #: Window in which a new uncorrectable ECC error fires.
    ecc_window: str = "15m"
    #: ``state`` label value of rows waiting for a GPU reset to be remapped.
    remap_pending_state: str = "pending"
    #: ``state`` label value counting failed row remaps (RMA territory).
    remap_failure_state: str = "failure"
    #: How long a row remap may stay pending before warning (the next reset clears it).
    remap_pending_for: str = "10m"
    #: Clock event reasons that mean thermal or power throttling (not idle, not app clocks).
    throttle_reasons: tuple[str, ...] = (
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    )
    #: Fraction of throttle_window a reason must be active to count as sustained.
    throttle_fraction: float = 0.5
    #: Window of the throttling fraction.
    throttle_window: str = "10m"
    #: How long throttling must be sustained before warning.
    throttle_for: str = "15m"

    # --- the fabric and the host (docs/fabric.md) --------------------------------------------------
    #: An InfiniBand/RoCE port down (state below Active) this long pages: a port down longer than the
    #: transport's timeout (about 7 s) has already torn the job's NCCL connections.
    fabric_port_down_for: str = "1m"
    #: Only a port that was Active within this window pages when down: a port never cabled does not.
    fabric_port_memory: str = "24h"
    #: Any growth of ``link_downed`` (or of the link-integrity counters) in this window pages, and the
    #: page stays up this long after the last one (NVIDIA NVSentinel: link_downed growing is fatal).
    fabric_link_downed_window: str = "15m"
    #: A port flaps when ``link_downed`` grows this many times (or its netdev's carrier changes twice
    #: as many) within ``fabric_flap_window`` (NVSentinel's link-flap rule: 3 in 10 minutes).
    fabric_flap_count: int = 3
    fabric_flap_window: str = "10m"
    #: Symbol errors per hour above which a link fails the IBTA bit-error budget (1e-12 at the port's
    #: rate: 120 per hour, NVSentinel's threshold).
    fabric_symbol_errors_per_hour: float = 120.0
    #: Link error recoveries per minute, averaged over ``fabric_recovery_window``, that make a storm
    #: (NVSentinel: above 5 per minute is degradation).
    fabric_recoveries_per_minute: float = 5.0
    fabric_recovery_window: str = "5m"
    #: A port's expected signalling rate in Gb/s (400 for NDR, the H100/H200/B200 SKUs' ports); 0: compare
    #: each port with the other active ports of its host and link layer only.
    fabric_expected_rate_gbps: float = 0.0
    #: How long a port must run slower than its peers (or its expected rate) before warning.
    fabric_slow_for: str = "10m"
    #: How long a PCIe link must run below its maximum width (or speed, under load) before warning.
    pcie_degraded_for: str = "10m"
    #: A GPU counts as under load, so that a PCIe speed below its maximum means something, above this
    #: utilization (GPUs drop to 2.5 GT/s when idle).
    pcie_busy_utilization: float = 0.5
    #: Window in which a new fatal or non-fatal AER error fires (and how long the alert stays up).
    pcie_aer_window: str = "15m"
    #: Window in which a new uncorrectable host-memory (EDAC) error pages.
    host_memory_ue_window: str = "15m"
    #: Correctable host-memory errors rise when at least ``host_ce_min`` came in ``host_ce_window`` and
    #: that is more than ``host_ce_factor`` times their rate over the ``host_ce_baseline`` before it.
    host_ce_window: str = "1h"
    host_ce_min: int = 10
    host_ce_factor: float = 2.0
    host_ce_baseline: str = "6h"
    #: A CPU package throttles when its thermal throttle counts grew in every ``cpu_throttle_window`` for
    #: ``cpu_throttle_for``.
    cpu_throttle_window: str = "10m"
    cpu_throttle_for: str = "15m"
    #: Window in which a kernel line before trouble (soft lockup, hung task, mlx5 timeout...) warns.
    kernel_trouble_window: str = "15m"
    #: Kernel-log patterns counted but never alerted on (corrected PCIe errors are routine noise).
    kernel_trouble_ignore: tuple[str, ...] = ("pcie_bus_error_corrected",)

    # --- dcgm-exporter mode (alerts/babysitter-dcgm-exporter-rules.yaml, docs/dcgm-exporter.md) -------
    #: Matchers selecting dcgm-exporter's series (e.g. ``job="dcgm-exporter"``); empty: wherever they are.
    dcgm_selector: str = ""
    #: Where Xids come from: ``field`` (DCGM_FI_DEV_XID_ERRORS, the last Xid, in the default counters),
    #: ``exp`` (DCGM_EXP_XID_ERRORS_COUNT, per Xid code over the exporter's count window) or ``none``
    #: (the node agent's Xid collector still reads the kernel log and counts every Xid).
    dcgm_xid_source: str = "field"

    # --- remediation (babysitter remediate) ---------------------------------------------------------
    #: Window in which a failed remediation action, or a refusal by the drain cap or rate limit, pages.
    remediation_window: str = "15m"

    # --- the monitoring itself (generate/alerts/monitoring.py) --------------------------------------
    #: Matchers on the rule engine's (Prometheus, vmalert) and Alertmanager's own series, e.g.
    #: ``job=~"prometheus|alertmanager"``; empty: wherever they come from (their names are their own).
    #: The shipped scrape configs scrape both (exporters/prometheus-scrape.yml).
    monitoring_selector: str = ""
    #: Window in which failed rule evaluations and failed or dropped notifications count (the
    #: Prometheus and Alertmanager mixins' 5 m).
    monitoring_window: str = "5m"
    #: The same for failed or dropped notifications (AlertDeliveryFailing,
    #: AlertmanagerNotificationsFailing): shorter, because the rule engine and Alertmanager try again
    #: at least every minute, and the window is how long the alert stays true after delivery works
    #: again. With 5 m, a 7-minute Alertmanager outage paged AlertDeliveryFailing 4 minutes after it
    #: was over (benchmarks/results/campaign.md, shipped profile). Rule groups may be evaluated every
    #: 5 m, so RuleEvaluationFailing keeps ``monitoring_window``.
    monitoring_delivery_window: str = "2m"
    #: How long they must keep failing before paging. Longer than the window, so one failure alone (a
    #: query timeout under a load spike, a receiver's network blip) never pages; a broken rule or a dead
    #: receiver fails at every evaluation and does.
    monitoring_for: str = "10m"

    # --- loss -------------------------------------------------------------------------------------
    #: Window in which a non-finite loss fires.
    nonfinite_window: str = "10m"

    # --- dashboard colours (what a person reads at 3 a.m.) ------------------------------------------
    #: MFU below this is red: a stall, a tiny batch or throttled GPUs, not a tuning question.
    mfu_poor: float = 0.2
    #: MFU from this up is green, amber in between: well-tuned dense LLM training reaches 35-55%
    #: (PaLM 540B 46.2% on TPU v4; Llama 3 405B 38-43% BF16 on H100, per their papers).
    mfu_good: float = 0.35
    #: Goodput below this is red; amber below ``goodput_target`` (the alert's threshold), green above.
    goodput_poor: float = 0.75
    #: The last checkpoint's age turns amber from here (at most half the overdue cap), red from
    #: ``checkpoint_overdue_max_seconds`` (where CheckpointOverdue fires at the latest).
    checkpoint_age_warn_seconds: int = 3600
    #: GPU temperature (Celsius) from which panels turn amber and red: datacenter GPUs (H100/A100)
    #: throttle in the high 80s (``nvidia-smi -q``: "GPU Slowdown Temp"); amber leaves room to act.
    gpu_temperature_warm: float = 80.0
    gpu_temperature_hot: float = 87.0

    def __post_init__(self) -> None:
        for name in ("cluster_label", "rack_label"):
            if not _LABEL.fullmatch(getattr(self, name)):
                raise ValueError(f"{name} is not a Prometheus label name: {getattr(self, name)!r}")
        for label in self.run_labels:
            if not _LABEL.fullmatch(label) or label in (self.cluster_label, "run", "rank", "le", "quantile"):
                raise ValueError(f"run_labels: {label!r} is not a free label name")
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name.endswith(("_window", "_for", "_interval")):
                seconds = parse_duration(value)
                if item.name.endswith(("_window", "_interval")) and seconds <= 0:
                    raise ValueError(f"{item.name} must be positive: {value!r}")
        for name in (
            "mfu_drop_fraction",
            "goodput_target",
            "throttle_fraction",
            "mfu_poor",
            "mfu_good",
            "slowdown_share",
        ):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie strictly between 0 and 1")
        if not (self.mfu_poor < self.mfu_good and 0.0 < self.goodput_poor < self.goodput_target):
            raise ValueError(
                "dashboard colours: need mfu_poor < mfu_good and 0 < goodput_poor < goodput_target"
            )
        if not (
            self.checkpoint_age_warn_seconds > 0 and self.gpu_temperature_warm < self.gpu_temperature_hot
        ):
            raise ValueError(
                "dashboard colours: need 0 < checkpoint_age_warn_seconds and "
                "gpu_temperature_warm < gpu_temperature_hot"
            )
        if not 0.0 < self.pcie_busy_utilization < 1.0:
            raise ValueError("pcie_busy_utilization must lie strictly between 0 and 1")
        if (
            self.fabric_flap_count < 1
            or self.host_ce_min < 1
            or self.host_ce_factor <= 1.0
            or self.fabric_expected_rate_gbps < 0
            or self.fabric_symbol_errors_per_hour <= 0
            or self.fabric_recoveries_per_minute <= 0
        ):
            raise ValueError(
                "fabric thresholds: need fabric_flap_count >= 1, host_ce_min >= 1, host_ce_factor > 1, "
                "fabric_expected_rate_gbps >= 0 and positive error rates"
            )
        if self.straggler_ratio <= 1.0:
            raise ValueError("straggler_ratio must be above 1")
        if "{alert}" not in self.runbook_url_pattern:
            raise ValueError("runbook_url_pattern must contain {alert}")
        if not _is_web_url(self.runbook_base_url):
            raise ValueError(
                "runbook_base_url must be an absolute http(s) URL (a page links to it): "
                f"{self.runbook_base_url!r}"
            )
        overlap = set(self.xid_page_actions) & set(self.xid_ignore_actions)
        if overlap:
            raise ValueError(f"Xid actions both paged and ignored: {sorted(overlap)}")
        if self.dcgm_xid_source not in ("field", "exp", "none"):
            raise ValueError(f"dcgm_xid_source: 'field', 'exp' or 'none', got {self.dcgm_xid_source!r}")
        if not self.throttle_reasons or not self.xid_page_actions:
            raise ValueError("throttle_reasons and xid_page_actions must not be empty")

    def runbook_url(self, alert: str) -> str:
        """The absolute runbook link of ``alert`` (a relative link is not clickable in a page)."""
        link = self.runbook_url_pattern.replace("{alert}", alert)
        if _is_web_url(link):
            return link
        return self.runbook_base_url.rstrip("/") + "/" + link.lstrip("/")


def _is_web_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not any(c.isspace() for c in text)


def fast(base: GenerateConfig | None = None) -> GenerateConfig:
    """Short windows and ``for:`` durations for end-to-end tests and demos (1 s scrape interval)."""
    return replace(
        base or GenerateConfig(),
        rate_window="20s",
        page_eval_interval="1s",
        fatal_eval_interval="1s",
        stall_min_seconds=15,
        stall_step_factor=5.0,
        stall_baseline_window="2m",
        stall_lookback_window="5m",
        stall_for="0s",
        culprit_silent_for="5s",
        target_down_for="10s",
        rack_silent_window="10s",
        rack_lookback_window="5m",
        rack_silent_for="0s",
        trainer_exit_window="1m",
        mfu_baseline_window="5m",
        mfu_drop_for="30s",
        straggler_for="30s",
        goodput_window="10m",
        goodput_min_wall_seconds=30,
        slowdown_window="1m",
        slowdown_for="20s",
        goodput_for="30s",
        ledger_not_writing_for="10s",
        checkpoint_interval_window="5m",
        checkpoint_overdue_max_seconds=120,
        checkpoint_age_warn_seconds=60,
        # The shipped 5m over twelve, as the profile's other windows: with 0s a healthy 22.5 s eval
        # phase between two 15 s saves chatted CheckpointOverdue (the fast campaign, seed 1).
        checkpoint_overdue_for="25s",
        checkpoint_failure_window="1m",
        checkpoint_slow_window="2m",
        checkpoint_missing_for="0s",
        storage_probe_window="30s",
        storage_probe_for="10s",
        storage_failing_for="5s",
        collector_failing_for="10s",
        trainer_failing_window="30s",
        trainer_failing_for="30s",
        claimed_twice_for="10s",
        xid_window="1m",
        gpu_down_for="5s",
        ecc_window="1m",
        remap_pending_for="10s",
        throttle_window="30s",
        throttle_for="15s",
        nonfinite_window="1m",
        remediation_window="1m",
        monitoring_window="20s",
        monitoring_delivery_window="10s",
        # Longer than the window, as at the shipped settings: a restarted Prometheus drops its first
        # evaluations' alerts before it finds Alertmanager, and with 10 s that burst paged
        # AlertDeliveryFailing in the campaign (benchmarks/results/campaign.md, seed 3).
        monitoring_for="25s",
        fabric_port_down_for="5s",
        fabric_port_memory="5m",
        fabric_link_downed_window="1m",
        fabric_flap_window="1m",
        fabric_recovery_window="30s",
        fabric_slow_for="10s",
        pcie_degraded_for="10s",
        pcie_aer_window="1m",
        host_memory_ue_window="1m",
        host_ce_window="1m",
        host_ce_baseline="5m",
        cpu_throttle_window="30s",
        cpu_throttle_for="15s",
        kernel_trouble_window="1m",
    )


#: Named profiles the command line offers.
PROFILES: dict[str, Callable[[], GenerateConfig]] = {"default": GenerateConfig, "fast": fast}


def profile(name: str) -> GenerateConfig:
    """The config of a named profile; KeyError lists the known names."""
    try:
        factory = PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
    return factory()
