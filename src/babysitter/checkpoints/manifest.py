"""The manifest of a checkpoint: every file a save wrote, its size and its chunk digests, as JSON.

Where it lives: inside a checkpoint directory as ``babysitter-manifest.json`` (so a framework that
rotates the directory away takes the manifest with it), beside a single-file checkpoint as the hidden
``.<file>.babysitter-manifest.json`` (hidden, so that a resume that globs ``step_*`` or ``*.pt`` for
the newest checkpoint never picks a manifest instead). It is written to a temporary name, fsynced,
renamed into place and the directory fsynced: a reader sees a whole manifest or none. It is written
LAST, after every file it lists was hashed, so **a manifest means a complete save**; a save that died
half-way has none.

Several ranks of one ``torch.distributed.checkpoint`` save each hash their own shards and write a
*part* (``babysitter-manifest.part-<rank>.json``, same format, same atomic write); rank 0 merges the
parts into the manifest and removes them (:mod:`babysitter.checkpoints.build`).

Reading is strict and bounded (a manifest is input from a shared file system, and the node agent
reads it as root): a path that is absolute or climbs out with ``..``, a size or count out of range, a
digest that is not hex of the algorithm's length, a chunk size outside
[:data:`~babysitter.checkpoints.digest.MIN_CHUNK`, :data:`~babysitter.checkpoints.digest.MAX_CHUNK`]
is a :class:`ManifestError`; so is a manifest file larger than :data:`MAX_MANIFEST_BYTES` (refused
before it is read), one with more than :data:`MAX_FILES` files or :data:`MAX_DIGESTS` digests, or JSON
nested deeper than any manifest. A manifest file that is not a regular file (a FIFO, a link) is an
OSError, and is never opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from babysitter import jsonin
from babysitter.checkpoints.digest import ALGORITHMS, MAX_CHUNK, MIN_CHUNK, chunk_count
from babysitter.userfiles import TooLargeError, read_regular

__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "MAX_DIGESTS",
    "MAX_FILES",
    "MAX_MANIFEST_BYTES",
    "PART_PREFIX",
    "VERSION",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "is_manifest_file",
    "manifest_id",
    "manifest_path",
    "parse_manifest",
    "part_path",
    "read_manifest",
    "write_atomic",
]

FORMAT = "babysitter-checkpoint-manifest"
VERSION = 1
MANIFEST_NAME = "babysitter-manifest.json"
PART_PREFIX = "babysitter-manifest.part-"
_SIDECAR = ".babysitter-manifest.json"
_TMP = ".babysitter-manifest.tmp."
#: Files a manifest may list (what :func:`babysitter.checkpoints.layouts.walk` lists at most).
MAX_FILES = 1 << 18
#: Digests a manifest may hold, all files together: 8 TiB of checkpoint at the default 16 MiB chunk.
MAX_DIGESTS = 1 << 19
#: Bytes of manifest a reader accepts: a 1 TB checkpoint's is ~5 MB, MAX_DIGESTS take ~36 MB.
#: Parsed, a manifest holds ~3.5 times its bytes in memory (a 32 MiB one: +110 MiB).
MAX_MANIFEST_BYTES = 40 << 20
_MAX_BYTES = (1 << 53) - 1
_DIGEST_HEX = {alg: hashlib.new(alg).digest_size * 2 for alg in ALGORITHMS}
_HEX = re.compile(r"^[0-9a-f]+$")


class ManifestError(ValueError):
    """A manifest that cannot be read or is not one this version understands."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint's root, size and chunk digests
    (empty when the manifest records sizes only)."""

    path: str
    size: int
    chunks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    """What one save wrote. ``layout`` is how it was recognized (``dcp``, ``hf``, ``torch``,
    ``safetensors``, ``files``); ``note`` what the layout check found; ``ranks`` the ranks whose
    files it lists."""

    run: str
    step: int
    layout: str
    created: float
    host: str
    alg: str | None
    chunk: int
    files: tuple[FileEntry, ...]
    ranks: tuple[int, ...] = (0,)
    note: str = ""
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def nbytes(self) -> int:
        """Bytes of every listed file together."""
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, object]:
        """The manifest as written (digests as lists)."""
        return {
            "format": FORMAT,
            "v": VERSION,
            "run": self.run,
            "step": self.step,
            "layout": self.layout,
            "created": round(self.created, 6),
            "host": self.host,
            "ranks": list(self.ranks),
            "alg": self.alg,
            "chunk": self.chunk,
            "bytes": self.nbytes,
            "note": self.note,
            "files": [{"path": f.path, "size": f.size, "chunks": list(f.chunks)} for f in self.files],
        }

    def encode(self) -> bytes:
        """The manifest's bytes (compact JSON, one newline at the end)."""
        return (json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False) + "\n").encode()


def manifest_id(data: bytes) -> str:
    """A manifest's identity: the first 16 hex digits of the SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()[:16]


def manifest_path(checkpoint: str | os.PathLike[str], *, is_dir: bool | None = None) -> Path:
    """Where the manifest of ``checkpoint`` lives: inside a directory, beside a file."""
    path = Path(checkpoint)
    if is_dir is None:
        is_dir = path.is_dir()
    return path / MANIFEST_NAME if is_dir else path.with_name(f".{path.name}{_SIDECAR}")


def part_path(directory: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` writes its part of a shared directory's manifest."""
    return Path(directory) / f"{PART_PREFIX}{rank}.json"


def is_manifest_file(name: str) -> bool:
    """True for the names of manifests, parts and their temporary files (never listed in one)."""
    return name == MANIFEST_NAME or name.startswith((PART_PREFIX, _TMP)) or name.endswith(_SIDECAR)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing: a temporary file in the same
    directory, fsynced, renamed over ``path``, then the directory fsynced (mode 0644)."""
    tmp = path.with_name(f"{_TMP}{os.getpid()}.{path.name}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
        dfd = os.open(path.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _int(obj: dict[str, object], key: str, low: int = 0, high: int = _MAX_BYTES) -> int:
    value = obj.get(key)
    if type(value) is not int or not low <= value <= high:
        raise ManifestError(f"{key!r} must be an integer in [{low}, {high}]")
    return value


def _str(obj: dict[str, object], key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise ManifestError(f"{key!r} must be a string")
    return value[:1024]


def _rel(text: object) -> str:
    if not isinstance(text, str) or not text or "\x00" in text or len(text) > 4096:
        raise ManifestError("a file path must be a non-empty string")
    pure = PurePosixPath(text)
    if pure.is_absolute() or ".." in pure.parts or str(pure) in ("", "."):
        raise ManifestError(f"file path {text[:200]!r} must stay inside the checkpoint")
    return str(pure)


def parse_manifest(data: bytes) -> Manifest:
    """The manifest in ``data``; ManifestError when it is not a valid manifest of this version."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{len(data)} bytes is larger than any manifest ({MAX_MANIFEST_BYTES})")
    try:
        obj = jsonin.loads(data, max_bytes=MAX_MANIFEST_BYTES)
    except jsonin.JSONLimitError as exc:
        raise ManifestError(f"not a manifest: {exc}") from None
    except ValueError as exc:
        raise ManifestError(f"not JSON (a torn or foreign file): {exc}") from None
    if type(obj) is not dict or obj.get("format") != FORMAT:
        raise ManifestError("not a babysitter checkpoint manifest")
    if obj.get("v") != VERSION:
        raise ManifestError(f"manifest version {obj.get('v')!r} is not {VERSION}")
    alg = obj.get("alg")
    if alg is not None and alg not in ALGORITHMS:
        raise ManifestError(f"unknown digest {alg!r}")
    chunk = _int(obj, "chunk", MIN_CHUNK, MAX_CHUNK)
    files_raw = obj.get("files")
    if type(files_raw) is not list or len(files_raw) > MAX_FILES:
        raise ManifestError(f"'files' must be a list of at most {MAX_FILES} entries")
    digests = sum(len(e["chunks"]) for e in files_raw if type(e) is dict and type(e.get("chunks")) is list)
    if digests > MAX_DIGESTS:
        raise ManifestError(f"{digests} digests, more than a manifest may hold ({MAX_DIGESTS})")
    files = []
    seen: set[str] = set()
    width = _DIGEST_HEX.get(alg or "", 0)
    for entry in files_raw:
        if type(entry) is not dict:
            raise ManifestError("a file entry must be an object")
        rel = _rel(entry.get("path"))
        if rel in seen:
            raise ManifestError(f"file {rel!r} is listed twice")
        seen.add(rel)
        size = _int(entry, "size")
        chunks = entry.get("chunks", [])
        if type(chunks) is not list:
            raise ManifestError(f"'chunks' of {rel!r} must be a list")
        if alg is None:
            if chunks:
                raise ManifestError(f"{rel!r} has digests but the manifest names no algorithm")
        elif len(chunks) != chunk_count(size, chunk) or not all(
            isinstance(d, str) and len(d) == width and _HEX.match(d) for d in chunks
        ):
            raise ManifestError(f"{rel!r} must have one {alg} digest per {chunk}-byte chunk")
        files.append(FileEntry(rel, size, tuple(chunks)))
    ranks = obj.get("ranks", [0])
    if type(ranks) is not list or not all(type(r) is int and 0 <= r < 1 << 24 for r in ranks):
        raise ManifestError("'ranks' must be a list of ranks")
    created = obj.get("created", 0.0)
    if type(created) not in (int, float) or not 0 <= created < 1e11:
        raise ManifestError("'created' must be a Unix time")
    return Manifest(
        run=_str(obj, "run", ""),
        step=_int(obj, "step"),
        layout=_str(obj, "layout", "files"),
        created=float(created),
        host=_str(obj, "host", ""),
        alg=alg,
        chunk=chunk,
        files=tuple(files),
        ranks=tuple(ranks),
        note=_str(obj, "note", ""),
    )


def read_manifest(path: Path) -> tuple[Manifest, str]:
    """(manifest, its id) read from ``path``; OSError when it cannot be read (FileNotFoundError when
    there is none; a FIFO, device or symbolic link is refused without being opened), ManifestError
    when it is not a valid manifest (one larger than :data:`MAX_MANIFEST_BYTES` is not read)."""
    try:
        data = read_regular(path, limit=MAX_MANIFEST_BYTES, follow_symlinks=False)
    except TooLargeError as exc:
        raise ManifestError(f"larger than any manifest: {exc.strerror}") from None
    return parse_manifest(data), manifest_id(data)
