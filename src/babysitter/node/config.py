"""Node agent configuration: flags, a config file and the environment, checked once at start.

Precedence: a flag given on the command line, then ``BABYSITTER_NODE_<NAME>`` in the environment,
then the config file (``--config``: JSON, or TOML on Python 3.11+), then the default. Names are the
long flag names: ``--listen-address`` is ``BABYSITTER_NODE_LISTEN_ADDRESS`` and ``listen_address``
(or ``listen-address``) in the file. Lists are arrays in the file; in the environment, paths are
separated by ``os.pathsep`` and networks by commas. Collectors are switched with
``--collector.NAME`` / ``--no-collector.NAME``, ``BABYSITTER_NODE_COLLECTOR_<NAME>=1|0`` or a
``collectors`` table in the file.

Every mistake (an unknown key, a bad address, a TLS key without a certificate, a storage collector
without paths) is a :class:`ConfigError` at start, never a surprise at the first scrape.

The listen address defaults to loopback (``127.0.0.1:9946``): an agent exposes details of the host
and its jobs, so binding every interface is a deliberate choice. The systemd unit and the DaemonSet
in ``exporters/`` set it.
"""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from babysitter import registration
from babysitter.node.workloads.trainers import MAX_SERIES_TOTAL

__all__ = [
    "COLLECTORS",
    "DEFAULT_LISTEN_ADDRESS",
    "DEFAULT_PORT",
    "ENV_PREFIX",
    "SYSFS_COLLECTORS",
    "AgentConfig",
    "ConfigError",
    "add_arguments",
    "load_config",
    "parse_listen_address",
]

ENV_PREFIX = "BABYSITTER_NODE_"
DEFAULT_PORT = 9946
DEFAULT_LISTEN_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
#: Collectors by name, with whether each is on when nothing switches it.
COLLECTORS: dict[str, str] = {
    "gpu": "GPU health over NVML or DCGM (on by default)",
    "xid": "Xid errors from NVML events and the kernel log (on by default)",
    "storage": "storage probe in each --storage-path (on when paths are given)",
    "sentinel": "checkpoint sentinel over each --checkpoint-run-dir (on when dirs are given)",
    "trainers": "metrics of the training processes registered on this host (on by default)",
    "jobs": "which batch job holds each GPU, from --gpu-job-dir (on when the directory is given)",
    "probe": "results of babysitter probe from --probe-results-dir (on when the directory is given)",
    "infiniband": "InfiniBand/RoCE ports from <sysfs>/class/infiniband (on by default; with --simulate only "
    "when --path.sysfs is given)",
    "pcie": "PCIe link width, speed and AER of GPUs and NICs (on by default, as infiniband)",
    "topology": "each GPU's nearest NIC port, fabric_gpu_nic_info (on by default, as infiniband)",
    "edac": "host memory errors from EDAC (on by default, as infiniband)",
    "thermal": "CPU thermal throttle counts (on by default, as infiniband)",
}
#: The collectors that read the host's sysfs: off under --simulate unless --path.sysfs names a tree.
SYSFS_COLLECTORS = ("infiniband", "pcie", "topology", "edac", "thermal")
GPU_BACKENDS = ("auto", "nvml", "dcgm", "none")


class ConfigError(ValueError):
    """A configuration mistake, reported before the agent starts."""


@dataclass
class AgentConfig:
    """Everything the node agent needs to start."""

    listen_address: str = DEFAULT_LISTEN_ADDRESS
    port: int | None = None
    port_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    gpu_backend: str = "auto"
    nvlink_per_link: bool = False
    simulate: int = 0
    gpu_model: str = "H100"
    scenario: Path | None = None
    simulate_kernel_log: Path | None = None
    simulate_host: int = 0
    registry_dir: Path = field(default_factory=registration.default_dir)
    trainer_timeout: float = 2.0
    trainer_series_limit: int = MAX_SERIES_TOTAL
    trainer_ca_file: Path | None = None
    trainer_cert_file: Path | None = None
    trainer_key_file: Path | None = None
    trainer_networks: list[str] = field(default_factory=list)
    kmsg_path: str = "/dev/kmsg"
    xid_state_file: Path | None = None
    storage_path: list[Path] = field(default_factory=list)
    storage_interval: float = 60.0
    storage_size: int = 1024 * 1024
    checkpoint_run_dir: list[Path] = field(default_factory=list)
    checkpoint_keep_last: int = 3
    checkpoint_interval: float = 30.0
    checkpoint_verify_bytes: int = 1 << 30
    checkpoint_reverify_interval: float = 6 * 3600.0
    checkpoint_manifest_grace: float = 1800.0
    checkpoint_run_timeout: float = 60.0
    checkpoint_run_memory: int = 512 << 20
    collector_timeout: float = 10.0
    gpu_job_dir: Path | None = None
    probe_results_dir: Path | None = None
    path_sysfs: Path | None = None
    path_procfs: Path | None = None
    fabric_all_counters: bool = False
    fabric_rescan_interval: float = 60.0
    collectors: dict[str, bool] = field(default_factory=dict)

    @property
    def host(self) -> str:
        """The bind host."""
        return parse_listen_address(self.listen_address)[0]

    @property
    def bind_port(self) -> int:
        """The bind port: ``port`` when given, else the listen address's."""
        return self.port if self.port is not None else parse_listen_address(self.listen_address)[1]

    def enabled(self, name: str) -> bool:
        """Whether collector ``name`` runs: explicit switch, else its default."""
        if name in self.collectors:
            return self.collectors[name]
        if name == "storage":
            return bool(self.storage_path)
        if name == "sentinel":
            return bool(self.checkpoint_run_dir)
        if name == "jobs":
            return self.gpu_job_dir is not None
        if name == "probe":
            return self.probe_results_dir is not None
        if name == "gpu":
            return self.gpu_backend != "none"
        if name in SYSFS_COLLECTORS:
            return not self.simulate or self.path_sysfs is not None
        return True

    @property
    def sysfs(self) -> Path:
        """The sysfs root the hardware collectors read (``--path.sysfs``, default ``/sys``)."""
        return self.path_sysfs or Path("/sys")

    @property
    def procfs(self) -> Path:
        """The procfs root (``--path.procfs``, default ``/proc``)."""
        return self.path_procfs or Path("/proc")


_HELP: dict[str, str] = {
    "listen_address": f"HOST:PORT to serve /metrics on (default {DEFAULT_LISTEN_ADDRESS}; 0.0.0.0: all IPv4)",
    "port": "port to serve on, overriding the listen address's (0: an ephemeral port)",
    "port_file": "write the bound HOST:PORT to this file once serving (for tests and scripts)",
    "tls_cert_file": "serve HTTPS with this PEM certificate (needs --tls-key-file)",
    "tls_key_file": "PEM private key for --tls-cert-file",
    "gpu_backend": "GPU backend: auto (DCGM when its bindings are installed, else NVML), nvml, dcgm, none",
    "nvlink_per_link": "export NVLink errors per link (4 series per link) instead of summed over links",
    "simulate": "simulate COUNT GPUs instead of reading real ones (tests, demos)",
    "gpu_model": "simulated GPU model: H100, H200, B200, A100, L40S, V100",
    "scenario": 'JSON file of timed simulated faults, or "demo" (see babysitter.node.gpu.simulate)',
    "simulate_kernel_log": "with --simulate: append simulated NVRM Xid lines to this file",
    "simulate_host": "with --simulate: this simulated host's number (0-65535), so that its GPUs' UUIDs "
    "differ from other simulated hosts' (a simulated cluster; default 0)",
    "registry_dir": "trainer registration directory (default $BABYSITTER_REGISTRY_DIR or /tmp/babysitter)",
    "trainer_timeout": "seconds to wait for one trainer endpoint (default 2; shorter when Prometheus' "
    "scrape timeout asks for it)",
    "trainer_series_limit": "series served from all trainers of this host per scrape, shared fairly "
    f"between users (default {MAX_SERIES_TOTAL}; docs/security.md)",
    "trainer_ca_file": "CA bundle to verify HTTPS trainer endpoints",
    "trainer_cert_file": "PEM client certificate the agent presents to HTTPS trainer endpoints that "
    "require one (a tracker's TLSConfig(client_cafile=...)); needs --trainer-key-file",
    "trainer_key_file": "PEM private key for --trainer-cert-file",
    "trainer_networks": "network (CIDR, repeatable) trainer endpoints may be in besides loopback, e.g. a pod "
    "network; registrations pointing anywhere else are refused",
    "kmsg_path": "kernel log to read Xid lines from: /dev/kmsg (default), a file, or '' for none",
    "xid_state_file": "keep Xid counts here across agent restarts (exact even when the ring buffer wrapped)",
    "storage_path": "checkpoint directory to probe (repeatable)",
    "storage_interval": "seconds between storage probes (default 60)",
    "storage_size": "bytes written by each storage probe (default 1 MiB)",
    "checkpoint_run_dir": "run directory whose ledger the checkpoint sentinel verifies (repeatable)",
    "checkpoint_keep_last": "how many of the newest checkpoints the sentinel verifies (default 3)",
    "checkpoint_interval": "seconds between checkpoint sentinel passes (default 30)",
    "checkpoint_verify_bytes": "bytes of checkpoint the sentinel reads back per pass to verify digests "
    "against their manifests (default 1 GiB: ~34 MB/s at one pass every 30 s; 0: sizes and headers only)",
    "checkpoint_reverify_interval": "seconds before a verified checkpoint's digests are swept again "
    "(default 21600)",
    "checkpoint_manifest_grace": "seconds a save's promised manifest may take before the save counts as "
    "incomplete (default 1800; at once when its process ended)",
    "checkpoint_run_timeout": "seconds a sentinel pass waits for one run directory's checks before it kills "
    "that run's worker and marks the run's checks failing (default 60; other runs are not delayed beyond it)",
    "checkpoint_run_memory": "bytes one run directory's sentinel worker may allocate beyond its size at "
    "start (RLIMIT_AS; default 512 MiB: a manifest takes ~20 MiB per TB of checkpoint, so the last 3 "
    "checkpoints of ~8 TB each; at least 32 MiB)",
    "collector_timeout": "seconds one collector may take before it is reported failed (default 10)",
    "gpu_job_dir": "per-GPU job id files written by a Slurm prolog (dcgm-exporter's hpc-job-mapping format)",
    "probe_results_dir": "directory where 'babysitter probe --results-dir' writes this host's results",
    "path_sysfs": "sysfs mount point the hardware collectors read (default /sys; a container mounts the "
    "host's, e.g. /host/sys)",
    "path_procfs": "procfs mount point (default /proc; the NVIDIA driver's GPU list is read there)",
    "fabric_all_counters": "export every counter of InfiniBand counters/ and hw_counters/, not only the "
    "default set (about 40 more series per port)",
    "fabric_rescan_interval": "seconds between re-reads of the PCIe tree, RDMA devices and CPU topology "
    "(default 60; 0: every scrape)",
}
#: Flags spelled node_exporter's way (a dot), with the project's dashed spelling kept as an alias.
_FLAG_NAMES: dict[str, tuple[str, ...]] = {
    "path_sysfs": ("--path.sysfs", "--path-sysfs"),
    "path_procfs": ("--path.procfs", "--path-procfs"),
}


_METAVAR = {
    "listen_address": "HOST:PORT",
    "port": "PORT",
    "port_file": "FILE",
    "tls_cert_file": "FILE",
    "tls_key_file": "FILE",
    "gpu_backend": "{auto,nvml,dcgm,none}",
    "simulate": "COUNT",
    "gpu_model": "NAME",
    "scenario": "FILE",
    "simulate_kernel_log": "FILE",
    "simulate_host": "N",
    "registry_dir": "DIR",
    "trainer_ca_file": "FILE",
    "trainer_cert_file": "FILE",
    "trainer_key_file": "FILE",
    "trainer_series_limit": "SERIES",
    "trainer_networks": "CIDR",
    "kmsg_path": "PATH",
    "xid_state_file": "FILE",
    "storage_path": "DIR",
    "storage_size": "BYTES",
    "checkpoint_run_dir": "DIR",
    "checkpoint_keep_last": "K",
    "checkpoint_verify_bytes": "BYTES",
    "checkpoint_run_memory": "BYTES",
    "gpu_job_dir": "DIR",
    "probe_results_dir": "DIR",
    "path_sysfs": "DIR",
    "path_procfs": "DIR",
}


def _kind(name: str) -> str:
    default = {f.name: f for f in fields(AgentConfig)}[name]
    annotation = str(default.type)
    if annotation == "list[str]":
        return "strs"
    if annotation.startswith("list["):
        return "paths"
    if "Path" in annotation:
        return "path"
    if annotation == "bool":
        return "bool"
    if annotation.startswith("int"):
        return "int"
    if annotation == "float":
        return "float"
    return "str"


_FIELDS = [f.name for f in fields(AgentConfig) if f.name != "collectors"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every option to ``parser`` (defaults are None so unset flags fall through to env/file)."""
    parser.add_argument(
        "--config", type=Path, default=None, help="config file (JSON, or TOML on Python 3.11+)"
    )
    for name in _FIELDS:
        flags = _FLAG_NAMES.get(name, ("--" + name.replace("_", "-"),))
        kind = _kind(name)
        metavar = _METAVAR.get(name, "SECONDS" if kind == "float" else None)
        if kind == "bool":
            parser.add_argument(*flags, dest=name, action="store_true", default=None, help=_HELP[name])
        elif kind in ("paths", "strs"):
            parser.add_argument(
                *flags,
                dest=name,
                action="append",
                type=Path if kind == "paths" else str,
                default=None,
                metavar=metavar,
                help=_HELP[name],
            )
        else:
            parser.add_argument(*flags, dest=name, default=None, metavar=metavar, help=_HELP[name])
    for name, help_ in COLLECTORS.items():
        parser.add_argument(
            f"--collector.{name}", dest=f"collector_{name}", action="store_true", default=None, help=help_
        )
        parser.add_argument(
            f"--no-collector.{name}",
            dest=f"collector_{name}",
            action="store_false",
            default=None,
            help=f"disable the {name} collector",
        )


def _convert(name: str, value: Any, source: str) -> Any:
    kind = _kind(name)
    try:
        if kind == "bool":
            return _bool(value)
        if kind == "strs":
            if isinstance(value, str):  # the environment: comma-separated (IPv6 has colons)
                return [v.strip() for v in value.split(",") if v.strip()]
            if isinstance(value, list):
                return [str(v) for v in value]
            raise TypeError("expected a list of strings")
        if kind == "paths":
            if isinstance(value, str):
                return [Path(p) for p in value.split(os.pathsep) if p]
            if isinstance(value, list):
                return [Path(str(p)) for p in value]
            raise TypeError("expected a list of paths")
        if kind == "path":
            return Path(str(value)) if value not in (None, "") else None
        if kind == "int":
            if isinstance(value, bool):
                raise TypeError("expected an integer")
            return int(value)
        if kind == "float":
            return float(value)
        if not isinstance(value, (str, int, float)):
            raise TypeError("expected a string")
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {name.replace('_', '-')}: {value!r}: {exc}") from exc


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true/false or 1/0")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
    try:
        if path.suffix == ".toml":
            try:
                tomllib = importlib.import_module("tomllib")
            except ImportError:
                raise ConfigError(f"config file {path}: TOML needs Python 3.11+; use JSON") from None
            data: Any = tomllib.loads(raw.decode())
        else:
            data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a table/object")
    return data


def load_config(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """Merge flags, environment and config file into a checked :class:`AgentConfig`."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    collectors: dict[str, bool] = {}
    config_path = getattr(args, "config", None) or env.get(ENV_PREFIX + "CONFIG") or None
    if config_path:
        data = _read_file(Path(config_path))
        for key, value in data.items():
            name = key.replace("-", "_").replace(".", "_")
            if name == "collectors":
                if not isinstance(value, dict):
                    raise ConfigError(f"config file {config_path}: collectors must be a table of name = bool")
                for cname, on in value.items():
                    _check_collector(cname, f"config file {config_path}")
                    collectors[cname] = _convert("nvlink_per_link", on, f"config file {config_path}")
            elif name in _FIELDS:
                values[name] = _convert(name, value, f"config file {config_path}")
            else:
                raise ConfigError(f"config file {config_path}: unknown key {key!r}")
    for name in _FIELDS:
        key = ENV_PREFIX + name.upper()
        if key in env:
            values[name] = _convert(name, env[key], f"environment {key}")
    for cname in COLLECTORS:
        key = f"{ENV_PREFIX}COLLECTOR_{cname.upper()}"
        if key in env:
            collectors[cname] = _convert("nvlink_per_link", env[key], f"environment {key}")
    if args is not None:
        for name in _FIELDS:
            value = getattr(args, name, None)
            if value is not None:
                values[name] = _convert(name, value, "flag")
        for cname in COLLECTORS:
            value = getattr(args, f"collector_{cname}", None)
            if value is not None:
                collectors[cname] = bool(value)
    config = AgentConfig(**values, collectors=collectors)
    _validate(config)
    return config


def _check_collector(name: str, source: str) -> None:
    if name not in COLLECTORS:
        raise ConfigError(f"{source}: unknown collector {name!r}; known: {', '.join(COLLECTORS)}")


def parse_listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` into (host, port); ConfigError when malformed or host empty."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(
            f"listen address {text!r}: use HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT} or 0.0.0.0:9946"
        )
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"listen address {text!r}: port {port!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"listen address {text!r}: port out of range")
    return host, number


def _validate(c: AgentConfig) -> None:
    parse_listen_address(c.listen_address)
    if c.port is not None and not 0 <= c.port <= 65535:
        raise ConfigError(f"port {c.port} out of range 0..65535")
    if (c.tls_cert_file is None) != (c.tls_key_file is None):
        raise ConfigError("TLS needs both --tls-cert-file and --tls-key-file")
    if (c.trainer_cert_file is None) != (c.trainer_key_file is None):
        raise ConfigError("a trainer client certificate needs --trainer-cert-file and --trainer-key-file")
    for path in (c.tls_cert_file, c.tls_key_file, c.trainer_ca_file, c.trainer_cert_file, c.trainer_key_file):
        if path is not None and not os.access(path, os.R_OK):
            raise ConfigError(f"{path}: not readable")
    for network in c.trainer_networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError as exc:
            raise ConfigError(f"trainer network {network!r}: {exc}") from None
    if c.gpu_backend not in GPU_BACKENDS:
        raise ConfigError(f"gpu backend {c.gpu_backend!r}: one of {', '.join(GPU_BACKENDS)}")
    if c.simulate < 0:
        raise ConfigError("--simulate COUNT must be >= 0")
    if c.scenario is not None and not c.simulate:
        raise ConfigError("--scenario needs --simulate COUNT")
    if not 0 <= c.simulate_host < 1 << 16 or (c.simulate_host and not c.simulate):
        raise ConfigError("--simulate-host N needs --simulate COUNT and 0 <= N <= 65535")
    for name, value in (
        ("trainer timeout", c.trainer_timeout),
        ("storage interval", c.storage_interval),
        ("collector timeout", c.collector_timeout),
        ("checkpoint interval", c.checkpoint_interval),
        ("checkpoint run timeout", c.checkpoint_run_timeout),
    ):
        if not value > 0:
            raise ConfigError(f"{name} must be positive, got {value}")
    if c.collectors.get("trainers", True) and c.trainer_timeout >= c.collector_timeout:
        # A round of trainer fetches takes up to the trainer timeout: at or above the collector's
        # deadline, one hung trainer would mark the whole trainers collector failed every scrape.
        raise ConfigError(
            f"trainer timeout ({c.trainer_timeout:g} s) must be below the collector timeout "
            f"({c.collector_timeout:g} s): one hung trainer would fail the whole collector"
        )
    if c.trainer_series_limit <= 0:
        raise ConfigError(f"trainer series limit must be positive, got {c.trainer_series_limit}")
    if c.fabric_rescan_interval < 0:
        raise ConfigError(f"fabric rescan interval must be >= 0, got {c.fabric_rescan_interval}")
    for flag, path in (("--path.sysfs", c.path_sysfs), ("--path.procfs", c.path_procfs)):
        if path is not None and not path.is_dir():
            raise ConfigError(f"{flag} {path}: not a directory")
    if c.storage_size <= 0 or c.checkpoint_keep_last <= 0:
        raise ConfigError("storage size and checkpoint keep-last must be positive")
    if (
        c.checkpoint_verify_bytes < 0
        or not c.checkpoint_reverify_interval >= 0
        or not c.checkpoint_manifest_grace >= 0
    ):
        raise ConfigError("checkpoint verify bytes and reverify interval must not be negative")
    if c.checkpoint_run_memory < 32 << 20:
        raise ConfigError(f"checkpoint run memory must be at least 32 MiB, got {c.checkpoint_run_memory}")
    if c.collectors.get("storage") and not c.storage_path:
        raise ConfigError("the storage collector needs at least one --storage-path")
    if c.collectors.get("jobs") and c.gpu_job_dir is None:
        raise ConfigError("the jobs collector needs --gpu-job-dir")
    if c.collectors.get("sentinel") and not c.checkpoint_run_dir:
        raise ConfigError("the sentinel collector needs at least one --checkpoint-run-dir")
    if c.collectors.get("probe") and c.probe_results_dir is None:
        raise ConfigError("the probe collector needs --probe-results-dir")
    if c.xid_state_file is not None and not c.xid_state_file.parent.is_dir():
        raise ConfigError(f"--xid-state-file {c.xid_state_file}: directory {c.xid_state_file.parent} missing")
    if c.collectors.get("gpu") and c.gpu_backend == "none" and not c.simulate:
        raise ConfigError("--collector.gpu contradicts --gpu-backend none")
