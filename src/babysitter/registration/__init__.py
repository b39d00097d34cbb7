"""The local registration directory: how a node agent finds every tracker endpoint on its host.

Each tracker writes one small JSON file per metrics endpoint into its own user's directory
(``<dir>/<uid>/<pid>-<port>.json``, see :mod:`babysitter.registration._write`); the agent lists them
with a :class:`Scanner`, which trusts nothing in them (see :mod:`babysitter.registration.scan` and
docs/security.md), and serves those endpoints' metrics on its own port.
"""

from __future__ import annotations

from pathlib import Path

from babysitter.registration._endpoint import MAX_PID, Endpoint, Target, parse_endpoint, parse_target
from babysitter.registration._write import (
    ENV_DIR,
    default_dir,
    process_start_time,
    register,
    unregister,
    user_dir,
)
from babysitter.registration.scan import (
    SKIP_REASONS,
    Network,
    Registered,
    Scanner,
    is_alive,
    read_registration,
)

__all__ = [
    "ENV_DIR",
    "MAX_PID",
    "SKIP_REASONS",
    "Endpoint",
    "Network",
    "Registered",
    "Scanner",
    "Target",
    "default_dir",
    "is_alive",
    "list_endpoints",
    "parse_endpoint",
    "parse_target",
    "process_start_time",
    "read_registration",
    "register",
    "unregister",
    "user_dir",
]


def list_endpoints(directory: Path, *, prune: bool = False) -> list[Endpoint]:
    """The endpoints a fresh :class:`Scanner` would serve now (tools and tests; the agent keeps one)."""
    return [r.endpoint for r in Scanner(directory).scan(prune=prune)]
