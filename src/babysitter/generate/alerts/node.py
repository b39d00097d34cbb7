"""Node alerts: the storage probe, the agent's collectors and Xid sources, the agent itself, a rack whose
metrics stop arriving, and the trainer endpoints the agent fetches (a group of their own)."""

from __future__ import annotations

from typing import Any

from babysitter.catalog import node as N
from babysitter.catalog import storage as S
from babysitter.generate.alerts._common import (
    _GPU,
    _V,
    _VD,
    Alert,
    AlertTest,
    _l,
    _node_labels,
    _series,
    _up_series,
    _with,
)
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, new_or_increased, regex, select
from babysitter.generate.rules import Records

__all__ = ["node_alerts", "trainer_fetch_alerts"]


def node_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ns, c = cfg.node_selector, cfg.cluster_label
    host_path = (c, "instance", "path")
    slow_s = f"{cfg.storage_probe_slow_seconds:g}"
    running = select(S.STORAGE_PROBE_RUNNING, ns)
    storage_slow = Alert(
        name="StorageProbeSlow",
        # Slow probes, or one that has not returned at all (a hung mount never updates the timings).
        expr=(
            f"max {by(host_path)} (avg_over_time({r.storage_probe_total}[{cfg.storage_probe_window}]))"
            f" > {slow_s}\nor\nmax {by(host_path)} ({running}) > {slow_s}"
        ),
        severity="warning",
        component="storage",
        summary=f"Checkpoint storage {_l('path')} on {_l('instance')} is slow: {_VD} per probe.",
        description=(
            f"A small write + fsync in {_l('path')} on {_l('instance')} (cluster {_l(c)}) took {_VD} on "
            f"average over {cfg.storage_probe_window}, or has been running that long (threshold {slow_s}s). "
            f"Checkpoint saves there will be slow, time out or hang."
        ),
        for_=cfg.storage_probe_for,
        test=AlertTest(
            series=(
                (_series(S.STORAGE_PROBE_WRITE, _with(_GPU, path="/ckpt")), "0.5+0x40"),
                (_series(S.STORAGE_PROBE_FSYNC, _with(_GPU, path="/ckpt")), "0.2+0x10 8+0x30"),
                (_series(S.STORAGE_PROBE_RUNNING, _with(_GPU, path="/ckpt")), "0+0x40"),
                (_series(S.STORAGE_PROBE_WRITE, _with(_GPU, path="/fast")), "0.5+0x40"),
                (_series(S.STORAGE_PROBE_FSYNC, _with(_GPU, path="/fast")), "0.2+0x40"),
                (_series(S.STORAGE_PROBE_RUNNING, _with(_GPU, path="/fast")), "0+0x40"),
                # /hung: the last probe was fast, the current one never returns.
                (_series(S.STORAGE_PROBE_WRITE, _with(_GPU, path="/hung")), "0.5+0x40"),
                (_series(S.STORAGE_PROBE_FSYNC, _with(_GPU, path="/hung")), "0.2+0x40"),
                (_series(S.STORAGE_PROBE_RUNNING, _with(_GPU, path="/hung")), "0+0x20 60+60x20"),
            ),
            quiet=(("10m", "fast"), ("25m", "before for:")),
            fire_at="35m",
            fire_labels=(
                {"cluster": "c1", "instance": "n1:9400", "path": "/ckpt"},
                {"cluster": "c1", "instance": "n1:9400", "path": "/hung"},
            ),
            fire_text=tuple(
                (
                    f"Checkpoint storage {path} on n1:9400 is slow: {took} per probe.",
                    f"A small write + fsync in {path} on n1:9400 (cluster c1) took {took} on average over "
                    "10m, or has been running that long (threshold 5s). Checkpoint saves there will be slow, "
                    "time out or hang.",
                )
                for path, took in (("/ckpt", "8.5s"), ("/hung", "15m 0s"))
            ),
        ),
    )
    host_key = (c, "instance")
    probe_up = S.STORAGE_PROBE_UP
    storage_failing = Alert(
        name="StorageProbeFailing",
        expr=f"max {by(host_path)} ({select(probe_up, ns)}) == 0",
        severity="warning",
        component="storage",
        summary=f"Checkpoint storage {_l('path')} on {_l('instance')} fails the storage probe.",
        description=(
            f"The storage probe of {_l('path')} on {_l('instance')} (cluster {_l(c)}) has failed for "
            f"{cfg.storage_failing_for}: the directory is missing, read-only, full, not permitted or "
            f"returns I/O errors (the reason label of the probe's error counter says which). Checkpoint "
            f"saves there fail."
        ),
        for_=cfg.storage_failing_for,
        test=AlertTest(
            series=(
                (_series(probe_up, _with(_node_labels(), path="/ckpt")), "1+0x5 0+0x20"),
                (_series(probe_up, _with(_node_labels(), path="/fast")), "1+0x25"),
            ),
            quiet=(("5m", "succeeding"), ("9m", "before for:")),
            fire_at="15m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400", "path": "/ckpt"},),
            fire_text=(
                (
                    "Checkpoint storage /ckpt on n1:9400 fails the storage probe.",
                    "The storage probe of /ckpt on n1:9400 (cluster c1) has failed for 5m: the directory is "
                    "missing, read-only, full, not permitted or returns I/O errors (the reason label of the "
                    "probe's error counter says which). Checkpoint saves there fail.",
                ),
            ),
        ),
    )
    success = N.COLLECTOR_SUCCESS
    collector_key = (*host_key, "collector")
    collector_failing = Alert(
        name="NodeCollectorFailing",
        expr=f"max {by(collector_key)} ({select(success, ns)}) == 0",
        severity="warning",
        component="node",
        summary=f"Node agent collector {_l('collector')} on {_l('instance')} fails.",
        description=(
            f"The {_l('collector')} collector of the node agent on {_l('instance')} (cluster {_l(c)}) has "
            f"failed for {cfg.collector_failing_for}; what it watches (GPUs, Xid, storage, trainers) is "
            f"blind there. Its log line says why."
        ),
        for_=cfg.collector_failing_for,
        test=AlertTest(
            series=(
                (_series(success, {**_node_labels(), "collector": "xid"}), "1+0x5 0+0x20"),
                (_series(success, {**_node_labels(), "collector": "gpu"}), "1+0x25"),
            ),
            quiet=(("5m", "succeeding"), ("15m", "before for:")),
            fire_at="20m",
            fire_labels=({"cluster": "c1", "collector": "xid", "instance": "n1:9400"},),
            fire_text=(
                (
                    "Node agent collector xid on n1:9400 fails.",
                    "The xid collector of the node agent on n1:9400 (cluster c1) has failed for 10m; what "
                    "it watches (GPUs, Xid, storage, trainers) is blind there. Its log line says why.",
                ),
            ),
        ),
    )
    sources = N.XID_SOURCE_UP
    xid_blind = Alert(
        name="NodeXidBlind",
        # One source (kernel log or NVML events) is enough; only when every one fails is the host blind.
        expr=f"max {by(host_key)} ({select(sources, ns)}) == 0",
        severity="warning",
        component="node",
        summary=f"Xid errors on {_l('instance')} go unseen.",
        description=(
            f"No Xid source (kernel log, NVML events) of the node agent on {_l('instance')} (cluster "
            f"{_l(c)}) has worked for {cfg.collector_failing_for}: GPU faults there raise no Xid alert. "
            f"Usually /dev/kmsg is unreadable for the agent's user or container."
        ),
        for_=cfg.collector_failing_for,
        test=AlertTest(
            series=(
                (_series(sources, {**_node_labels(), "source": "kmsg"}), "1+0x5 0+0x20"),
                (_series(sources, {**_node_labels(), "source": "nvml"}), "0+0x25"),
                (_series(sources, {**_node_labels(), "instance": "n2:9400", "source": "kmsg"}), "0+0x25"),
                (_series(sources, {**_node_labels(), "instance": "n2:9400", "source": "nvml"}), "1+0x25"),
            ),
            quiet=(("5m", "the kernel log still works"), ("15m", "before for:")),
            fire_at="20m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400"},),
            fire_text=(
                (
                    "Xid errors on n1:9400 go unseen.",
                    "No Xid source (kernel log, NVML events) of the node agent on n1:9400 (cluster c1) has "
                    "worked for 10m: GPU faults there raise no Xid alert. Usually /dev/kmsg is unreadable "
                    "for the agent's user or container.",
                ),
            ),
        ),
    )
    agent_labels = {"cluster": "c1", "instance": "n1:9400", "job": "babysitter-node"}
    agent_down = Alert(
        name="NodeAgentDown",
        expr=f"up{{{cfg.node_up_selector}}} == 0",
        severity="critical",
        component="node",
        summary=f"Node agent {_l('instance')} is down.",
        description=(
            f"Prometheus has not scraped the node agent at {_l('instance')} (cluster {_l(c)}) for "
            f"{cfg.target_down_for}: the host is down or unreachable, or the agent died. Its GPU alerts "
            f"are silenced meanwhile."
        ),
        for_=cfg.target_down_for,
        test=AlertTest(
            series=(
                (_up_series(agent_labels), "1+0x5 0+0x10"),
                (_up_series(_with(agent_labels, instance="n2:9400")), "1+0x15"),
            ),
            quiet=(("5m", "up"), ("10m", "before for:")),
            fire_at="12m",
            fire_labels=(agent_labels,),
            fire_text=(
                (
                    "Node agent n1:9400 is down.",
                    "Prometheus has not scraped the node agent at n1:9400 (cluster c1) for 5m: the host is "
                    "down or unreachable, or the agent died. Its GPU alerts are silenced meanwhile.",
                ),
            ),
        ),
    )
    rk = cfg.rack_label
    rack_key = by((c, rk))
    # Only series a rack's agent labelled: on a single Prometheus (no racks) a restart that leaves it a
    # few seconds without fresh samples is no rack gone silent (the campaign's fast profile paged it).
    node_up = f'up{{{cfg.node_up_selector}, {rk}!=""}}'
    rack_labels = {"cluster": "c1", rk: "r07", "instance": "n1:9400", "job": "babysitter-node"}
    rack_silent = Alert(
        name="RackMetricsMissing",
        # Remote write sends no staleness marker when the sender dies: the rack's series just stop,
        # so no target-down alert can fire for it. Its hosts' ``up`` series, remembered over the
        # lookback, tell the rack that went silent.
        expr=(
            f"group {rack_key} (max_over_time({node_up}[{cfg.rack_lookback_window}]))\nunless\n"
            f"group {rack_key} (max_over_time({node_up}[{cfg.rack_silent_window}]))"
        ),
        severity="critical",
        component="node",
        summary=f"No metrics arrive from rack {_l(rk)}.",
        description=(
            f"No series of rack {_l(rk)} (cluster {_l(c)}) reached this Prometheus for "
            f"{cfg.rack_silent_window}: the rack's agent Prometheus died, cannot reach the central tier, "
            f"or the whole rack is down. Every alert about its hosts and ranks is blind meanwhile."
        ),
        for_=cfg.rack_silent_for,
        test=AlertTest(
            series=(
                (_up_series(rack_labels), "1+0x10"),
                (_up_series(_with(rack_labels, instance="n2:9400")), "1+0x10"),
                (_up_series(_with(rack_labels, **{rk: "r08"})), "1+0x30"),
                # A host scraped by a single Prometheus (no rack label), silent from 10m: not a rack.
                (_up_series({"cluster": "c1", "instance": "n9:9400", "job": "babysitter-node"}), "1+0x10"),
            ),
            quiet=(
                ("10m", "metrics arrive"),
                ("13m", "silent for less than the window"),
                ("14m", "before for:"),
            ),
            fire_at="16m",
            fire_labels=({"cluster": "c1", rk: "r07"},),
            fire_text=(
                (
                    "No metrics arrive from rack r07.",
                    "No series of rack r07 (cluster c1) reached this Prometheus for 3m: the rack's agent "
                    "Prometheus died, cannot reach the central tier, or the whole rack is down. Every alert "
                    "about its hosts and ranks is blind meanwhile.",
                ),
            ),
        ),
    )
    return [storage_slow, storage_failing, collector_failing, xid_blind, agent_down, rack_silent]


def trainer_fetch_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    """The node agent's own view of the trainers it serves: endpoints it cannot fetch, registrations it
    refuses (docs/security.md), when they keep failing."""
    ns, c, w, f = cfg.node_selector, cfg.cluster_label, cfg.trainer_failing_window, cfg.trainer_failing_for
    errors, skipped = N.TRAINER_SCRAPE_ERRORS, N.TRAINER_REGISTRATIONS_SKIPPED

    def keeps_growing(name: str, counter: str, **text: Any) -> Alert:
        """A warning per host and reason while ``counter`` grew in every ``w`` for ``f`` (a counter
        series appears with its first failure: new_or_increased counts that one too)."""
        expr = f"sum by ({c}, instance, reason) (\n  {new_or_increased(counter, w)}\n)"
        return Alert(name=name, expr=expr, severity="warning", component="node", for_=f, **text)

    fetch = keeps_growing(
        "NodeTrainerFetchFailing",
        select(errors, ns),
        summary=f"Trainer endpoints on {_l('instance')} keep failing: {_l('reason')}.",
        description=(
            f"The node agent on {_l('instance')} (cluster {_l(c)}) failed {_V} fetches of registered trainer "
            f"endpoints with {_l('reason')} in the last {w}, and has kept failing for {f}. Those ranks' "
            f"metrics are missing, so their stall, MFU and goodput alerts are blind; "
            f"{errors.name} names the run and rank."
        ),
        test=AlertTest(
            series=(
                # n1: rank 0 of r1 times out at every scrape from 5m on (its series appears then).
                (_series(errors, _with(_node_labels(), run="r1", rank="0", reason="timeout")), "_x4 1+1x40"),
                # n2: one failed fetch (a trainer that was restarting), never again: no warning.
                (
                    _series(
                        errors,
                        _with(_node_labels(), instance="n2:9400", run="r2", rank="0", reason="connect"),
                    ),
                    "_x4 1+0x40",
                ),
            ),
            quiet=(("5m", "failing, before for:"), ("15m", "before for:")),
            fire_at="25m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400", "reason": "timeout"},),
            fire_text=(
                (
                    "Trainer endpoints on n1:9400 keep failing: timeout.",
                    "The node agent on n1:9400 (cluster c1) failed 10 fetches of registered trainer "
                    "endpoints with timeout in the last 10m, and has kept failing for 15m. Those ranks' "
                    "metrics are missing, so their stall, MFU and goodput alerts are blind; "
                    f"{errors.name} names the run and rank.",
                ),
            ),
        ),
    )
    registration = keeps_growing(
        "NodeTrainerRegistrationSkipped",
        # Each bad file is counted once, so growth means new ones keep coming; dead registrations (a
        # trainer that exited) are the normal churn of jobs ending, not a fault.
        select(skipped, ns, regex("reason", ("dead",), negate=True)),
        summary=f"The node agent on {_l('instance')} keeps refusing trainer registrations: {_l('reason')}.",
        description=(
            f"The node agent on {_l('instance')} (cluster {_l(c)}) refused {_V} new trainer registrations as "
            f"{_l('reason')} in the last {w}, and new ones have kept coming for {f}. Those trainers are not "
            f"served, so their runs look absent to Prometheus; docs/security.md says what each reason means."
        ),
        test=AlertTest(
            series=(
                # n1: a tracker restarted in a loop registers as another user's directory every minute.
                (_series(skipped, _with(_node_labels(), reason="wrong_owner")), "_x4 1+1x40"),
                # n1: trainers ending leave dead registrations: churn, never a warning.
                (_series(skipped, _with(_node_labels(), reason="dead")), "0+1x45"),
                # n2: one malformed file, counted once and logged: no warning.
                (
                    _series(skipped, _with(_node_labels(), instance="n2:9400", reason="malformed")),
                    "_x4 1+0x40",
                ),
            ),
            quiet=(("5m", "refused, before for:"), ("15m", "before for:")),
            fire_at="25m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400", "reason": "wrong_owner"},),
            fire_text=(
                (
                    "The node agent on n1:9400 keeps refusing trainer registrations: wrong_owner.",
                    "The node agent on n1:9400 (cluster c1) refused 10 new trainer registrations as "
                    "wrong_owner in the last 10m, and new ones have kept coming for 15m. Those trainers are "
                    "not served, so their runs look absent to Prometheus; docs/security.md says what each "
                    "reason means.",
                ),
            ),
        ),
    )
    return [fetch, registration]
