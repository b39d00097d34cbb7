"""Simulated GPUs for tests and the demo: N fake GPUs of a chosen model and a scenario of timed faults.

The simulator drives :class:`babysitter.node.gpu.fake.FakeNvml`, so the real GPU and Xid collector
code paths run against it. A ticker thread moves the GPUs through a plausible training load (power,
energy, temperature, utilization, tensor activity) and applies scenario events when they fall due.

A scenario is a JSON file: ``{"events": [{"at": 5, "gpu": 3, "event": "xid", "xid": 79}, ...]}``
(a bare list works too), ``at`` in seconds since the simulator started, or, with ``"epoch": <Unix
time>`` next to the events, since that time: several simulated hosts share one clock, and an agent
restarted in the middle replays the events already past (their state, not their Xid events). Events:

``xid`` (``xid``: code) an NVML Xid event, plus a kernel-log line when ``kernel_log`` is set;
``lost`` the GPU stops answering (every NVML call raises ``NVMLError_GpuIsLost``); ``recover``;
``replace`` (a new board in the slot: it answers, its error counters and row remaps start from zero);
``hang`` (``seconds``) every NVML call on the GPU blocks that long (0 ends it);
``throttle`` (``reasons``: list of reason labels of :data:`babysitter.node.gpu.collector.CLOCK_EVENT_REASONS`)
and ``clear_throttle``; ``ecc`` (``type``: corrected|uncorrected, ``count``);
``remap`` (``state``: correctable|uncorrectable|pending|failure, ``count``);
``nvlink`` (``link``, ``type``: replay|recovery|crc_flit|crc_data, ``count``); ``pcie_replay`` (``count``);
``load`` (``utilization``, ``tensor_active``: ratios); ``unsupported`` (``query``: an NVML function name);
``error`` (``query``, ``code``: an NVML return code) that query fails with that error from now on.

Shorthands for the common faults: ``xid79`` (Xid 79, then the GPU is lost) and ``xid48``
(Xid 48 with an uncorrected ECC error and a pending row remap).

``--scenario demo`` (any name in :data:`BUILTIN_SCENARIOS`) needs no file: a few minutes of throttling,
ECC errors, an Xid 48 and a GPU falling off the bus, spread over the simulated GPUs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.node.gpu import fake as F
from babysitter.node.gpu.fake import FakeGpu, FakeNvml

__all__ = [
    "BUILTIN_SCENARIOS",
    "EVENTS",
    "GPU_MODELS",
    "THROTTLED_CLOCK",
    "GpuModel",
    "ScenarioEvent",
    "Simulator",
    "load_scenario",
    "parse_scenario",
    "resolve_model",
    "scenario_epoch",
]

log = logging.getLogger(__name__)

#: A throttled GPU's SM clock (and tensor activity) as a fraction of its unthrottled value.
THROTTLED_CLOCK = 0.7


@dataclass(frozen=True)
class GpuModel:
    """What NVML reports for one GPU model, as far as the simulator needs it."""

    name: str
    memory_bytes: int
    power_limit_watts: float
    idle_watts: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    nvlinks: int
    gpm: bool
    #: Ampere and later remap rows; older GPUs retire pages instead (NVML answers NotSupported).
    row_remapping: bool = True


_GIB = 1024**3
#: Models by short name; names and sizes as nvidia-smi reports them on these products.
GPU_MODELS: dict[str, GpuModel] = {
    "H100": GpuModel("NVIDIA H100 80GB HBM3", 80 * _GIB, 700.0, 70.0, 1980, 2619, 18, True),
    "H200": GpuModel("NVIDIA H200", 141 * _GIB, 700.0, 75.0, 1980, 3201, 18, True),
    "B200": GpuModel("NVIDIA B200", 180 * _GIB, 1000.0, 120.0, 1965, 3996, 18, True),
    "A100": GpuModel("NVIDIA A100-SXM4-80GB", 80 * _GIB, 400.0, 55.0, 1410, 1593, 12, False),
    "L40S": GpuModel("NVIDIA L40S", 48 * _GIB, 350.0, 35.0, 2520, 9001, 0, False),
    "V100": GpuModel(
        "Tesla V100-SXM2-32GB", 32 * _GIB, 300.0, 40.0, 1530, 877, 6, False, row_remapping=False
    ),
}

#: The faults a scenario may script.
EVENTS = frozenset(
    {
        "xid",
        "xid79",
        "xid48",
        "lost",
        "recover",
        "replace",
        "hang",
        "throttle",
        "clear_throttle",
        "ecc",
        "remap",
        "nvlink",
        "pcie_replay",
        "load",
        "unsupported",
        "error",
    }
)
_REASON_BITS = {
    "gpu_idle": F.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": F.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": F.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": F.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": F.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": F.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": F.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": F.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": F.nvmlClocksEventReasonDisplayClockSetting,
}
_ECC_TYPES = {
    "corrected": F.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    "uncorrected": F.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
}
_REMAP_STATES = ("correctable", "uncorrectable", "pending", "failure")
_NVLINK_TYPES = {
    "replay": F.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": F.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": F.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": F.NVML_NVLINK_ERROR_DL_CRC_DATA,
}


def resolve_model(name: str) -> GpuModel:
    """The model for a short name (``H100``) or a full NVML name; ValueError listing the choices."""
    key = name.strip().upper()
    if key in GPU_MODELS:
        return GPU_MODELS[key]
    for model in GPU_MODELS.values():
        if model.name.lower() == name.strip().lower():
            return model
    raise ValueError(f"unknown GPU model {name!r}; choose one of {', '.join(GPU_MODELS)}")


@dataclass(frozen=True)
class ScenarioEvent:
    """One timed event of a scenario (see the module docstring)."""

    at: float
    gpu: int
    event: str
    args: Mapping[str, Any] = field(default_factory=dict)


def parse_scenario(data: object, gpu_count: int) -> list[ScenarioEvent]:
    """Validate scenario data; ValueError naming the bad event."""
    raw = data.get("events") if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise ValueError('a scenario is a list of events or {"events": [...]}')
    events: list[ScenarioEvent] = []
    for i, item in enumerate(raw):
        where = f"scenario event {i}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: not an object")
        kind = item.get("event")
        if kind not in EVENTS:
            raise ValueError(f"{where}: unknown event {kind!r}; one of {', '.join(sorted(EVENTS))}")
        try:
            at = float(item.get("at", 0.0))
            gpu = int(item.get("gpu", 0))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: 'at' and 'gpu' must be numbers") from exc
        if not math.isfinite(at) or at < 0:
            raise ValueError(f"{where}: 'at' must be >= 0 seconds")
        if not 0 <= gpu < gpu_count:
            raise ValueError(f"{where}: gpu {gpu} out of range (0..{gpu_count - 1})")
        args = {k: v for k, v in item.items() if k not in ("at", "gpu", "event")}
        _check_args(where, kind, args)
        events.append(ScenarioEvent(at, gpu, kind, args))
    return sorted(events, key=lambda e: e.at)


def _check_args(where: str, kind: str, args: Mapping[str, Any]) -> None:
    if kind == "xid" and not isinstance(args.get("xid"), int):
        raise ValueError(f"{where}: xid needs an integer 'xid'")
    if kind == "throttle":
        reasons = args.get("reasons", [])
        if not isinstance(reasons, list) or not reasons or any(r not in _REASON_BITS for r in reasons):
            raise ValueError(f"{where}: throttle needs 'reasons' from {', '.join(_REASON_BITS)}")
    if kind == "ecc" and args.get("type", "corrected") not in _ECC_TYPES:
        raise ValueError(f"{where}: ecc 'type' is corrected or uncorrected")
    if kind == "remap" and args.get("state", "pending") not in _REMAP_STATES:
        raise ValueError(f"{where}: remap 'state' is one of {', '.join(_REMAP_STATES)}")
    if kind == "nvlink" and args.get("type", "crc_flit") not in _NVLINK_TYPES:
        raise ValueError(f"{where}: nvlink 'type' is one of {', '.join(_NVLINK_TYPES)}")
    if kind in ("unsupported", "error") and not str(args.get("query", "")).startswith("nvml"):
        raise ValueError(f"{where}: {kind} needs 'query', an NVML function name")
    if kind == "error" and not isinstance(args.get("code"), int):
        raise ValueError(f"{where}: error needs an integer NVML return 'code'")
    for key in ("count", "seconds", "utilization", "tensor_active", "link"):
        if key in args and not isinstance(args[key], (int, float)):
            raise ValueError(f"{where}: {key!r} must be a number")


#: Scenarios by name, for demos; GPU numbers are taken modulo the simulated count.
BUILTIN_SCENARIOS: dict[str, list[dict[str, Any]]] = {
    "demo": [
        {"at": 30, "gpu": 2, "event": "throttle", "reasons": ["hw_thermal_slowdown"]},
        {"at": 45, "gpu": 5, "event": "ecc", "type": "corrected", "count": 12},
        {"at": 60, "gpu": 3, "event": "xid48"},
        {"at": 75, "gpu": 1, "event": "nvlink", "link": 4, "type": "crc_flit", "count": 30},
        {"at": 90, "gpu": 2, "event": "clear_throttle"},
        {"at": 120, "gpu": 6, "event": "xid", "xid": 13},
        {"at": 150, "gpu": 7, "event": "xid79"},
    ],
}


def scenario_epoch(path: Path) -> float | None:
    """The Unix time a scenario file's ``at`` counts from (its ``"epoch"``), None when it has none (``at``
    counts from the simulator's start) or is a built-in name; ValueError when it is not a number."""
    if str(path) in BUILTIN_SCENARIOS and not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"scenario {path}: {exc}") from exc
    epoch = data.get("epoch") if isinstance(data, dict) else None
    if epoch is None:
        return None
    if (
        isinstance(epoch, bool)
        or not isinstance(epoch, (int, float))
        or not math.isfinite(epoch)
        or epoch < 0
    ):
        raise ValueError(f"scenario {path}: 'epoch' must be a Unix time in seconds, got {epoch!r}")
    return float(epoch)


def load_scenario(path: Path, gpu_count: int) -> list[ScenarioEvent]:
    """Read and validate a scenario file (or a built-in name); ValueError naming it when wrong."""
    if str(path) in BUILTIN_SCENARIOS and not path.exists():
        events = [{**e, "gpu": int(e["gpu"]) % gpu_count} for e in BUILTIN_SCENARIOS[str(path)]]
        return parse_scenario(events, gpu_count)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"scenario {path}: {exc}") from exc
    try:
        return parse_scenario(data, gpu_count)
    except ValueError as exc:
        raise ValueError(f"scenario {path}: {exc}") from exc


class Simulator:
    """``count`` fake GPUs of ``model`` under load, with ``scenario`` events applied on time."""

    def __init__(
        self,
        count: int,
        model: GpuModel | str = "H100",
        *,
        scenario: Sequence[ScenarioEvent] = (),
        kernel_log: Path | None = None,
        tick_seconds: float = 0.5,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        host: int = 0,
        epoch: float | None = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"simulate at least one GPU, got {count}")
        self.model = resolve_model(model) if isinstance(model, str) else model
        m = self.model
        gpus = F.fake_gpus(
            count,
            host=host,
            name=m.name,
            memory_total=m.memory_bytes,
            power_limit_mw=int(m.power_limit_watts * 1000),
            power_mw=int(m.idle_watts * 1000),
            sm_clock_mhz=m.sm_clock_mhz,
            mem_clock_mhz=m.mem_clock_mhz,
            nvlink_active=m.nvlinks,
            gpm_supported=m.gpm,
        )
        for gpu in gpus:
            if m.row_remapping:
                gpu.unsupported |= {"nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"}
            else:
                gpu.unsupported.add("nvmlDeviceGetRemappedRows")
        self.nvml = FakeNvml(gpus)
        self.kernel_log = kernel_log
        self._pending = list(scenario)
        self._tick = tick_seconds
        self._rng = random.Random(seed)
        self._clock = clock
        self._last = self._t0 = clock()
        if epoch is not None:
            # ``at`` counts from a Unix time shared with whoever wrote the scenario: an agent restarted
            # in the middle of it picks up where the GPUs are (events already past are replayed); one
            # started before it waits for it (an event at 30 s fired 30 s after the agent's start,
            # seconds early, when the agents started while the campaign's stack came up).
            self._t0 -= time.time() - epoch
        self._replay_until = self._clock() - self._t0 if epoch is not None else -1.0
        self._load = [(0.95, 0.45) for _ in gpus]  # (utilization, tensor active) per GPU
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.applied: list[ScenarioEvent] = []
        self.step()

    def start(self) -> None:
        """Run the ticker thread (daemon; :meth:`close` stops it)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bs-simulator", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the ticker."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            try:
                self.step()
            except Exception as exc:  # the simulator must not take the agent down
                log.warning("babysitter: simulator step failed: %s", exc)

    def step(self) -> None:
        """Advance the load model to now and apply the scenario events that are due."""
        now = self._clock()
        elapsed = now - self._t0
        dt = max(now - self._last, 0.0)
        self._last = now
        while self._pending and self._pending[0].at <= elapsed:
            event = self._pending.pop(0)
            self._apply(event, replay=event.at <= self._replay_until)
            self.applied.append(event)
        m = self.model
        for gpu, (util, tensor) in zip(self.nvml.gpus, self._load, strict=True):
            if gpu.lost:
                continue
            jitter = self._rng.uniform(-0.02, 0.02)
            u = min(max(util + jitter, 0.0), 1.0)
            throttled = bool(gpu.clock_event_reasons & ~F.nvmlClocksEventReasonGpuIdle)
            gpu.utilization_gpu = round(u * 100)
            gpu.utilization_memory = round(u * 60)
            gpu.tensor_active_pct = (
                min(max(tensor + jitter, 0.0), 1.0) * 100 * (THROTTLED_CLOCK if throttled else 1.0)
            )
            gpu.memory_used = int(m.memory_bytes * 0.85 * (1.0 if u > 0.05 else 0.0))
            watts = m.idle_watts + (m.power_limit_watts * 0.92 - m.idle_watts) * u
            if throttled:
                watts = min(watts, m.power_limit_watts * 0.75)
            gpu.power_mw = int(watts * 1000)
            gpu.energy_mj += int(watts * dt * 1000)
            target = 35 + 40 * u + (15 if gpu.clock_event_reasons & _THERMAL else 0)
            gpu.temperature_c = round(target + self._rng.uniform(-1, 1))
            gpu.memory_temperature_c = gpu.temperature_c + 8
            gpu.sm_clock_mhz = int(m.sm_clock_mhz * (THROTTLED_CLOCK if throttled else 1.0))

    def _apply(self, event: ScenarioEvent, *, replay: bool = False) -> None:
        """Apply one event; ``replay`` (an event from before this simulator started, anchored
        scenarios only) restores its state but raises no Xid: NVML delivers an event once, and its
        kernel-log line is already in the log."""
        gpu = self.nvml.gpu(event.gpu)
        a = event.args
        kind = event.event
        extra = f" {dict(a)}" if a else ""
        log.info("babysitter: simulator: GPU %d %s%s%s", event.gpu, kind, extra, " (replayed)" * replay)
        if kind in ("xid", "xid79", "xid48"):
            xid = {"xid79": 79, "xid48": 48}.get(kind, int(a.get("xid", 0)))
            if not replay:
                self._xid(event.gpu, xid)
            if kind == "xid79":
                gpu.lost = True
            elif kind == "xid48":
                self._ecc(gpu, F.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, 1)
                rows = list(gpu.remapped_rows)
                rows[1] += 1
                rows[2] = 1
                gpu.remapped_rows = (rows[0], rows[1], rows[2], rows[3])
        elif kind == "lost":
            gpu.lost = True
        elif kind == "recover":
            gpu.lost = False
            gpu.delay_seconds = 0.0
        elif kind == "replace":  # a new board in the slot: answering, nothing counted, nothing pending
            gpu.lost = False
            gpu.delay_seconds = 0.0
            gpu.clock_event_reasons = 0
            gpu.remapped_rows = (0, 0, 0, 0)
            gpu.ecc.clear()
            gpu.nvlink_errors.clear()
            gpu.pcie_replays = 0
        elif kind == "hang":
            gpu.delay_seconds = float(a.get("seconds", 30.0))
        elif kind == "throttle":
            for reason in a["reasons"]:
                gpu.clock_event_reasons |= _REASON_BITS[reason]
        elif kind == "clear_throttle":
            gpu.clock_event_reasons = 0
        elif kind == "ecc":
            self._ecc(gpu, _ECC_TYPES[a.get("type", "corrected")], int(a.get("count", 1)))
        elif kind == "remap":
            rows = list(gpu.remapped_rows)
            index = _REMAP_STATES.index(a.get("state", "pending"))
            rows[index] = 1 if index >= 2 else rows[index] + int(a.get("count", 1))
            gpu.remapped_rows = (rows[0], rows[1], rows[2], rows[3])
        elif kind == "nvlink":
            key = (int(a.get("link", 0)), _NVLINK_TYPES[a.get("type", "crc_flit")])
            gpu.nvlink_errors[key] = gpu.nvlink_errors.get(key, 0) + int(a.get("count", 1))
        elif kind == "pcie_replay":
            gpu.pcie_replays += int(a.get("count", 1))
        elif kind == "load":
            util, tensor = self._load[event.gpu]
            self._load[event.gpu] = (float(a.get("utilization", util)), float(a.get("tensor_active", tensor)))
        elif kind == "unsupported":
            gpu.unsupported.add(str(a["query"]))
        elif kind == "error":
            gpu.errors[str(a["query"])] = int(a["code"])

    @staticmethod
    def _ecc(gpu: FakeGpu, error_type: int, count: int) -> None:
        for scope in (F.NVML_VOLATILE_ECC, F.NVML_AGGREGATE_ECC):
            gpu.ecc[(error_type, scope)] = gpu.ecc.get((error_type, scope), 0) + count

    def _xid(self, index: int, xid: int) -> None:
        self.nvml.inject_event(index, F.nvmlEventTypeXidCriticalError, xid)
        if self.kernel_log is None:
            return
        gpu = self.nvml.gpu(index)
        domain, bus, rest = gpu.pci_bus_id.lower().split(":")
        pci = f"{int(domain, 16):04x}:{bus}:{rest.split('.')[0]}"
        text = _XID_TEXT.get(xid, "simulated error")
        line = f"NVRM: Xid (PCI:{pci}): {xid}, pid=4242, name=python3, {text}\n"
        try:
            fd = os.open(self.kernel_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("babysitter: simulator could not write %s: %s", self.kernel_log, exc)


_THERMAL = (
    F.nvmlClocksEventReasonSwThermalSlowdown
    | F.nvmlClocksEventReasonHwThermalSlowdown
    | F.nvmlClocksEventReasonHwSlowdown
)
_XID_TEXT = {
    79: "GPU has fallen off the bus.",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
    "subpartition 0.",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_00000000.",
    13: "Graphics Exception: ESR 0x404600=0x80000002",
}
