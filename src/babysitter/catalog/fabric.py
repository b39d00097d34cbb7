"""Metrics of the fabric and the host, read by the node agent from sysfs: InfiniBand/RoCE ports, PCIe
links and AER, the GPU-to-NIC topology, EDAC memory errors, CPU thermal throttling, kernel-log trouble.

InfiniBand series carry ``device`` (``mlx5_0``) and ``port`` (``1``); PCIe series ``pci_address`` (the
full ``0000:9b:00.0``) and ``kind`` (``gpu`` or ``nic``). No host label: Prometheus' ``instance`` is
the host, as for every node agent series. docs/fabric.md says what each one means and cannot see.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "CPU_CORE_THROTTLES",
    "CPU_PACKAGE_THROTTLES",
    "DEFAULT_HW_COUNTERS",
    "DEFAULT_PORT_ERRORS",
    "EDAC_CORRECTABLE",
    "EDAC_UNCORRECTABLE",
    "GPU_NIC",
    "IB_LABELS",
    "IB_PORT_CARRIER_CHANGES",
    "IB_PORT_COUNTER",
    "IB_PORT_DATA",
    "IB_PORT_ERRORS",
    "IB_PORT_HW_COUNTER",
    "IB_PORT_INFO",
    "IB_PORT_PACKETS",
    "IB_PORT_PHYS_STATE",
    "IB_PORT_RATE",
    "IB_PORT_STATE",
    "IB_PORT_TRANSMIT_WAIT",
    "KERNEL_LOG_EVENTS",
    "KERNEL_LOG_PATTERNS",
    "METRICS",
    "PCIE_AER_ERRORS",
    "PCIE_AER_SEVERITIES",
    "PCIE_DEVICE_INFO",
    "PCIE_LABELS",
    "PCIE_LINK_MAX_SPEED",
    "PCIE_LINK_MAX_WIDTH",
    "PCIE_LINK_SPEED",
    "PCIE_LINK_WIDTH",
    "SYSFS_ITEMS_DROPPED",
    "SYSFS_PROBLEMS",
]

IB_LABELS = ("device", "port")
PCIE_LABELS = ("pci_address", "kind")

#: The error counters of ``counters/`` exported by default (the IBTA PortCounters the alerts and
#: NVIDIA NVSentinel's NIC monitor read); ``--fabric-all-counters`` exports every file there.
DEFAULT_PORT_ERRORS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
#: The driver counters of ``hw_counters/`` (mlx5, irdma) exported by default: RDMA transport retries
#: and timeouts, and the congestion notifications RoCE's DCQCN sends and handles.
DEFAULT_HW_COUNTERS = (
    "out_of_sequence",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "np_cnp_sent",
    "rp_cnp_handled",
)
#: Severities of ``pcie_aer_errors_total`` (the kernel's ``aer_dev_correctable``, ``_nonfatal``, ``_fatal``).
PCIE_AER_SEVERITIES = ("correctable", "nonfatal", "fatal")
#: The ``pattern`` values of ``kernel_log_events_total``: kernel lines that come before trouble.
KERNEL_LOG_PATTERNS = (
    "soft_lockup",
    "hung_task",
    "pcie_bus_error_corrected",
    "pcie_bus_error_uncorrected",
    "mlx5_cmd_timeout",
    "mlx5_health",
    "nfs_not_responding",
)


def _ib(name: str, kind: str, unit: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, unit, help_, labels=(*IB_LABELS, *labels), source="node")  # type: ignore[arg-type]


def _pcie(name: str, kind: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, "", help_, labels=(*PCIE_LABELS, *labels), source="node")  # type: ignore[arg-type]


IB_PORT_STATE = _ib(
    "infiniband_port_state_id",
    "gauge",
    "",
    "Logical port state (IBTA): 1 Down, 2 Init, 3 Armed, 4 Active, 5 Active-defer.",
)
IB_PORT_PHYS_STATE = _ib(
    "infiniband_port_physical_state_id",
    "gauge",
    "",
    "Physical port state (IBTA): 1 Sleep, 2 Polling, 3 Disabled, 4 Training, 5 LinkUp, 6 LinkErrorRecovery, "
    "7 PhyTest.",
)
IB_PORT_RATE = _ib(
    "infiniband_port_rate_bytes_per_second",
    "gauge",
    "bytes",
    "Signalling rate the port trained at (400 Gb/s NDR x4 = 5e10).",
)
IB_PORT_INFO = _ib(
    "infiniband_port_info",
    "info",
    "",
    "1 per port: its link layer (InfiniBand or Ethernet for RoCE), the PCI function of its NIC, its netdev "
    "and the NIC's firmware.",
    labels=("link_layer", "pci_address", "interface", "fw_version"),
)
IB_PORT_ERRORS = _ib(
    "infiniband_port_errors_total",
    "counter",
    "",
    "Port error counters of counters/ (IBTA PortCounters; 16/8-bit ones saturate): symbol_error, "
    "link_downed, link_error_recovery, port_rcv_errors, port_rcv_remote_physical_errors, port_xmit_discards, "
    "local_link_integrity_errors, excessive_buffer_overrun_errors.",
    labels=("counter",),
)
IB_PORT_TRANSMIT_WAIT = _ib(
    "infiniband_port_transmit_wait_total",
    "counter",
    "",
    "Ticks the port had data to send but no flow-control credits (port_xmit_wait): congestion downstream.",
)
IB_PORT_COUNTER = _ib(
    "infiniband_port_counter_total",
    "counter",
    "",
    "Every other counter of counters/, with --fabric-all-counters only.",
    labels=("counter",),
)
IB_PORT_HW_COUNTER = _ib(
    "infiniband_port_hw_counter_total",
    "counter",
    "",
    "Driver counters of hw_counters/ where the driver has them (mlx5, irdma): out_of_sequence, "
    "local_ack_timeout_err, rnr_nak_retry_err, np_cnp_sent, rp_cnp_handled; every one with "
    "--fabric-all-counters.",
    labels=("counter",),
)
IB_PORT_DATA = _ib(
    "infiniband_port_data_bytes_total",
    "counter",
    "bytes",
    "Data received and transmitted (port_rcv_data, port_xmit_data: 4-byte words, multiplied by 4).",
    labels=("direction",),
)
IB_PORT_PACKETS = _ib(
    "infiniband_port_packets_total",
    "counter",
    "",
    "Packets received and transmitted (port_rcv_packets, port_xmit_packets).",
    labels=("direction",),
)
IB_PORT_CARRIER_CHANGES = _ib(
    "infiniband_port_carrier_changes_total",
    "counter",
    "",
    "Carrier changes of the port's netdev (RoCE Ethernet, IPoIB): each flap counts two, down and up.",
    labels=("interface",),
)

PCIE_LINK_WIDTH = _pcie("pcie_link_width", "gauge", "Lanes the PCIe link trained at (current_link_width).")
PCIE_LINK_MAX_WIDTH = _pcie(
    "pcie_link_max_width",
    "gauge",
    "Lanes the link can train at: the lower of the device's and its upstream port's max_link_width.",
)
PCIE_LINK_SPEED = _pcie(
    "pcie_link_speed_transfers_per_second",
    "gauge",
    "Transfer rate the link runs at now (current_link_speed; 32 GT/s = 3.2e10). GPUs lower it when idle.",
)
PCIE_LINK_MAX_SPEED = _pcie(
    "pcie_link_max_speed_transfers_per_second",
    "gauge",
    "Transfer rate the link can run at: the lower of the device's and its upstream port's max_link_speed.",
)
PCIE_AER_ERRORS = _pcie(
    "pcie_aer_errors_total",
    "counter",
    "PCIe Advanced Error Reporting counts on the device's link, by severity: the device's own "
    "(aer_dev_*) plus its upstream port's, which is where errors of a failing device are often counted.",
    labels=("severity",),
)
PCIE_DEVICE_INFO = _pcie(
    "pcie_device_info",
    "info",
    "1 per watched PCIe device (GPUs and NICs by PCI class): vendor and device ids, driver, NUMA node, "
    "and the upstream port its link goes to.",
    labels=("vendor_id", "device_id", "driver", "numa_node", "upstream"),
)

GPU_NIC = MetricSpec(
    "fabric_gpu_nic_info",
    "info",
    "",
    "1 per GPU and nearest NIC port (deepest common PCIe bridge; link PIX, PXB, PHB, NODE or SYS as "
    "nvidia-smi topo names them), nic_index 0.. when several are equally near: joins a rank's GPU "
    "(uuid) to its NIC's port series.",
    labels=(
        "uuid",
        "pci_bus_id",
        "gpu_pci_address",
        "device",
        "port",
        "nic_pci_address",
        "link",
        "nic_index",
    ),
    source="node",
)

EDAC_CORRECTABLE = MetricSpec(
    "edac_correctable_errors_total",
    "counter",
    "",
    "Correctable host-memory (ECC) errors by memory controller (EDAC ce_count).",
    labels=("controller",),
    source="node",
)
EDAC_UNCORRECTABLE = MetricSpec(
    "edac_uncorrectable_errors_total",
    "counter",
    "",
    "Uncorrectable host-memory errors by memory controller (EDAC ue_count).",
    labels=("controller",),
    source="node",
)
CPU_CORE_THROTTLES = MetricSpec(
    "cpu_core_throttles_total",
    "counter",
    "",
    "Thermal throttle events of a CPU package's cores, summed over its cores (core_throttle_count).",
    labels=("package",),
    source="node",
)
CPU_PACKAGE_THROTTLES = MetricSpec(
    "cpu_package_throttles_total",
    "counter",
    "",
    "Thermal throttle events of a CPU package (package_throttle_count).",
    labels=("package",),
    source="node",
)
KERNEL_LOG_EVENTS = MetricSpec(
    "kernel_log_events_total",
    "counter",
    "",
    "Kernel log lines that come before trouble, since boot, by pattern: soft_lockup, hung_task, "
    "pcie_bus_error_corrected, pcie_bus_error_uncorrected, mlx5_cmd_timeout, mlx5_health, "
    "nfs_not_responding.",
    labels=("pattern",),
    source="node",
)
SYSFS_PROBLEMS = MetricSpec(
    "babysitter_sysfs_problems_total",
    "counter",
    "",
    "sysfs files a collector could not use, each counted once while it lasts, by reason: unreadable, "
    "vanished, garbage, unavailable (N/A (no PMA)), not_regular (a FIFO, socket, device node or symbolic "
    "link where the kernel has a file); a reason's series appears with its first problem.",
    labels=("collector", "reason"),
    source="node",
)
SYSFS_ITEMS_DROPPED = MetricSpec(
    "babysitter_sysfs_items_dropped",
    "gauge",
    "",
    "Things the collector's last scan found beyond its cap (catalog.budget.CAPS), by kind: rdma_device, "
    "port, counter, pcie_device, cpu, package, memory_controller; not watched, logged once. A kind's "
    "series appears when it first goes over.",
    labels=("collector", "kind"),
    source="node",
)

METRICS: tuple[MetricSpec, ...] = (
    IB_PORT_STATE,
    IB_PORT_PHYS_STATE,
    IB_PORT_RATE,
    IB_PORT_INFO,
    IB_PORT_ERRORS,
    IB_PORT_TRANSMIT_WAIT,
    IB_PORT_COUNTER,
    IB_PORT_HW_COUNTER,
    IB_PORT_DATA,
    IB_PORT_PACKETS,
    IB_PORT_CARRIER_CHANGES,
    PCIE_LINK_WIDTH,
    PCIE_LINK_MAX_WIDTH,
    PCIE_LINK_SPEED,
    PCIE_LINK_MAX_SPEED,
    PCIE_AER_ERRORS,
    PCIE_DEVICE_INFO,
    GPU_NIC,
    EDAC_CORRECTABLE,
    EDAC_UNCORRECTABLE,
    CPU_CORE_THROTTLES,
    CPU_PACKAGE_THROTTLES,
    KERNEL_LOG_EVENTS,
    SYSFS_PROBLEMS,
    SYSFS_ITEMS_DROPPED,
)
