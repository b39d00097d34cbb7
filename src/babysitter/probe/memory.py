"""Device memory bandwidth and host-device copy bandwidth.

Device memory: a copy of a ``size`` buffer into another on the same device; each copy reads and
writes ``size`` bytes, so bandwidth counts ``2 x size`` per copy (the STREAM "copy" convention and
what ``nvbandwidth``'s device-local copy reports). The buffer must be far larger than the last-level
cache (50 MB on an H100; 1 GiB by default) or the cache is measured instead.

Host-device: pinned host memory to device and back, one direction at a time, ``size`` bytes per
copy. A CPU-only probe has no host-device path: skipped, with the reason.
"""

from __future__ import annotations

from typing import Any

from babysitter.probe._timer import best_batch_seconds
from babysitter.probe.results import Bandwidth

__all__ = ["NO_DEVICE", "measure_host_device", "measure_memory"]

NO_DEVICE = "no accelerator: a CPU-only probe has no host-device path"


def measure_memory(device: Any, *, size_bytes: int, iterations: int, repeats: int) -> Bandwidth:
    """Bandwidth of a device-to-device copy of ``size_bytes``, read + write bytes per second."""
    import torch

    if size_bytes < 4:
        raise ValueError(f"memory probe size must be at least 4 bytes, got {size_bytes}")
    count = size_bytes // 4
    src = torch.ones(count, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = best_batch_seconds(device, lambda: dst.copy_(src), iterations=iterations, repeats=repeats)
    moved = 2 * count * 4 * iterations
    return Bandwidth(
        bytes=count * 4, iterations=iterations, bytes_per_second=moved / seconds if seconds > 0 else None
    )


def measure_host_device(
    device: Any, *, size_bytes: int, iterations: int, repeats: int
) -> tuple[Bandwidth, Bandwidth]:
    """(host-to-device, device-to-host) pinned copy bandwidth; both skipped on a CPU."""
    if getattr(device, "type", "cpu") == "cpu":
        return Bandwidth(skipped=NO_DEVICE), Bandwidth(skipped=NO_DEVICE)
    import torch

    if size_bytes < 1:
        raise ValueError(f"host-device probe size must be positive, got {size_bytes}")
    host = torch.ones(size_bytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    h2d = best_batch_seconds(
        device, lambda: dev.copy_(host, non_blocking=True), iterations=iterations, repeats=repeats
    )
    d2h = best_batch_seconds(
        device, lambda: host.copy_(dev, non_blocking=True), iterations=iterations, repeats=repeats
    )
    moved = size_bytes * iterations
    return (
        Bandwidth(bytes=size_bytes, iterations=iterations, bytes_per_second=moved / h2d if h2d > 0 else None),
        Bandwidth(bytes=size_bytes, iterations=iterations, bytes_per_second=moved / d2h if d2h > 0 else None),
    )
