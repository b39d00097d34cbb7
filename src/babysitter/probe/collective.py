"""All-reduce bus bandwidth of the job, as NCCL-tests define it.

``algbw = size / time`` per all-reduce; ``busbw = algbw x 2(n-1)/n`` for ``n`` ranks: the rate each
link must sustain in a ring all-reduce, comparable across job sizes and with the hardware's link
speed (NCCL-tests' doc/PERFORMANCE.md). The time is the slowest rank's (an all-reduce finishes when
its last rank does), measured around a whole batch with one synchronization at the end.

Runs under torchrun (or any launcher that sets the ``torch.distributed`` env:// variables) with NCCL
on GPUs and gloo on CPUs; a single process skips it with the reason.
"""

from __future__ import annotations

import time
from typing import Any

from babysitter.probe.results import CollectiveResult

__all__ = ["SINGLE_PROCESS", "bus_bandwidth", "measure_allreduce"]

SINGLE_PROCESS = "single process: launch with torchrun for the collective probe"


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """NCCL-tests' all-reduce bus bandwidth from the algorithm bandwidth and the number of ranks."""
    if world_size < 1:
        raise ValueError(f"world size must be positive, got {world_size}")
    return algbw * 2.0 * (world_size - 1) / world_size


def measure_allreduce(device: Any, *, size_bytes: int, iterations: int, warmup: int = 2) -> CollectiveResult:
    """All-reduce ``size_bytes`` of fp32 ``iterations`` times over the default process group."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return CollectiveResult(skipped=SINGLE_PROCESS)
    world = dist.get_world_size()
    backend = str(dist.get_backend())
    if world < 2:
        return CollectiveResult(backend=backend, world_size=world, skipped=SINGLE_PROCESS)
    count = max(1, size_bytes // 4)
    tensor = torch.ones(count, device=device, dtype=torch.float32)
    cuda = getattr(device, "type", "") == "cuda"
    for _ in range(max(0, warmup)):
        dist.all_reduce(tensor)
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    per_op = float(elapsed.item()) / iterations
    algbw = count * 4 / per_op if per_op > 0 else None
    return CollectiveResult(
        backend=backend,
        world_size=world,
        bytes=count * 4,
        iterations=iterations,
        seconds_per_op=per_op,
        algbw_bytes_per_second=algbw,
        busbw_bytes_per_second=None if algbw is None else bus_bandwidth(algbw, world),
    )
