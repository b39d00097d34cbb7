"""Writing a checkpoint's manifest once its save is done: list, check the structure, hash, commit.

Who writes what:

- **A DCP directory** (several ranks write shards): each rank hashes the shards it wrote
  (``__<rank>_*.distcp``: on a network file system these are still in that host's page cache, so
  hashing them reads memory, not the network, and the ranks hash in parallel) and commits a *part*.
  Rank 0 hashes its own shards and everything else (``.metadata``), checks the structure (every
  shard ``.metadata`` references is there, with the bytes it points into), waits for the other
  owners' parts, merges them and commits the manifest, then removes the parts. An owner whose part
  does not come within ``max(part_wait, 4 x rank 0's own hashing time)`` (a rank without a tracker,
  a save on a subgroup whose ranks are numbered differently) is hashed by rank 0 itself, so the
  manifest always covers every file.
- **Any other directory** (``save_pretrained``, custom layouts): rank 0 hashes every file; other
  ranks write nothing (frameworks call the save hook on every rank with the same directory).
- **A file** (``torch.save``, one safetensors file): the rank that saved it.

A structure problem (a truncated safetensors shard, a zip archive without its directory, an index or
``.metadata`` naming a shard that is not there) means the save is not complete: no manifest is written
and the result says why. So does a file that changed size while it was hashed (still being written).

What readers accept bounds what is written: a checkpoint of more than
:data:`~babysitter.checkpoints.manifest.MAX_DIGESTS` chunks gets a manifest of sizes only (its note
says so), one of more than :data:`~babysitter.checkpoints.manifest.MAX_FILES` files none.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from babysitter.checkpoints.digest import ALGORITHM, BUFFER, CHUNK, check_chunk, chunk_count, hash_file
from babysitter.checkpoints.layouts import detect, shard_owner, structure_problems, walk
from babysitter.checkpoints.manifest import (
    MAX_DIGESTS,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    ManifestError,
    manifest_id,
    manifest_path,
    part_path,
    read_manifest,
    write_atomic,
)

__all__ = ["BuildResult", "build_manifest"]


@dataclass(frozen=True)
class BuildResult:
    """What one rank's manifest job did: ``kind`` is ``manifest`` (committed), ``part`` (this rank's
    part of a shared directory), ``skipped`` (nothing for this rank to write) or ``failed`` (``why``)."""

    kind: str
    path: Path | None = None
    manifest: Manifest | None = None
    mid: str = ""
    why: str = ""
    seconds: float = 0.0
    hashed_bytes: int = 0

    @property
    def ok(self) -> bool:
        """True when this rank's job did what it had to (a manifest, a part, or nothing to do)."""
        return self.kind != "failed"


class _Superseded(Exception):
    """A newer save to the same path began: this one's files are being overwritten."""


class _Hasher:
    def __init__(
        self,
        base: Path,
        alg: str | None,
        chunk: int,
        stop: threading.Event | None,
        cancelled: Callable[[], bool] | None,
    ) -> None:
        self.base, self.alg, self.chunk, self.stop, self.cancelled = base, alg, chunk, stop, cancelled
        self.buf = bytearray(min(BUFFER, chunk))
        self.bytes = 0

    def check(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise InterruptedError("the tracker closed before the manifest was done")
        if self.cancelled is not None and self.cancelled():
            raise _Superseded("a newer save to the same path began")

    def entries(self, listing: dict[str, int], names: Iterable[str]) -> list[FileEntry]:
        out = []
        for rel in names:
            self.check()
            expected = listing[rel]
            if self.alg is None:
                size = os.stat(self.base / rel).st_size
                chunks: list[str] = []
            else:
                size, chunks = hash_file(self.base / rel, alg=self.alg, chunk=self.chunk, buf=self.buf)
                self.bytes += size
            if size != expected:
                raise OSError(
                    f"{rel} changed size while the manifest was made ({expected} -> {size} bytes): "
                    "the save was still writing it"
                )
            out.append(FileEntry(rel, size, tuple(chunks)))
        return out


def _read_part(directory: Path, owner: int, step: int, listing: dict[str, int]) -> list[FileEntry] | None:
    """A rank's committed part, when it is there and matches the files as they are now."""
    try:
        part, _ = read_manifest(part_path(directory, owner))
    except (OSError, ManifestError):
        return None
    if part.step != step or any(listing.get(f.path) != f.size for f in part.files):
        return None
    return list(part.files)


def build_manifest(
    checkpoint: str | os.PathLike[str],
    *,
    run: str,
    step: int,
    rank: int = 0,
    alg: str | None = ALGORITHM,
    chunk: int = CHUNK,
    part_wait: float = 60.0,
    poll: float = 0.2,
    stop: threading.Event | None = None,
    cancelled: Callable[[], bool] | None = None,
    dcp_metadata: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> BuildResult:
    """Make and commit this rank's share of the manifest of the checkpoint at ``checkpoint``.

    Never raises for what the file system does (a vanished path, a file still being written, a
    permission error): the result says ``failed`` and why. ``cancelled`` returning True (a newer save
    to the same path began: its bytes are replacing these) stops it with nothing written, ``skipped``."""
    check_chunk(chunk)
    t0 = clock()
    root = Path(checkpoint)
    hasher = _Hasher(root.parent if root.is_file() else root, alg, chunk, stop, cancelled)

    def result(kind: str, **kwargs: object) -> BuildResult:
        if kind == "failed" and cancelled is not None and cancelled():
            # A newer save to the same path is rewriting these bytes: what this one read (a zip
            # directory half written, a shard that shrank) says nothing about either save.
            kind, kwargs = "skipped", {"why": "superseded by a newer save to the same path"}
        return BuildResult(kind, seconds=clock() - t0, hashed_bytes=hasher.bytes, **kwargs)  # type: ignore[arg-type]

    def made(layout: str, files: tuple[FileEntry, ...], ranks: list[int], note: str = "") -> Manifest:
        host = socket.gethostname()
        if hasher.alg is None:  # sizes only (also what other ranks' parts hashed)
            files = tuple(FileEntry(f.path, f.size) for f in files)
            if alg is not None:
                note = f"{note}; sizes only: more than {MAX_DIGESTS} chunks of {chunk} bytes".lstrip("; ")
        return Manifest(
            run, step, layout, time.time(), host, hasher.alg, chunk, files, tuple(sorted(set(ranks))), note
        )

    try:
        if not root.exists():
            return result("failed", why=f"{root} does not exist (rotated away, or never written)")
        is_dir = root.is_dir()
        listing = walk(root)
        layout = detect(root, listing)
        if alg is not None and sum(chunk_count(size, chunk) for size in listing.values()) > MAX_DIGESTS:
            hasher.alg = None  # more digests than a reader accepts: a manifest of sizes only
        ranks = [rank]
        if is_dir and layout == "dcp":
            owners = {o for o in map(shard_owner, listing) if o is not None}
            mine = [rel for rel in listing if shard_owner(rel) == rank]
            if rank != 0:
                if not mine:
                    return result("skipped", why=f"no shards of rank {rank} in {root}")
                part = made(layout, tuple(hasher.entries(listing, mine)), [rank])
                target = part_path(root, rank)
                hasher.check()
                write_atomic(target, part.encode())
                return result("part", path=target, manifest=part)
            own = [rel for rel in listing if shard_owner(rel) in (None, 0)]
            problems = structure_problems(root, listing, dcp_metadata=dcp_metadata)
            if problems:
                return result("failed", why=_problems(problems))
            entries = hasher.entries(listing, own)
            own_seconds = clock() - t0
            deadline = clock() + max(part_wait, 4 * own_seconds)
            waiting = sorted(owners - {0})
            while waiting:
                for owner in list(waiting):
                    found = _read_part(root, owner, step, listing)
                    if found is not None:
                        entries.extend(found)
                        ranks.append(owner)
                        waiting.remove(owner)
                if not waiting or clock() >= deadline:
                    break
                hasher.check()
                time.sleep(poll)
            for owner in waiting:  # no part in time: hash that rank's shards here
                entries.extend(hasher.entries(listing, [r for r in listing if shard_owner(r) == owner]))
            note = f"dcp: {len(owners)} shard owner(s), {len(owners) - len(waiting)} hashed by their own rank"
            files = tuple(sorted(entries, key=lambda e: e.path))
        elif is_dir and rank != 0:
            return result("skipped", why=f"rank {rank}: rank 0 writes the manifest of {root}")
        else:
            problems = structure_problems(root, listing, dcp_metadata=dcp_metadata)
            if problems:
                return result("failed", why=_problems(problems))
            files = tuple(hasher.entries(listing, listing))
            note = f"{layout}: {len(files)} file(s)"
        manifest = made(layout, files, ranks, note)
        data = manifest.encode()
        if len(data) > MAX_MANIFEST_BYTES:
            return result("failed", why=f"its manifest would be {len(data)} bytes, more than readers accept")
        target = manifest_path(root, is_dir=is_dir)
        hasher.check()
        write_atomic(target, data)
        if is_dir and layout == "dcp":
            for owner in ranks:
                if owner != 0:
                    with contextlib.suppress(OSError):
                        part_path(root, owner).unlink()
        return result("manifest", path=target, manifest=manifest, mid=manifest_id(data))
    except _Superseded as exc:
        return result("skipped", why=str(exc))
    except InterruptedError as exc:
        return result("failed", why=str(exc))
    except OSError as exc:
        return result("failed", why=f"{type(exc).__name__}: {exc}")


def _problems(problems: list[tuple[str, str]]) -> str:
    first, why = problems[0]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"incomplete: {first}: {why}{more}"
