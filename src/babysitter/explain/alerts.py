"""The alerts that fired about a run in the window, and the cause each one stands for.

An alert that fired on the run, on one of its GPUs or on one of its hosts is evidence nobody should
have to reconcile by hand: ``explain`` never says "nothing found" for a cause whose alert fired (a
throttle that began late in the window is under the 50%-of-the-window bar yet pages after 45 s).
Read from Prometheus' own ``ALERTS`` series (firing state), so it sees what the loaded rules decided,
at any evaluation, whatever their thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from babysitter.generate.promql import eq, join_matchers
from babysitter.prom import Sample

__all__ = ["ALERT_CAUSES", "FiredAlert", "fired_query", "run_alerts"]

#: Alert name -> the explain cause it is evidence of (the generated alerts; see alerts/).
ALERT_CAUSES: dict[str, str] = {
    "GpuThrottled": "gpu_throttling",
    "GpuXidCritical": "gpu_fault",
    "GpuXidError": "gpu_fault",
    "GpuDown": "gpu_fault",
    "GpuEccUncorrectable": "gpu_fault",
    "GpuRowRemapFailed": "gpu_fault",
    "TrainingProcessExited": "restart",
    "TrainingStalled": "hang",
    "TrainingStragglerRank": "straggler",
    "CheckpointSaveSlow": "checkpoint",
    "CheckpointSaveFailing": "checkpoint",
    "StorageProbeSlow": "storage",
    "TrainingNonFiniteLoss": "loss",
    "TrainingReplicaDiverged": "replica_divergence",
    "CheckpointCorrupt": "checkpoint_corrupt",
    # The fabric's (generate/alerts/fabric.py): a port or PCIe link of a host the run is on.
    "InfinibandPortDown": "fabric",
    "InfinibandLinkDowned": "fabric",
    "FabricPortFlapping": "fabric",
    "InfinibandSymbolErrors": "fabric",
    "InfinibandLinkErrorRecoveryStorm": "fabric",
    "InfinibandLinkIntegrityErrors": "fabric",
    "InfinibandPortSlow": "fabric",
    "PcieLinkDowntrained": "fabric",
    "PcieLinkSlow": "fabric",
    "PcieAerFatal": "fabric",
    "PcieAerNonFatal": "fabric",
}


@dataclass(frozen=True)
class FiredAlert:
    """One alert series that fired in the window: its name, labels and the fraction of the window."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    fraction: float = 0.0

    @property
    def cause(self) -> str:
        """The explain cause this alert is evidence of."""
        return ALERT_CAUSES[self.name]

    def where(self) -> str:
        """The labels that say what it was about (gpu, host, reason...)."""
        keys = ("run", "rank", "instance", "gpu", "device", "port", "pci_address", "reason", "xid", "path")
        return " ".join(f"{k}={self.labels[k]}" for k in keys if k in self.labels)


def _step(seconds: float) -> int:
    return max(1, round(seconds / 60))


def fired_query(seconds: float) -> str:
    """Each firing series of the mapped alerts over ``seconds``: the fraction of the range it fired
    (sampled at 1/60 of the range; ``ALERTS`` exists only while an alert is pending or firing)."""
    names = "|".join(sorted(ALERT_CAUSES))
    selector = join_matchers(eq("alertstate", "firing"), f'alertname=~"{names}"')
    step = _step(seconds)
    return (
        f"clamp_max(count_over_time(ALERTS{{{selector}}}[{max(1, round(seconds))}s:{step}s]) "
        f"* {step} / {max(1, round(seconds))}, 1)"
    )


def run_alerts(
    samples: list[Sample],
    *,
    run: str,
    cluster_label: str,
    cluster: str,
    gpus: dict[str, dict[str, str]],
    hosts: set[str],
) -> list[FiredAlert]:
    """The fired alerts about this run: labelled with the run, or about one of its GPUs (instance and
    gpu index, or uuid, of the rank-to-GPU join), or a host-level alert on one of its hosts."""
    gpu_keys = {(lab.get("instance", ""), lab.get("gpu", "")) for lab in gpus.values()}
    uuids = {lab.get("uuid", "") for lab in gpus.values()} - {""}
    out = []
    for sample in samples:
        lab = sample.labels
        name = lab.get("alertname", "")
        if name not in ALERT_CAUSES or not sample.value > 0:
            continue
        if cluster and lab.get(cluster_label, cluster) != cluster:
            continue
        if "run" in lab:
            mine = lab["run"] == run
        elif "gpu" in lab or "uuid" in lab:
            mine = (lab.get("instance", ""), lab.get("gpu", "")) in gpu_keys or lab.get("uuid", "") in uuids
        else:
            mine = lab.get("instance", "") in hosts
        if mine:
            out.append(FiredAlert(name, dict(lab), float(sample.value)))
    return out
