"""babysitter: MFU and goodput observability for LLM training.

One line in the training script::

    tracker = babysitter.watch(model, tokens_per_step=batch_size * seq_len, dtype="bf16")

then ``tracker.step()`` once per optimizer step. See :func:`watch`. The code that runs inside the
training process lives in :mod:`babysitter.training`; ``docs/architecture.md`` maps the rest.
"""

from __future__ import annotations

from babysitter._version import __version__
from babysitter.export.http import TLSConfig
from babysitter.training import CheckpointHandle, Tracker, TrackerSnapshot, watch

__all__ = ["CheckpointHandle", "TLSConfig", "Tracker", "TrackerSnapshot", "__version__", "watch"]
