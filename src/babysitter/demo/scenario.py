"""The demo's script of faults: a JSON file format, its validation, and the default scenario.

A scenario is ``{"duration": S, "gpus": N, "gpu_model": "H100", "events": [...]}``; each event has
``at`` (seconds since the demo started) and ``event``:

* training faults, played inside the training process: ``slow_checkpoint`` (``seconds``: the next
  checkpoint save blocks that long, as on a slow file system), ``hang`` (``seconds``: the training
  loop stops stepping, as in a stuck collective; the process still answers scrapes), ``slow_data``
  (``seconds``, ``wait``: for that long each batch waits ``wait`` seconds for the input pipeline,
  counted by the tracker's ``data()``), ``eval`` (``seconds``: an eval phase of forward passes,
  marked with the tracker's ``phase("eval")``), ``loss_spike`` and ``nan_loss`` (``seconds``: for
  that long the model's logits are scaled up 30x, or made NaN, as in a numerically bad stretch; the
  loop skips those updates, as a spike guard or AMP's grad scaler does);
* process faults, played by the demo: ``kill`` (SIGKILL the training process; it is restarted after
  ``restart_after`` seconds, default 5, and resumes from its last checkpoint, so the steps since then
  are lost progress; ``null`` leaves it dead) and ``freeze`` (SIGSTOP for ``seconds``, then SIGCONT:
  the process stops answering scrapes too);
* node faults, played by the node agent's GPU simulator, with ``gpu``: every event of
  :mod:`babysitter.node.gpu.simulate` (``xid79``, ``xid``, ``lost``, ``recover``, ``throttle``, ``ecc``...).

``expect`` (a list of alert names) says which pages the fault must cause; each kind has a default
(:data:`EXPECTED`), and the demo's closing table shows, for every fault, when its page arrived.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.node.gpu.simulate import EVENTS as SIM_EVENTS
from babysitter.node.gpu.simulate import GPU_MODELS, THROTTLED_CLOCK, parse_scenario

__all__ = [
    "DEFAULT_SCENARIO",
    "EXPECTED",
    "NODE_EVENTS",
    "PROCESS_EVENTS",
    "TRAINER_EVENTS",
    "DemoEvent",
    "Scenario",
    "default_scenario",
    "load_scenario",
    "parse_scenario_data",
]

TRAINER_EVENTS = frozenset({"slow_checkpoint", "hang", "slow_data", "eval", "loss_spike", "nan_loss"})
PROCESS_EVENTS = frozenset({"kill", "freeze"})
#: The simulator's faults, as the demo scripts them: its ``hang`` (a GPU that stops answering) is
#: ``hang_gpu`` here, ``hang`` being the trainer's; ``unsupported`` and ``error`` test the agent alone.
NODE_EVENTS = (SIM_EVENTS - {"hang", "unsupported", "error"}) | {"hang_gpu"}

#: The alerts each kind of fault must page, unless the event says otherwise with ``expect``.
EXPECTED: dict[str, tuple[str, ...]] = {
    "slow_checkpoint": ("CheckpointSaveSlow",),
    "hang": ("TrainingStalled",),
    "freeze": ("TrainingStalled",),
    "kill": ("TrainingProcessExited",),
    "nan_loss": ("TrainingNonFiniteLoss",),
    # One page per GPU fault: the paging Xid inhibits the GPU's GpuDown (exporters/alertmanager.yml);
    # Xid 48's action is a workflow (a warning), its page the uncorrectable ECC error.
    "xid79": ("GpuXidCritical",),
    "xid48": ("GpuEccUncorrectable",),
    "lost": ("GpuDown",),
}

_MAX_DURATION = 24 * 3600.0
#: The longest a ``slow_data`` batch may wait, in seconds (a stall, not a hang).
_MAX_DATA_WAIT = 10.0


@dataclass(frozen=True)
class DemoEvent:
    """One scripted fault."""

    at: float
    event: str
    gpu: int | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    expect: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        """``seconds`` of a timed fault (every trainer fault, and freeze)."""
        return float(self.args.get("seconds", 0.0))

    def describe(self) -> str:
        """A short human description, for the terminal."""
        if self.event == "slow_checkpoint":
            return f"slow checkpoint save ({self.seconds:g} s)"
        if self.event == "hang":
            return f"training hangs for {self.seconds:g} s (stuck collective)"
        if self.event == "slow_data":
            wait = float(self.args.get("wait", 0.0))
            return f"input pipeline slow: each batch waits {wait:g} s, for {self.seconds:g} s"
        if self.event == "eval":
            return f"eval phase ({self.seconds:g} s)"
        if self.event == "loss_spike":
            return f"loss spikes for {self.seconds:g} s (logits 30x)"
        if self.event == "nan_loss":
            return f"loss is NaN for {self.seconds:g} s"
        if self.event == "freeze":
            return f"training process frozen (SIGSTOP) for {self.seconds:g} s"
        if self.event == "kill":
            after = self.args.get("restart_after", 5.0)
            tail = "not restarted" if after is None else f"restarted after {float(after):g} s"
            return f"training killed (SIGKILL), {tail}"
        if self.event == "xid79":
            return f"Xid 79 on GPU {self.gpu}: fallen off the bus"
        if self.event == "recover":
            return f"GPU {self.gpu} back (reset)"
        if self.event == "throttle":
            return f"GPU {self.gpu} throttles ({' + '.join(map(str, self.args.get('reasons', ())))})"
        if self.event == "clear_throttle":
            return f"GPU {self.gpu} stops throttling"
        extra = " ".join(f"{k}={v}" for k, v in self.args.items())
        return f"GPU {self.gpu}: {self.event} {extra}".rstrip()


@dataclass(frozen=True)
class Scenario:
    """A validated scenario."""

    duration: float
    gpus: int
    gpu_model: str
    events: tuple[DemoEvent, ...]

    def node_events(self) -> list[dict[str, Any]]:
        """The node faults in the simulator's scenario format (``hang_gpu`` becomes its ``hang``)."""
        return [
            {
                "at": e.at,
                "gpu": e.gpu,
                "event": "hang" if e.event == "hang_gpu" else e.event,
                **dict(e.args),
            }
            for e in self.events
            if e.event in NODE_EVENTS
        ]

    def trainer_events(self, gpu: int | None = None) -> list[dict[str, Any]]:
        """The faults the training process plays itself; with ``gpu`` (the simulated GPU the training
        claims), also that GPU's clock: a ``throttle`` on it slows each step's compute to the
        simulator's throttled SM clock (:data:`THROTTLED_CLOCK`) until a ``clear_throttle``, as a
        throttled GPU slows the training on it (``gpu_clock`` events, ``factor`` the clock ratio)."""
        played = [
            {
                "at": e.at,
                "event": e.event,
                "seconds": e.seconds,
                **({"wait": float(e.args["wait"])} if e.event == "slow_data" else {}),
            }
            for e in self.events
            if e.event in TRAINER_EVENTS
        ]
        clocks = {"throttle": THROTTLED_CLOCK, "clear_throttle": 1.0}
        played += [
            {"at": e.at, "event": "gpu_clock", "factor": clocks[e.event]}
            for e in self.events
            if gpu is not None and e.gpu == gpu and e.event in clocks
        ]
        return sorted(played, key=lambda e: float(e["at"]))

    def truncated(self, duration: float) -> tuple[Scenario, list[DemoEvent]]:
        """This scenario cut to ``duration`` seconds, and the events that no longer fit."""
        keep = tuple(e for e in self.events if e.at < duration)
        dropped = [e for e in self.events if e.at >= duration]
        return Scenario(duration, self.gpus, self.gpu_model, keep), dropped


def _number(where: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{where} must be >= 0, got {value!r}")
    return float(value)


def parse_scenario_data(data: object) -> Scenario:
    """Validate decoded scenario JSON; ValueError naming the bad field."""
    if not isinstance(data, dict):
        raise ValueError('a demo scenario is an object: {"duration": S, "events": [...]}')
    unknown = set(data) - {"duration", "gpus", "gpu_model", "events", "description"}
    if unknown:
        raise ValueError(f"unknown scenario keys: {', '.join(sorted(unknown))}")
    duration = _number("duration", data.get("duration", 120.0))
    assert duration is not None
    if not 10.0 <= duration <= _MAX_DURATION:
        raise ValueError(f"duration must lie between 10 s and {_MAX_DURATION:g} s, got {duration:g}")
    gpus = data.get("gpus", 8)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 64:
        raise ValueError(f"gpus must be an integer from 1 to 64, got {gpus!r}")
    model = data.get("gpu_model", "H100")
    if model not in GPU_MODELS:
        raise ValueError(f"gpu_model must be one of {', '.join(GPU_MODELS)}, got {model!r}")
    raw = data.get("events", [])
    if not isinstance(raw, list):
        raise ValueError("events must be a list")
    events: list[DemoEvent] = []
    for i, item in enumerate(raw):
        events.append(_event(f"event {i}", item, gpus))
    events.sort(key=lambda e: e.at)
    scenario = Scenario(duration, gpus, model, tuple(events))
    # The simulator validates the node faults' own arguments, with its own messages.
    parse_scenario(scenario.node_events(), gpus)
    return scenario


def _event(where: str, item: object, gpus: int) -> DemoEvent:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: not an object")
    kind = item.get("event")
    known = TRAINER_EVENTS | PROCESS_EVENTS | NODE_EVENTS
    if kind not in known:
        raise ValueError(f"{where}: unknown event {kind!r}; one of {', '.join(sorted(known))}")
    at = _number(f"{where}: 'at'", item.get("at"))
    assert at is not None
    args = {k: v for k, v in item.items() if k not in ("at", "event", "gpu", "expect")}
    if kind in TRAINER_EVENTS or kind == "freeze":
        seconds = _number(f"{where}: 'seconds'", args.get("seconds"))
        if not seconds:
            raise ValueError(f"{where}: {kind} needs 'seconds' > 0")
    if kind == "slow_data":
        wait = _number(f"{where}: 'wait'", args.get("wait"))
        if not wait or wait > _MAX_DATA_WAIT:
            raise ValueError(f"{where}: slow_data needs 'wait' > 0 and <= {_MAX_DATA_WAIT:g} s, got {wait!r}")
    if kind == "kill":
        _number(f"{where}: 'restart_after'", args.get("restart_after", 5.0), allow_none=True)
    gpu: int | None = None
    if kind in NODE_EVENTS:
        raw_gpu = item.get("gpu")
        if isinstance(raw_gpu, bool) or not isinstance(raw_gpu, int) or not 0 <= raw_gpu < gpus:
            raise ValueError(f"{where}: {kind} needs 'gpu' from 0 to {gpus - 1}, got {raw_gpu!r}")
        gpu = raw_gpu
    elif "gpu" in item:
        raise ValueError(f"{where}: {kind} is not a GPU event; remove 'gpu'")
    expect = item.get("expect", list(EXPECTED.get(str(kind), ())))
    if not isinstance(expect, list) or not all(isinstance(x, str) and x.isidentifier() for x in expect):
        raise ValueError(f"{where}: 'expect' must be a list of alert names")
    return DemoEvent(at, str(kind), gpu, args, tuple(expect))


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file; ValueError with the path when it is unreadable or wrong."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"scenario {path}: {exc}") from exc
    try:
        return parse_scenario_data(data)
    except ValueError as exc:
        raise ValueError(f"scenario {path}: {exc}") from exc


#: The default story, about two minutes: each fault well apart so every page is easy to follow. The
#: throttle comes first, after a healthy stretch, so that the 20 s the demo explains and the 30 s
#: before them hold no other fault, nor a hang's stuck step in the rules' 20 s rate window (issue 22:
#: explained 3 s after the hang, its line read "0.4x" in one run and "1.8x" in the next). The GPU
#: stays throttled, as a hot GPU does, so the rest of the run (and --keep) runs on it.
DEFAULT_SCENARIO: dict[str, Any] = {
    "description": (
        "healthy stretch, the training's GPU throttles (explained on screen), slow checkpoint, Xid 79, "
        "training killed and restarted, hang, recovery"
    ),
    "duration": 125,
    "gpus": 8,
    "gpu_model": "H100",
    "events": [
        {
            "at": 28,
            "event": "throttle",
            "gpu": 6,
            "reasons": ["hw_slowdown", "hw_thermal_slowdown"],
            "expect": ["GpuThrottled"],
        },
        {"at": 50, "event": "slow_checkpoint", "seconds": 6},
        {"at": 58, "event": "xid79", "gpu": 3},
        {"at": 66, "event": "kill", "restart_after": 4},
        {"at": 76, "event": "recover", "gpu": 3},
        {"at": 83, "event": "hang", "seconds": 22},
    ],
}


def default_scenario() -> Scenario:
    """The built-in scenario (also in ``examples/demo-scenario.json``)."""
    return parse_scenario_data(DEFAULT_SCENARIO)
