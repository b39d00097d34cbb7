"""The kernel log as an Xid source: a parser for NVIDIA's ``NVRM:`` lines and a follower thread.

The parser takes one line at a time from any of the places the kernel log shows up:

- ``/dev/kmsg`` records, ``prio,seq,usec,flags;message`` plus continuation lines starting with a space
  (Documentation/ABI/testing/dev-kmsg). Only records of facility 0 (``prio >> 3 == 0``) are trusted:
  the kernel forces userspace writes to ``/dev/kmsg`` to facility LOG_USER, so a forged
  ``NVRM: Xid`` written by any process cannot raise a counter.
- ``dmesg`` (``[  123.456] NVRM: ...``, ``dmesg -T``) and journal/syslog text (``... kernel: NVRM: ...``).

It understands the Xid line of several driver generations::

    NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s ...   (R470+)
    NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable ...
    NVRM: Xid (PCI:0000:3d:00): 79, pid=0, GPU has fallen off the bus.                   (pid, no name)
    NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.                          (no pid/name)
    NVRM: Xid (0000:01:00): 13, 0003 00000000 0000a097 ...                               (old, no "PCI:")
    NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel ...    (MIG)
    NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:00): 13, pid=8123, name=python3, ...        (MIG)

and the ``NVRM: GPU at PCI:0000:9b:00: GPU-<uuid>`` line the driver prints before a GPU's first
error, which maps the bus id to the GPU's UUID. Anything else (NVSwitch ``SXid`` lines, garbage,
lines cut short before the comma after the Xid code) is skipped; nothing raises.

Every kernel line is also matched against the patterns of lines that come before trouble
(:func:`trouble`: soft lockups, hung tasks, PCIe bus errors, mlx5 command timeouts and health
failures, an NFS server not responding), which the Xid collector counts by pattern.

The follower reads ``/dev/kmsg`` (a character device: one record per ``read``, ``poll`` for new
ones) from its oldest record, or a plain file from its start, and follows it like ``tail -F``
(rotation and truncation reopen it). Every Xid in it is reported, the history present at open
included, each ``/dev/kmsg`` record at most once (by its sequence number): the counter means "Xids
since boot" (see docs/xid.md).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import select
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from babysitter.node.collector import normalize_pci_bus_id

__all__ = ["KernelLogFollower", "KernelLogParser", "XidEvent", "parse_log", "trouble"]

log = logging.getLogger(__name__)

_MAX_LINE = 8192  # longer lines are cut before matching; kernel records are < 1 KiB of text
_MAX_PENDING = 64 * 1024  # a file "line" longer than this without a newline is garbage: dropped
_READ_SIZE = 64 * 1024  # /dev/kmsg needs a buffer larger than one record (EINVAL otherwise)
_MAX_BUSES = 1024
_FINGERPRINT = 64  # bytes before the read offset that must be unchanged for a file to be "the same"

_KMSG_HEADER = re.compile(r"^(\d{1,10}),(\d{1,20}),(\d{1,20}),[^;]{0,64};")
_BUS = r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"  # VMD domains have 5 digits
# MIG: the driver attributes an Xid to a GPU instance, or to a GPU and a compute instance, inside the
# parentheses: "(PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u)" (kernel_rc.c, krcReportXid).
_MIG = r"(?: GPU-I:(\d{1,5})(?: GPU-CI:(\d{1,5}))?)?"
_XID = re.compile(r"Xid \((?:PCI:)?" + _BUS + _MIG + r"\): (\d{1,6}),(.*)$")
_PID_NAME = re.compile(r"^\s*pid=([^,]{0,32}),\s*(?:name=([^,]{0,64}),\s?)?(.*)$")
_GPU_AT = re.compile(r"GPU at PCI:" + _BUS + r": (GPU-[0-9a-fA-F-]{8,64})")
_NVRM = "NVRM: "
_MLX5_HEALTH = re.compile(
    r"health compromised|health poll failed|[Ff]atal error|internal error|health recovery"
)


def trouble(message: str) -> str | None:
    """The pattern (a value of ``kernel_log_events_total{pattern}``) a kernel line matches, if any::

        watchdog: BUG: soft lockup - CPU#12 stuck for 23s! [python:4242]          soft_lockup
        INFO: task python3:4242 blocked for more than 120 seconds.                 hung_task
        pcieport 0000:16:00.0: PCIe Bus Error: severity=Corrected, type=Physical   pcie_bus_error_corrected
        ... PCIe Bus Error: severity=Uncorrected (Non-Fatal), ...  (or Fatal)      pcie_bus_error_uncorrected
        mlx5_core 0000:19:00.0: wait_func:1110:(pid 37): ENABLE_HCA(0x104) timeout  mlx5_cmd_timeout
        mlx5_core 0000:19:00.0: poll_health:800: device's health compromised       mlx5_health
        nfs: server 10.0.0.5 not responding, still trying                          nfs_not_responding

    Cheap substring checks first: every kernel line passes through here.
    """
    if "soft lockup" in message:
        return "soft_lockup" if "stuck for" in message else None
    if "blocked for more than" in message:
        return "hung_task" if "task " in message else None
    if "PCIe Bus Error" in message:
        return "pcie_bus_error_corrected" if "severity=Corrected" in message else "pcie_bus_error_uncorrected"
    if "mlx5_core" in message:
        if _MLX5_HEALTH.search(message):
            return "mlx5_health"
        return "mlx5_cmd_timeout" if "timeout" in message else None
    if "nfs: server" in message and "not responding" in message:
        return "nfs_not_responding"
    return None


@dataclass(frozen=True)
class XidEvent:
    """One Xid as the kernel logged it."""

    xid: int
    pci_bus_id: str  # normalized (``0000:9b:00``)
    uuid: str  # from the driver's preceding ``GPU at PCI`` line for this bus; "" when not seen
    pid: int | None  # None for old drivers and ``pid='<unknown>'``
    process: str  # the process name, "" when absent or unknown
    message: str  # the text after the code (bounded)
    seq: int | None = None  # /dev/kmsg sequence number
    usec: int | None = None  # /dev/kmsg timestamp (microseconds since boot)
    gpu_instance: int | None = None  # MIG GPU instance (``GPU-I:``), None when not attributed
    compute_instance: int | None = None  # MIG compute instance (``GPU-CI:``), None when not attributed


class KernelLogParser:
    """Turns kernel log lines into :class:`XidEvent`; remembers bus-to-UUID lines between calls.

    Not thread-safe: one parser per reader. Counters (``lines``, ``forged``, ``lost_records``) are
    for diagnostics and tests; ``record_seq`` is the ``/dev/kmsg`` sequence number of the line just
    fed (None for a continuation or a line without a kmsg header) and ``pattern`` the trouble pattern
    it matched (:func:`trouble`; never for a record userspace wrote).
    """

    def __init__(self) -> None:
        self.bus_uuids: dict[str, str] = {}
        self.lines = 0
        self.forged = 0
        self.lost_records = 0
        self.record_seq: int | None = None
        self.pattern: str | None = None
        self._last_seq: int | None = None

    def feed(self, raw: str | bytes) -> XidEvent | None:
        """Parse one line (without or with its newline); the Xid it reports, if any."""
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if len(line) > _MAX_LINE:
            line = line[:_MAX_LINE]
        self.lines += 1
        self.record_seq = None
        self.pattern = None
        seq: int | None = None
        usec: int | None = None
        if line[:1] == " ":
            return None  # /dev/kmsg continuation (" SUBSYSTEM=pci") or indented noise
        header = _KMSG_HEADER.match(line) if line[:1].isdigit() else None
        if header is not None:
            prio, seq, usec = int(header.group(1)), int(header.group(2)), int(header.group(3))
            self.record_seq = seq
            self._track_seq(seq)
            message = line[header.end() :]
            if prio >> 3 != 0:
                if _NVRM in message:
                    self.forged += 1  # written by userspace, not the driver
                return None
        else:
            message = line
        if (  # trouble()'s keywords, tested inline: every kernel line passes here
            "lockup" in message
            or "blocked for" in message
            or "Bus Error" in message
            or "mlx5_core" in message
            or "nfs: server" in message
        ):
            self.pattern = trouble(message)
        at = message.find(_NVRM)
        if at < 0:
            return None
        text = message[at + len(_NVRM) :].rstrip("\r\n")
        if text.startswith("Xid "):
            return self._xid(text, seq, usec)
        if text.startswith("GPU at PCI:"):
            self._gpu_at(text)
        return None

    def _xid(self, text: str, seq: int | None, usec: int | None) -> XidEvent | None:
        match = _XID.match(text)
        if match is None:
            return None
        xid = int(match.group(4))
        if xid <= 0:
            return None
        bus = normalize_pci_bus_id(match.group(1))
        gpu_instance = int(match.group(2)) if match.group(2) is not None else None
        compute_instance = int(match.group(3)) if match.group(3) is not None else None
        rest = match.group(5)
        pid: int | None = None
        process = ""
        fields = _PID_NAME.match(rest)
        if fields is not None:
            pid_text = fields.group(1).strip().strip("'")
            pid = int(pid_text) if pid_text.isdigit() else None
            name = (fields.group(2) or "").strip().strip("'")
            process = "" if name == "<unknown>" else name
            rest = fields.group(3)
        return XidEvent(
            xid=xid,
            pci_bus_id=bus,
            uuid=self.bus_uuids.get(bus, ""),
            pid=pid,
            process=process,
            message=rest.strip()[:256],
            seq=seq,
            usec=usec,
            gpu_instance=gpu_instance,
            compute_instance=compute_instance,
        )

    def _gpu_at(self, text: str) -> None:
        match = _GPU_AT.match(text)
        if match is None:
            return
        bus = normalize_pci_bus_id(match.group(1))
        if bus not in self.bus_uuids and len(self.bus_uuids) >= _MAX_BUSES:
            return
        self.bus_uuids[bus] = match.group(2).lower().replace("gpu-", "GPU-", 1)

    def _track_seq(self, seq: int) -> None:
        last = self._last_seq
        if last is not None and seq > last + 1:
            self.lost_records += seq - last - 1
        self._last_seq = seq


def parse_log(lines: Iterable[str | bytes], parser: KernelLogParser | None = None) -> list[XidEvent]:
    """Every Xid in ``lines`` (a whole dmesg/journal dump, say), in order."""
    parser = parser or KernelLogParser()
    found: list[XidEvent] = []
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            found.append(event)
    return found


#: ``on_status(ok, reason)``: the source opened (``ok``) or failed; called on every change only.
StatusCallback = Callable[[bool, str], None]
#: ``on_event(event, live)``: an Xid; ``live`` is False for history (already in the log at open).
EventCallback = Callable[[XidEvent, bool], None]
#: ``on_pattern(pattern, live)``: a kernel line matched a trouble pattern (:func:`trouble`).
PatternCallback = Callable[[str, bool], None]


class KernelLogFollower:
    """Follows ``/dev/kmsg`` or a log file on the calling thread until ``stop`` is set.

    Every Xid is reported once, history included: a ``/dev/kmsg`` record is identified by its
    sequence number, and records up to ``resume_after_seq`` (set from a saved state before ``run``,
    then advanced as records are read) are parsed for bus-to-UUID lines but not reported again, so a
    reopen after an error does not repeat the ring buffer. A plain file reopened after an error
    resumes where it was read up to, when the bytes before that point are unchanged; a rotated or
    truncated file is new content, read from its start.

    ``on_caught_up`` is called each time the history present at open has been read. Never raises: an
    unreadable source is reported through ``on_status`` (once per change) and retried every
    ``retry_seconds``.
    """

    def __init__(
        self,
        path: str,
        on_event: EventCallback,
        on_status: StatusCallback,
        *,
        on_caught_up: Callable[[], None] | None = None,
        on_pattern: PatternCallback | None = None,
        poll_seconds: float = 0.5,
        retry_seconds: float = 30.0,
    ) -> None:
        self.path = path
        self.parser = KernelLogParser()
        self.records = 0  # lines or records read, history included
        self.offset = 0  # bytes read from the current file (plain files only)
        self.live = False  # True once the history present at the first open has been read
        self.resume_after_seq: int | None = None
        self._on_event = on_event
        self._on_status = on_status
        self._on_caught_up = on_caught_up
        self._on_pattern = on_pattern
        self._poll = poll_seconds
        self._retry = retry_seconds
        self._last_status: tuple[bool, str] | None = None
        self._file_done: tuple[int, int, bytes] | None = None  # (inode, end of last full line, bytes before)

    def run(self, stop: threading.Event) -> None:
        """Read until ``stop`` is set; reopen after errors."""
        while not stop.is_set():
            try:
                st = os.stat(self.path)
                if stat.S_ISCHR(st.st_mode):
                    self._follow_device(stop)
                elif stat.S_ISREG(st.st_mode):
                    self._follow_file(stop)
                else:
                    raise OSError(errno.EINVAL, "not a character device or regular file", self.path)
            except OSError as exc:
                self._status(False, _describe(exc))
            except Exception as exc:  # a bug here must not end the thread silently
                log.exception("babysitter: kernel log reader failed on %s", self.path)
                self._status(False, f"internal error: {type(exc).__name__}")
            stop.wait(self._retry)

    # --- /dev/kmsg ---------------------------------------------------------------------------------
    def _follow_device(self, stop: threading.Event) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._status(True, "")
            live = False
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLPRI)
            while not stop.is_set():
                try:
                    chunk = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    if not live:  # the backlog is drained: from here on, records are new
                        live = True
                        self._caught_up()
                    poller.poll(int(self._poll * 1000))
                    continue
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # overwritten before we read them (the seq gap counts them)
                        continue
                    raise
                if not chunk:
                    poller.poll(int(self._poll * 1000))
                    continue
                self._feed(chunk.split(b"\n"), live)
        finally:
            os.close(fd)

    # --- plain files (dmesg/journal text) ----------------------------------------------------------
    def _follow_file(self, stop: threading.Event) -> None:
        fh = open(self.path, "rb", buffering=0)  # noqa: SIM115 (held across the loop, closed in finally)
        try:
            self._status(True, "")
            ino = os.fstat(fh.fileno()).st_ino
            self.offset, done_tail = self._resume_point(fh.fileno(), ino)
            if self.offset:
                fh.seek(self.offset)
            pending = b""
            tail = done_tail
            seen: tuple[int, int] | None = None
            live = False
            while not stop.is_set():
                chunk = fh.read(_READ_SIZE)
                if chunk:
                    self.offset += len(chunk)
                    tail = (tail + chunk)[-_FINGERPRINT:]
                    data = pending + chunk
                    pending = self._feed_partial(data, live)
                    done_tail = (done_tail + data[: len(data) - len(pending)])[-_FINGERPRINT:]
                    self._file_done = (ino, self.offset - len(pending), done_tail)
                    continue
                if not live:  # read up to the end once: everything after is new
                    live = True
                    self._caught_up()
                if stop.wait(self._poll):
                    return
                try:
                    st = os.stat(self.path)
                except FileNotFoundError:
                    continue  # rotated away; wait for the new file
                # Rotated (new inode), truncated (shorter), or truncated and rewritten since we last
                # looked (the bytes before our offset changed: copytruncate racing a writer).
                replaced = st.st_ino != ino or st.st_size < self.offset
                if not replaced and tail and (st.st_size, st.st_mtime_ns) != seen:
                    replaced = os.pread(fh.fileno(), len(tail), self.offset - len(tail)) != tail
                seen = (st.st_size, st.st_mtime_ns)
                if replaced:
                    fh.close()
                    fh = open(self.path, "rb", buffering=0)  # noqa: SIM115
                    ino = os.fstat(fh.fileno()).st_ino
                    pending = tail = done_tail = b""
                    self.offset = 0
                    self._file_done = (ino, 0, b"")
        finally:
            fh.close()

    def _resume_point(self, fd: int, ino: int) -> tuple[int, bytes]:
        """Where to read a (re)opened file from: (offset, bytes before it); (0, b"") for new content."""
        done = self._file_done
        if done is None or done[0] != ino or done[1] == 0:
            return 0, b""
        _, offset, before = done
        if os.fstat(fd).st_size < offset or os.pread(fd, len(before), offset - len(before)) != before:
            return 0, b""  # rewritten while we were away: new content
        return offset, before

    def _feed_partial(self, data: bytes, live: bool) -> bytes:
        *complete, rest = data.split(b"\n")
        self._feed(complete, live)
        if len(rest) > _MAX_PENDING:
            return b""
        return rest

    def _feed(self, lines: list[bytes], live: bool) -> None:
        for line in lines:
            if not line:
                continue
            self.records += 1
            event = self.parser.feed(line)
            seq = self.parser.record_seq
            if seq is not None and self.resume_after_seq is not None and seq <= self.resume_after_seq:
                continue  # reported before (an earlier open, or the saved state)
            if event is not None:
                self._on_event(event, live)
            pattern = self.parser.pattern
            if pattern is not None and self._on_pattern is not None:
                self._on_pattern(pattern, live)
            if seq is not None:
                self.resume_after_seq = seq

    def _caught_up(self) -> None:
        self.live = True
        if self._on_caught_up is not None:
            try:
                self._on_caught_up()
            except Exception:
                log.exception("babysitter: kernel log caught-up callback failed")

    def _status(self, ok: bool, reason: str) -> None:
        if self._last_status != (ok, reason):
            self._last_status = (ok, reason)
            with contextlib.suppress(Exception):
                self._on_status(ok, reason)


def _describe(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (the agent needs CAP_SYSLOG, or root, to read /dev/kmsg)"
    if exc.errno == errno.ENOENT:
        return "no such file"
    return exc.strerror or type(exc).__name__
