"""Which checkpoint to resume from: the newest one that VERIFIES, not the newest one that exists.

For each save the ledger records (:func:`babysitter.ledger.reader.read_saves`), newest last, a status:

- ``verified``: its manifest is there, every listed file has its recorded size, the structure checks
  pass, and the node agent's sentinel has not found a digest mismatch in it (its verdict file,
  :mod:`babysitter.checkpoints.verdicts`); with ``deep`` every digest is read back here instead (what
  was just read is fresher than a verdict, and a copied run directory carries the original's
  verdicts file: a mismatch found in the original condemns the copy's same manifest until then).
- ``corrupt``: one of those checks failed (the reason and the file say which).
- ``incomplete``: the tracker promised a manifest and none was committed (the save died half-way, or
  its manifest thread found it incomplete), or the save began and never ended but its path is there.
- ``pending``: the manifest is promised, not written yet, and the save is recent (still hashing).
- ``missing``: the path is gone. ``unknown``: no path, a URL, the storage cannot be read, or the
  path is outside this run directory (reason ``outside``: a copied run directory's ledger naming the
  original's checkpoint, which the copy must not vouch for; :mod:`babysitter.ledger.paths`).
- ``sizes_only``: a save from a tracker that wrote no manifest; it exists with at least its bytes.

Every path is resolved by :func:`babysitter.ledger.paths.resolve`, so a moved run directory checks the
checkpoints where they are now. ``path`` is where it was checked, ``ledger_path`` what the ledger says.

:func:`resume_point` is the newest ``verified`` one. Only when no save of the run promised or has a
manifest (trackers older than manifests, or ``checkpoint_manifest="off"``) is it the newest
``sizes_only`` one, as before manifests, and it says so.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from babysitter.checkpoints.manifest import manifest_path
from babysitter.checkpoints.verdicts import Verdict, read_verdicts
from babysitter.checkpoints.verify import check_sizes, check_structure, load_manifest, verify_checkpoint
from babysitter.ledger.paths import OUTSIDE, SavePath, reads_for_others, resolve
from babysitter.ledger.reader import DEFAULT_FILE_NAME, read_saves
from babysitter.ledger.saves import SaveRecord

__all__ = ["STATUSES", "CheckpointStatus", "checkpoint_statuses", "resume_point"]

STATUSES = ("verified", "corrupt", "incomplete", "pending", "missing", "unknown", "sizes_only")
#: A promised manifest not there after this long means the save did not complete.
PENDING_SECONDS = 3600.0
_KEEP = 64


@dataclass(frozen=True)
class CheckpointStatus:
    """One save and what checking it now found."""

    step: int
    path: str | None
    time: float
    status: str
    reason: str = ""
    file: str = ""
    detail: str = ""
    mid: str = ""
    #: The save promised or has a manifest (False: a tracker that wrote none).
    manifest: bool = True
    #: The path as the ledger stores it (``path`` is where it is now; they differ for a moved run).
    ledger_path: str | None = None

    @property
    def verified(self) -> bool:
        """True when this checkpoint verifies."""
        return self.status == "verified"

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return dict(self.__dict__)


def _size_check(path: Path, nbytes: int | None) -> tuple[str, str]:
    """(status, detail) of a save without a manifest: it exists with at least its recorded bytes."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        total = 0
        for folder, _dirs, names in os.walk(path):
            for name in names:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    continue
        size = total
    else:
        size = st.st_size
    if nbytes is not None and size < nbytes:
        return "corrupt", f"{size} bytes, the ledger says {nbytes}"
    return "sizes_only", ""


def _status(
    save: SaveRecord,
    verdicts: dict[tuple[int, str], Verdict],
    now: float,
    deep: bool,
    paths: Callable[[SaveRecord], SavePath],
) -> CheckpointStatus | None:
    raw = save.path
    where = paths(save)
    path = where.path

    def status(what: str, *, manifest: bool = True, **kwargs: str) -> CheckpointStatus:
        shown = raw if path is None else str(path)
        return CheckpointStatus(
            save.step, shown, save.time, what, manifest=manifest, ledger_path=raw, **kwargs
        )

    if path is None or raw is None:
        reason = "outside" if where.why.startswith(OUTSIDE) else ""
        return status("unknown", manifest=save.manifest, reason=reason, detail=where.why)
    if not os.path.lexists(path):
        if save.state == "aborted":
            return None  # a save that died before it wrote anything: nothing to resume from or to fear
        return status("missing", manifest=save.manifest, detail="does not exist")
    if save.state == "aborted":
        return status("incomplete", reason="incomplete", detail="the save began and never ended")
    try:
        if not os.path.exists(manifest_path(path)):
            if not save.manifest:
                what, detail = _size_check(path, save.nbytes)
                return status(what, manifest=False, reason="size" if detail else "", detail=detail)
            if save.manifest_ok is False:
                return status("incomplete", reason="incomplete", detail=save.why)
            if save.manifest_ok is None and now - save.time < PENDING_SECONDS:
                return status("pending", detail="its manifest is being written")
            return status("incomplete", reason="no_manifest", detail="no manifest: the save did not complete")
        if deep:
            _manifest, mid, problems = verify_checkpoint(path, digests=True, drop_cache=True)
            problem = problems[0] if problems else None
        else:
            manifest, mid, problem = load_manifest(path)
            if manifest is not None:
                problem = check_sizes(path, manifest) or check_structure(path, manifest)
        if problem is not None:
            return status("corrupt", reason=problem.reason, file=problem.file, detail=problem.detail, mid=mid)
        verdict = None if deep else verdicts.get((save.step, raw))  # every byte just read: fresher
        if verdict is not None and not verdict.ok and verdict.mid == mid:
            detail = f"{verdict.detail} (the node agent on {verdict.host} found it)"
            return status("corrupt", reason=verdict.reason, file=verdict.file, detail=detail, mid=mid)
        return status("verified", mid=mid)
    except OSError as exc:
        return status("unknown", detail=f"cannot check: {exc.strerror or exc}")


def checkpoint_statuses(
    run_dir: Path,
    *,
    file_name: str = DEFAULT_FILE_NAME,
    now: float | None = None,
    deep: bool = False,
    keep: int = _KEEP,
    privileged: bool | None = None,
) -> list[CheckpointStatus]:
    """The status of the run's last ``keep`` saves, oldest first (OSError when the ledger cannot be read).

    ``privileged``: checking for someone else (default: when this process is not the run directory's
    owner, e.g. root): nothing outside the run directory is checked (:mod:`babysitter.ledger.paths`)."""
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    if privileged is None:
        privileged = reads_for_others(run_dir)

    def paths(save: SaveRecord) -> SavePath:
        return resolve(save.path, run_dir, origin=save.origin, privileged=privileged, file_name=file_name)

    by_path: dict[str, SaveRecord] = {}
    for save in read_saves(run_dir, file_name=file_name).saves(now=now, abort_after=PENDING_SECONDS):
        by_path[save.path or f"\x00step {save.step}"] = save  # a path saved again: its newest save
    saves = sorted(by_path.values(), key=lambda s: s.time)[-keep:]
    verdicts = read_verdicts(run_dir)
    out = []
    for save in saves:
        found = _status(save, verdicts, now, deep, paths)
        if found is not None:
            out.append(found)
    return out


def resume_point(statuses: list[CheckpointStatus]) -> CheckpointStatus | None:
    """The newest checkpoint to resume from (see the module doc); None when there is none."""
    for status in reversed(statuses):
        if status.verified:
            return status
    if not any(s.manifest for s in statuses):
        for status in reversed(statuses):
            if status.status == "sizes_only":
                return status
    return None
