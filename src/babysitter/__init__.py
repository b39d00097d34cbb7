"""babysitter: MFU and goodput observability for LLM training."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
