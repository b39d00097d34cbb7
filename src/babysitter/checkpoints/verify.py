"""Checking a checkpoint against its manifest: sizes always, structure once, digests within a budget.

Three levels, cheapest first:

1. **Sizes**: every listed file exists with exactly its recorded size (one ``stat`` each). Catches
   a truncated, extended, replaced or deleted shard at once.
2. **Structure** (:func:`babysitter.checkpoints.layouts.structure_problems`): headers only.
3. **Digests**: each chunk read back (cached pages dropped first, so the bytes come from the storage)
   and compared with its digest. :class:`ChunkVerifier` walks a checkpoint's chunks in a fixed
   random order (single-chunk files first: ``.metadata``, indexes, configs), a budget of bytes at a
   time, across the sentinel's passes; a sweep that is ``k`` % done has found a corruption anywhere
   with probability ``k`` %.

What none of them can see: bytes that were wrong before the save wrote them (a GPU that computed
garbage, a flipped bit in host memory): the manifest certifies what was written. The replica check
(``watch(replica_check_every=N)``) is for that.

Every listed file must be a regular file: it is looked at with ``lstat`` and opened without following
a link or blocking (:func:`babysitter.userfiles.open_regular`), so a FIFO or a link in its place is a
``missing_file`` problem, never a reader blocked forever. A chunk is never larger than
:data:`~babysitter.checkpoints.digest.MAX_CHUNK` (a manifest with larger ones is invalid), so every
chunk fits in a sentinel pass and no file is called verified while its chunks can never be read.
"""

from __future__ import annotations

import os
import random
import stat
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from babysitter.catalog.storage import CORRUPT_REASONS
from babysitter.checkpoints.digest import BUFFER, hash_range
from babysitter.checkpoints.layouts import structure_problems
from babysitter.checkpoints.manifest import Manifest, ManifestError, manifest_path, read_manifest
from babysitter.userfiles import open_regular

__all__ = [
    "REASONS",
    "ChunkVerifier",
    "Problem",
    "check_sizes",
    "check_structure",
    "load_manifest",
    "verify_checkpoint",
]

#: Why a checkpoint fails verification (the ``reason`` label of ``checkpoint_corrupt_newest_step``).
REASONS = CORRUPT_REASONS


@dataclass(frozen=True)
class Problem:
    """What is wrong with a checkpoint: ``reason`` (one of :data:`REASONS`), the ``file`` (relative
    to the checkpoint; empty when it is the checkpoint as a whole) and the detail in words."""

    reason: str
    file: str
    detail: str

    def text(self) -> str:
        """``size: __2_0.distcp: 4096 bytes, the manifest says 8192 (truncated)``."""
        return f"{self.reason}: {self.file + ': ' if self.file else ''}{self.detail}"


def _base(checkpoint: Path) -> Path:
    return checkpoint.parent if checkpoint.is_file() else checkpoint


def load_manifest(checkpoint: Path) -> tuple[Manifest | None, str, Problem | None]:
    """(manifest, id, None), or (None, "", the problem) when it is absent or unreadable."""
    path = manifest_path(checkpoint)
    try:
        manifest, mid = read_manifest(path)
    except FileNotFoundError:
        return None, "", Problem("no_manifest", "", f"no {path.name}: the save did not complete")
    except ManifestError as exc:
        return None, "", Problem("manifest_invalid", path.name, str(exc))
    except OSError as exc:
        return None, "", Problem("manifest_invalid", path.name, f"cannot be read: {exc.strerror or exc}")
    return manifest, mid, None


def check_sizes(checkpoint: Path, manifest: Manifest) -> Problem | None:
    """The first listed file that is gone or whose size differs from the manifest's, or None."""
    base = _base(checkpoint)
    for entry in manifest.files:
        try:
            st = os.lstat(base / entry.path)
        except FileNotFoundError:
            return Problem("missing_file", entry.path, "listed in the manifest, not on disk")
        except OSError as exc:
            return Problem("missing_file", entry.path, f"cannot be read: {exc.strerror or exc}")
        if not stat.S_ISREG(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            return Problem("missing_file", entry.path, f"listed as a file, on disk {what}")
        size = st.st_size
        if size != entry.size:
            how = "truncated" if size < entry.size else "grown or rewritten"
            return Problem("size", entry.path, f"{size} bytes, the manifest says {entry.size} ({how})")
    return None


def check_structure(checkpoint: Path, manifest: Manifest) -> Problem | None:
    """The first structure problem of the listed files (headers only), or None."""
    problems = structure_problems(checkpoint, {f.path: f.size for f in manifest.files})
    if not problems:
        return None
    rel, why = problems[0]
    return Problem("structure", rel, why)


class _Order(Sequence[tuple[int, int]]):
    """``(file index, chunk index)`` pairs packed 8 bytes each (a list of tuples took ~80 bytes a
    chunk: 40 MiB for a manifest of 524,288 digests, kept as long as the sentinel watches it)."""

    def __init__(self, packed: array[int]) -> None:
        self._packed = packed

    def __len__(self) -> int:
        return len(self._packed)

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[int, int]]: ...
    def __getitem__(self, index: int | slice) -> tuple[int, int] | Sequence[tuple[int, int]]:
        if isinstance(index, slice):
            return [(v >> 32, v & 0xFFFFFFFF) for v in self._packed[index]]
        value = self._packed[index]
        return value >> 32, value & 0xFFFFFFFF


class ChunkVerifier:
    """The digests of one checkpoint, verified a budget at a time in a fixed random order.

    ``seed`` fixes the order (the sentinel seeds with the manifest id, so a restarted agent walks the
    same order). After a full sweep ``sweeps`` grows and the order starts over.
    """

    def __init__(
        self, checkpoint: Path, manifest: Manifest, *, seed: str = "", drop_cache: bool = True
    ) -> None:
        self.checkpoint = checkpoint
        self.manifest = manifest
        self.drop_cache = drop_cache
        singles = array("q", (i << 32 for i, f in enumerate(manifest.files) if len(f.chunks) == 1))
        rest = array(
            "q",
            (
                (i << 32) + k
                for i, f in enumerate(manifest.files)
                if len(f.chunks) > 1
                for k in range(len(f.chunks))
            ),
        )
        random.Random(seed).shuffle(rest)  # the permutation a list of the same length would get
        self.order: Sequence[tuple[int, int]] = _Order(singles + rest)
        self.cursor = 0
        self.sweeps = 0
        self.verified_bytes = 0
        self._buf: bytearray | None = None

    @property
    def total_bytes(self) -> int:
        """Bytes of one full sweep."""
        return self.manifest.nbytes

    @property
    def fraction(self) -> float:
        """How much of the current sweep is done (1.0 for a manifest without digests)."""
        if not self.order or self.manifest.alg is None:
            return 1.0
        return self.cursor / len(self.order)

    def _length(self, item: tuple[int, int]) -> int:
        entry = self.manifest.files[item[0]]
        chunk = self.manifest.chunk
        return max(0, min(chunk, entry.size - item[1] * chunk))

    def next_length(self) -> int | None:
        """Bytes of the next chunk to verify; None when the sweep is done or there are no digests."""
        if self.manifest.alg is None or self.cursor >= len(self.order):
            return None
        return self._length(self.order[self.cursor])

    def restart(self) -> None:
        """Start a new sweep."""
        self.cursor = 0
        self.sweeps += 1

    def verify(self, budget: int, *, stop: Callable[[], bool] | None = None) -> tuple[Problem | None, int]:
        """Verify chunks from the cursor while the next one fits in ``budget`` bytes: (the first
        problem or None, bytes read). A problem leaves the cursor on the bad chunk."""
        used = 0
        base = _base(self.checkpoint)
        alg = self.manifest.alg
        if alg is None:
            return None, 0
        if self._buf is None:
            self._buf = bytearray(min(BUFFER, self.manifest.chunk))
        fds: dict[int, int] = {}
        try:
            while self.cursor < len(self.order):
                item = self.order[self.cursor]
                length = self._length(item)
                if used + length > budget or (stop is not None and stop()):
                    break
                entry = self.manifest.files[item[0]]
                fd = fds.get(item[0])
                if fd is None:
                    try:
                        fd = open_regular(base / entry.path, follow_symlinks=False)
                    except FileNotFoundError:
                        return Problem(
                            "missing_file", entry.path, "listed in the manifest, not on disk"
                        ), used
                    fds[item[0]] = fd
                offset = item[1] * self.manifest.chunk
                digest, got = hash_range(
                    fd, offset, length, alg=alg, buf=self._buf, drop_cache=self.drop_cache
                )
                used += got
                if got != length:
                    return Problem(
                        "size", entry.path, f"ends at byte {offset + got}, the manifest says {entry.size}"
                    ), used
                if digest != entry.chunks[item[1]]:
                    return (
                        Problem(
                            "digest",
                            entry.path,
                            f"bytes {offset}-{offset + length} differ from the manifest's {alg} "
                            f"(chunk {item[1] + 1} of {len(entry.chunks)})",
                        ),
                        used,
                    )
                self.cursor += 1
                self.verified_bytes += got
        except OSError as exc:
            return Problem(
                "missing_file",
                self.manifest.files[self.order[self.cursor][0]].path,
                f"cannot be read: {exc.strerror or exc}",
            ), used
        finally:
            for fd in fds.values():
                os.close(fd)
        return None, used


def verify_checkpoint(
    checkpoint: Path, *, digests: bool = True, drop_cache: bool = False
) -> tuple[Manifest | None, str, list[Problem]]:
    """Everything at once (``babysitter checkpoint verify``, the report's ``--verify``): the manifest,
    its id, and every problem found (sizes and structure always, every digest with ``digests``)."""
    manifest, mid, problem = load_manifest(checkpoint)
    if manifest is None:
        return None, "", [problem] if problem is not None else []
    problems = []
    for check in (check_sizes, check_structure):
        found = check(checkpoint, manifest)
        if found is not None:
            problems.append(found)
    if digests and not problems and manifest.alg is not None:
        verifier = ChunkVerifier(checkpoint, manifest, seed=mid, drop_cache=drop_cache)
        while verifier.next_length() is not None:
            found, _ = verifier.verify(1 << 62)
            if found is None:
                break
            problems.append(found)
            verifier.cursor += 1  # go on: report every bad chunk's file
    return manifest, mid, problems
