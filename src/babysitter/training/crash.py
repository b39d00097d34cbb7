"""A rank's last words: the uncaught exception that ends it, kept in the run directory.

A crashed rank cannot answer an incident's request, and the launcher usually tears the other ranks
down within seconds (torchrun does), so by the time a page goes out nothing alive remembers why.
With a run directory, ``watch()`` chains a ``sys.excepthook`` that writes the exception, its
traceback and the rank's step to ``RUN_DIR/incidents/crashes/rank<N>-pid<P>-<time>.json`` (0600, in
a 0700 directory) before the previous hook prints it as usual; the gatherer puts the records of the
incident's time in its bundle. At most :data:`KEEP` records are kept (the oldest go). A process
killed by a signal (SIGKILL, the OOM killer) runs no hook: the bundle says the rank did not answer.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import traceback
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any

from babysitter.training import incident_files as F
from babysitter.training.tracker import Tracker

__all__ = ["KEEP", "install", "write_record"]

KEEP = 64
_MAX_FRAMES = 64
_MAX_MESSAGE = 2000
_installed = False
_current: tuple[weakref.ref[Tracker], Path] | None = None


def write_record(
    tracker: Tracker,
    run_dir: Path,
    exc_type: type[BaseException],
    exc: BaseException,
    tb: TracebackType | None,
) -> Path | None:
    """Write one crash record; its path (None when the directory cannot be made)."""
    cfg = tracker.config
    folder = run_dir / F.INCIDENTS / F.CRASHES
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    summary = traceback.extract_tb(tb)[-_MAX_FRAMES:]
    now = time.time()
    age = tracker.seconds_since_last_step()
    record: dict[str, Any] = {
        "v": 1,
        "run": cfg.run,
        "rank": cfg.rank.rank,
        "world_size": cfg.rank.world_size,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": round(now, 6),
        "step": tracker.global_step,
        "seconds_since_last_step": None if age is None else round(age, 3),
        "type": f"{exc_type.__module__}.{exc_type.__qualname__}",
        "message": str(exc)[:_MAX_MESSAGE],
        "frames": [
            {
                "file": f.filename[:300],
                "line": f.lineno or 0,
                "function": f.name[:100],
                "code": (f.line or "")[:200],
            }
            for f in summary
        ],
    }
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    name = f"rank{cfg.rank.rank}-pid{os.getpid()}-{stamp}.json"
    with F.opened_dir(folder) as fd:
        with contextlib.suppress(FileExistsError):
            F.write_json(name, record, dir_fd=fd)
        records = sorted(n for n in os.listdir(fd) if n.startswith("rank") and n.endswith(".json"))
        old = sorted(records, key=lambda n: _mtime(fd, n))[: max(0, len(records) - KEEP)]
        for stale in old:
            with contextlib.suppress(OSError):
                os.unlink(stale, dir_fd=fd)
    return folder / name


def _mtime(fd: int, name: str) -> float:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def install(tracker: Tracker, run_dir: str | os.PathLike[str]) -> bool:
    """Make ``tracker`` the one whose crash is recorded (the newest ``watch()`` of the process), and
    chain the hook into ``sys.excepthook`` the first time; True when the hook was chained now."""
    global _current, _installed
    _current = (weakref.ref(tracker), Path(run_dir))
    if _installed:
        return False
    _installed = True
    previous = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        held = _current
        owner = held[0]() if held is not None else None
        wanted = not issubclass(exc_type, KeyboardInterrupt)
        if wanted and owner is not None and held is not None and not owner.closed:
            try:
                write_record(owner, held[1], exc_type, exc, tb)
            except Exception as error:  # the crash's own report must still be printed
                owner.errors.record("crash_record", error)
        previous(exc_type, exc, tb)

    sys.excepthook = hook
    return True
