"""Recording rules of the fabric and the host: a rank joined to its NIC port, the hosts' fabric errors.

A rank names its GPU's ``uuid`` in its info series; the node agent's GPU-to-NIC info series names, per
GPU uuid, its nearest NIC port(s) (``nic_index`` 0.. when several are equally near). The join goes one
``nic_index`` at a time, so that a GPU between two ports and two ranks on one GPU both work (PromQL
joins one side many, the other side one: here the GPU side is one per uuid and index). From the NIC
port, its error counters and flaps, and the PCIe width of the GPU's and the NIC's links, join on the
agent's ``instance``, which serves both the topology and the port series.

Counts are exact, not ``increase()``'s extrapolation: a counter's value now minus its last value
before the window (:func:`increased`). A series born in the window (an agent that just started,
reading counters the driver kept since it loaded) counts nothing: history never pages or scores.
"""

from __future__ import annotations

from typing import Protocol

from babysitter.catalog import fabric as F
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, eq, regex, select, unit_test


class Records(Protocol):
    """The record names these rules make (``babysitter.generate.rules.Records``, which imports this
    module: the names are passed in, not imported)."""

    @property
    def rank_key(self) -> tuple[str, ...]: ...
    @property
    def host_fabric_errors(self) -> str: ...
    @property
    def rank_nic(self) -> str: ...
    @property
    def rank_nic_errors(self) -> str: ...
    @property
    def rank_pcie_width(self) -> str: ...


__all__ = ["MAX_NIC_INDEX", "fabric_recording_tests", "fabric_rules", "increased"]

#: ``nic_index`` values joined (the node agent exports at most 4 equally near ports per GPU).
MAX_NIC_INDEX = 4


def increased(selector: str, window: str, memory: str = "6h") -> str:
    """How much each counter grew in ``window``: its value now minus its last one before the window
    (looked for over ``memory``), where that is more than 0. A series without a value before the
    window (an agent started within it, or back after a gap longer than ``memory``), or reset within
    it (the host rebooted, the driver reloaded), counts from its lowest reading in the window: the
    agent's first reading is its past and never counts, but what grows after it, or after the reset,
    does, at once. (Without that, a link that went down in an agent's first ``window``, as after the
    reboot that follows a fault, paged only once the window had passed: the shipped-profile
    campaign's flapping port paged 3.5 minutes late and its link-down 8.5.)"""
    before = f"last_over_time({selector}[{memory}] offset {window})"
    low = f"{selector} - min_over_time({selector}[{window}])"
    # ``A or B`` keeps B's series only where A has none: the value before the window where there is
    # one, else the lowest reading. One ``before``, not two (``... unless before``): each loads every
    # sample of ``memory``, the rule's main cost (benchmarks/results/fatal_groups.md).
    reset = f"resets({selector}[{window}]) > 0"
    return f"(((({selector} - {before}) or ({low})) > 0) or (({low}) > 0 and {reset}))"


def _port_errors(cfg: GenerateConfig) -> str:
    """Error counters and carrier changes grown in the rate window, per port (0 for quiet ports)."""
    ns, w = cfg.node_selector, cfg.rate_window
    port = by((cfg.cluster_label, "instance", "device", "port"))
    errors = increased(select(F.IB_PORT_ERRORS, ns), w)
    flaps = increased(select(F.IB_PORT_CARRIER_CHANGES, ns), w)
    return f"(sum {port} ({errors} or {flaps})\nor 0 * max {port} ({select(F.IB_PORT_STATE, ns)}))"


def fabric_rules(cfg: GenerateConfig, r: Records) -> list[dict[str, object]]:
    """The ``babysitter-fabric.rules`` group."""
    ns, ts, c, w = cfg.node_selector, cfg.tracker_selector, cfg.cluster_label, cfg.rate_window
    host = by((c, "instance"))
    nic_labels = ("instance", "device", "port", "nic_pci_address", "gpu_pci_address", "link")
    info = select(T.INFO, ts, 'uuid!=""')
    ranks = f"max {by((*r.rank_key, 'uuid'))} ({info})"
    per_index = [
        f"{ranks}\n* on ({c}, uuid) group_left ({', '.join(nic_labels)})\n"
        f"max {by((c, 'uuid', *nic_labels))} ({select(F.GPU_NIC, ns, eq('nic_index', str(i)))})"
        for i in range(MAX_NIC_INDEX)
    ]
    aer = select(F.PCIE_AER_ERRORS, ns, regex("severity", ("nonfatal", "fatal")))
    device = (c, "instance", "pci_address")
    width, most = select(F.PCIE_LINK_WIDTH, ns), select(F.PCIE_LINK_MAX_WIDTH, ns)
    ratio = f"max {by(device)} ({width})\n/ max {by(device)} ({most})"

    def link_of(which: str) -> str:
        relabeled = f'label_replace({r.rank_nic}, "pci_address", "$1", "{which}", "(.+)")'
        return f"{relabeled}\n* on ({', '.join(device)}) group_left ()\n({ratio})"

    hosts = f"{select(F.IB_PORT_STATE, ns)} or {select(F.PCIE_DEVICE_INFO, ns)}"
    return [
        {
            "record": r.host_fabric_errors,
            "expr": (
                f"sum {host} (\n  {increased(select(F.IB_PORT_ERRORS, ns), w)}\n"
                f"  or {increased(select(F.IB_PORT_CARRIER_CHANGES, ns), w)}\n  or {increased(aer, w)}\n)\n"
                f"or 0 * group {host} ({hosts})"
            ),
        },
        {"record": r.rank_nic, "expr": "\nor\n".join(f"(\n{part}\n)" for part in per_index)},
        {
            "record": r.rank_nic_errors,
            "expr": f"{r.rank_nic}\n* on ({c}, instance, device, port) group_left ()\n{_port_errors(cfg)}",
        },
        {
            "record": r.rank_pcie_width,
            "expr": (
                f"min {by((*r.rank_key, 'instance'))} (\n{link_of('gpu_pci_address')}\nor\n"
                f"{link_of('nic_pci_address')}\n)"
            ),
        },
    ]


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{key}="{value}"' for key, value in labels.items())
    return f"{name}{{{inner}}}"


def fabric_recording_tests(cfg: GenerateConfig, r: Records) -> dict[str, object]:
    """promtool ``promql_expr_test`` cases for :func:`fabric_rules` (default config), each computed by hand.

    Two ranks of run r1: rank 0 on GPU-a, whose nearest port mlx5_0 downs twice at minutes 6 and 8; rank
    1 on GPU-b, which sits between two equally near ports (mlx5_1 clean, mlx5_2 flapping: its netdev's
    carrier changed 4 times) and whose own PCIe link trained at x8 of x16. The trainers reach Prometheus
    through another target (``t1:9000``) than the node agent (``h1:9946``): the joins go by uuid, never
    by the trainers' instance. Host h1 also counts one non-fatal AER error at minute 7; host h2 has
    fabric series and no errors (0, not nothing).
    """
    agent = {"cluster": "c1", "instance": "h1:9946", "job": "babysitter-node"}
    trainer = {"cluster": "c1", "instance": "t1:9000", "job": "babysitter-train", "run": "r1"}

    def port(device: str, **extra: str) -> dict[str, str]:
        return {**agent, "device": device, "port": "1", **extra}

    nics = (
        ("GPU-a", "0000:18:00.0", "mlx5_0", "0000:19:00.0", "0"),
        ("GPU-b", "0000:28:00.0", "mlx5_1", "0000:29:00.0", "0"),
        ("GPU-b", "0000:28:00.0", "mlx5_2", "0000:29:00.1", "1"),
    )
    series: list[tuple[str, str]] = [
        (_series(T.INFO.name, {**trainer, "rank": "0", "uuid": "GPU-a"}), "1+0x20"),
        (_series(T.INFO.name, {**trainer, "rank": "1", "uuid": "GPU-b"}), "1+0x20"),
        (_series(T.INFO.name, {**trainer, "rank": "2", "uuid": ""}), "1+0x20"),  # a CPU rank: no NIC
    ]
    for uuid, gpu, device, nic, index in nics:
        labels = {
            **agent,
            "uuid": uuid,
            "pci_bus_id": gpu[:-2],
            "gpu_pci_address": gpu,
            "device": device,
            "port": "1",
            "nic_pci_address": nic,
            "link": "PIX",
            "nic_index": index,
        }
        series.append((_series(F.GPU_NIC.name, labels), "1+0x20"))
        series.append((_series(F.IB_PORT_STATE.name, port(device)), "4+0x20"))
    series += [
        (_series(F.IB_PORT_ERRORS.name, port("mlx5_0", counter="link_downed")), "0+0x5 1+0x1 2+0x13"),
        (_series(F.IB_PORT_ERRORS.name, port("mlx5_0", counter="symbol_error")), "0+0x20"),
        (_series(F.IB_PORT_ERRORS.name, port("mlx5_1", counter="link_downed")), "0+0x20"),
        (_series(F.IB_PORT_CARRIER_CHANGES.name, port("mlx5_2", interface="ibp41s1")), "2+0x5 6+0x15"),
    ]
    for address, kind, width in (
        ("0000:18:00.0", "gpu", "16"),
        ("0000:19:00.0", "nic", "16"),
        ("0000:28:00.0", "gpu", "8"),
        ("0000:29:00.0", "nic", "16"),
        ("0000:29:00.1", "nic", "16"),
    ):
        dev = {**agent, "pci_address": address, "kind": kind}
        series.append((_series(F.PCIE_LINK_WIDTH.name, dev), f"{width}+0x20"))
        series.append((_series(F.PCIE_LINK_MAX_WIDTH.name, dev), "16+0x20"))
        severity = "nonfatal" if address == "0000:19:00.0" else "fatal"
        values = "0+0x6 1+0x14" if severity == "nonfatal" else "0+0x20"
        series.append((_series(F.PCIE_AER_ERRORS.name, {**dev, "severity": severity}), values))
    h2 = {"cluster": "c1", "instance": "h2:9946", "job": "babysitter-node", "device": "mlx5_0", "port": "1"}
    series.append((_series(F.IB_PORT_STATE.name, h2), "4+0x20"))

    def rank_out(record: str, rank: str, **extra: str) -> str:
        return _series(record, {"cluster": "c1", "run": "r1", "rank": rank, **extra})

    def nic_out(rank: str, uuid: str, gpu: str, device: str, nic: str) -> str:
        labels = {
            "uuid": uuid,
            "instance": "h1:9946",
            "device": device,
            "port": "1",
            "nic_pci_address": nic,
            "gpu_pci_address": gpu,
            "link": "PIX",
        }
        return rank_out(r.rank_nic, rank, **labels)

    def errors_out(rank: str, uuid: str, gpu: str, device: str, nic: str) -> str:
        return nic_out(rank, uuid, gpu, device, nic).replace(r.rank_nic, r.rank_nic_errors, 1)

    cases: list[tuple[str, list[tuple[str, float]]]] = [
        (
            r.host_fabric_errors,
            [
                (_series(r.host_fabric_errors, {"cluster": "c1", "instance": "h1:9946"}), 2 + 4 + 1),
                (_series(r.host_fabric_errors, {"cluster": "c1", "instance": "h2:9946"}), 0),
            ],
        ),
        (
            r.rank_nic,
            [
                (nic_out("0", *nics[0][:4]), 1),
                (nic_out("1", *nics[1][:4]), 1),
                (nic_out("1", *nics[2][:4]), 1),
            ],
        ),
        (
            r.rank_nic_errors,
            [
                (errors_out("0", *nics[0][:4]), 2),  # mlx5_0 downed twice in the last 5 minutes
                (errors_out("1", *nics[1][:4]), 0),
                (errors_out("1", *nics[2][:4]), 4),  # mlx5_2's netdev: 4 carrier changes
            ],
        ),
        (
            r.rank_pcie_width,
            [
                (rank_out(r.rank_pcie_width, "0", instance="h1:9946"), 1),
                (rank_out(r.rank_pcie_width, "1", instance="h1:9946"), 0.5),  # GPU-b at x8 of x16
            ],
        ),
    ]
    return {
        "evaluation_interval": "1m",
        "tests": [unit_test(series, cases, interval="1m", eval_time="10m")],
    }
