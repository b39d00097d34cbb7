"""Lemon detection: devices and nodes more than a fraction below the median of their peers.

Meta's practice (goodput.md): a few bad nodes cause most interruptions and slowdowns, and a
synchronous job runs at the speed of its slowest rank, so one slow GPU costs the whole allocation.
The probe compares like with like: devices only against devices of the same model (a mixed fleet
must not flag every A100 next to H100s), storage only against the same path on other hosts. A group
of one has no fleet to compare with and flags nothing.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

from babysitter.catalog.probe import DEVICE_CHECKS
from babysitter.probe.results import CollectiveResult, DeviceResult, Lemon, StorageResult

__all__ = ["DEFAULT_FRACTION", "find_lemons", "flag_below_median"]

#: Flag what is more than 10% below the median: run-to-run noise of a quiet GPU matmul is ~1-2%, and a
#: 10% slower rank already costs a synchronous job 10%.
DEFAULT_FRACTION = 0.10


def flag_below_median(values: Sequence[float], fraction: float) -> tuple[float, list[int]]:
    """(median, indices of values below ``(1 - fraction) x median``); nothing flagged for fewer than 2."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"lemon fraction must be in (0, 1), got {fraction}")
    if len(values) < 2:
        return (values[0] if values else 0.0), []
    median = statistics.median(values)
    limit = (1.0 - fraction) * median
    return median, [i for i, v in enumerate(values) if v < limit]


def _devices(devices: Sequence[DeviceResult], fraction: float) -> list[Lemon]:
    lemons: list[Lemon] = []
    by_model: dict[str, list[DeviceResult]] = defaultdict(list)
    for device in devices:
        by_model[device.name].append(device)
    for group in by_model.values():
        for check in DEVICE_CHECKS:
            measured = [(d, v) for d in group if (v := d.value(check)) is not None and v > 0]
            median, flagged = flag_below_median([v for _, v in measured], fraction)
            for i in flagged:
                d, v = measured[i]
                lemons.append(Lemon("device", d.host, d.gpu, check, v, median, len(measured)))
    return lemons


def _node_matmul(devices: Sequence[DeviceResult], fraction: float) -> list[Lemon]:
    """Nodes compared by the median matmul throughput of their devices, among nodes of the same models."""
    per_node: dict[str, list[DeviceResult]] = defaultdict(list)
    for device in devices:
        per_node[device.host].append(device)
    groups: dict[tuple[str, ...], list[tuple[str, float]]] = defaultdict(list)
    for host, members in per_node.items():
        values = [v for d in members if (v := d.matmul.flops_per_second)]
        if values:
            groups[tuple(sorted({d.name for d in members}))].append((host, statistics.median(values)))
    lemons: list[Lemon] = []
    for nodes in groups.values():
        median, flagged = flag_below_median([v for _, v in nodes], fraction)
        for i in flagged:
            host, value = nodes[i]
            lemons.append(Lemon("node", host, "", "matmul", value, median, len(nodes)))
    return lemons


def _node_storage(storage: Sequence[StorageResult], fraction: float) -> list[Lemon]:
    lemons: list[Lemon] = []
    by_path: dict[str, list[StorageResult]] = defaultdict(list)
    for result in storage:
        by_path[result.path].append(result)
    for group in by_path.values():
        for check in ("storage_write", "storage_read"):
            measured = [
                (s, v)
                for s in group
                if (v := s.write_bytes_per_second if check == "storage_write" else s.read_bytes_per_second)
            ]
            median, flagged = flag_below_median([v for _, v in measured], fraction)
            for i in flagged:
                s, v = measured[i]
                lemons.append(Lemon("node", s.host, "", check, v, median, len(measured)))
    return lemons


def _node_allreduce(collectives: Sequence[CollectiveResult], fraction: float) -> list[Lemon]:
    """Nodes compared by their intra-node all-reduce busbw, among nodes with as many ranks."""
    by_size: dict[int, list[CollectiveResult]] = defaultdict(list)
    for c in collectives:
        if c.host and not c.skipped and c.busbw_bytes_per_second:
            by_size[c.world_size].append(c)
    lemons: list[Lemon] = []
    for group in by_size.values():
        values = [c.busbw_bytes_per_second or 0.0 for c in group]
        median, flagged = flag_below_median(values, fraction)
        for i in flagged:
            lemons.append(Lemon("node", group[i].host, "", "allreduce", values[i], median, len(group)))
    return lemons


def find_lemons(
    devices: Sequence[DeviceResult],
    storage: Sequence[StorageResult],
    fraction: float = DEFAULT_FRACTION,
    node_collectives: Sequence[CollectiveResult] = (),
) -> list[Lemon]:
    """Every device and node check more than ``fraction`` below its peers' median."""
    return [
        *_devices(devices, fraction),
        *_node_matmul(devices, fraction),
        *_node_allreduce(node_collectives, fraction),
        *_node_storage(storage, fraction),
    ]
