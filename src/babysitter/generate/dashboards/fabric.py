"""The fabric and host panels: a row of node health (ports, PCIe links, AER, host memory, CPU thermal,
kernel-log trouble) and a row of the run overview (the run's hosts' fabric errors, ranks on a sick link)."""

from __future__ import annotations

from babysitter.catalog import fabric as F
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig
from babysitter.generate.dashboards._builder import Panel, Row, Target
from babysitter.generate.dashboards._common import host_matchers, rec, run_filter, run_matchers
from babysitter.generate.promql import eq, new_or_increased, regex, select
from babysitter.generate.rules import Records

__all__ = ["node_health_fabric", "node_health_tiles", "run_overview_fabric"]

_ACTIVE = 4


def node_health_tiles(cfg: GenerateConfig) -> list[Panel]:
    """Overview tiles: ports not active, links below their width, uncorrectable memory errors in range."""
    h = host_matchers(cfg)
    state = select(F.IB_PORT_STATE, h)
    width, most = select(F.PCIE_LINK_WIDTH, h), select(F.PCIE_LINK_MAX_WIDTH, h)
    ue = select(F.EDAC_UNCORRECTABLE, h)

    def alarm(title: str, expr: str) -> Panel:
        return Panel(title, (Target(expr),), kind="stat", width=4, height=5, red_above=0.5)

    return [
        alarm("Fabric ports not active", f"count({state} < {_ACTIVE}) or vector(0)"),
        alarm("PCIe links below their width", f"count({width} < {most}) or vector(0)"),
        alarm("Host memory UE in range", f"sum {new_or_increased(ue, '$__range')} or vector(0)"),
    ]


def node_health_fabric(cfg: GenerateConfig) -> list[Panel | Row]:
    """The "Fabric, PCIe and host" row of node health."""
    h, ri = host_matchers(cfg), "$__rate_interval"
    port = "{{instance}} {{device}}/{{port}}"
    device = "{{instance}} {{kind}} {{pci_address}}"
    ignored = regex("pattern", cfg.kernel_trouble_ignore)
    return [
        Row("Fabric, PCIe and host"),
        Panel(
            "Port state",
            (
                Target(select(F.IB_PORT_STATE, h), port),
                Target(select(F.IB_PORT_PHYS_STATE, h), port + " physical"),
            ),
            min=0,
            max=7,
            width=8,
            description="IBTA logical state of each InfiniBand/RoCE port: 4 is Active; 1 Down, 2 Init, "
            "3 Armed; and its physical state (5 LinkUp; 2 Polling: no light from the other end, 3 "
            "Disabled). InfinibandPortDown pages when a port that was Active stays below for "
            f"{cfg.fabric_port_down_for}.",
        ),
        Panel(
            "Port error counters",
            (
                Target(
                    f"sum by (instance, device, port, counter) "
                    f"({new_or_increased(select(F.IB_PORT_ERRORS, h), ri)})",
                    port + " {{counter}}",
                ),
            ),
            bars=True,
            min=0,
            width=8,
            description="Growth of each error counter of counters/ (symbol errors, link downed and error "
            "recovery, receive errors, discards, link integrity, buffer overruns). Thresholds: link_downed "
            f"growing pages; symbol errors above {cfg.fabric_symbol_errors_per_hour:g}/h and link error "
            f"recovery above {cfg.fabric_recoveries_per_minute:g}/min warn.",
        ),
        Panel(
            "Flaps: link downed and carrier changes",
            (
                Target(
                    f"sum by (instance, device, port) "
                    f"({new_or_increased(select(F.IB_PORT_ERRORS, h, eq('counter', 'link_downed')), ri)})",
                    port + " link downed",
                ),
                Target(
                    f"sum by (instance, device, port, interface) "
                    f"({new_or_increased(select(F.IB_PORT_CARRIER_CHANGES, h), ri)})",
                    port + " {{interface}} carrier",
                ),
            ),
            bars=True,
            min=0,
            width=8,
            description="A flap is a link_downed or two carrier changes of the port's netdev (RoCE, IPoIB): "
            f"{cfg.fabric_flap_count} in {cfg.fabric_flap_window} page as FabricPortFlapping.",
        ),
        Panel(
            "Port rate",
            (Target(f"{select(F.IB_PORT_RATE, h)} * 8", port),),
            unit="bps",
            min=0,
            width=8,
            description="The rate each port trained at; one below its peers of the same link layer warns "
            "(InfinibandPortSlow).",
        ),
        Panel(
            "Port throughput",
            (
                Target(
                    f"sum by (instance, device, port, direction) (rate({select(F.IB_PORT_DATA, h)}[{ri}]))",
                    port + " {{direction}}",
                ),
            ),
            unit="Bps",
            min=0,
            width=8,
        ),
        Panel(
            "RDMA retries, timeouts and congestion",
            (
                Target(
                    "sum by (instance, device, port, counter) "
                    f"(rate({select(F.IB_PORT_HW_COUNTER, h)}[{ri}]))",
                    port + " {{counter}}",
                ),
                Target(f"rate({select(F.IB_PORT_TRANSMIT_WAIT, h)}[{ri}])", port + " xmit wait"),
            ),
            min=0,
            width=8,
            description="hw_counters/ of the driver (mlx5, irdma): out-of-sequence packets, ACK timeouts and "
            "RNR retries (the transport retrying), congestion notifications sent and handled (RoCE's "
            "DCQCN), and transmit wait ticks (no credits: congestion downstream).",
        ),
        Panel(
            "PCIe width / maximum",
            (Target(f"{select(F.PCIE_LINK_WIDTH, h)} / {select(F.PCIE_LINK_MAX_WIDTH, h)}", device),),
            unit="percentunit",
            min=0,
            max=1,
            width=8,
            description="Lanes each GPU's and NIC's link trained at over the most both of its ends can do: "
            f"below 1 is a downtrained link (PcieLinkDowntrained after {cfg.pcie_degraded_for}).",
        ),
        Panel(
            "PCIe speed / maximum",
            (
                Target(
                    f"{select(F.PCIE_LINK_SPEED, h)} / {select(F.PCIE_LINK_MAX_SPEED, h)}",
                    device,
                ),
            ),
            unit="percentunit",
            min=0,
            max=1,
            width=8,
            description="An idle GPU lowers its link speed on purpose: only a speed below 1 under load "
            f"means something (PcieLinkSlow counts a GPU above {cfg.pcie_busy_utilization:.0%} utilization).",
        ),
        Panel(
            "PCIe AER errors",
            (
                Target(
                    f"sum by (instance, pci_address, kind, severity) "
                    f"({new_or_increased(select(F.PCIE_AER_ERRORS, h), ri)})",
                    device + " {{severity}}",
                ),
            ),
            bars=True,
            min=0,
            width=8,
            description="Advanced Error Reporting counts on each link (the device's and its upstream "
            "port's): fatal pages, non-fatal warns, correctable ones are shown only.",
        ),
        Panel(
            "Host memory errors (EDAC)",
            (
                Target(
                    f"sum by (instance, controller) ({new_or_increased(select(F.EDAC_CORRECTABLE, h), ri)})",
                    "{{instance}} mc{{controller}} correctable",
                ),
                Target(
                    "sum by (instance, controller) "
                    f"({new_or_increased(select(F.EDAC_UNCORRECTABLE, h), ri)})",
                    "{{instance}} mc{{controller}} uncorrectable",
                ),
            ),
            bars=True,
            min=0,
            width=8,
        ),
        Panel(
            "CPU thermal throttling",
            (
                Target(
                    f"sum by (instance, package) (rate({select(F.CPU_PACKAGE_THROTTLES, h)}[{ri}]))",
                    "{{instance}} package {{package}}",
                ),
                Target(
                    f"sum by (instance, package) (rate({select(F.CPU_CORE_THROTTLES, h)}[{ri}]))",
                    "{{instance}} package {{package}} cores",
                ),
            ),
            min=0,
            width=8,
        ),
        Panel(
            "Kernel log trouble",
            (
                Target(
                    f"sum by (instance, pattern) ({new_or_increased(select(F.KERNEL_LOG_EVENTS, h), ri)})",
                    "{{instance}} {{pattern}}",
                ),
            ),
            bars=True,
            min=0,
            width=8,
            description="Kernel lines that come before trouble, by pattern (soft lockups, hung tasks, PCIe "
            f"bus errors, mlx5 timeouts and health, NFS not responding); all but {ignored} warn as "
            "NodeKernelTrouble.",
        ),
    ]


def run_overview_fabric(cfg: GenerateConfig, r: Records) -> list[Panel | Row]:
    """The run overview's "Fabric of the run's hosts" row."""
    m, f, c = run_matchers(cfg), run_filter(cfg), cfg.cluster_label
    hosts = f"max by ({c}, instance) ({select(T.STEPS, m)})\nor max by ({c}, instance) ({rec(r.rank_nic, f)})"
    return [
        Row("Fabric of the run's hosts"),
        Panel(
            "Fabric errors on the run's hosts",
            (Target(f"{r.host_fabric_errors}\nand on ({c}, instance)\n({hosts})", "{{instance}}"),),
            bars=True,
            min=0,
            width=12,
            description=f"Port error counters, carrier changes and uncorrectable PCIe errors new in the last "
            f"{cfg.rate_window} on each host the run's ranks train on ({r.host_fabric_errors}): a flapping "
            "or failing link there slows or stops the whole job.",
        ),
        Panel(
            "Ranks by their NIC's errors and PCIe width",
            (
                Target(f"max without () ({rec(r.rank_nic_errors, f)})", mode="instant"),
                Target(f"max without () ({rec(r.rank_pcie_width, f)})", mode="instant"),
            ),
            kind="table",
            width=12,
            columns=(
                ("Value #A", f"NIC port errors ({cfg.rate_window})"),
                ("Value #B", "lowest PCIe width / max"),
            ),
            description=f"Each rank's GPU's nearest NIC port ({F.GPU_NIC.name}, joined on uuid) with its "
            f"new error counters and flaps ({r.rank_nic_errors}), and the lowest width ratio of its GPU's "
            f"and NIC's PCIe links ({r.rank_pcie_width}). Errors above 0, or a width below 1, name the rank "
            "a sick link slows.",
        ),
    ]
