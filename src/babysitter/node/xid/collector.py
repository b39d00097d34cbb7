"""Xid errors from NVML events and the kernel log, counted once per event, per GPU, code and action.

Exported as the counter ``gpu_xid_errors_total{gpu,uuid,pci_bus_id,model,xid,action}`` (repeats
are visible, unlike dcgm-exporter's last-value gauge). Two sources, each on its own thread:

- NVML: an event set registered for ``nvmlEventTypeXidCriticalError`` on every GPU that supports
  it (``NVMLError_NotSupported`` devices are skipped with a log line), waited on in 500 ms slices.
- The kernel log: ``/dev/kmsg`` or a dmesg/journal text file (:mod:`babysitter.node.xid.kmsg`).

**Counted once.** Both sources usually report the same Xid within milliseconds. A sighting is
counted when it arrives, unless it *pairs* with a not-yet-paired sighting of the same GPU (PCI bus)
and Xid code from the *other* source within ``dedupe_window_seconds`` (10 s by default); pairs are
matched oldest first. Repeats seen by one source are never merged, so a burst of N Xids seen by both
counts N, and an Xid only one source saw (the driver rate-limits its prints; NVML may not cover a
GPU) still counts. Trade-off: two distinct events within the window that each source saw only one
of count once, and a source lagging more than the window counts twice.

**Unknown GPUs.** An Xid for a bus that is not in ``gpus()`` (a GPU NVML no longer lists, or never
did) is still counted: ``gpu=""`` and ``model=""``, ``pci_bus_id`` from the log, ``uuid`` from the
driver's ``GPU at PCI`` line when it was seen (else ``""``).

**Xids since boot.** The kernel log is read from its oldest record, so the counter means "Xid events
since boot" (as far back as the kernel ring buffer reaches): Xids logged before the agent started, or
while it was down, are counted when it starts. NVML starts only once that history has been read, so
an Xid is either in the history (kmsg alone reports it) or new (both may, and they pair). A restart
reads the same records again and arrives at the same counts. With ``state_path`` the counts and the
sequence number of the last kernel record counted are saved, so a restart restores them and counts
only later records: exact even when the ring buffer has since dropped old records, or NVML saw Xids
the kernel log did not. **MIG**: the GPU and compute instance of a kernel-log Xid are in its log line,
not in labels (the per-GPU series budget; docs/xid.md).

**Source health.** A source that cannot be read (``/dev/kmsg`` without CAP_SYSLOG, NVML without
event support) logs one line per change and shows in :meth:`XidCollector.source_status` and, once
the catalog has it, in ``babysitter_xid_source_up{source}``; the other source keeps counting.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.core import Metric

from babysitter.catalog import fabric as F
from babysitter.catalog import node as N
from babysitter.catalog._spec import MetricSpec
from babysitter.node.collector import GpuIdentity, normalize_pci_bus_id
from babysitter.node.xid.codes import action_for
from babysitter.node.xid.kmsg import KernelLogFollower, XidEvent
from babysitter.node.xid.state import StateError, XidState, boot_id, load_state, save_state

__all__ = ["SOURCES", "XidCollector", "XidDeduper"]

log = logging.getLogger(__name__)

SOURCES = ("kmsg", "nvml")
_MAX_XID = 100_000  # codes are < 200 today; anything larger is corrupt data, not a new label value
_MAX_SERIES = 4096
_WAIT_MS = 500
_NVML_MAX_FAILURES = 8  # consecutive nvmlEventSetWait errors (not timeouts) before NVML is re-initialized
_LOG_EVERY = 60.0  # seconds between log lines for one GPU and Xid code
_NVML_NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t gpuInstanceId/computeInstanceId when not attributed
_HISTORY_SHOWN = 8  # (GPU, code) groups named in the start-up line about the history
_CLOCK_SLACK_US = 1_000_000  # printk's clock against CLOCK_MONOTONIC: doubt goes to NVML

#: NVML device handle address -> label values (gpu, uuid, pci_bus_id, model) read at registration.
_Devices = dict[int | None, tuple[str, str, str, str]]

#: Source health gauge, once catalog/node.py defines it (see docs/xid.md); None until then.
_SOURCE_UP: MetricSpec | None = getattr(N, "XID_SOURCE_UP", None)


class XidDeduper:
    """Pairs sightings of the same (GPU, Xid) from two sources within a window; see the module doc.

    ``admit`` returns True when the sighting is a new event (count it) and False when it is the
    other source's report of an event already counted. Memory is bounded: sightings older than the
    window are dropped, at most ``max_pending`` are kept per key.
    """

    def __init__(self, window_seconds: float, *, max_pending: int = 1024) -> None:
        if window_seconds < 0:
            raise ValueError(f"dedupe window must be >= 0 s, got {window_seconds}")
        self.window = float(window_seconds)
        self._max_pending = max_pending
        self._pending: dict[tuple[str, int], deque[tuple[str, float]]] = {}
        self._admitted = 0

    def admit(self, key: tuple[str, int], source: str, now: float) -> bool:
        pending = self._pending.get(key)
        if pending is not None:
            while pending and pending[0][1] < now - self.window:
                pending.popleft()
            for i, (other, _) in enumerate(pending):
                if other != source:
                    del pending[i]
                    return False
        else:
            pending = self._pending[key] = deque()
        if len(pending) >= self._max_pending:
            pending.popleft()
        pending.append((source, now))
        self._admitted += 1
        if self._admitted % 256 == 0:
            self._sweep(now)
        return True

    def _sweep(self, now: float) -> None:
        for key in [k for k, q in self._pending.items() if not q or q[-1][1] < now - self.window]:
            del self._pending[key]


class XidCollector:
    """The ``xid`` collector: NVML Xid events plus the kernel log, deduplicated (module doc).

    ``gpus`` returns the agent's GPUs (labels, bus-to-GPU mapping); it is called from the reader
    threads and must be thread-safe. ``nvml`` is a pynvml-shaped module (real or
    :class:`~babysitter.node.gpu.fake.FakeNvml`); the NVML thread takes its own ``nvmlInit``
    reference and releases it on close. ``kmsg_path=None`` or ``nvml=None`` disables that source.
    NVML waits up to ``kmsg_wait_seconds`` for the kernel log's history to be read (module doc).
    ``state_path`` (optional) is where counts survive a restart; ``boot`` overrides the boot id
    (tests).
    """

    name = "xid"

    def __init__(
        self,
        *,
        gpus: Callable[[], Sequence[GpuIdentity]],
        kmsg_path: str | None = "/dev/kmsg",
        nvml: Any | None = None,
        dedupe_window_seconds: float = 10.0,
        kmsg_retry_seconds: float = 30.0,
        nvml_retry_seconds: float = 30.0,
        kmsg_wait_seconds: float = 10.0,
        state_path: str | None = None,
        state_save_seconds: float = 1.0,
        boot: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gpus = gpus
        self._kmsg_path = kmsg_path
        self._nvml = nvml
        self._clock = clock
        self._kmsg_wait = float(kmsg_wait_seconds)
        self._kmsg_ready = threading.Event()  # the kernel log's history is read (or it cannot be)
        self._state_path = state_path
        self._state_every = float(state_save_seconds)
        self._boot = boot_id() if boot is None else boot
        self._kmsg_seq: int | None = None  # seq of the last kernel record whose Xid is in the counts
        self._resumable = True  # False once an Xid without a seq was counted (see XidState)
        self._dirty = threading.Event()
        self._state_lock = threading.Lock()
        self._state_warned = False
        self._history: dict[tuple[str, int], int] = {}  # (bus, xid) -> Xids read as history
        self._history_logged = False
        self._nvml_since_us: int | None = None  # CLOCK_MONOTONIC µs of NVML's first working registration
        self._left_to_nvml = 0  # kernel records read late that NVML had already reported (not counted)
        self._dedupe = XidDeduper(dedupe_window_seconds)
        self._nvml_retry = float(nvml_retry_seconds)
        self._nvml_warned: set[tuple[int, str]] = set()
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, ...], int] = {}
        self._seen = dict.fromkeys(SOURCES, 0)  # sightings per source, before dedupe
        self._patterns = dict.fromkeys(F.KERNEL_LOG_PATTERNS, 0)  # kernel lines before trouble, by pattern
        self._status: dict[str, tuple[bool, str]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._overflow_logged = False
        self._logged: dict[tuple[str, int, str], tuple[float | None, int]] = {}
        self.follower: KernelLogFollower | None = None
        if kmsg_path is not None:
            self.follower = KernelLogFollower(
                kmsg_path,
                self._on_kmsg,
                lambda ok, reason: self._set_status("kmsg", ok, reason),
                on_caught_up=self._on_kmsg_caught_up,
                on_pattern=self._on_pattern,
                retry_seconds=kmsg_retry_seconds,
            )
        else:
            self._kmsg_ready.set()

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the reader threads (idempotent)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        if self._state_path is not None:
            self._restore()
        if self.follower is not None:
            self._spawn("babysitter-xid-kmsg", self.follower.run)
        if self._nvml is not None:
            self._spawn("babysitter-xid-nvml", self._nvml_loop)
        if self._state_path is not None:
            self._spawn("babysitter-xid-state", self._save_loop)

    def close(self) -> None:
        """Stop the threads (they notice within about half a second), then save the state."""
        self._stop.set()
        self._dirty.set()
        for thread in self._threads:
            thread.join(timeout=5.0)
        self._threads.clear()
        if self._state_path is not None and self._started:
            self._save()

    def _spawn(self, name: str, target: Callable[[threading.Event], None]) -> None:
        thread = threading.Thread(target=target, args=(self._stop,), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # --- what the agent scrapes --------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        self.start()  # harmless when already started; a forgotten start() must not lose events
        family = N.GPU_XID_ERRORS.family()
        with self._lock:
            counts = sorted(self._counts.items())
            status = dict(self._status)
        for labels, value in counts:
            family.add_metric(list(labels), float(value))  # type: ignore[attr-defined]
        yield family
        if self.follower is not None:
            with self._lock:
                patterns = dict(self._patterns)
            events = F.KERNEL_LOG_EVENTS.family()
            for pattern, count in patterns.items():
                events.add_metric([pattern], float(count))  # type: ignore[attr-defined]
            yield events
        if _SOURCE_UP is not None:
            up = _SOURCE_UP.family()
            for source, (ok, _) in sorted(status.items()):
                up.add_metric([source], 1.0 if ok else 0.0)  # type: ignore[attr-defined]
            yield up

    def source_status(self) -> dict[str, tuple[bool, str]]:
        """``{source: (ok, reason)}`` for each enabled source that has reported (``reason`` when not ok)."""
        with self._lock:
            return dict(self._status)

    def sightings(self) -> dict[str, int]:
        """Xids each source reported since start, before deduplication (diagnostics)."""
        with self._lock:
            return dict(self._seen)

    # --- counting ----------------------------------------------------------------------------------
    def _count(
        self,
        source: str,
        xid: int,
        labels: tuple[str, str, str, str],
        *,
        seq: int | None = None,
        instance: str = "",
        history: bool = False,
    ) -> None:
        """Count one sighting; ``labels`` are (gpu, uuid, pci_bus_id, model).

        ``seq`` is the kernel record's sequence number (kmsg), ``instance`` the MIG instance for the
        log line, ``history`` marks kmsg records already in the log at start (one summary line).
        """
        if not 0 < xid < _MAX_XID:
            log.debug("babysitter: ignoring out-of-range Xid %r from %s", xid, source)
            return
        key = (labels[2] or labels[1], xid)
        series = (*labels, str(xid), action_for(xid))
        with self._lock:
            self._seen[source] += 1
            if source == "kmsg":  # the cursor moves with the counts, under one lock: a consistent state
                if seq is None:
                    self._resumable = False
                else:
                    self._kmsg_seq = seq
            self._dirty.set()
            # History NVML cannot have reported (_on_kmsg checks) pairs with nothing.
            if not history and not self._dedupe.admit(key, source, self._clock()):
                return
            if not self._add(series, 1):
                return
            if history and not self._history_logged:  # summed up in one line once the history is read
                self._history[key] = self._history.get(key, 0) + 1
                return
        self._log_xid(source, xid, series[5], labels, instance)

    def _add(self, series: tuple[str, ...], value: int) -> bool:
        """Add to a series (lock held); False when the series cap drops it."""
        if series not in self._counts and len(self._counts) >= _MAX_SERIES:
            if not self._overflow_logged:
                self._overflow_logged = True
                log.warning("babysitter: more than %d Xid series; new ones are dropped", _MAX_SERIES)
            return False
        self._counts[series] = self._counts.get(series, 0) + value
        return True

    def _log_xid(
        self, source: str, xid: int, action: str, labels: tuple[str, str, str, str], instance: str
    ) -> None:
        """One line per GPU (MIG instance) and Xid code per minute at most: a storm must not flood the log."""
        key = (labels[2] or labels[1], xid, instance)
        now = self._clock()
        with self._lock:
            last, suppressed = self._logged.get(key, (None, 0))
            if last is not None and now - last < _LOG_EVERY:
                self._logged[key] = (last, suppressed + 1)
                return
            self._logged[key] = (now, 0)
        more = f" (+{suppressed} more since the last line)" if suppressed else ""
        log.info(
            "babysitter: Xid %d (%s) on GPU %r bus %s%s via %s%s",
            xid,
            action,
            labels[0],
            labels[2],
            f" {instance}" if instance else "",
            source,
            more,
        )

    def _set_status(self, source: str, ok: bool, reason: str) -> None:
        if source == "kmsg" and not ok:
            self._kmsg_ready.set()  # no history to wait for: NVML goes ahead
        with self._lock:
            previous = self._status.get(source)
            self._status[source] = (ok, reason)
        if previous == (ok, reason):
            return
        if ok:
            if previous is not None:
                log.info("babysitter: Xid source %s is readable again", source)
        else:
            where = self._kmsg_path if source == "kmsg" else "NVML"
            log.warning("babysitter: Xid source %s (%s) unavailable: %s", source, where, reason)

    def _identity(self, pci_bus_id: str = "", uuid: str = "") -> GpuIdentity | None:
        try:
            gpus = list(self._gpus())
        except Exception:
            log.debug("babysitter: gpus() failed while mapping an Xid", exc_info=True)
            return None
        for gpu in gpus:
            try:
                if pci_bus_id and normalize_pci_bus_id(gpu.pci_bus_id) == pci_bus_id:
                    return gpu
            except ValueError:
                continue
            if uuid and gpu.uuid == uuid:
                return gpu
        return None

    # --- kernel log --------------------------------------------------------------------------------
    def _on_pattern(self, pattern: str, live: bool) -> None:
        """A kernel line before trouble (history included: the counter means since boot, as Xids)."""
        with self._lock:
            if pattern in self._patterns:
                self._patterns[pattern] += 1

    def _on_kmsg(self, event: XidEvent, live: bool) -> None:
        if not live and self._nvml_saw(event):
            # Read late (the kernel log was unreadable while NVML ran): NVML reported this period,
            # beyond the pairing window; counting it again would count it twice.
            with self._lock:
                self._left_to_nvml += 1
                if event.seq is not None:
                    self._kmsg_seq = event.seq
                else:
                    self._resumable = False
                self._dirty.set()
            return
        gpu = self._identity(pci_bus_id=event.pci_bus_id)
        labels = gpu.label_values() if gpu is not None else ("", event.uuid, event.pci_bus_id, "")
        instance = _mig_instance(event.gpu_instance, event.compute_instance)
        self._count("kmsg", event.xid, labels, seq=event.seq, instance=instance, history=not live)

    def _nvml_saw(self, event: XidEvent) -> bool:
        """Whether NVML was watching when the kernel logged ``event`` (unknown time: yes, if it ran)."""
        with self._lock:
            since = self._nvml_since_us
        if since is None:
            return False
        return event.usec is None or event.usec >= since - _CLOCK_SLACK_US

    def _on_kmsg_caught_up(self) -> None:
        """The history present at open is read: one line about it, then NVML may start."""
        self._kmsg_ready.set()
        with self._lock:
            left, self._left_to_nvml = self._left_to_nvml, 0
        if left:
            log.info(
                "babysitter: %d Xids logged while the kernel log was unreadable were left to NVML, "
                "which reported that period",
                left,
            )
        with self._lock:
            if self._history_logged:
                return
            self._history_logged = True
            history = sorted(self._history.items(), key=lambda item: (-item[1], item[0]))
            self._history.clear()
        if not history:
            return
        shown = ", ".join(f"Xid {xid} x{n} on bus {bus}" for (bus, xid), n in history[:_HISTORY_SHOWN])
        more = f" and {len(history) - _HISTORY_SHOWN} more" if len(history) > _HISTORY_SHOWN else ""
        log.info(
            "babysitter: %d Xids were already in the kernel log (since boot, before this agent): %s%s",
            sum(n for _, n in history),
            shown,
            more,
        )

    # --- NVML --------------------------------------------------------------------------------------
    def _nvml_loop(self, stop: threading.Event) -> None:
        """Run NVML sessions until stopped; a failed one (no driver yet, driver reloaded) is retried.

        The first session waits for the kernel log's history to be read (at most ``kmsg_wait_seconds``):
        an Xid NVML reports is then never also in that history, where it could not pair.
        """
        deadline = time.monotonic() + self._kmsg_wait
        while not stop.is_set() and not self._kmsg_ready.wait(
            min(0.1, max(0.0, deadline - time.monotonic()))
        ):
            if time.monotonic() >= deadline:
                log.warning(
                    "babysitter: kernel log history not read after %g s; NVML starts", self._kmsg_wait
                )
                break
        while not stop.is_set():
            try:
                self._nvml_session(stop)
            except Exception as exc:  # a bug: report it, never end the thread
                log.exception("babysitter: NVML Xid event loop failed")
                self._set_status("nvml", False, f"{type(exc).__name__}: {exc}")
            stop.wait(self._nvml_retry)

    def _nvml_session(self, stop: threading.Event) -> None:
        """Init, register every GPU, wait for events; returns (status set) when NVML keeps failing."""
        nv: Any = self._nvml
        try:
            nv.nvmlInit()
        except Exception as exc:
            self._set_status("nvml", False, f"nvmlInit failed: {exc}")
            return
        event_set: Any = None
        try:
            event_set = nv.nvmlEventSetCreate()
            devices = self._nvml_register(nv, event_set)
            if not devices:
                self._set_status("nvml", False, "no GPU supports Xid events")
                return
            self._set_status("nvml", True, "")
            with self._lock:
                if self._nvml_since_us is None:
                    self._nvml_since_us = _monotonic_us()
            failures = 0
            while not stop.is_set():
                try:
                    data = nv.nvmlEventSetWait(event_set, _WAIT_MS)
                except nv.NVMLError_Timeout:
                    failures = 0
                    continue
                except nv.NVMLError as exc:
                    failures += 1
                    if failures >= _NVML_MAX_FAILURES:
                        self._set_status("nvml", False, f"nvmlEventSetWait keeps failing: {exc}")
                        return  # start over: init again, register again
                    stop.wait(min(0.1 * 2**failures, 5.0))
                    continue
                failures = 0
                if int(data.eventType) & int(nv.nvmlEventTypeXidCriticalError):
                    instance = _mig_instance(
                        _nvml_instance(getattr(data, "gpuInstanceId", None)),
                        _nvml_instance(getattr(data, "computeInstanceId", None)),
                    )
                    self._on_nvml(devices, nv, data.device, int(data.eventData), instance)
        finally:
            if event_set is not None:
                try:
                    nv.nvmlEventSetFree(event_set)
                except Exception:
                    log.debug("babysitter: nvmlEventSetFree failed", exc_info=True)
            try:
                nv.nvmlShutdown()
            except Exception:
                log.debug("babysitter: nvmlShutdown failed", exc_info=True)

    def _nvml_register(self, nv: Any, event_set: Any) -> _Devices:
        """Register every GPU that supports Xid events; handle address -> (gpu, uuid, bus, model)."""
        devices: _Devices = {}
        for index in range(int(nv.nvmlDeviceGetCount())):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                bus = normalize_pci_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
                model = _text(nv.nvmlDeviceGetName(handle))
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
            except nv.NVMLError_NotSupported:
                self._warn_once(
                    index, "not supported", logging.INFO, "does not support NVML Xid events; kernel log only"
                )
                continue
            except nv.NVMLError as exc:
                self._warn_once(
                    index, str(exc), logging.WARNING, f"cannot be watched for NVML Xid events: {exc}"
                )
                continue
            devices[_address(handle)] = (str(index), uuid, bus, model)
        return devices

    def _warn_once(self, index: int, what: str, level: int, message: str) -> None:
        """Log a GPU's registration problem once, not at every retry."""
        if (index, what) not in self._nvml_warned:
            self._nvml_warned.add((index, what))
            log.log(level, "babysitter: GPU %d %s", index, message)

    def _on_nvml(self, devices: _Devices, nv: Any, handle: Any, xid: int, instance: str = "") -> None:
        known = devices.get(_address(handle))
        if known is None:  # not a handle we registered: ask NVML who it is (may fail on a lost GPU)
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                bus = normalize_pci_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
            except Exception:
                uuid, bus = "", ""
            known = ("", uuid, bus, "")
        gpu = self._identity(pci_bus_id=known[2], uuid=known[1])
        self._count("nvml", xid, gpu.label_values() if gpu is not None else known, instance=instance)

    # --- state file --------------------------------------------------------------------------------
    def _restore(self) -> None:
        """Load the saved counts of this boot and skip the kernel records they already hold."""
        path = str(self._state_path)
        try:
            state = load_state(path)
        except StateError as exc:
            log.warning("babysitter: Xid state ignored, counting the kernel log from its start: %s", exc)
            return
        if state is None:
            return
        why = ""
        if not self._boot or state.boot_id != self._boot:
            why = "it is from another boot" if self._boot else "this kernel has no boot id"
        elif state.kmsg_path != (self._kmsg_path or ""):
            why = f"it is for kernel log {state.kmsg_path!r}"
        elif not state.resumable:
            why = "it counted text log lines, which are counted again from the log instead"
        if why:
            log.info("babysitter: Xid state %s not restored: %s", path, why)
            return
        with self._lock:
            for (gpu, uuid, bus, model, xid), value in state.counts.items():
                self._add((gpu, uuid, bus, model, str(xid), action_for(xid)), value)
            self._kmsg_seq = state.kmsg_seq
        if self.follower is not None:
            self.follower.resume_after_seq = state.kmsg_seq
        log.info(
            "babysitter: restored %d Xids of this boot from %s; kernel records after seq %s are new",
            sum(state.counts.values()),
            path,
            state.kmsg_seq,
        )

    def _save_loop(self, stop: threading.Event) -> None:
        """Save when something was counted, at most once per ``state_save_seconds``."""
        while not stop.is_set():
            self._dirty.wait()
            if stop.is_set():
                return
            self._save()
            stop.wait(self._state_every)

    def _save(self) -> None:
        with self._state_lock:
            with self._lock:
                self._dirty.clear()
                counts: dict[tuple[str, str, str, str, int], int] = {}
                for (gpu, uuid, bus, model, xid, _), value in self._counts.items():
                    key = (gpu, uuid, bus, model, int(xid))
                    counts[key] = counts.get(key, 0) + value
                state = XidState(self._boot, self._kmsg_path or "", self._kmsg_seq, self._resumable, counts)
            try:
                save_state(str(self._state_path), state)
            except OSError as exc:
                if not self._state_warned:
                    self._state_warned = True
                    log.warning("babysitter: cannot save the Xid state to %s: %s", self._state_path, exc)
                return
            if self._state_warned:
                self._state_warned = False
                log.info("babysitter: Xid state saved to %s again", self._state_path)


def _monotonic_us() -> int:
    """CLOCK_MONOTONIC in µs: the clock of /dev/kmsg timestamps (printk's local_clock) on servers."""
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)


def _mig_instance(gpu_instance: int | None, compute_instance: int | None) -> str:
    """``GPU-I 5 GPU-CI 0`` for the log line; "" when the Xid is not attributed to a MIG instance."""
    if gpu_instance is None:
        return ""
    return f"GPU-I {gpu_instance}" + (f" GPU-CI {compute_instance}" if compute_instance is not None else "")


def _nvml_instance(value: object) -> int | None:
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return None if number == _NVML_NO_INSTANCE else number


def _address(handle: Any) -> int | None:
    """A device handle's pointer value: equal for the handle NVML returns in events and at registration."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
