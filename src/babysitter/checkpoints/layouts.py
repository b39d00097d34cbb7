"""Recognizing a checkpoint's layout, which rank wrote which file, and cheap checks of its structure.

Layouts:

- ``dcp``: a ``torch.distributed.checkpoint`` directory: ``.metadata`` (written last by the
  coordinator) and ``__<rank>_<n>.distcp`` shards, ``<rank>`` being the writer's rank in the save's
  process group (found anywhere under the root, so the Hugging Face Trainer's FSDP subdirectory counts).
- ``hf``: a Hugging Face ``save_pretrained`` directory: ``config.json``, ``*.safetensors`` shards and
  their ``model.safetensors.index.json``.
- ``safetensors`` / ``torch``: one file, a safetensors file or a ``torch.save`` zip archive.
- ``files``: anything else (every file is listed and hashed; no structure is known).

The structure checks read headers only, never tensors, and never unpickle anything: a safetensors
header must index the file to its last byte (the format has no holes, so a truncated or extended file
fails), a zip archive (``torch.save``) must have its central directory at the end and every member
inside the file, an index must name shards that exist. ``.metadata`` of a DCP save is a pickle: it is
read (by torch's own reader, only where torch is already imported: the training process) to check
that every shard it references exists with the bytes it points into; the node agent never reads it.

They run as root in the node agent on files users write, so each is bounded: regular files only,
opened without following a link or blocking (:mod:`babysitter.userfiles`); JSON through
:mod:`babysitter.jsonin`; a safetensors header or an index of more than :data:`MAX_HEADER_BYTES`, and
a zip directory of more than :data:`MAX_ZIP_ENTRIES` members, are not checked (a real one that large
is rare, and its digests are still verified); the zip directory is read a block at a time from its
end record, never built into a list.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from babysitter import jsonin
from babysitter.checkpoints.manifest import MAX_FILES, is_manifest_file
from babysitter.userfiles import TooLargeError, open_regular, read_regular

__all__ = [
    "LAYOUTS",
    "MAX_HEADER_BYTES",
    "MAX_ZIP_ENTRIES",
    "WalkLimitError",
    "detect",
    "shard_owner",
    "structure_problems",
    "walk",
]

LAYOUTS = ("dcp", "hf", "safetensors", "torch", "files")
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
_SAFETENSORS_LIMIT = 100_000_000  # the format's own limit on its header (safetensors' MAX_HEADER_SIZE)
#: Largest safetensors header or Hugging Face index checked (~150 bytes a tensor: 100,000 tensors).
MAX_HEADER_BYTES = 16 << 20
#: Most members of a zip archive whose directory is checked (``torch.save`` writes one per storage
#: and five more; 65,536 is also the classic zip limit). Reading them costs ~1 us each.
MAX_ZIP_ENTRIES = 1 << 16
_ZIP_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")
_ZIP_BLOCK = 1 << 20
_MAX_ZIP_DIRECTORY = MAX_ZIP_ENTRIES << 8  # 256 bytes a member: torch.save's names are ~30
_EOCD, _EOCD64, _LOCATOR64, _CENTRAL = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07", b"PK\x01\x02"
_ZIP32 = 0xFFFFFFFF


class WalkLimitError(OSError):
    """More files under a checkpoint than a manifest may list."""


def walk(root: Path, limit: int = MAX_FILES) -> dict[str, int]:
    """``{relative path: size}`` of the regular files under ``root`` (symlinks not followed, manifests
    and their parts left out), or ``{name: size}`` of ``root`` itself when it is a file."""
    st = os.stat(root)
    if stat.S_ISREG(st.st_mode):
        return {root.name: st.st_size}
    found: dict[str, int] = {}
    stack = [(str(root), "")]
    while stack:
        directory, prefix = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                rel = f"{prefix}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, rel + "/"))
                elif entry.is_file(follow_symlinks=False) and not is_manifest_file(entry.name):
                    if len(found) >= limit:
                        raise WalkLimitError(f"more than {limit} files under {root}")
                    found[rel] = entry.stat(follow_symlinks=False).st_size
    return dict(sorted(found.items()))


def shard_owner(rel: str) -> int | None:
    """The rank that wrote a DCP shard (``__3_0.distcp`` -> 3), None for any other file."""
    match = _SHARD.match(PurePosixPath(rel).name)
    return int(match.group(1)) if match else None


def _zip_magic(path: Path, *, follow_symlinks: bool = True) -> bool:
    try:
        fd = open_regular(path, follow_symlinks=follow_symlinks)
    except OSError:
        return False
    try:
        return os.pread(fd, 4, 0) == b"PK\x03\x04"
    except OSError:
        return False
    finally:
        os.close(fd)


def detect(root: Path, files: dict[str, int]) -> str:
    """The layout of the checkpoint at ``root`` whose files are ``files`` (from :func:`walk`)."""
    if root.is_file():
        if root.name.endswith(".safetensors"):
            return "safetensors"
        return "torch" if _zip_magic(root) else "files"
    names = [PurePosixPath(rel).name for rel in files]
    if any(name == ".metadata" or _SHARD.match(name) for name in names):
        return "dcp"
    if any(n.endswith((".safetensors", ".safetensors.index.json")) or n == "config.json" for n in names):
        return "hf"
    return "files"


def _safetensors(path: Path, size: int) -> str | None:
    """What is wrong with a safetensors file's header, or None."""
    if size < 8:
        return f"{size} bytes: shorter than a safetensors header"
    fd = open_regular(path, follow_symlinks=False)
    try:
        (length,) = struct.unpack("<Q", os.pread(fd, 8, 0).ljust(8, b"\x00"))
        if length > _SAFETENSORS_LIMIT or 8 + length > size:
            return f"header length {length} does not fit in {size} bytes (truncated?)"
        if length > MAX_HEADER_BYTES:
            return None  # a real header may be this large; more than is parsed here (digests still checked)
        raw = os.pread(fd, length, 8)
    finally:
        os.close(fd)
    try:
        header = jsonin.loads(raw, max_bytes=MAX_HEADER_BYTES)
    except jsonin.JSONLimitError as exc:
        return f"the header is not a safetensors header: {exc}"
    except ValueError:
        return "the header is not JSON (overwritten or truncated)"
    if type(header) is not dict:
        return "the header is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if type(info) is dict else None
        if type(offsets) is not list or len(offsets) != 2 or not all(type(o) is int for o in offsets):
            return f"tensor {str(name)[:80]!r} has no data offsets"
        end = max(end, offsets[1])
    if 8 + length + end != size:
        return f"the header indexes {8 + length + end} bytes, the file has {size} (truncated or extended)"
    return None


class _ZipError(ValueError):
    """What makes a zip archive incomplete."""


def _zip_end(fd: int, size: int) -> tuple[int, int, int, int]:
    """(members, central directory offset, its size, shift) from the end records, as ``zipfile``
    reads them: ``shift`` is how far the archive starts into the file (bytes before it, which
    ``zipfile`` allows); the offset returned is where the directory really is."""
    tail_len = min(size, 22 + 0xFFFF)
    tail = os.pread(fd, tail_len, size - tail_len)
    at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < 22:
        raise _ZipError("no end of central directory record")
    count, cd_size, cd_offset = struct.unpack_from("<HII", tail, at + 10)
    end = size - tail_len + at  # where the end record is: the directory ends there
    locator = os.pread(fd, 4, end - 20) if end >= 20 else b""
    if locator == _LOCATOR64:  # zip64 (torch.save always writes it): its end record comes first
        end -= 20 + 56
        record = os.pread(fd, 56, end) if end >= 0 else b""
        if len(record) != 56 or not record.startswith(_EOCD64):
            raise _ZipError("a zip64 archive without its zip64 end record")
        count, cd_size, cd_offset = struct.unpack_from("<QQQ", record, 32)
    elif count == 0xFFFF or _ZIP32 in (cd_size, cd_offset):
        raise _ZipError("a zip64 archive without its zip64 end record locator")
    shift = end - cd_size - cd_offset
    if shift < 0:
        raise _ZipError("the central directory does not fit before its end record")
    return count, cd_offset + shift, cd_size, shift


def _zip64_extra(extra: bytes, sizes: list[int]) -> None:
    """Replace the 0xFFFFFFFF values of ``sizes`` (size, compressed size, offset) in place from the
    zip64 extra field."""
    i = 0
    while i + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, i)
        if kind == 1:
            j = i + 4
            for k in range(3):
                if sizes[k] == _ZIP32:
                    if j + 8 > i + 4 + length or j + 8 > len(extra):
                        raise _ZipError("a zip64 member without its zip64 sizes")
                    (sizes[k],) = struct.unpack_from("<Q", extra, j)
                    j += 8
            return
        i += 4 + length
    if _ZIP32 in sizes:
        raise _ZipError("a zip64 member without its zip64 sizes")


def _zip(path: Path, size: int) -> str | None:
    """What is wrong with a zip archive's directory (``torch.save``'s format), or None.

    Every member must lie inside the file (what ``zipfile`` checks when it opens one). Read here from
    the end records a block at a time, so a directory of 500,000 members costs neither the 234 MiB
    nor the 4.8 s of CPU that ``zipfile`` spends building its list: more than
    :data:`MAX_ZIP_ENTRIES` are not checked at all."""
    fd = open_regular(path, follow_symlinks=False)
    try:
        count, pos, cd_size, shift = _zip_end(fd, size)
        if count > MAX_ZIP_ENTRIES or cd_size > _MAX_ZIP_DIRECTORY:
            return None  # more than is checked here (the members' digests are still verified)
        block, i, stop = b"", 0, pos + cd_size

        def have(n: int) -> None:
            nonlocal block, i, pos
            while len(block) - i < n:
                more = os.pread(fd, min(_ZIP_BLOCK, stop - pos), pos) if pos < stop else b""
                if not more:
                    raise _ZipError("the central directory is truncated")
                block, i, pos = block[i:] + more, 0, pos + len(more)

        for _ in range(count):
            have(46)  # the fixed part of an entry
            if block[i : i + 4] != _CENTRAL:
                raise _ZipError("a central directory entry without its signature")
            names, extras, comments = struct.unpack_from("<HHH", block, i + 28)
            have(46 + names + extras + comments)
            compressed, plain = struct.unpack_from("<II", block, i + 20)
            sizes = [plain, compressed, struct.unpack_from("<I", block, i + 42)[0]]
            if _ZIP32 in sizes:
                _zip64_extra(block[i + 46 + names : i + 46 + names + extras], sizes)
            if sizes[2] + shift + sizes[1] > size:
                name = block[i + 46 : i + 46 + min(names, 80)].decode("utf-8", "replace")
                return f"member {name!r} runs past the end of the file"
            i += 46 + names + extras + comments
    except _ZipError as exc:
        return f"not a complete zip archive (torch.save writes one): {exc}"
    finally:
        os.close(fd)
    return None


def _index(root: Path, rel: str, files: dict[str, int]) -> str | None:
    """What is missing from a Hugging Face index's shards, or None."""
    try:
        raw = read_regular(root / rel, limit=MAX_HEADER_BYTES, follow_symlinks=False)
        index = jsonin.loads(raw, max_bytes=MAX_HEADER_BYTES)
    except TooLargeError:
        return None  # more than is parsed here (the shards' digests are still verified)
    except jsonin.JSONLimitError as exc:
        return f"the index is not a Hugging Face index: {exc}"
    except ValueError:
        return "the index is not JSON (truncated?)"
    weight_map = index.get("weight_map") if type(index) is dict else None
    if type(weight_map) is not dict:
        return "the index has no weight_map"
    base = str(PurePosixPath(rel).parent)
    names = {str(v) for v in weight_map.values()}
    missing = sorted(n for n in names if (n if base == "." else f"{base}/{n}") not in files)
    if missing:
        return f"the index names {len(missing)} shard(s) that are not there: {', '.join(missing[:3])}"
    return None


def _dcp_metadata(directory: Path, prefix: str, files: dict[str, int]) -> str | None:
    """What the DCP ``.metadata`` references that is missing or too short, or None (torch's reader)."""
    reader_mod: Any = sys.modules.get("torch.distributed.checkpoint")
    if reader_mod is None:  # never import torch (nor unpickle) where the training did not
        return None
    try:
        metadata = reader_mod.FileSystemReader(str(directory)).read_metadata()
    except Exception as exc:
        return f".metadata cannot be read ({type(exc).__name__}: {str(exc)[:120]})"
    need: dict[str, int] = {}
    for info in getattr(metadata, "storage_data", {}).values():
        rel = f"{prefix}{info.relative_path}"
        need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
    for rel, end in sorted(need.items()):
        if rel not in files:
            return f".metadata references {rel}, which is not there"
        if files[rel] < end:
            return f".metadata references bytes up to {end} of {rel}, which has {files[rel]}"
    return None


def structure_problems(
    root: Path, files: dict[str, int], *, dcp_metadata: bool = False
) -> list[tuple[str, str]]:
    """``(file, what is wrong)`` for every file whose structure is broken; empty when all is well.

    ``root`` is the checkpoint (file or directory), ``files`` its listing from :func:`walk`.
    ``dcp_metadata`` also reads DCP ``.metadata`` (a pickle: the training process only)."""
    base = root.parent if root.is_file() else root
    problems = []
    for rel, size in files.items():
        path = base / rel
        name = PurePosixPath(rel).name
        try:
            why = None
            if name.endswith(".safetensors"):
                why = _safetensors(path, size)
            elif name.endswith(".index.json"):
                why = _index(base, rel, files)
            elif name.endswith(_ZIP_SUFFIXES) and _zip_magic(path, follow_symlinks=False):
                why = _zip(path, size)
            elif name == ".metadata" and dcp_metadata:
                parent = str(PurePosixPath(rel).parent)
                why = _dcp_metadata(path.parent, "" if parent == "." else parent + "/", files)
        except OSError as exc:
            why = f"cannot be read: {exc.strerror or exc}"
        if why:
            problems.append((rel, why))
    return problems
