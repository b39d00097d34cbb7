"""Turning ``watch()``'s arguments and the environment into a checked tracker configuration.

Everything a user can get wrong is checked here, before training starts, with an error that says
what to pass instead. What the environment gets wrong (a busy port, an unwritable directory) is not
an error: the tracker reports it as a metric and one log line, and training goes on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import ssl
import sys
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.export.http import TLSConfig
from babysitter.flops.parallel import ParallelLayout
from babysitter.labels import sanitize_value, validate_labels
from babysitter.training.dist import RankInfo, detect_rank

__all__ = [
    "MANIFEST_MODES",
    "FlopsChoice",
    "PeakChoice",
    "TrackerConfig",
    "manifest_mode",
    "missing_flops_said",
    "resolve",
]

#: ``watch(checkpoint_manifest=...)`` and ``checkpoint_save(manifest=...)`` values
#: (:mod:`babysitter.training.manifests`).
MANIFEST_MODES = ("background", "blocking", "off")


def manifest_mode(value: object, what: str = "checkpoint_manifest") -> str:
    """A manifest mode from a setting (``True`` is ``background``, ``False`` is ``off``); ValueError
    for anything else."""
    if value is True:
        return "background"
    if value is False:
        return "off"
    if isinstance(value, str) and value in MANIFEST_MODES:
        return value
    raise ValueError(f"{what} must be one of {', '.join(MANIFEST_MODES)} (or True/False), got {value!r}")


log = logging.getLogger("babysitter")

DEFAULT_BASE_PORT = 9450
_RUN_NAME = re.compile(r"[^A-Za-z0-9_.:-]+")


@dataclass(frozen=True)
class FlopsChoice:
    """FLOPs per token and where they came from; ``None`` values mean unknown (no MFU)."""

    model: float | None
    hardware: float | None
    source: str


@dataclass(frozen=True)
class PeakChoice:
    """Dense peak FLOP/s of this rank's device for the training dtype, and where it came from."""

    flops_per_second: float | None
    device: str
    dtype: str
    source: str


@dataclass(frozen=True)
class TrackerConfig:
    """Everything the tracker needs, checked."""

    run: str
    rank: RankInfo
    labels: dict[str, str]
    tokens_per_step: int | None
    samples_per_step: int | None
    flops: FlopsChoice
    peak: PeakChoice
    port: int | None
    addr: str
    tls: TLSConfig | None
    registry_dir: Path | None
    run_dir: Path | None
    flush_interval: float
    mfu_window: float
    timing: str
    #: How this rank's data-parallel replica is split (tokens and FLOPs are shared among its ranks).
    parallel: ParallelLayout = field(default_factory=ParallelLayout)


def _positive_number(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _run_name(run: str | None, run_dir: Path | None, env: Mapping[str, str]) -> str:
    candidates = [
        run,
        env.get("BABYSITTER_RUN"),
        run_dir.name if run_dir is not None else None,
        env.get("TORCHELASTIC_RUN_ID") if env.get("TORCHELASTIC_RUN_ID") not in (None, "", "none") else None,
        env.get("SLURM_JOB_ID"),
    ]
    for candidate in candidates:
        if candidate:
            name = _RUN_NAME.sub("_", sanitize_value(candidate)).strip("_")
            if name:
                return name
    return "unnamed"


def _port(port: int | None, rank: RankInfo, env: Mapping[str, str]) -> int | None:
    if port is None:
        raw = env.get("BABYSITTER_PORT")
        base, source = DEFAULT_BASE_PORT, f"the default base port {DEFAULT_BASE_PORT}"
        if raw is not None:
            try:
                base = int(raw)
            except ValueError:
                raise ValueError(f"BABYSITTER_PORT={raw!r} is not an integer") from None
            if base == 0:
                return 0
            source = f"BABYSITTER_PORT={base}"
        port = base + rank.local_rank
        if not 0 < port <= 65535:
            raise ValueError(
                f"the metrics port is {source} + LOCAL_RANK {rank.local_rank} = {port}, outside 1..65535: "
                "check LOCAL_RANK and BABYSITTER_PORT, or pass port= (0 = any free port, -1 = none)"
            )
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"port must be an int, got {type(port).__name__}")
    if port < 0:
        return None  # negative: no HTTP endpoint at all (push-only or tests)
    if port > 65535:
        raise ValueError(f"port must be 0..65535 (0 = any free port, -1 = no endpoint), got {port}")
    return port


def _addr(addr: object) -> str:
    """A bind address of this host: a literal IP (or a name resolving to one) that can be bound."""
    if not isinstance(addr, str) or not addr.strip():
        raise ValueError("addr must be a non-empty address string such as '127.0.0.1' or '0.0.0.0'")
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"addr {addr!r} is not an IP address or a resolvable host name: {exc}") from None
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind(sockaddr)  # port 0: checks the address, takes no port
    except OSError as exc:
        raise ValueError(
            f"addr {addr!r} is not an address of this host ({exc.strerror or exc}); use '127.0.0.1' "
            "(the default: the node agent serves the metrics), '0.0.0.0' or an address of this host"
        ) from None
    return addr


def _tls(tls: object) -> TLSConfig | None:
    """The TLS settings, with the certificate, key and client CA loaded once to prove they work."""
    if tls is None:
        return None
    if not isinstance(tls, TLSConfig):
        raise TypeError(
            f"tls must be a babysitter.TLSConfig(certfile=..., keyfile=...), got {type(tls).__name__}"
        )
    try:
        tls.context()
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"tls: {exc}") from None
    return tls


#: True while a caller that has already said why there are no FLOPs calls ``watch()`` without them.
_MISSING_FLOPS_SAID: ContextVar[bool] = ContextVar("babysitter_missing_flops_said", default=False)


@contextlib.contextmanager
def missing_flops_said() -> Iterator[None]:
    """Inside, ``watch()`` without FLOPs does not log its own warning: the caller (a callback) has
    logged the one line, with the reason and the argument of its own that fixes it."""
    token = _MISSING_FLOPS_SAID.set(True)
    try:
        yield
    finally:
        _MISSING_FLOPS_SAID.reset(token)


def _flops(
    model: object,
    flops_per_token: object,
    hardware_flops_per_token: float | None,
    seq_len: int | None,
) -> FlopsChoice:
    from babysitter import flops as flops_mod

    # A callback that already tried the model and said why it gives no FLOPs passes the model on for
    # its other uses (the device, the layout): it is not asked again, which would raise.
    if flops_per_token is None and (model is None or _MISSING_FLOPS_SAID.get()):
        if not _MISSING_FLOPS_SAID.get():
            log.warning(
                "babysitter: no FLOPs per token, so train_model_flops_total and MFU are not reported: pass "
                "flops_per_token= to watch() (or the model, e.g. watch(model, seq_len=...))"
            )
        return FlopsChoice(None, None, "unknown")
    if flops_per_token is None:
        try:
            per_token = flops_mod.infer(model, seq_len=seq_len)
        except flops_mod.FlopsUnavailable as exc:
            hint = {
                "seq_len": " (the length of the sequences it trains on)",
                "flops_per_token": (
                    " (a number, or babysitter.flops.estimate(...), from_parameters(...) or "
                    "measure(...).per_token())"
                ),
            }.get(exc.argument, "")
            raise flops_mod.FlopsUnavailable(
                exc.reason,
                argument=exc.argument,
                pending=exc.pending,
                message=(
                    f"cannot derive FLOPs per token from the model: {exc.reason}. Pass {exc.argument}={hint}"
                ),
            ) from exc
    elif isinstance(flops_per_token, flops_mod.FlopsPerToken):
        per_token = flops_per_token
    else:
        value = _positive_number("flops_per_token", flops_per_token)
        per_token = flops_mod.FlopsPerToken(model=value, hardware=value, source="explicit")
    model_flops = _positive_number("flops_per_token", per_token.model)
    hardware = per_token.hardware
    if hardware_flops_per_token is not None:
        hardware = _positive_number("hardware_flops_per_token", hardware_flops_per_token)
    if hardware < model_flops:
        raise ValueError("hardware_flops_per_token counts recomputation and cannot be below flops_per_token")
    if per_token.note:
        level = logging.WARNING if per_token.source == "params:no-attention" else logging.INFO
        log.log(level, "babysitter: %s", per_token.note)
    return FlopsChoice(model_flops, float(hardware), per_token.source)


def _peak(peak_flops: float | None, dtype: object, device: str | None) -> PeakChoice:
    from babysitter import hardware

    # fp32 training whose matmuls run on TF32 tensor cores is measured against the TF32 peak.
    dtype_name = hardware.matmul_dtype(dtype) if dtype is not None else "bf16"
    if peak_flops is not None:
        value = _positive_number("peak_flops", peak_flops)
        return PeakChoice(value, device or "user", dtype_name, "explicit")
    name = device if device is not None else hardware.detect_device_name()
    if name is None:
        log.warning(
            "babysitter: no accelerator found; MFU is not reported (pass peak_flops= to set the peak)"
        )
        return PeakChoice(None, "cpu", dtype_name, "none")
    entry = hardware.lookup_peak(name, dtype_name)
    if entry is None:
        return PeakChoice(None, name, dtype_name, "unknown")
    return PeakChoice(entry.flops_per_second, entry.device, entry.dtype, entry.source)


def _timing(timing: str, model: object) -> str:
    if timing not in ("auto", "cpu", "cuda"):
        raise ValueError(f"timing must be 'auto', 'cpu' or 'cuda', got {timing!r}")
    if timing != "auto":
        return timing
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return "cpu"
    try:
        if not torch.cuda.is_available():
            return "cpu"
        if model is not None and hasattr(model, "parameters"):
            first = next(iter(model.parameters()), None)
            if first is not None and first.device.type != "cuda":
                return "cpu"
        return "cuda"
    except Exception:
        return "cpu"


def resolve(
    *,
    model: object,
    run: str | None,
    tokens_per_step: int | None,
    samples_per_step: int | None,
    flops_per_token: object,
    hardware_flops_per_token: float | None,
    seq_len: int | None,
    peak_flops: float | None,
    dtype: object,
    device: str | None,
    port: int | None,
    addr: str,
    tls: TLSConfig | None,
    registry_dir: str | os.PathLike[str] | None,
    run_dir: str | os.PathLike[str] | None,
    labels: Mapping[str, object] | None,
    flush_interval: float,
    mfu_window: float,
    timing: str,
    env: Mapping[str, str] | None = None,
    parallelism: object = None,
) -> TrackerConfig:
    """Check every argument; raise TypeError/ValueError naming the bad one."""
    from babysitter.flops.parallel import resolve_layout

    env = os.environ if env is None else env
    rank = detect_rank(env)
    run_path = Path(run_dir) if run_dir is not None else None
    if tokens_per_step is not None:
        tokens_per_step = _count("tokens_per_step", tokens_per_step)
    if samples_per_step is not None:
        samples_per_step = _count("samples_per_step", samples_per_step)
    if seq_len is not None and _count("seq_len", seq_len) == 0:
        raise ValueError("seq_len must be > 0")
    addr = _addr(addr)
    tls = _tls(tls)
    registry_path: Path | None = None
    if registry_dir is not None:
        registry_path = Path(registry_dir)
    else:
        from babysitter.registration import default_dir

        registry_path = default_dir()
    return TrackerConfig(
        run=_run_name(run, run_path, env),
        rank=rank,
        labels=validate_labels(labels),
        tokens_per_step=tokens_per_step,
        samples_per_step=samples_per_step,
        flops=_flops(model, flops_per_token, hardware_flops_per_token, seq_len),
        peak=_peak(peak_flops, dtype, device),
        port=_port(port, rank, env),
        addr=addr,
        tls=tls,
        registry_dir=registry_path,
        run_dir=run_path,
        flush_interval=_positive_number("flush_interval", flush_interval),
        mfu_window=_positive_number("mfu_window", mfu_window),
        timing=_timing(timing, model),
        parallel=resolve_layout(parallelism, world_size=rank.world_size, model=model),
    )
