"""Where a save's checkpoint is now: the one rule every reader of the ledger's paths follows.

A run directory moves (``mv``, a new mount point, a restore from backup) and is copied (to compare
runs, to fork one). The ledger used to store absolute checkpoint paths, so a moved run directory
reported its checkpoints missing while they sat next to the ledger, and a copy checked, and vouched
for, the original's checkpoints. The rule now:

**Writing** (:func:`ledger_path`): a checkpoint inside the run directory (the directory holding the
ledger) is stored relative to it; one outside it (``..``, another mount: deliberately elsewhere) is
stored absolute, as given. The start record stores the absolute directory the ledger was written in
(``dir``), so an absolute path is known to have been outside it.

**Reading** (:func:`resolve`, used by ``babysitter report``, :mod:`babysitter.checkpoints.resume`,
``remediate``'s requeue and the node agent's sentinel), ``run_dir`` being where the ledger is now:

1. A relative path is taken under ``run_dir``: it moves and copies with the run directory.
2. An absolute path inside the directory the ledger was written in (its start record's ``dir``) is
   mapped to the same place under ``run_dir`` (a ledger written relative never has one; a tracker's
   spelling through a symbolic link might).
3. An absolute path inside ``run_dir`` (also once symbolic links are resolved) is used as it is.
4. Ledgers from before this rule (no ``dir``): the original directory is inferred from the path
   itself: the longest tail of it (all but its first component at most) that exists under
   ``run_dir`` is taken to be where it is now. This finds a moved or copied run directory's own
   checkpoints; it can be wrong when the run directory holds an unrelated entry of the same name
   as a checkpoint stored elsewhere, and it cannot tell where a checkpoint deleted from the run
   directory was (that one stays where the ledger says, and is reported missing there, or as in 5).
5. An absolute path outside ``run_dir`` that lies inside another run's directory (one of its
   parents holds a ledger of the same name), when no ``dir`` says it was deliberately outside, is
   ``outside this run directory``: a copied run directory never vouches for the original's
   checkpoint. Otherwise an absolute path outside is a checkpoint stored elsewhere on purpose, and
   is used as it is (the run and its copies share it: that is sound, it is the run's checkpoint).
6. Reading for someone else (``privileged``: the node agent as root, or any process that is not the
   run directory's owner) uses only 1-3: a path that is absolute outside ``run_dir`` or climbs out of
   it with ``..`` is refused, nothing outside the run directory is looked at, and nothing is inferred
   (inferring looks at paths the user chose).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["OUTSIDE", "SavePath", "ledger_path", "reads_for_others", "resolve"]

#: What a path that another run's directory holds is reported as.
OUTSIDE = "outside this run directory"


@dataclass(frozen=True)
class SavePath:
    """Where a save's checkpoint is to be checked now. ``path`` None: it cannot be checked here, and
    ``why`` says why (no path, a URL, outside this run directory, refused). ``inside``: it lies in
    the run directory (it moves and copies with it)."""

    path: Path | None
    inside: bool = False
    why: str = ""
    #: It was found by inferring where an old ledger's run directory was (rule 4).
    inferred: bool = False


def _within(path: str, directory: str) -> str | None:
    """``path`` relative to ``directory`` when it lies inside it (lexically; both normalized and
    absolute), "." for the directory itself, else None."""
    if path == directory:
        return "."
    prefix = directory if directory.endswith("/") else directory + "/"
    return path[len(prefix) :] if path.startswith(prefix) else None


def ledger_path(path: str | os.PathLike[str] | None, run_dir: str | os.PathLike[str]) -> str | None:
    """How the ledger stores a checkpoint path: relative to ``run_dir`` when it lies inside it
    (lexically, or once symbolic links are resolved), else absolute. None stays None."""
    if path is None:
        return None
    text = os.fspath(path)
    if "://" in text:
        return text  # a URL: not a path on this host
    absolute, base = os.path.abspath(text), os.path.abspath(run_dir)
    rel = _within(absolute, base)
    if rel is None:
        rel = _within(os.path.realpath(absolute), os.path.realpath(base))
    return absolute if rel is None else rel


def reads_for_others(run_dir: Path) -> bool:
    """Whether this process reads ``run_dir`` with rights its owner lacks: root, or another user."""
    try:
        return os.geteuid() != os.stat(run_dir).st_uid
    except OSError:
        return True


def _moved(path: str, run_dir: Path) -> Path | None:
    """Rule 4: the longest tail of ``path`` that exists under ``run_dir``."""
    parts = PurePosixPath(path).parts[1:]  # without the root
    for k in range(1, len(parts)):  # drop at least the first component: that much moved
        candidate = run_dir.joinpath(*parts[k:])
        if os.path.lexists(candidate):
            return candidate
    return None


def _another_run(path: str, run_dir: Path, file_name: str) -> bool:
    """Rule 5: a parent of ``path`` (not ``run_dir``) holds a ledger named ``file_name``."""
    here = os.path.abspath(run_dir)
    for parent in PurePosixPath(path).parents:
        if str(parent) != here and os.path.isfile(parent / file_name):
            return True
    return False


def resolve(
    raw: str | None,
    run_dir: Path,
    *,
    origin: str | None = None,
    privileged: bool = False,
    file_name: str = "babysitter-ledger.jsonl",
) -> SavePath:
    """Where the checkpoint the ledger stores as ``raw`` is now (the module doc's rules).

    ``run_dir``: the directory holding the ledger now; ``origin``: the directory it was written in
    (its start record's ``dir``; None for ledgers from before it was recorded); ``privileged``: the
    reader has rights the run's owner lacks (:func:`reads_for_others`); ``file_name``: the ledger's
    name, to recognize another run's directory."""
    if not raw:
        return SavePath(None, why="the ledger has no path for it")
    if "://" in raw:
        return SavePath(None, why="a URL, not a path on this host")
    if "\x00" in raw:
        return SavePath(None, why="not a path")
    if not os.path.isabs(raw):
        below = os.path.normpath(raw)
        if below == ".." or below.startswith("../"):
            if privileged:
                return SavePath(None, why=f"{OUTSIDE} (climbs out of it): not checked for another user")
            return SavePath(run_dir / raw)
        return SavePath(run_dir / below if below != "." else run_dir, inside=True)
    path = os.path.normpath(raw)
    rel: str | None = None
    if origin:
        rel = _within(path, os.path.normpath(origin))
        if rel is not None:
            return SavePath(run_dir / rel if rel != "." else run_dir, inside=True)
    rel = _within(path, os.path.abspath(run_dir))
    if rel is None and not privileged:  # the same directory spelled through a symbolic link
        rel = _within(os.path.realpath(path), os.path.realpath(run_dir))
    if rel is not None:
        return SavePath(run_dir / rel if rel != "." else run_dir, inside=True)
    if privileged:
        return SavePath(None, why=f"{OUTSIDE} (an absolute path): not checked for another user")
    if origin:
        return SavePath(Path(path))  # recorded as outside the run directory: stored elsewhere on purpose
    moved = _moved(path, run_dir)
    if moved is not None:
        return SavePath(moved, inside=True, inferred=True)
    if _another_run(path, run_dir, file_name):
        return SavePath(None, why=f"{OUTSIDE}: {path} is in another run's directory")
    return SavePath(Path(path))
