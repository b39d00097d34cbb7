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
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import sys
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from babysitter.checkpoints.manifest import is_manifest_file

__all__ = ["LAYOUTS", "WalkLimitError", "detect", "shard_owner", "structure_problems", "walk"]

LAYOUTS = ("dcp", "hf", "safetensors", "torch", "files")
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
_MAX_FILES = 1_000_000
_MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own limit
_ZIP_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")


class WalkLimitError(OSError):
    """More files under a checkpoint than a manifest may list."""


def walk(root: Path, limit: int = _MAX_FILES) -> dict[str, int]:
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


def _zip_magic(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    except OSError:
        return False


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
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        if length > _MAX_SAFETENSORS_HEADER or 8 + length > size:
            return f"header length {length} does not fit in {size} bytes (truncated?)"
        try:
            header = json.loads(fh.read(length))
        except (ValueError, UnicodeDecodeError):
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


def _zip(path: Path, size: int) -> str | None:
    """What is wrong with a zip archive's directory (``torch.save``'s format), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"member {info.filename[:80]!r} runs past the end of the file"
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return f"not a complete zip archive (torch.save writes one): {exc}"
    return None


def _index(root: Path, rel: str, files: dict[str, int]) -> str | None:
    """What is missing from a Hugging Face index's shards, or None."""
    try:
        index = json.loads((root / rel).read_bytes())
    except (ValueError, UnicodeDecodeError):
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
            elif name.endswith(_ZIP_SUFFIXES) and _zip_magic(path):
                why = _zip(path, size)
            elif name == ".metadata" and dcp_metadata:
                parent = str(PurePosixPath(rel).parent)
                why = _dcp_metadata(path.parent, "" if parent == "." else parent + "/", files)
        except OSError as exc:
            why = f"cannot be read: {exc.strerror or exc}"
        if why:
            problems.append((rel, why))
    return problems
