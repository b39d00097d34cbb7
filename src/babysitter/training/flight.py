"""PyTorch's flight recorder, read safely: which collectives this rank enqueued, and when.

Every process group records its collectives in a ring buffer (``TORCH_FR_BUFFER_SIZE`` entries;
torch 2.13 keeps 2000 by default, 0 turns it off, older releases start off): the group, the
collective's sequence number, the operation and the tensor sizes, the host time it was enqueued,
and per group the last enqueued and last completed sequence numbers. Two recorders exist on a CUDA
build: the generic one (``_dump_fr_trace_json``: gloo, CPU collectives) and ProcessGroupNCCL's own
(``_dump_nccl_trace_json``: NCCL collectives appear only there). Both dump JSON; neither releases
the GIL while it does, and the full dump costs tens of microseconds per entry (measured here:
``docs/integrations.md``), so this module offers two reads: :meth:`Recorder.status` (the groups'
counters only, without entries: tens of microseconds) and :meth:`Recorder.capture` (every entry).

What the gloo recorder of torch 2.13 holds, checked with real gloo ranks on this build: ``state`` is
always ``scheduled`` and both ``time_discovered_*_ns`` are 0 (gloo reports no start or completion
time), ``retired`` turns true once a collective completed, ``time_created_ns`` is the host's wall
clock (``time.time_ns()``'s clock) when the collective was enqueued, ``pg_status`` carries
``last_enqueued_collective`` and ``last_completed_collective`` (``last_started_collective`` stays
-1). NCCL entries add ``duration_ms`` (GPU time of the collective, its wait for the slowest peer
included) when ``TORCH_NCCL_ENABLE_TIMING=1``.

Everything here is defensive: a missing API, a malformed, empty or oversized dump, or an entry
without the fields it needs raises :class:`DumpError` (or is skipped and counted), never anything
else; the caller counts and logs once.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace

__all__ = [
    "BUFFER_ENV",
    "DEFAULT_BUFFER",
    "MAX_BYTES",
    "MAX_CAPTURE_BUFFER",
    "Capture",
    "DumpError",
    "Entry",
    "GroupStatus",
    "Recorder",
    "buffer_size",
    "enable",
    "parse",
    "wall_ns",
]

#: The environment variables torch reads for the buffer size, newest name first.
BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
#: What ``watch()`` sets when neither is set: torch 2.13's own default, so nothing changes there and
#: older releases (which start with the recorder off) record as 2.13 does.
DEFAULT_BUFFER = 2000
#: Above this many entries a capture is too slow to run every straggler round (about 20 us per entry,
#: with the GIL held); such a buffer is read only when a rank stalls.
MAX_CAPTURE_BUFFER = 8192
#: A dump larger than this is not parsed (counted as ``huge``).
MAX_BYTES = 32 * 1024 * 1024

_DUMPERS = (("nccl", "_dump_nccl_trace_json"), ("generic", "_dump_fr_trace_json"))


def wall_ns() -> int:
    """The host's wall clock, the clock the recorder stamps ``time_created_ns`` with.

    One function so that a test can shift it together with the dump's times: a host whose clock is
    off by ``d`` shifts both by ``d`` (``tests/test_collectives_e2e.py`` runs a rank that way).
    """
    return time.time_ns()


class DumpError(ValueError):
    """A dump that cannot be used; ``reason`` is a short key (malformed, empty, huge, api)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class GroupStatus:
    """One process group's counters: the last collective enqueued and the last completed."""

    enqueued: int
    completed: int


@dataclass(frozen=True)
class Entry:
    """One recorded collective (the fields babysitter uses)."""

    pg_id: str
    pg: str
    desc: str
    seq: int
    op: str
    backend: str
    created: float
    numel: int
    record_id: int
    retired: bool
    duration: float | None = None


@dataclass
class Capture:
    """What one dump held: group counters by ``pg_id``, entries oldest first, and the dump's cost."""

    groups: dict[str, GroupStatus]
    entries: list[Entry] = field(default_factory=list)
    names: dict[str, tuple[str, str]] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: int = 0
    has_entries: bool = False


def buffer_size(env: Mapping[str, str] | None = None) -> int | None:
    """The buffer size the environment asks for (the first of :data:`BUFFER_ENV` set), None if unset;
    a value that is not an integer counts as 0 (torch would reject it too)."""
    env = os.environ if env is None else env
    for name in BUFFER_ENV:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return max(0, int(raw))
        except ValueError:
            return 0
    return None


def enable(env: MutableMapping[str, str] | None = None) -> str:
    """Ask torch to record collectives, unless the environment already says how many.

    Returns ``set`` (babysitter set ``TORCH_FR_BUFFER_SIZE``), ``user`` (the user's size, > 0) or
    ``off`` (the user's size is 0). torch reads the variable when its recorder records the first
    collective, so this works before ``init_process_group`` and, on torch 2.13, before the first
    collective (checked here); after that only what torch already decided counts.
    """
    env = os.environ if env is None else env
    size = buffer_size(env)
    if size is None:
        env[BUFFER_ENV[0]] = str(DEFAULT_BUFFER)
        return "set"
    return "user" if size > 0 else "off"


def _int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise DumpError("malformed", f"{what} is a bool")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise DumpError("malformed", f"{what} is not an integer: {str(value)[:40]!r}")


def _numel(sizes: object) -> int:
    total = 0
    if not isinstance(sizes, list):
        return 0
    for shape in sizes:
        if isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            n = 1
            for d in shape:
                n *= d
            total += n
    return total


def _entry(item: object) -> Entry:
    if not isinstance(item, dict):
        raise DumpError("malformed", "an entry is not an object")
    group = item.get("process_group")
    if not (isinstance(group, list) and len(group) >= 1 and all(isinstance(x, str) for x in group)):
        raise DumpError("malformed", "an entry has no process_group [name, desc]")
    name = str(item.get("profiling_name", ""))
    backend, _, op = name.rpartition(":")
    created_ns = _int(item.get("time_created_ns"), "time_created_ns")
    duration = item.get("duration_ms")
    seconds = (
        float(duration) / 1000.0
        if isinstance(duration, (int, float)) and not isinstance(duration, bool) and math.isfinite(duration)
        else None
    )
    return Entry(
        pg_id=str(_int(item.get("pg_id", -1), "pg_id")),
        pg=group[0],
        desc=group[1] if len(group) > 1 else "",
        seq=_int(item.get("collective_seq_id"), "collective_seq_id"),
        op=op[:64],
        backend=backend[:16],
        created=created_ns / 1e9,
        numel=_numel(item.get("input_sizes")),
        record_id=_int(item.get("record_id", -1), "record_id"),
        retired=bool(item.get("retired", False)),
        duration=seconds,
    )


def parse(raw: object, *, max_bytes: int = MAX_BYTES, shift_ns: int = 0) -> Capture:
    """A :class:`Capture` from one JSON dump; :class:`DumpError` when it is unusable as a whole.

    ``shift_ns`` is added to every ``time_created_ns`` (the tests' clock offset; 0 otherwise). Entries
    that lack a field are skipped and counted in ``Capture.skipped``; p2p entries are left out (their
    ``collective_seq_id`` does not advance).
    """
    if isinstance(raw, str):
        raw = raw.encode()
    if not isinstance(raw, (bytes, bytearray)):
        raise DumpError("malformed", f"the dump is {type(raw).__name__}, not bytes")
    if not raw:
        raise DumpError("empty", "the dump is empty")
    if len(raw) > max_bytes:
        raise DumpError("huge", f"{len(raw)} bytes (at most {max_bytes} are parsed)")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise DumpError("malformed", f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DumpError("malformed", "the dump is not a JSON object")
    status = data.get("pg_status", {})
    if not isinstance(status, dict):
        raise DumpError("malformed", "pg_status is not an object")
    groups: dict[str, GroupStatus] = {}
    for pg_id, counters in status.items():
        if not isinstance(counters, dict):
            raise DumpError("malformed", f"pg_status[{str(pg_id)[:20]!r}] is not an object")
        groups[str(pg_id)] = GroupStatus(
            enqueued=_int(counters.get("last_enqueued_collective", -1), "last_enqueued_collective"),
            completed=_int(counters.get("last_completed_collective", -1), "last_completed_collective"),
        )
    capture = Capture(groups=groups, has_entries="entries" in data)
    items = data.get("entries", [])
    if not isinstance(items, list):
        raise DumpError("malformed", "entries is not a list")
    for item in items:
        try:
            entry = _entry(item)
        except DumpError:
            capture.skipped += 1
            continue
        if isinstance(item, dict) and item.get("is_p2p") is True:
            continue
        if shift_ns:
            entry = replace(entry, created=entry.created + shift_ns / 1e9)
        capture.entries.append(entry)
        capture.names[entry.pg_id] = (entry.pg, entry.desc)
    return capture


def _clock_shift() -> int:
    """:func:`wall_ns` minus the real wall clock, to the millisecond: 0 unless a test shifted it."""
    return round((wall_ns() - time.time_ns()) / 1e6) * 1_000_000


class Recorder:
    """The flight recorders of this torch build, dumped and parsed (never raises but :class:`DumpError`).

    ``api`` maps a recorder kind (``nccl``, ``generic``) to its dump function ``(include_entries,
    only_active) -> bytes``; by default the functions torch has. The recorder stamps with the host's
    wall clock, so its times move with :func:`wall_ns` (a test that shifts one shifts both; ``shift_ns``
    adds a fixed offset instead).
    """

    def __init__(
        self,
        api: Mapping[str, Callable[[bool, bool], object]] | None = None,
        *,
        max_bytes: int = MAX_BYTES,
        shift_ns: int = 0,
    ) -> None:
        self.api = dict(api) if api is not None else self.torch_api()
        self.max_bytes = max_bytes
        self.shift_ns = shift_ns

    @staticmethod
    def torch_api() -> dict[str, Callable[[bool, bool], object]]:
        """The dump functions of the imported torch (empty without torch.distributed)."""
        import sys

        c10d = getattr(getattr(sys.modules.get("torch"), "_C", None), "_distributed_c10d", None)
        found: dict[str, Callable[[bool, bool], object]] = {}
        for kind, name in _DUMPERS:
            fn = getattr(c10d, name, None)
            if callable(fn):
                found[kind] = fn
        return found

    def _read(self, entries: bool) -> Capture:
        if not self.api:
            raise DumpError("api", "this torch has no flight recorder dump (torch >= 2.8 has one)")
        t0 = time.perf_counter()
        merged: Capture | None = None
        for kind in ("nccl", "generic"):
            fn = self.api.get(kind)
            if fn is None:
                continue
            try:
                raw = fn(entries, False)
            except Exception as exc:  # a C++ error surfaces as RuntimeError; anything else too
                raise DumpError("api", f"{kind} dump raised {type(exc).__name__}: {exc}") from None
            part = parse(raw, max_bytes=self.max_bytes, shift_ns=self.shift_ns or _clock_shift())
            if merged is None:
                merged = part
                continue
            # A group both recorders know (a CPU and a CUDA backend on one group): NCCL's counters,
            # read first, win; its collectives are the training's.
            for pg_id, counters in part.groups.items():
                merged.groups.setdefault(pg_id, counters)
            known = {e.pg_id for e in merged.entries}
            merged.entries.extend(e for e in part.entries if e.pg_id not in known)
            for pg_id, name in part.names.items():
                merged.names.setdefault(pg_id, name)
            merged.skipped += part.skipped
            merged.has_entries = merged.has_entries or part.has_entries
        assert merged is not None  # self.api is not empty
        merged.seconds = time.perf_counter() - t0
        return merged

    def status(self) -> Capture:
        """The groups' counters only (no entries): cheap, fine to call every second."""
        return self._read(False)

    def capture(self) -> Capture:
        """Every entry of every recorder (costly: about 20 us per entry with the GIL held)."""
        return self._read(True)
