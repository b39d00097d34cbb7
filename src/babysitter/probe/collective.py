"""All-reduce bus bandwidth of the job, as NCCL-tests define it.

``algbw = size / time`` per all-reduce; ``busbw = algbw x 2(n-1)/n`` for ``n`` ranks: the rate each
link must sustain in a ring all-reduce, comparable across job sizes and with the hardware's link
speed (NCCL-tests' doc/PERFORMANCE.md). The time is the slowest rank's (an all-reduce finishes when
its last rank does), measured around a whole batch with one synchronization at the end.

Also per host (:func:`measure_intra_node`): the same all-reduce among the ranks of each host, all
hosts at once, so a node with a degraded NVLink/NVSwitch stands out against the other nodes.

Runs under torchrun (or any launcher that sets the ``torch.distributed`` env:// variables) with NCCL
on GPUs and gloo on CPUs; a single process skips it with the reason.
"""

from __future__ import annotations

import time
from typing import Any

from babysitter.probe.results import CollectiveResult

__all__ = ["SINGLE_PROCESS", "bus_bandwidth", "measure_allreduce", "measure_intra_node"]

SINGLE_PROCESS = "single process: launch with torchrun for the collective probe"


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """NCCL-tests' all-reduce bus bandwidth from the algorithm bandwidth and the number of ranks."""
    if world_size < 1:
        raise ValueError(f"world size must be positive, got {world_size}")
    return algbw * 2.0 * (world_size - 1) / world_size


def _timed(
    device: Any, *, size_bytes: int, iterations: int, warmup: int, group: Any = None
) -> CollectiveResult:
    """All-reduce over ``group`` (default: the world); every member must call this."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    count = max(1, size_bytes // 4)
    tensor = torch.ones(count, device=device, dtype=torch.float32)
    cuda = getattr(device, "type", "") == "cuda"
    for _ in range(max(0, warmup)):
        dist.all_reduce(tensor, group=group)
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor, group=group)
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    per_op = float(elapsed.item()) / iterations
    algbw = count * 4 / per_op if per_op > 0 else None
    return CollectiveResult(
        backend=str(dist.get_backend(group)),
        world_size=size,
        bytes=count * 4,
        iterations=iterations,
        seconds_per_op=per_op,
        algbw_bytes_per_second=algbw,
        busbw_bytes_per_second=None if algbw is None else bus_bandwidth(algbw, size),
    )


def measure_allreduce(device: Any, *, size_bytes: int, iterations: int, warmup: int = 2) -> CollectiveResult:
    """All-reduce ``size_bytes`` of fp32 ``iterations`` times over the default process group."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return CollectiveResult(skipped=SINGLE_PROCESS)
    if dist.get_world_size() < 2:
        return CollectiveResult(backend=str(dist.get_backend()), world_size=1, skipped=SINGLE_PROCESS)
    return _timed(device, size_bytes=size_bytes, iterations=iterations, warmup=warmup)


def measure_intra_node(
    device: Any, *, host: str, size_bytes: int, iterations: int, warmup: int = 2
) -> CollectiveResult:
    """All-reduce among the ranks of each host, every host at once; this rank's host's result.

    A node whose NVLink/NVSwitch (or, on CPUs, shared memory) is degraded shows up here, where the
    job-wide number would only show the slowest link somewhere. Every rank must call this.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return CollectiveResult(host=host, skipped=SINGLE_PROCESS)
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, host)
    groups: dict[str, Any] = {}
    for name in sorted(set(hosts)):  # every rank creates every group, in the same order
        groups[name] = dist.new_group([rank for rank, h in enumerate(hosts) if h == name])
    if hosts.count(host) < 2:
        return CollectiveResult(host=host, skipped="one rank on this host")
    result = _timed(device, size_bytes=size_bytes, iterations=iterations, warmup=warmup, group=groups[host])
    result.host = host
    return result
