"""babysitter: MFU and goodput observability for LLM training.

One line in the training script::

    tracker = babysitter.watch(model, tokens_per_step=batch_size * seq_len, dtype="bf16")

then ``tracker.step()`` once per optimizer step. See :func:`watch`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from babysitter.export.http import TLSConfig
from babysitter.tracker import CheckpointHandle, Tracker, TrackerSnapshot
from babysitter.watch import watch

__all__ = ["CheckpointHandle", "TLSConfig", "Tracker", "TrackerSnapshot", "__version__", "watch"]
