"""Where NaN began: the first step at which this rank's loss, or gradient norm, stopped being finite.

``train_loss`` samples the latest loss about once a second; that cannot say which rank went first,
because a NaN on one rank reaches every rank within a step (the gradient all-reduce spreads it, and
the next step's losses are NaN everywhere). So the tracker keeps a reference to *every* step's loss
and gradient norm (``step(loss=..., grad_norm=...)``: two list stores on the hot path, a ring of
:data:`RING` steps) and this reader looks at each of them off the training thread:

* Python numbers: ``math.isfinite``;
* CPU tensors: read;
* CUDA tensors: stacked and copied to pinned host memory on a side stream that waits for the training
  stream (``Stream.wait_stream``), completion polled with ``Event.query`` at the next pass: the host
  never waits for the device, as with the loss reader.

The first non-finite step per signal is exported as ``train_nonfinite_first_step{signal}`` and logged
once with the rank and host; ``TrainingNonFiniteLoss`` names the rank whose loss went first (the
loss is computed before any collective, so it points at the rank where the NaN came from; a gradient
norm taken after the all-reduce is the same on every rank and ties). More than :data:`RING` steps
between two housekeeping passes drop the oldest (counted; the first step is then at most that late).
A successful ``checkpoint_load`` (a rollback) starts over.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from babysitter.catalog import integrity as I

__all__ = ["RING", "NonFiniteWatch"]

log = logging.getLogger("babysitter")

#: Steps of losses and gradient norms the tracker keeps between two housekeeping passes.
RING = 1024


class NonFiniteWatch:
    """The first non-finite step of each signal on this rank (fed by the tracker's housekeeping)."""

    def __init__(self, where: Callable[[], str], training_stream: Any = None) -> None:
        self._where = where
        self._training_stream = training_stream
        self.first: dict[str, int] = {}
        self.dropped = 0
        self._pending: list[tuple[str, list[int], Any, Any]] = []  # (signal, steps, host copy, event)
        self._stream: Any = None

    def reset(self) -> None:
        """Forget the first steps (the run rolled back to a checkpoint)."""
        self.first.clear()
        self._pending.clear()

    def _found(self, signal: str, step: int) -> None:
        if signal in self.first and self.first[signal] <= step:
            return
        self.first[signal] = step
        log.error(
            "babysitter: %s: the %s is not finite at step %d, the first such step here",
            self._where(),
            "loss" if signal == "loss" else "gradient norm",
            step,
        )

    def scan(self, entries: Sequence[tuple[int, object, object]]) -> None:
        """Look at ``(step, loss, grad_norm)`` of the steps since the last pass, oldest first."""
        self._poll()
        batches: dict[str, tuple[list[int], list[Any]]] = {}
        for step, *values in entries:
            for signal, value in zip(I.NONFINITE_SIGNALS, values, strict=True):
                if value is None or signal in self.first:
                    continue
                if value.__class__ is float or value.__class__ is int:
                    if not math.isfinite(value):
                        self._found(signal, step)
                    continue
                device = getattr(getattr(value, "device", None), "type", None)
                if device == "cpu":
                    if not math.isfinite(float(value.detach().reshape(()).item())):  # type: ignore[attr-defined]
                        self._found(signal, step)
                elif device == "cuda":
                    steps, tensors = batches.setdefault(signal, ([], []))
                    steps.append(step)
                    tensors.append(value)
                else:
                    try:
                        number = float(value)  # type: ignore[arg-type]
                    except (TypeError, ValueError):
                        continue
                    if not math.isfinite(number):
                        self._found(signal, step)
        for signal, (steps, tensors) in batches.items():
            self._start_copy(signal, steps, tensors)

    def _start_copy(self, signal: str, steps: list[int], tensors: list[Any]) -> None:
        torch = sys.modules["torch"]
        device = tensors[0].device
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        side = self._stream
        with torch.cuda.stream(side):
            side.wait_stream(self._training_stream or torch.cuda.default_stream(device))
            stacked = torch.stack([t.detach().reshape(()).float() for t in tensors])
            host = torch.empty(stacked.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(stacked, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        for t in tensors:
            t.record_stream(side)
        self._pending.append((signal, steps, host, done))

    def _poll(self) -> None:
        still = []
        for signal, steps, host, done in self._pending:
            if not done.query():
                still.append((signal, steps, host, done))
                continue
            for step, value in zip(steps, host.tolist(), strict=True):
                if not math.isfinite(value):
                    self._found(signal, step)
                    break
        self._pending = still

    def metrics(self, label_names: list[str], label_values: list[str]) -> list[Any]:
        """``train_nonfinite_first_step{signal}`` once a signal was non-finite (a metrics source)."""
        if not self.first:
            return []
        family = I.NONFINITE_FIRST_STEP.family(label_names)
        for signal in I.NONFINITE_SIGNALS:
            if signal in self.first:
                family.add_metric([*label_values, signal], float(self.first[signal]))  # type: ignore[attr-defined]
        return [family]
