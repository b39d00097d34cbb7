"""Reading loss values without a per-step device synchronization.

The training thread only keeps a reference to the latest loss object. The housekeeping thread,
about once a second, turns it into a float: Python numbers directly, CPU tensors by reading them,
and CUDA tensors by a non-blocking copy into pinned host memory on a side stream that waits on the
training thread's stream (``Stream.wait_stream``); the copy's completion is polled with
``Event.query`` at the next pass.
"""

from __future__ import annotations

import math
import sys
from typing import Any

__all__ = ["LossReader"]


class LossReader:
    """Turns the latest loss object into a float, off the training thread."""

    def __init__(self, training_stream: Any = None) -> None:
        # The stream the training thread computes on, captured on that thread at watch() time:
        # streams are per-thread, so this thread's "current stream" would be the wrong one.
        self._training_stream = training_stream
        self.value: float | None = None
        self.nonfinite = 0
        self._last: object = None  # the object last read: each loss is read (and counted) once
        self._pending: tuple[Any, Any, Any] | None = None  # (source tensor, host copy, done event)
        self._stream: Any = None

    def poll(self, latest: object) -> None:
        """Advance: finish a pending device copy, then start reading ``latest`` (if new)."""
        if self._pending is not None:
            _source, host, done = self._pending
            if not done.query():
                return
            self._pending = None
            self._set(float(host.item()))
        if latest is None or latest is self._last:
            return
        self._last = latest
        if isinstance(latest, (int, float)):
            self._set(float(latest))
            return
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(latest, torch.Tensor):
            raise TypeError(f"loss must be a number or a torch.Tensor, got {type(latest).__name__}")
        tensor = latest.detach()
        if tensor.numel() != 1:
            raise ValueError(f"loss must be a scalar, got shape {tuple(tensor.shape)}")
        if tensor.device.type == "cpu":
            self._set(float(tensor.reshape(()).item()))
            return
        if tensor.device.type != "cuda":
            raise TypeError(f"reading a loss on {tensor.device.type} devices is not supported yet")
        self._start_cuda_copy(torch, tensor)

    def _start_cuda_copy(self, torch: Any, tensor: Any) -> None:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=tensor.device)
        side = self._stream
        host = torch.empty((), dtype=tensor.dtype, pin_memory=True)
        with torch.cuda.stream(side):
            # The side stream waits for the training stream on the device; the host never waits.
            training = self._training_stream or torch.cuda.default_stream(tensor.device)
            side.wait_stream(training)
            host.copy_(tensor.reshape(()), non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        tensor.record_stream(side)
        self._pending = (tensor, host, done)

    def _set(self, value: float) -> None:
        if math.isfinite(value):
            self.value = value
        else:
            self.nonfinite += 1
            self.value = value
