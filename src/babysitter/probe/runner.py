"""Run the whole probe: per-device measurements, the collective, storage, lemons, results files.

Under torchrun (``WORLD_SIZE`` > 1) every rank probes its own device, the job measures all-reduce
bandwidth, local rank 0 of each host measures checkpoint storage (all hosts at once, as a real
checkpoint save does), and every rank receives every result (``all_gather_object``) so each host can
write its own results file for its node agent. A single process probes every local GPU in turn (or
the CPU) and skips the collective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import platform
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.probe.lemons import DEFAULT_FRACTION, find_lemons
from babysitter.probe.results import (
    CollectiveResult,
    DeviceResult,
    MatmulResult,
    ProbeReport,
    StorageResult,
    host_file_name,
    write_report,
)
from babysitter.training.dist import detect_rank

__all__ = ["SECTIONS", "ProbeConfig", "Sizes", "physical_gpu_label", "run_probe"]

log = logging.getLogger(__name__)

#: Parts of the probe that ``--skip`` can leave out.
SECTIONS = ("matmul", "memory", "host_device", "collective", "storage")


@dataclass(frozen=True)
class Sizes:
    """Problem sizes; the defaults differ between GPUs and CPUs (see :meth:`for_device`)."""

    matmul_n: int
    matmul_iterations: int
    memory_bytes: int
    memory_iterations: int
    host_device_bytes: int
    host_device_iterations: int
    collective_bytes: int
    collective_iterations: int
    storage_bytes: int
    repeats: int = 3

    @classmethod
    def for_device(cls, kind: str) -> Sizes:
        """Defaults for ``cuda`` (seconds per device on an H100) or ``cpu`` (seconds on a laptop)."""
        if kind == "cuda":
            return cls(8192, 50, 2**30, 20, 256 * 2**20, 10, 256 * 2**20, 20, 2**30)
        return cls(1024, 5, 64 * 2**20, 5, 0, 0, 4 * 2**20, 10, 256 * 2**20)


@dataclass
class ProbeConfig:
    """What to probe and where to put the results."""

    device: str = "auto"  # auto | cuda | cpu
    sizes: dict[str, int] = field(default_factory=dict)  # overrides of Sizes fields
    storage_paths: Sequence[Path] = ()
    lemon_fraction: float = DEFAULT_FRACTION
    skip: frozenset[str] = frozenset()
    results_dir: Path | None = None
    timeout_seconds: float = 600.0
    #: The name this host is reported as (default: its hostname); e.g. the node's name in Kubernetes,
    #: where the hostname is the pod's.
    host: str | None = None
    #: Test knob: sleep this long after every matmul on these global ranks (makes lemons).
    slow_ranks: frozenset[int] = frozenset()
    slow_delay_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device must be auto, cuda or cpu, got {self.device!r}")
        unknown = set(self.skip) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown sections to skip: {sorted(unknown)}; known: {', '.join(SECTIONS)}")
        names = {f.name for f in dataclasses.fields(Sizes)}
        for key, value in self.sizes.items():
            if key not in names:
                raise ValueError(f"unknown size {key!r}; known: {', '.join(sorted(names))}")
            if value < (0 if key in ("host_device_bytes", "host_device_iterations") else 1):
                raise ValueError(f"{key} must be positive, got {value}")
        if not 0.0 < self.lemon_fraction < 1.0:
            raise ValueError(f"lemon fraction must be in (0, 1), got {self.lemon_fraction}")
        if self.host is not None and not self.host.strip():
            raise ValueError("the host name must not be empty")
        if self.slow_delay_seconds < 0:
            raise ValueError("the slow-rank delay must not be negative")


def _device_kind(choice: str) -> str:
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _probe_device(
    device: Any, *, host: str, rank: int, local_rank: int, sizes: Sizes, cfg: ProbeConfig
) -> DeviceResult:
    import torch

    from babysitter.probe.compute import measure_matmul
    from babysitter.probe.memory import measure_memory

    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else _cpu_name()
    gpu = physical_gpu_label(device.index or 0) if cuda else f"cpu{local_rank}"
    result = DeviceResult(host=host, rank=rank, local_rank=local_rank, gpu=gpu, name=name)
    delay = cfg.slow_delay_seconds if rank in cfg.slow_ranks else 0.0
    steps: list[tuple[str, Any]] = [
        (
            "matmul",
            lambda: setattr(
                result,
                "matmul",
                measure_matmul(
                    device,
                    name=name,
                    n=sizes.matmul_n,
                    iterations=sizes.matmul_iterations,
                    repeats=sizes.repeats,
                    delay_seconds=delay,
                ),
            ),
        ),
        (
            "memory",
            lambda: setattr(
                result,
                "memory",
                measure_memory(
                    device,
                    size_bytes=sizes.memory_bytes,
                    iterations=sizes.memory_iterations,
                    repeats=sizes.repeats,
                ),
            ),
        ),
        ("host_device", lambda: _host_device(result, device, sizes)),
    ]
    for section, step in steps:
        if section in cfg.skip:
            _mark_skipped(result, section)
            continue
        try:
            # CUDA events and copies run on the current device's stream: make it this device's.
            with torch.cuda.device(device) if cuda else contextlib.nullcontext():
                step()
        except Exception as exc:  # one failed measurement must not lose the others
            log.warning("babysitter probe: %s on %s failed: %s", section, gpu, exc)
            result.errors.append(f"{section}: {type(exc).__name__}: {exc}"[:500])
        finally:
            if cuda:
                torch.cuda.empty_cache()
    return result


def physical_gpu_label(index: int, environ: Mapping[str, str] | None = None) -> str:
    """The GPU's index as NVML and the node agent number it (``gpu`` label), not torch's visible index:
    with ``CUDA_VISIBLE_DEVICES=4,5`` torch's device 1 is GPU 5. UUIDs or MIG names in the variable
    leave torch's index (the JSON has no better answer without NVML)."""
    env = os.environ if environ is None else environ
    visible = [part.strip() for part in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    if visible and all(part.isdigit() for part in visible) and index < len(visible):
        return visible[index]
    return str(index)


def _host_device(result: DeviceResult, device: Any, sizes: Sizes) -> None:
    from babysitter.probe.memory import NO_DEVICE, measure_host_device

    if device.type == "cuda" and (sizes.host_device_bytes < 1 or sizes.host_device_iterations < 1):
        raise ValueError("host-device probe sizes must be positive on a GPU")
    if device.type != "cuda":
        result.host_to_device.skipped = result.device_to_host.skipped = NO_DEVICE
        return
    result.host_to_device, result.device_to_host = measure_host_device(
        device,
        size_bytes=sizes.host_device_bytes,
        iterations=sizes.host_device_iterations,
        repeats=sizes.repeats,
    )


def _mark_skipped(result: DeviceResult, section: str) -> None:
    reason = "skipped (--skip)"
    if section == "matmul":
        result.matmul = MatmulResult(skipped=reason)
    elif section == "memory":
        result.memory.skipped = reason
    else:
        result.host_to_device.skipped = result.device_to_host.skipped = reason


def _host() -> str:
    return socket.gethostname()


def run_probe(cfg: ProbeConfig) -> ProbeReport:
    """Probe this process's device(s); under torchrun, the whole job's report on every rank.

    Setup errors (no CUDA when asked for, bad sizes) raise ValueError; a failing measurement is
    recorded in the report (``errors``, ``skipped``) and the rest still runs.
    """
    import torch

    kind = _device_kind(cfg.device)
    sizes = dataclasses.replace(Sizes.for_device(kind), **cfg.sizes)
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1") or 1)
    distributed = world > 1
    info = detect_rank()
    host = cfg.host.strip()[:128] if cfg.host else _host()
    started = time.time()
    if distributed:
        import torch.distributed as dist

        if kind == "cuda":
            torch.cuda.set_device(info.local_rank % max(1, torch.cuda.device_count()))
        dist.init_process_group(
            backend="nccl" if kind == "cuda" else "gloo",
            timeout=datetime.timedelta(seconds=cfg.timeout_seconds),
        )
    try:
        if kind == "cpu":
            torch.set_num_threads(
                max(1, (os.cpu_count() or 1) // max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1)))
            )
            devices = [torch.device("cpu")]
        elif distributed:
            devices = [torch.device("cuda", torch.cuda.current_device())]
        else:
            devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        results = [
            _probe_device(
                device,
                host=host,
                rank=info.rank if distributed else i,
                local_rank=info.local_rank if distributed else i,
                sizes=sizes,
                cfg=cfg,
            )
            for i, device in enumerate(devices)
        ]
        collective = CollectiveResult(skipped="skipped (--skip)")
        node_collective: list[CollectiveResult] = []
        if "collective" not in cfg.skip:
            collective = _collective(devices[0], sizes)
            if distributed:
                node = _node_collective(devices[0], sizes, host)
                node_collective = [node] if info.local_rank == 0 else []
        storage: list[StorageResult] = []
        if "storage" not in cfg.skip and cfg.storage_paths:
            if distributed:
                torch.distributed.barrier()  # every host writes at once, as a checkpoint save does
            if info.local_rank == 0 or not distributed:
                from babysitter.probe.storage import measure_storage

                storage = [
                    measure_storage(p, size_bytes=sizes.storage_bytes, host=host) for p in cfg.storage_paths
                ]
        if distributed:
            gathered: list[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, (results, storage, node_collective))
            results = [d for part in gathered for d in part[0]]
            storage = [s for part in gathered for s in part[1]]
            node_collective = [c for part in gathered for c in part[2]]
    finally:
        if distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    results.sort(key=lambda d: d.rank)
    report = ProbeReport(
        started=started,
        finished=time.time(),
        world_size=world,
        lemon_fraction=cfg.lemon_fraction,
        devices=results,
        collective=collective,
        node_collectives=node_collective,
        storage=storage,
        lemons=find_lemons(results, storage, cfg.lemon_fraction, node_collective),
    )
    if cfg.results_dir is not None and (info.local_rank == 0 or not distributed):
        try:
            write_report(report.for_host(host), cfg.results_dir / host_file_name(host))
        except OSError as exc:
            log.error("babysitter probe: cannot write results to %s: %s", cfg.results_dir, exc)
    return report


def _collective(device: Any, sizes: Sizes) -> CollectiveResult:
    from babysitter.probe.collective import measure_allreduce

    try:
        return measure_allreduce(
            device, size_bytes=sizes.collective_bytes, iterations=sizes.collective_iterations
        )
    except Exception as exc:
        log.warning("babysitter probe: all-reduce failed: %s", exc)
        return CollectiveResult(skipped=f"failed: {type(exc).__name__}: {exc}"[:500])


def _node_collective(device: Any, sizes: Sizes, host: str) -> CollectiveResult:
    from babysitter.probe.collective import measure_intra_node

    try:
        return measure_intra_node(
            device, host=host, size_bytes=sizes.collective_bytes, iterations=sizes.collective_iterations
        )
    except Exception as exc:
        log.warning("babysitter probe: intra-node all-reduce failed: %s", exc)
        return CollectiveResult(host=host, skipped=f"failed: {type(exc).__name__}: {exc}"[:500])
