"""Assemble the node agent from its configuration and run it until SIGTERM/SIGINT.

Setup mistakes (bad flags, an explicitly requested collector that cannot exist here) raise
:class:`~babysitter.node.config.ConfigError` before anything is served. What the host gets wrong
later (no driver yet, a GPU lost, a trainer dead) never stops the agent: the affected collector
reports ``babysitter_collector_success 0`` and logs.
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.export.server import bind_hint
from babysitter.node.agent import Agent, Server
from babysitter.node.collector import Collector, GpuIdentity
from babysitter.node.config import AgentConfig, ConfigError
from babysitter.node.gpu.collector import GpuCollector
from babysitter.node.gpu.nvml import NvmlUnavailable, load_pynvml
from babysitter.node.gpu.simulate import Simulator, load_scenario, scenario_epoch
from babysitter.node.workloads.jobs import GpuJobsCollector
from babysitter.node.workloads.trainers import TrainersCollector

__all__ = ["Running", "build", "run", "write_port_file"]

log = logging.getLogger(__name__)


@dataclass
class Running:
    """A built agent and what must be stopped with it."""

    agent: Agent
    simulator: Simulator | None = None
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Close the collectors, then the simulator."""
        self.agent.close()
        if self.simulator is not None:
            self.simulator.close()
        for cleanup in self.cleanups:
            with contextlib.suppress(Exception):
                cleanup()


def build(config: AgentConfig) -> Running:
    """The agent with every enabled collector, started; ConfigError for impossible requests."""
    collectors: list[Collector] = []
    simulator: Simulator | None = None
    backend, driver = "none", ""
    nvml: Any = None
    identities: Callable[[], list[GpuIdentity]] = list
    if config.simulate:
        try:
            scenario = load_scenario(config.scenario, config.simulate) if config.scenario else []
            simulator = Simulator(
                config.simulate,
                config.gpu_model,
                scenario=scenario,
                kernel_log=config.simulate_kernel_log,
                host=config.simulate_host,
                epoch=scenario_epoch(config.scenario) if config.scenario else None,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        simulator.start()
    try:
        if config.enabled("gpu"):
            gpu, backend, nvml = _gpu_collector(config, simulator)
            if gpu is not None:
                collectors.append(gpu)
                identities = getattr(gpu, "identities", identities)
                driver = str(getattr(gpu, "driver_version", ""))
        if config.enabled("xid"):
            xid = _optional(
                "babysitter.node.xid.collector",
                "XidCollector",
                config,
                "xid",
                lambda cls: cls(
                    gpus=identities,
                    kmsg_path=_kmsg(config),
                    nvml=nvml,
                    state_path=str(config.xid_state_file) if config.xid_state_file else None,
                ),
            )
            if xid is not None:
                collectors.append(xid)
        collectors.extend(_sysfs_collectors(config, identities))
        if config.enabled("storage"):
            storage = _optional(
                "babysitter.node.storage.probe",
                "StorageProbeCollector",
                config,
                "storage",
                lambda cls: cls(
                    config.storage_path,
                    size_bytes=config.storage_size,
                    interval_seconds=config.storage_interval,
                ),
            )
            if storage is not None:
                collectors.append(storage)
        if config.enabled("sentinel"):
            sentinel = _optional(
                "babysitter.node.storage.sentinel",
                "CheckpointSentinelCollector",
                config,
                "sentinel",
                lambda cls: cls(
                    config.checkpoint_run_dir,
                    keep_last=config.checkpoint_keep_last,
                    refresh_seconds=config.checkpoint_interval,
                    verify_bytes=config.checkpoint_verify_bytes,
                    reverify_seconds=config.checkpoint_reverify_interval,
                    manifest_grace=config.checkpoint_manifest_grace,
                    run_timeout=config.checkpoint_run_timeout,
                    run_memory=config.checkpoint_run_memory,
                ),
            )
            if sentinel is not None:
                collectors.append(sentinel)
        if config.enabled("jobs") and config.gpu_job_dir is not None:
            collectors.append(GpuJobsCollector(config.gpu_job_dir, gpus=identities))
        if config.enabled("probe") and config.probe_results_dir is not None:
            results_dir = config.probe_results_dir
            probe = _optional(
                "babysitter.node.workloads.probe_results",
                "ProbeResultsCollector",
                config,
                "probe",
                lambda cls: cls(results_dir),
            )
            if probe is not None:
                collectors.append(probe)
        if config.enabled("trainers"):
            ca = str(config.trainer_ca_file) if config.trainer_ca_file else None
            networks = [ipaddress.ip_network(n, strict=False) for n in config.trainer_networks]
            collectors.append(
                TrainersCollector(
                    config.registry_dir,
                    timeout=config.trainer_timeout,
                    max_series_total=config.trainer_series_limit,
                    ca_file=ca,
                    client_cert=(
                        (str(config.trainer_cert_file), str(config.trainer_key_file))
                        if config.trainer_cert_file and config.trainer_key_file
                        else None
                    ),
                    networks=networks,
                )
            )
    except BaseException:
        for collector in collectors:
            with contextlib.suppress(Exception):
                collector.close()
        if simulator is not None:
            simulator.close()
        raise
    agent = Agent(
        collectors, backend=backend, driver_version=driver, collector_timeout=config.collector_timeout
    )
    return Running(agent, simulator)


def _sysfs_collectors(config: AgentConfig, gpus: Callable[[], list[GpuIdentity]]) -> list[Collector]:
    """The collectors over ``--path.sysfs`` (docs/fabric.md), each on unless switched off."""
    sysfs, every = str(config.sysfs), config.fabric_rescan_interval
    made: list[Collector] = []
    for name, module, cls_name, make in (
        (
            "infiniband",
            "babysitter.node.fabric.infiniband",
            "InfinibandCollector",
            lambda cls: cls(sysfs, all_counters=config.fabric_all_counters, rescan_seconds=every),
        ),
        (
            "pcie",
            "babysitter.node.fabric.pcie",
            "PcieCollector",
            lambda cls: cls(sysfs, rescan_seconds=every),
        ),
        (
            "topology",
            "babysitter.node.fabric.topology",
            "TopologyCollector",
            lambda cls: cls(sysfs, procfs=str(config.procfs), gpus=gpus, rescan_seconds=every),
        ),
        ("edac", "babysitter.node.host.edac", "EdacCollector", lambda cls: cls(sysfs, rescan_seconds=every)),
        (
            "thermal",
            "babysitter.node.host.thermal",
            "CpuThermalCollector",
            lambda cls: cls(sysfs, rescan_seconds=every),
        ),
    ):
        if config.enabled(name):
            collector = _optional(module, cls_name, config, name, make)
            if collector is not None:
                made.append(collector)
    return made


def _kmsg(config: AgentConfig) -> str | None:
    if config.simulate:
        return str(config.simulate_kernel_log) if config.simulate_kernel_log else None
    return config.kmsg_path or None


def _gpu_collector(config: AgentConfig, simulator: Simulator | None) -> tuple[Collector | None, str, Any]:
    """(collector, backend name, pynvml-like object for the Xid collector)."""
    if simulator is not None:
        gpu = GpuCollector(simulator.nvml, nvlink_per_link=config.nvlink_per_link)
        _start_bounded(gpu, config.collector_timeout)
        return gpu, "simulated", simulator.nvml
    explicit = config.collectors.get("gpu", False)
    backend = config.gpu_backend
    if backend in ("auto", "dcgm"):
        from babysitter.node.gpu import dcgm

        try:
            collector = dcgm.DcgmCollector.from_bindings(nvlink_per_link=config.nvlink_per_link)
        except dcgm.DcgmUnavailable as exc:
            if backend == "dcgm":
                raise ConfigError(f"--gpu-backend dcgm: {exc}") from exc
            log.info("babysitter: DCGM not used (%s); trying NVML", exc)
        else:
            return collector, "dcgm", _pynvml_or_none()
    try:
        lib = load_pynvml()
    except NvmlUnavailable as exc:
        if backend == "nvml" or explicit:
            raise ConfigError(str(exc)) from exc
        log.warning("babysitter: no GPU collector: %s", exc)
        return None, "none", None
    gpu = GpuCollector(lib, nvlink_per_link=config.nvlink_per_link)
    _start_bounded(gpu, config.collector_timeout)
    return gpu, "nvml", lib


def _start_bounded(gpu: GpuCollector, timeout: float) -> None:
    """Start NVML without letting a hung driver keep the agent from serving.

    No driver yet (a node still booting, a driver upgrade) is logged and retried by the collector; a
    start that hangs keeps running in the background while the collector reports failure.
    """

    def work() -> None:
        try:
            gpu.start()
        except NvmlUnavailable as exc:
            log.error("babysitter: %s; the gpu collector reports failure and retries", exc)
        except Exception as exc:
            log.error("babysitter: GPU collector start failed: %s", exc)

    thread = threading.Thread(target=work, name="bs-gpu-start", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        log.error(
            "babysitter: NVML did not answer within %g s at start; serving without GPU metrics", timeout
        )


def _pynvml_or_none() -> Any:
    try:
        return load_pynvml()
    except NvmlUnavailable:
        return None


def _optional(
    module: str, cls_name: str, config: AgentConfig, name: str, make: Callable[[Any], Any]
) -> Collector | None:
    """A collector from another module of the agent; None (logged) when it is not in this build."""
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError) as exc:
        if config.collectors.get(name):
            raise ConfigError(f"collector {name} is not available: {exc}") from exc
        log.warning("babysitter: collector %s not available in this build: %s", name, exc)
        return None
    try:
        collector = make(cls)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"collector {name}: {exc}") from exc
    start = getattr(collector, "start", None)
    if callable(start):
        start()
    result: Collector = collector
    return result


def write_port_file(path: Path, address: str) -> None:
    """Write ``address`` atomically, so a reader never sees a partial line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".port-", dir=path.parent)
    try:
        os.write(fd, (address + "\n").encode())
        os.close(fd)
        fd = -1
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def run(config: AgentConfig, stop: threading.Event) -> int:
    """Serve until ``stop`` is set; 0 on a clean stop. ConfigError/OSError for setup failures."""
    running = build(config)
    try:
        certfile = str(config.tls_cert_file) if config.tls_cert_file else None
        keyfile = str(config.tls_key_file) if config.tls_key_file else None
        try:
            server = Server.start(
                running.agent, config.host, config.bind_port, certfile=certfile, keyfile=keyfile
            )
        except OSError as exc:
            hint = bind_hint(
                exc,
                config.bind_port,
                elsewhere="--listen-address HOST:PORT or --port PORT (--port 0 --port-file FILE: any free "
                "port, written to FILE)",
            )
            raise ConfigError(
                f"cannot serve on {config.host}:{config.bind_port}: {exc}{f'; {hint}' if hint else ''}"
            ) from exc
        try:
            log.info(
                "babysitter: node agent serving %s (collectors: %s; backend: %s)",
                server.url,
                ", ".join(running.agent.collector_names) or "none",
                running.agent.backend,
            )
            if config.port_file is not None:
                write_port_file(config.port_file, server.address)
            stop.wait()
            log.info("babysitter: node agent stopping")
        finally:
            server.stop()
            if config.port_file is not None:
                with contextlib.suppress(OSError):
                    config.port_file.unlink()
    finally:
        running.close()
    return 0
