"""Strict JSON for everything babysitter prints or writes for other programs: never ``NaN`` or ``Infinity``.

Python's ``json`` writes ``NaN``, ``Infinity`` and ``-Infinity`` by default, which no strict parser
(``jq``, JavaScript's ``JSON.parse``, Go's ``encoding/json``) reads: a report or an explanation with one
non-finite number (a rate over an empty window, a value a series carried) was not JSON at all. Here
every non-finite float becomes ``null`` (the value is unknown) before a strict ``json.dumps``
(``allow_nan=False``), so a path that produces one anyway fails loudly instead of writing bad JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite_only"]


def finite_only(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +/-Infinity), however deep, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_only(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_only(item) for item in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``value`` as strict JSON (non-finite numbers as null); kwargs as json.dumps'."""
    return json.dumps(finite_only(value), allow_nan=False, **kwargs)
