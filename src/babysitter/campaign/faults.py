"""The faults a campaign plays: what each one is, what it must page, what it must name, what the
remediator should do, how often the field sees it, and how the simulation plays it.

Every kind names the notifications it must cause (:class:`Expect`: the alert, the labels or text that
name the culprit) and whether it interrupts the job (a GPU that falls off the bus kills the process
on it, and a synchronous job with it: the campaign stops the job and starts it again once the fault
is cleared, as a scheduler requeues it). How it is played lives in :mod:`babysitter.campaign.play`;
this module is data, so that the schedule and the score can be tested without a cluster.

Weights (how often a kind is drawn beyond one of each) come from published tables, with the split
inside a row being this module's choice, said next to it:

* hard faults: Llama 3 405B's 419 unexpected interruptions in 54 days on 16,384 H100 (the paper's
  table as datacenterdynamics and the reference notes quote it: faulty GPU 148, GPU HBM3 memory 72,
  software bug 54 (12.9%), network switch/cable 35, GPU SRAM memory 19, GPU system processor 17, NIC 7
  (1.7%), NCCL watchdog timeouts 7 (1.7%), silent data corruption 6 (1.4%));
* slow faults: Greyhound/Falcon (ATC'25): communication fail-slows about 40% of cases (24 min on
  average), compute fail-slows under 2% (10 min).

Kinds without a published share (host memory, slow input pipeline, slow checkpoint storage, the
checkpoint and monitoring faults) are played once per coverage campaign and never drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "GREYHOUND",
    "KINDS",
    "LLAMA3",
    "Expect",
    "Kind",
    "draw_weights",
    "kind",
]


@dataclass(frozen=True)
class Expect:
    """A notification a fault must cause: ``alert`` naming its culprit by ``keys`` (culprit fields
    the alert must carry as labels, with the fault's values) and ``texts`` (culprit fields that must
    appear in its summary, description or culprit annotation, e.g. a step or a rank)."""

    alert: str
    keys: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Kind:
    """One kind of fault (see the module docstring)."""

    name: str
    title: str
    #: gpu, fabric, host, training, checkpoint, monitoring.
    area: str
    #: hard (interrupts or breaks hardware) or slow (the job runs on, slower) or data (the run's own).
    nature: str
    expect: tuple[Expect, ...]
    #: What the remediator should do: "drain+requeue", "drain", "requeue", "annotate" or "none".
    remedy: str
    #: Stop the job at the fault and start it again once it is cleared (the process on the GPU died).
    interrupts: bool = False
    #: The published row it stands for (see the module docstring), "" when it has none.
    source: str = ""
    #: Its weight in draws (a count of the source's interruptions, or a share), 0: never drawn.
    weight: float = 0.0
    #: Why it cannot be played at a profile: {"default": "reason"}.
    not_at: Mapping[str, str] = field(default_factory=dict)
    #: Other alerts about it wherever they point (the monitoring's own, for a monitoring fault).
    related: tuple[str, ...] = ()

    @property
    def alerts(self) -> tuple[str, ...]:
        """The alert names it must cause."""
        return tuple(e.alert for e in self.expect)


_GPU = ("host", "gpu")
_PORT = ("host", "device", "port")

#: Llama 3 405B's unexpected interruptions by component (count, as published).
LLAMA3: dict[str, int] = {
    "faulty GPU": 148,
    "GPU HBM3 memory": 72,
    "software bug": 54,
    "network switch/cable": 35,
    "GPU SRAM memory": 19,
    "GPU system processor": 17,
    "NIC": 7,
    "NCCL watchdog timeout": 7,
    "silent data corruption": 6,
}
#: Greyhound's fail-slows by kind (share of cases, as published: "about 40%", "under 2%").
GREYHOUND: dict[str, float] = {"communication": 0.40, "compute": 0.02}

KINDS: tuple[Kind, ...] = (
    Kind(
        "xid79",
        "Xid 79: GPU fallen off the bus",
        "gpu",
        "hard",
        (Expect("GpuXidCritical", _GPU), Expect("GpuDown", _GPU)),
        "drain+requeue",
        interrupts=True,
        source="llama3:faulty GPU",
        weight=148 / 2,  # half of "faulty GPU": off the bus
    ),
    Kind(
        "nvlink",
        "Xid 74 and NVLink CRC errors",
        "gpu",
        "hard",
        (Expect("GpuXidError", _GPU),),
        "drain+requeue",
        interrupts=True,
        source="llama3:faulty GPU",
        weight=148 / 4,  # a quarter: NVLink (the table counts NVLink failures as faulty GPUs)
    ),
    Kind(
        "aer_fatal",
        "PCIe AER fatal error on a GPU",
        "fabric",
        "hard",
        (Expect("PcieAerFatal", ("host", "pci_address")),),
        "drain+requeue",
        source="llama3:faulty GPU",
        weight=148 / 4,  # a quarter: the PCIe link (an AER storm often precedes Xid 79)
    ),
    Kind(
        "xid48",
        "Xid 48: double-bit ECC error",
        "gpu",
        "hard",
        (Expect("GpuEccUncorrectable", _GPU),),
        "drain+requeue",
        interrupts=True,
        source="llama3:GPU HBM3 memory",
        weight=72 * 2 / 3 + 19,  # two thirds of HBM3, and SRAM's ECC errors
    ),
    Kind(
        "row_remap_failure",
        "row remap failure (Xid 64)",
        "gpu",
        "hard",
        (Expect("GpuRowRemapFailed", _GPU), Expect("GpuXidCritical", _GPU)),
        "drain",
        source="llama3:GPU HBM3 memory",
        weight=72 / 3,
    ),
    Kind(
        "xid119",
        "Xid 119: GSP timeout",
        "gpu",
        "hard",
        (Expect("GpuXidCritical", _GPU),),
        "drain+requeue",
        interrupts=True,
        source="llama3:GPU system processor",
        weight=17,
    ),
    Kind(
        "throttle",
        "HW slowdown throttling",
        "gpu",
        "slow",
        (Expect("GpuThrottled", _GPU),),
        "annotate",
        source="greyhound:compute",
        weight=0.01,  # half of compute's share; the straggler rank the other half
    ),
    Kind(
        "pcie_downtrained",
        "NIC PCIe link downtrained to x8",
        "fabric",
        "slow",
        (Expect("PcieLinkDowntrained", ("host", "pci_address")),),
        "none",
        source="llama3:NIC",
        weight=7,
    ),
    Kind(
        "ib_flapping",
        "InfiniBand port flapping",
        "fabric",
        "hard",
        # A flap downs the link: InfinibandLinkDowned is the port's one page (it holds back the rest).
        (Expect("FabricPortFlapping", _PORT), Expect("InfinibandLinkDowned", _PORT)),
        "drain+requeue",
        source="llama3:network switch/cable",
        weight=35 / 2,
    ),
    Kind(
        "ib_down",
        "InfiniBand port down",
        "fabric",
        "hard",
        (Expect("InfinibandPortDown", _PORT), Expect("InfinibandLinkDowned", _PORT)),
        "drain+requeue",
        interrupts=True,
        source="llama3:network switch/cable",
        weight=35 / 2,
    ),
    Kind(
        "symbol_errors",
        "InfiniBand symbol errors",
        "fabric",
        "slow",
        (Expect("InfinibandSymbolErrors", _PORT),),
        "none",
        source="greyhound:communication",
        weight=0.40,
    ),
    Kind(
        "edac_ue",
        "host memory uncorrectable error (EDAC)",
        "host",
        "hard",
        (Expect("HostMemoryUncorrectableError", ("host", "controller")),),
        "drain+requeue",
    ),
    Kind(
        "straggler",
        "straggler rank (1.5x compute)",
        "training",
        "slow",
        (Expect("TrainingStragglerRank", ("rank",)),),
        "none",
        source="greyhound:compute",
        weight=0.01,
    ),
    Kind(
        "hang",
        "stopped rank (hang)",
        "training",
        "hard",
        (Expect("TrainingStalled", (), ("rank", "host")),),
        "drain+requeue",
        source="llama3:NCCL watchdog timeout",
        weight=7,
    ),
    Kind(
        "crash",
        "rank killed (SIGKILL)",
        "training",
        "hard",
        (Expect("TrainingProcessExited", ("host",)),),
        "requeue",
        interrupts=True,
        source="llama3:software bug",
        weight=54,
    ),
    Kind(
        "slow_input",
        "slow input pipeline",
        "training",
        "slow",
        (Expect("TrainingMfuDrop", (), ("data",)),),
        "none",
        not_at={
            "default": "TrainingMfuDrop needs 30 min of lower MFU against a 6 h baseline at shipped settings"
        },
    ),
    Kind(
        "slow_storage",
        "slow checkpoint storage",
        "checkpoint",
        "slow",
        (Expect("CheckpointSaveSlow"),),
        "none",
        not_at={"default": "the shipped threshold is a 10-minute mean save; a CPU job saves in milliseconds"},
    ),
    Kind(
        "ckpt_deleted",
        "newest checkpoint deleted",
        "checkpoint",
        "data",
        (Expect("CheckpointMissing", (), ("step",)),),
        "none",
    ),
    Kind(
        "ckpt_corrupt",
        "newest checkpoint's bytes flipped",
        "checkpoint",
        "data",
        (Expect("CheckpointCorrupt", ("file",)),),
        "none",
        not_at={
            "default": "a checkpoint the sentinel verified is read again every 6 h (--checkpoint-reverify-"
            "interval): rot after its first sweep is found within that, not within a campaign's minutes"
        },
    ),
    Kind(
        "nan",
        "NaN loss on one rank",
        "training",
        "data",
        (Expect("TrainingNonFiniteLoss", (), ("rank",)),),
        "none",
        source="llama3:silent data corruption",
        weight=3,
    ),
    Kind(
        "diverged",
        "diverged replica (a flipped bit)",
        "training",
        "data",
        (Expect("TrainingReplicaDiverged", ("rank", "host")),),
        "none",
        source="llama3:silent data corruption",
        weight=3,
    ),
    Kind(
        "agent_killed",
        "node agent killed",
        "monitoring",
        "hard",
        (Expect("NodeAgentDown", ("host",)),),
        "none",
    ),
    Kind(
        "alertmanager_down",
        "Alertmanager unreachable",
        "monitoring",
        "hard",
        (Expect("DeadMansSwitch"),),
        "none",
        related=("AlertDeliveryFailing",),
    ),
    Kind(
        "prometheus_down",
        "Prometheus down, then restarted",
        "monitoring",
        "hard",
        (Expect("DeadMansSwitch"),),
        "none",
    ),
)

_BY_NAME = {k.name: k for k in KINDS}


def kind(name: str) -> Kind:
    """The kind called ``name``; KeyError listing the known ones."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown fault {name!r}; known: {', '.join(_BY_NAME)}") from None


def draw_weights(table: str) -> dict[str, float]:
    """Kinds standing for a row of ``table`` ("llama3" or "greyhound") by weight, normalised to sum 1."""
    if table not in ("llama3", "greyhound"):
        raise ValueError(f"table is llama3 or greyhound, got {table!r}")
    found = {k.name: k.weight for k in KINDS if k.weight > 0 and k.source.startswith(f"{table}:")}
    total = sum(found.values())
    return {name: weight / total for name, weight in found.items()}
