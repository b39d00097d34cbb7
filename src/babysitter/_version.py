"""The package version, in a module of its own so that any layer can read it without importing the
public facade (``babysitter/__init__.py`` pulls in the training side)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
