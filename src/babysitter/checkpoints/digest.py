"""Content digests of checkpoint files, per fixed-size chunk, read with one reused buffer.

**Why SHA-256.** It is in every Python (``hashlib``, OpenSSL underneath, no new dependency), and on
CPUs with the SHA extensions (x86 since Ice Lake/Zen, ARMv8.2) OpenSSL's SHA-256 is the fastest
digest ``hashlib`` offers: 651-1,119 MiB/s on one core of the development VM (a shared 2-core Xeon
with ``sha_ni``) against BLAKE2b's 485-675 MiB/s (1.3-1.7x), and faster than that VM's disk writes
(466-684 MiB/s with fsync): ``benchmarks/bench_checkpoints.py``, results in
``benchmarks/results/checkpoints.md``. ``hashlib`` releases the GIL while it hashes and while the
file is read, so the background thread costs the training thread little beyond the CPU it takes. A
CRC (``zlib.crc32``, 3-3.5 GiB/s there) would be faster still but is not a content digest (32 bits,
linear); nothing here needs resistance to an attacker, only to chance, and 256 bits is that many
times over.

**Why chunks.** One digest per ``CHUNK`` (16 MiB) of each file, not one per file, lets the node
agent's sentinel verify a terabyte checkpoint a few chunks at a time within an I/O budget and still
say which byte range of which file went bad. A 1 TB checkpoint's manifest holds ~65,000 digests
(about 4.5 MB of JSON).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

__all__ = [
    "ALGORITHM",
    "ALGORITHMS",
    "BUFFER",
    "CHUNK",
    "MAX_CHUNK",
    "MIN_CHUNK",
    "check_chunk",
    "chunk_count",
    "hash_file",
    "hash_range",
]

#: The digest the tracker writes by default.
ALGORITHM = "sha256"
#: Digests a manifest may name (``hashlib`` names).
ALGORITHMS = ("sha256", "blake2b", "sha1")
#: Bytes per digest (what the tracker writes).
CHUNK = 16 << 20
#: The chunk sizes a manifest may use. Below: a 1-byte chunk turns a 43 MB checkpoint into a 2.8 GB
#: manifest (64 hex digits a byte), and lets a verdict tell single bytes apart. Above: the node
#: agent's sentinel reads at most ``max(its budget, CHUNK)`` bytes in a pass, so a larger chunk could
#: never be read, and its file never verified.
MIN_CHUNK = 64 << 10
MAX_CHUNK = CHUNK
#: Bytes read per system call (one buffer reused for every read).
BUFFER = 4 << 20


def check_chunk(chunk: object) -> int:
    """``chunk`` when it is a chunk size a manifest may use, else ValueError (at setup: a tracker
    must not write manifests that every reader refuses)."""
    if type(chunk) is not int or not MIN_CHUNK <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk must be an int in [{MIN_CHUNK}, {MAX_CHUNK}] bytes, got {chunk!r}")
    return chunk


def chunk_count(size: int, chunk: int = CHUNK) -> int:
    """Chunks of a file of ``size`` bytes (an empty file has one, the digest of nothing)."""
    return max(1, -(-size // chunk))


def _new(alg: str) -> Callable[[], object]:
    if alg not in ALGORITHMS:
        raise ValueError(f"unknown digest {alg!r}; one of {', '.join(ALGORITHMS)}")
    return getattr(hashlib, alg)  # type: ignore[no-any-return]


def hash_range(
    fd: int,
    offset: int,
    length: int,
    *,
    alg: str = ALGORITHM,
    buf: bytearray | None = None,
    drop_cache: bool = False,
) -> tuple[str, int]:
    """(hex digest, bytes read) of ``length`` bytes at ``offset`` of an open file; fewer bytes read than
    asked means the file is shorter than that. ``drop_cache`` first evicts the range's clean cached
    pages (``POSIX_FADV_DONTNEED``) so the bytes come from the storage, not from memory, and evicts
    them again afterwards so a verification pass does not fill the page cache."""
    h = _new(alg)()
    buf = buf if buf is not None else bytearray(BUFFER)
    view = memoryview(buf)
    if drop_cache and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    done = 0
    while done < length:
        want = min(len(buf), length - done)
        got = os.preadv(fd, [view[:want]], offset + done)
        if got <= 0:
            break
        h.update(view[:got])  # type: ignore[attr-defined]
        done += got
    if drop_cache and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    return h.hexdigest(), done  # type: ignore[attr-defined]


def hash_file(
    path: str | os.PathLike[str],
    *,
    alg: str = ALGORITHM,
    chunk: int = CHUNK,
    buf: bytearray | None = None,
) -> tuple[int, list[str]]:
    """(size, one digest per chunk) of a whole file, read once, front to back.

    The size is the file's at open; a file that grows while it is read is hashed up to that size, one
    that shrinks raises OSError (the save was still writing it)."""
    buf = buf if buf is not None else bytearray(BUFFER)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        digests = []
        for i in range(chunk_count(size, chunk)):
            offset = i * chunk
            length = min(chunk, size - offset)
            digest, got = hash_range(fd, offset, length, alg=alg, buf=buf)
            if got != length:
                raise OSError(
                    f"{os.fspath(path)} shrank while it was hashed ({offset + got} of {size} bytes)"
                )
            digests.append(digest)
        return size, digests
    finally:
        os.close(fd)
