"""The checkpoint saves a ledger records, folded from its ``start``, ``ckb``, ``cke`` and ``ckv`` lines.

A save is *completed* when its blocking part ended without an error (``cke`` with ``ok``), *aborted*
when it began (``ckb``) and never ended: its process was followed by a new incarnation, another save
began in the same process, the process closed, or it is older than ``abort_after`` seconds with no
end. A completed save may carry the tracker's promise of a manifest (``man``) and, once the manifest
thread is done, how that went (``ckv``). The node agent's sentinel, ``babysitter report`` and
``babysitter remediate`` read these (through :mod:`babysitter.checkpoints.resume` for the last two).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Literal

from babysitter.ledger.records import CheckpointBegin, CheckpointEnd, CheckpointManifest, End, Record, Start

__all__ = ["SaveLog", "SaveRecord", "SaveState"]

SaveState = Literal["completed", "aborted"]


@dataclass(frozen=True)
class SaveRecord:
    """One checkpoint save as the ledger tells it. ``time``: when it ended (completed) or began
    (aborted), Unix seconds. ``manifest``: the tracker promised a manifest; ``manifest_ok``: whether it
    committed one (None: not said yet), ``why`` when it did not; ``mid`` the manifest's id."""

    step: int
    path: str | None
    nbytes: int | None
    time: float
    state: SaveState = "completed"
    manifest: bool = False
    manifest_ok: bool | None = None
    why: str = ""
    mid: str = ""
    #: The process that made the save has ended (an end record, or a new incarnation began): a
    #: manifest it did not commit will never come.
    closed: bool = False
    #: The directory the ledger was written in when the save was recorded (its incarnation's start
    #: record's ``dir``; None for older ledgers): :func:`babysitter.ledger.paths.resolve` needs it.
    origin: str | None = None


class SaveLog:
    """Saves folded from ledger records in file order; keeps the newest record of at most ``max_steps``
    steps (a step saved again after a restart keeps its newest save)."""

    def __init__(self, *, max_steps: int = 4096) -> None:
        self._max = max_steps
        self._saves: OrderedDict[int, SaveRecord] = OrderedDict()
        self._open: SaveRecord | None = None  # the current incarnation's save under way
        self._origin: str | None = None  # where the current incarnation wrote the ledger
        self._live: list[int] = []  # steps saved by the current incarnation, not closed yet

    def _put(self, record: SaveRecord) -> None:
        self._saves.pop(record.step, None)
        self._saves[record.step] = record
        while len(self._saves) > self._max:
            self._saves.popitem(last=False)

    def _abort_open(self) -> None:
        if self._open is not None:
            self._put(replace(self._open, state="aborted"))
            self._open = None

    def _close(self) -> None:
        self._abort_open()
        for step in self._live:
            found = self._saves.get(step)
            if found is not None:
                self._saves[step] = replace(found, closed=True)
        self._live = []

    def add(self, record: Record) -> None:
        """Fold one record in (others than the five kinds are ignored)."""
        if isinstance(record, Start):
            if not record.segment:  # a new process: what its predecessor left open never ended
                self._close()
            self._origin = record.directory
        elif isinstance(record, End):
            self._close()
        elif isinstance(record, CheckpointBegin) and record.op == "save":
            self._abort_open()
            self._open = SaveRecord(
                record.step, record.path, None, record.t / 1e6, state="aborted", origin=self._origin
            )
        elif isinstance(record, CheckpointEnd) and record.op == "save":
            began = self._open
            self._open = None
            if record.ok:
                self._put(
                    SaveRecord(
                        record.step,
                        record.path or (began.path if began else None),
                        record.nbytes,
                        record.t / 1e6,
                        manifest=record.manifest,
                        origin=self._origin,
                    )
                )
                self._live.append(record.step)
                del self._live[:-64]
        elif isinstance(record, CheckpointManifest):
            found = self._saves.get(record.step)
            if found is not None and found.state == "completed" and found.path == record.path:
                self._saves[record.step] = replace(
                    found, manifest_ok=record.ok, why=record.why, mid=record.mid
                )

    def saves(self, *, now: float | None = None, abort_after: float | None = None) -> list[SaveRecord]:
        """Completed and aborted saves, oldest first. The save under way counts as aborted once it is
        older than ``abort_after`` seconds at ``now`` (a process killed mid-save and never restarted)."""
        found = list(self._saves.values())
        open_ = self._open
        if (
            open_ is not None
            and now is not None
            and abort_after is not None
            and now - open_.time > abort_after
        ):
            found.append(open_)
        return sorted(found, key=lambda s: s.time)

    @property
    def under_way(self) -> SaveRecord | None:
        """The save the newest incarnation began and has not ended (yet)."""
        return self._open
