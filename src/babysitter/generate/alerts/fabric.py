"""Fabric alerts: InfiniBand/RoCE ports that go down, flap, fail their bit-error budget or run slow, and
PCIe links that trained below their width or speed or report uncorrectable AER errors.

Every alert names its host (``instance``) and the device and port, or the PCI address. Thresholds are
NVIDIA NVSentinel's NIC monitor's, which cite the IBTA spec (docs/fabric.md): link_downed growing at
all is fatal, three in ten minutes a flap, symbol errors above 120 per hour (a 1e-12 bit error rate)
a failing link, link error recovery above 5 per minute degradation, local link integrity or buffer
overrun errors growing fatal.
"""

from __future__ import annotations

from babysitter.catalog import fabric as F
from babysitter.catalog import node as N
from babysitter.generate.alerts._common import _V, Alert, AlertTest, _l, _node_labels, _series
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, eq, regex, select
from babysitter.generate.rules import Records
from babysitter.generate.rules_fabric import increased

__all__ = ["fabric_alerts", "fabric_fatal_alerts"]

_ACTIVE = 4  # IBTA PortState Active (5, Active-defer, is up too)


def _port(**extra: str) -> dict[str, str]:
    return {**_node_labels(), "device": "mlx5_3", "port": "1", **extra}


def _port_labels(**extra: str) -> dict[str, str]:
    return {"cluster": "c1", "instance": "n1:9400", "device": "mlx5_3", "port": "1", **extra}


def _pci(address: str = "0000:49:00.0", kind: str = "nic", **extra: str) -> dict[str, str]:
    return {**_node_labels(), "pci_address": address, "kind": kind, **extra}


def fabric_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ns, c = cfg.node_selector, cfg.cluster_label
    port_key = (c, "instance", "device", "port")
    port = by(port_key)
    where = f"{_l('device')} port {_l('port')} on {_l('instance')} (cluster {_l(c)})"
    state = select(F.IB_PORT_STATE, ns)
    errors = F.IB_PORT_ERRORS

    def counter(name: str) -> str:
        return select(errors, ns, eq("counter", name))

    down = Alert(
        name="InfinibandPortDown",
        expr=(
            f"max {port} ({state}) < {_ACTIVE}\nand on ({', '.join(port_key)})\n"
            f"max {port} (max_over_time({state}[{cfg.fabric_port_memory}])) >= {_ACTIVE}"
        ),
        severity="critical",
        component="fabric",
        summary=f"Fabric port {_l('device')}/{_l('port')} on {_l('instance')} is down.",
        description=(
            f"{where} has been in state {_V} (IBTA: 1 Down, 2 Init, 3 Armed; 4 is Active) for "
            f"{cfg.fabric_port_down_for}, after being Active within {cfg.fabric_port_memory}. A port down "
            f"longer than the transport timeout (about 7 s) has torn the NCCL connections through it: the "
            f"ranks on the GPUs nearest to it ({F.GPU_NIC.name}) are stuck or dead. Check the cable, "
            f"the switch port and the subnet manager."
        ),
        for_=cfg.fabric_port_down_for,
        test=AlertTest(
            series=(
                (_series(F.IB_PORT_STATE, _port()), "4+0x5 1+0x10"),
                (_series(F.IB_PORT_STATE, _port(device="mlx5_0")), "4+0x15"),
                # mlx5_7 was never cabled: down from the start, never pages.
                (_series(F.IB_PORT_STATE, _port(device="mlx5_7")), "1+0x15"),
            ),
            quiet=(("5m", "active"), ("6m", "before for:")),
            fire_at="8m",
            fire_labels=(_port_labels(),),
            fire_text=(
                (
                    "Fabric port mlx5_3/1 on n1:9400 is down.",
                    "mlx5_3 port 1 on n1:9400 (cluster c1) has been in state 1 (IBTA: 1 Down, 2 Init, 3 "
                    "Armed; 4 is Active) for 1m, after being Active within 24h. A port down longer than "
                    "the transport timeout (about 7 s) has torn the NCCL connections through it: the ranks "
                    f"on the GPUs nearest to it ({F.GPU_NIC.name}) are stuck or dead. Check the cable, "
                    "the switch port and the subnet manager.",
                ),
            ),
        ),
    )
    lw = cfg.fabric_link_downed_window
    downed = Alert(
        name="InfinibandLinkDowned",
        expr=f"sum {port} (\n  {increased(counter('link_downed'), lw)}\n)",
        severity="critical",
        component="fabric",
        summary=f"Fabric link {_l('device')}/{_l('port')} on {_l('instance')} went down {_V} times.",
        description=(
            f"The link of {where} went down {_V} times in the last {lw} (link_downed grew). Each one breaks "
            f"the NCCL connections through the port for as long as it lasts; NVIDIA's NIC monitor treats any "
            f"growth as fatal. Drain the host and check the cable and the switch port."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                # Downed twice before the agent first read it (history: never pages), once more at 21m.
                (_series(errors, _port(counter="link_downed")), "2+0x20 3+0x30"),
                (_series(errors, _port(device="mlx5_0", counter="link_downed")), "5+0x50"),
                (_series(errors, _port(counter="symbol_error")), "0+10x50"),
                # An agent first read mlx5_7 at 19m (4: history), which went down at 22m: that pages at
                # once, not after the port's series is older than the window.
                (_series(errors, _port(device="mlx5_7", counter="link_downed")), "_x19 4+0x2 5+0x30"),
                # mlx5_5's host rebooted at 16m (its counters back to 0), and the link went down at 21m.
                (_series(errors, _port(device="mlx5_5", counter="link_downed")), "7+0x15 0+0x4 1+0x30"),
            ),
            quiet=(
                ("10m", "the agent's first reading: history"),
                ("20m", "no growth"),
                ("37m", f"the down left the {lw} window"),
            ),
            fire_at="23m",
            fire_labels=(_port_labels(), _port_labels(device="mlx5_5"), _port_labels(device="mlx5_7")),
            fire_text=tuple(
                (
                    f"Fabric link {device}/1 on n1:9400 went down 1 times.",
                    f"The link of {device} port 1 on n1:9400 (cluster c1) went down 1 times in the last 15m "
                    "(link_downed grew). Each one breaks the NCCL connections through the port for as long "
                    "as it lasts; NVIDIA's NIC monitor treats any growth as fatal. Drain the host and "
                    "check the cable and the switch port.",
                )
                for device in ("mlx5_3", "mlx5_5", "mlx5_7")
            ),
        ),
    )
    fw, flaps = cfg.fabric_flap_window, cfg.fabric_flap_count
    carrier = select(F.IB_PORT_CARRIER_CHANGES, ns)
    flapping = Alert(
        name="FabricPortFlapping",
        expr=(
            f"sum {port} ({increased(counter('link_downed'), fw)}) >= {flaps}\nor\n"
            f"sum {port} ({increased(carrier, fw)}) / 2 >= {flaps}"
        ),
        severity="critical",
        component="fabric",
        summary=f"Fabric port {_l('device')}/{_l('port')} on {_l('instance')} flaps.",
        description=(
            f"{where} went down and up {_V} times in the last {fw} (link_downed, or half its netdev's "
            f"carrier changes for RoCE), {flaps} or more is a flapping link: a bad cable or transceiver. "
            "Jobs through it hang or crash at every flap; drain the host and replace the cable."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                # mlx5_3 (InfiniBand) downs at minutes 16, 17 and 18; mlx5_5 (RoCE) flaps at 16 and 17.
                (_series(errors, _port(counter="link_downed")), "0+0x15 1+1x2 3+0x20"),
                (
                    _series(F.IB_PORT_CARRIER_CHANGES, _port(device="mlx5_5", interface="ens5np0")),
                    "2+0x15 4+2x1 6+0x20",
                ),
                # mlx5_4's RoCE netdev: 3 flaps (6 carrier changes) at minutes 16 to 18.
                (
                    _series(F.IB_PORT_CARRIER_CHANGES, _port(device="mlx5_4", interface="ens4np0")),
                    "2+0x15 4+2x2 8+0x20",
                ),
            ),
            quiet=(("15m", "no flap yet"), ("17m", "two downs so far")),
            fire_at="19m",
            fire_labels=(_port_labels(), _port_labels(device="mlx5_4")),
            fire_text=tuple(
                (
                    f"Fabric port {device}/1 on n1:9400 flaps.",
                    f"{device} port 1 on n1:9400 (cluster c1) went down and up 3 times in the last 10m "
                    "(link_downed, or half its netdev's carrier changes for RoCE), 3 or more is a flapping "
                    "link: a bad cable or transceiver. Jobs through it hang or crash at every flap; drain "
                    "the host and replace the cable.",
                )
                for device in ("mlx5_3", "mlx5_4")
            ),
        ),
    )
    per_hour = cfg.fabric_symbol_errors_per_hour
    symbols = Alert(
        name="InfinibandSymbolErrors",
        expr=f"sum {port} (increase({counter('symbol_error')}[1h])) > {per_hour:g}",
        severity="warning",
        component="fabric",
        summary=f"Fabric link {_l('device')}/{_l('port')} on {_l('instance')} exceeds its bit-error budget.",
        description=(
            f"{where} counted {_V} symbol errors in the last hour, above the {per_hour:g} per hour of the "
            f"IBTA bit-error budget (1e-12): the link is failing. Forward error correction still hides it; "
            f"plan to replace the cable or transceiver before it downs."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                # One a minute for an hour, then three a minute: 178 in the hour to 120m.
                (_series(errors, _port(counter="symbol_error")), "0+1x60 61+3x60"),
                (_series(errors, _port(device="mlx5_0", counter="symbol_error")), "0+1x120"),
            ),
            quiet=(("60m", "60 an hour"), ("80m", "rising, 98 in the last hour")),
            fire_at="120m",
            evaluation_interval="5m",
            fire_labels=(_port_labels(),),
            fire_text=(
                (
                    "Fabric link mlx5_3/1 on n1:9400 exceeds its bit-error budget.",
                    "mlx5_3 port 1 on n1:9400 (cluster c1) counted 178 symbol errors in the last hour, "
                    "above the 120 per hour of the IBTA bit-error budget (1e-12): the link is failing. "
                    "Forward error correction still hides it; plan to replace the cable or transceiver "
                    "before it downs.",
                ),
            ),
        ),
    )
    rw, per_minute = cfg.fabric_recovery_window, cfg.fabric_recoveries_per_minute
    recovery = Alert(
        name="InfinibandLinkErrorRecoveryStorm",
        expr=f"sum {port} (rate({counter('link_error_recovery')}[{rw}])) * 60 > {per_minute:g}",
        severity="warning",
        component="fabric",
        summary=f"Fabric link {_l('device')}/{_l('port')} on {_l('instance')} keeps retraining.",
        description=(
            f"{where} ran link error recovery {_V} times a minute over the last {rw} (above "
            f"{per_minute:g}): each retrain stalls the port's traffic. A degrading link; it usually downs "
            "next."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(errors, _port(counter="link_error_recovery")), "0+2x10 20+10x10"),
                (_series(errors, _port(device="mlx5_0", counter="link_error_recovery")), "0+1x20"),
            ),
            quiet=(("10m", "2 a minute"),),
            fire_at="18m",
            fire_labels=(_port_labels(),),
            fire_text=(
                (
                    "Fabric link mlx5_3/1 on n1:9400 keeps retraining.",
                    "mlx5_3 port 1 on n1:9400 (cluster c1) ran link error recovery 10 times a minute over "
                    "the last 5m (above 5): each retrain stalls the port's traffic. A degrading link; it "
                    "usually downs next.",
                ),
            ),
        ),
    )
    fatal_counters = regex("counter", ("local_link_integrity_errors", "excessive_buffer_overrun_errors"))
    integrity = Alert(
        name="InfinibandLinkIntegrityErrors",
        expr=f"sum {by((*port_key, 'counter'))} (\n  {increased(select(errors, ns, fatal_counters), lw)}\n)",
        severity="critical",
        component="fabric",
        summary=f"Fabric link {_l('device')}/{_l('port')} on {_l('instance')}: {_l('counter')}.",
        description=(
            f"{where} counted {_V} {_l('counter')} in the last {lw}: the physical link is losing its "
            "integrity (local_link_integrity_errors) or the port overran its receive buffers "
            "(excessive_buffer_overrun_errors). NVIDIA's NIC monitor treats either as fatal: drain the "
            "host."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(errors, _port(counter="local_link_integrity_errors")), "0+0x20 2+0x20"),
                (_series(errors, _port(counter="excessive_buffer_overrun_errors")), "0+0x40"),
            ),
            quiet=(("20m", "none"),),
            fire_at="22m",
            fire_labels=(_port_labels(counter="local_link_integrity_errors"),),
            fire_text=(
                (
                    "Fabric link mlx5_3/1 on n1:9400: local_link_integrity_errors.",
                    "mlx5_3 port 1 on n1:9400 (cluster c1) counted 2 local_link_integrity_errors in the "
                    "last 15m: the physical link is losing its integrity (local_link_integrity_errors) or "
                    "the port overran its receive buffers (excessive_buffer_overrun_errors). NVIDIA's NIC "
                    "monitor treats either as fatal: drain the host.",
                ),
            ),
        ),
    )
    rate = select(F.IB_PORT_RATE, ns)
    layered = (
        f"max {port} ({rate})\n* on ({', '.join(port_key)}) group_left (link_layer)\n"
        f"max {by((*port_key, 'link_layer'))} ({select(F.IB_PORT_INFO, ns)})\n"
        f"and on ({', '.join(port_key)}) max {port} ({state}) >= {_ACTIVE}"
    )
    expected = cfg.fabric_expected_rate_gbps
    slower = (
        f"(\n{layered}\n)\n< on ({c}, instance, link_layer) group_left ()\n"
        f"max by ({c}, instance, link_layer) (\n{layered}\n)"
    )
    if expected > 0:
        slower += f"\nor\n(\n{layered}\n) < {expected * 1e9 / 8:g}"
    expect_text = f" or below the expected {expected:g} Gb/s" if expected > 0 else ""
    slow = Alert(
        name="InfinibandPortSlow",
        expr=slower,
        severity="warning",
        component="fabric",
        summary=f"Fabric port {_l('device')}/{_l('port')} on {_l('instance')} runs slower than it should.",
        description=(
            f"{where} trained at {{{{ $value | humanize }}}}B/s, slower than the fastest active "
            f"{_l('link_layer')} port of the host{expect_text}, for {cfg.fabric_slow_for}. Collectives "
            "through it run at its pace; reseat or replace the cable, or check the switch port's speed."
        ),
        for_=cfg.fabric_slow_for,
        test=AlertTest(
            series=(
                (_series(F.IB_PORT_RATE, _port()), "5e10+0x5 2.5e10+0x20"),
                (_series(F.IB_PORT_RATE, _port(device="mlx5_0")), "5e10+0x25"),
                (_series(F.IB_PORT_STATE, _port()), "4+0x25"),
                (_series(F.IB_PORT_STATE, _port(device="mlx5_0")), "4+0x25"),
                # A 200G Ethernet port is not a peer of the 400G InfiniBand ones.
                (_series(F.IB_PORT_RATE, _port(device="mlx5_8")), "2.5e10+0x25"),
                (_series(F.IB_PORT_STATE, _port(device="mlx5_8")), "4+0x25"),
                *(
                    (
                        _series(
                            F.IB_PORT_INFO,
                            _port(
                                device=device, link_layer=layer, pci_address="", interface="", fw_version=""
                            ),
                        ),
                        "1+0x25",
                    )
                    for device, layer in (
                        ("mlx5_3", "InfiniBand"),
                        ("mlx5_0", "InfiniBand"),
                        ("mlx5_8", "Ethernet"),
                    )
                ),
            ),
            quiet=(("5m", "at full rate"), ("12m", "before for:")),
            fire_at="20m",
            fire_labels=(_port_labels(link_layer="InfiniBand"),),
            fire_text=(
                (
                    "Fabric port mlx5_3/1 on n1:9400 runs slower than it should.",
                    "mlx5_3 port 1 on n1:9400 (cluster c1) trained at 25GB/s, slower than the fastest active "
                    "InfiniBand port of the host, for 10m. Collectives through it run at its pace; reseat or "
                    "replace the cable, or check the switch port's speed.",
                ),
            ),
        ),
    )
    device_key = (c, "instance", "pci_address", "kind")
    device = by(device_key)
    pci_where = f"{_l('kind')} {_l('pci_address')} on {_l('instance')} (cluster {_l(c)})"
    width = Alert(
        name="PcieLinkDowntrained",
        expr=(
            f"max {device} ({select(F.PCIE_LINK_WIDTH, ns)})\n< on ({', '.join(device_key)})\n"
            f"max {device} ({select(F.PCIE_LINK_MAX_WIDTH, ns)})"
        ),
        severity="warning",
        component="fabric",
        summary=f"PCIe link of {_l('kind')} {_l('pci_address')} on {_l('instance')} runs at x{_V}.",
        description=(
            f"The PCIe link of {pci_where} trained at x{_V}, below the width both of its ends can do "
            f"({F.PCIE_LINK_MAX_WIDTH.name}), for {cfg.pcie_degraded_for}. Width does not drop to save "
            "power: the link retrained after errors or a connector is bad. Everything through it is slower "
            "(a NIC's RDMA traffic, a GPU's host transfers) and every health check still passes; reseat at "
            "the next maintenance."
        ),
        for_=cfg.pcie_degraded_for,
        test=AlertTest(
            series=(
                (_series(F.PCIE_LINK_WIDTH, _pci()), "16+0x5 8+0x20"),
                (_series(F.PCIE_LINK_MAX_WIDTH, _pci()), "16+0x25"),
                # A x16 card in a x8 slot: its maximum is the slot's, it is at its best.
                (_series(F.PCIE_LINK_WIDTH, _pci("0000:18:00.0", "gpu")), "8+0x25"),
                (_series(F.PCIE_LINK_MAX_WIDTH, _pci("0000:18:00.0", "gpu")), "8+0x25"),
            ),
            quiet=(("5m", "at full width"), ("12m", "before for:")),
            fire_at="20m",
            fire_labels=(
                {"cluster": "c1", "instance": "n1:9400", "pci_address": "0000:49:00.0", "kind": "nic"},
            ),
            fire_text=(
                (
                    "PCIe link of nic 0000:49:00.0 on n1:9400 runs at x8.",
                    "The PCIe link of nic 0000:49:00.0 on n1:9400 (cluster c1) trained at x8, below the "
                    f"width both of its ends can do ({F.PCIE_LINK_MAX_WIDTH.name}), for 10m. Width does not "
                    "drop to save power: the link retrained after errors or a connector is bad. Everything "
                    "through it is slower (a NIC's RDMA traffic, a GPU's host transfers) and every health "
                    "check still passes; reseat at the next maintenance.",
                ),
            ),
        ),
    )
    busy = cfg.pcie_busy_utilization
    gpu_busy = (
        f"label_replace(max by ({c}, instance, pci_bus_id) ({select(N.GPU_UTILIZATION, ns)}) > {busy:g}, "
        f'"pci_address", "$1.0", "pci_bus_id", "(.+)")'
    )
    nics = f"max by ({c}, instance, pci_address) ({select(F.PCIE_DEVICE_INFO, ns, eq('kind', 'nic'))})"
    speed = Alert(
        name="PcieLinkSlow",
        expr=(
            f"max {device} ({select(F.PCIE_LINK_SPEED, ns)})\n< on ({', '.join(device_key)})\n"
            f"max {device} ({select(F.PCIE_LINK_MAX_SPEED, ns)})\n"
            f"and on ({c}, instance, pci_address)\n(\n  {gpu_busy}\n  or {nics}\n)"
        ),
        severity="warning",
        component="fabric",
        summary=f"PCIe link of {_l('kind')} {_l('pci_address')} on {_l('instance')} runs below its speed.",
        description=(
            f"The PCIe link of {pci_where} ran at {{{{ $value | humanize }}}}T/s, below the speed both of "
            f"its ends can do, for {cfg.pcie_degraded_for}, while busy: a GPU above {busy:.0%} utilization "
            "(an idle GPU lowers its link speed on purpose), or a NIC (which does not). The link retrained "
            "after errors; reseat at the next maintenance."
        ),
        for_=cfg.pcie_degraded_for,
        test=AlertTest(
            series=(
                # GPU 0000:18:00.0 idles at 2.5 GT/s (fine), then works at 2.5 GT/s from minute 10.
                (_series(F.PCIE_LINK_SPEED, _pci("0000:18:00.0", "gpu")), "2.5e9+0x30"),
                (_series(F.PCIE_LINK_MAX_SPEED, _pci("0000:18:00.0", "gpu")), "3.2e10+0x30"),
                (
                    _series(
                        N.GPU_UTILIZATION,
                        {
                            **_node_labels(),
                            "gpu": "0",
                            "uuid": "GPU-a",
                            "pci_bus_id": "0000:18:00",
                            "model": "H100",
                        },
                    ),
                    "0+0x10 0.9+0x20",
                ),
                # The NIC runs at full speed throughout.
                (_series(F.PCIE_LINK_SPEED, _pci()), "3.2e10+0x30"),
                (_series(F.PCIE_LINK_MAX_SPEED, _pci()), "3.2e10+0x30"),
                (
                    _series(
                        F.PCIE_DEVICE_INFO,
                        _pci(vendor_id="", device_id="", driver="", numa_node="0", upstream=""),
                    ),
                    "1+0x30",
                ),
                # The NIC 0000:59:00.0 drops to 16 GT/s at minute 12: a NIC counts whatever its load.
                (_series(F.PCIE_LINK_SPEED, _pci("0000:59:00.0")), "3.2e10+0x11 1.6e10+0x18"),
                (_series(F.PCIE_LINK_MAX_SPEED, _pci("0000:59:00.0")), "3.2e10+0x30"),
                (
                    _series(
                        F.PCIE_DEVICE_INFO,
                        _pci(
                            "0000:59:00.0", vendor_id="", device_id="", driver="", numa_node="0", upstream=""
                        ),
                    ),
                    "1+0x30",
                ),
            ),
            quiet=(("9m", "an idle GPU at low speed"), ("15m", "busy, before for:")),
            fire_at="25m",
            fire_labels=(
                {"cluster": "c1", "instance": "n1:9400", "pci_address": "0000:18:00.0", "kind": "gpu"},
                {"cluster": "c1", "instance": "n1:9400", "pci_address": "0000:59:00.0", "kind": "nic"},
            ),
            fire_text=tuple(
                (
                    f"PCIe link of {kind} {address} on n1:9400 runs below its speed.",
                    f"The PCIe link of {kind} {address} on n1:9400 (cluster c1) ran at {speed}, below the "
                    "speed both of its ends can do, for 10m, while busy: a GPU above 50% utilization (an "
                    "idle GPU lowers its link speed on purpose), or a NIC (which does not). The link "
                    "retrained after errors; reseat at the next maintenance.",
                )
                for kind, address, speed in (
                    ("gpu", "0000:18:00.0", "2.5GT/s"),
                    ("nic", "0000:59:00.0", "16GT/s"),
                )
            ),
        ),
    )
    nonfatal = _aer_alert(
        cfg,
        "PcieAerNonFatal",
        severity_label="nonfatal",
        severity="warning",
        text="Non-fatal",
        why=(
            "A transaction was lost and the driver recovered it; repeats precede fatal errors. "
            "Watch the rate."
        ),
    )
    return [down, downed, flapping, symbols, recovery, integrity, slow, width, speed, nonfatal]


def fabric_fatal_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    """A fatal AER error: the link was reset, the GPU or NIC behind it is lost or about to be. In the
    hard GPU faults' fast group (``fatal_eval_interval``), so that it pages within 30 s as they do."""
    fatal = _aer_alert(
        cfg,
        "PcieAerFatal",
        severity_label="fatal",
        severity="critical",
        text="Fatal",
        why="The link was reset; a GPU behind it often falls off the bus next (Xid 79). Drain the host.",
    )
    return [fatal]


def _aer_alert(
    cfg: GenerateConfig, name: str, *, severity_label: str, severity: str, text: str, why: str
) -> Alert:
    """An alert on the uncorrectable AER errors of one severity newly counted on a PCIe link."""
    ns, c = cfg.node_selector, cfg.cluster_label
    device = by((c, "instance", "pci_address", "kind"))
    pci_where = f"{_l('kind')} {_l('pci_address')} on {_l('instance')} (cluster {_l(c)})"
    aw = cfg.pcie_aer_window
    aer = F.PCIE_AER_ERRORS
    return Alert(
        name=name,
        expr=f"sum {device} (\n  {increased(select(aer, ns, eq('severity', severity_label)), aw)}\n)",
        severity=severity,
        component="fabric",
        summary=f"{text} PCIe errors on {_l('kind')} {_l('pci_address')} of {_l('instance')}.",
        description=(
            f"The PCIe link of {pci_where} reported {_V} {severity_label} uncorrectable AER errors in "
            f"the last {aw} (the device's own and its upstream port's). {why}"
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(aer, _pci(severity=severity_label)), "0+0x20 1+0x30"),
                (_series(aer, _pci(severity="correctable")), "0+5x50"),
                (_series(aer, _pci("0000:18:00.0", "gpu", severity=severity_label)), "3+0x50"),
            ),
            quiet=(("20m", "none new; the GPU's 3 are history"), ("37m", f"left the {aw} window")),
            fire_at="22m",
            fire_labels=(
                {"cluster": "c1", "instance": "n1:9400", "pci_address": "0000:49:00.0", "kind": "nic"},
            ),
            fire_text=(
                (
                    f"{text} PCIe errors on nic 0000:49:00.0 of n1:9400.",
                    "The PCIe link of nic 0000:49:00.0 on n1:9400 (cluster c1) reported 1 "
                    f"{severity_label} uncorrectable AER errors in the last 15m (the device's own and "
                    f"its upstream port's). {why}",
                ),
            ),
        ),
    )
