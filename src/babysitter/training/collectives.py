"""This rank's collectives, from PyTorch's flight recorder, read on a thread of their own.

What it serves, per rank (``catalog/runtime.py``):

* ``train_collective_last_enqueued_seq{pg}``: the sequence number of the last collective this rank
  enqueued on each process group (at most :data:`MAX_GROUPS`, babysitter's own group left out). In a
  hang the ranks below the highest of their run never reached the collective the others wait in;
  the recording rules name them (``generate/collectives.py``).
* ``train_collective_stuck_seq{pg, op, size, last_completed}``: while this rank is stalled, the
  collective it waits in (the oldest it enqueued and has not completed), with its operation, element
  count and the last collective it completed. Only while stalled, so its labels never churn in
  normal running.
* ``train_collective_lag_seconds``: how much later than the median rank this rank arrives at the
  default group's collectives (set by the straggler rounds, ``training/arrival.py``).

It also tells ``train_info{flight_recorder}`` whether the recorder is on, and puts the same facts in
the hang watchdog's report.

Cost, bounded: every ``interval`` (1 s) the groups' counters alone (a dump without entries, tens of
microseconds); a full dump (about 20 us per entry with the GIL held, so up to ~40 ms for torch's
2000 entries) only when a straggler round asks for one (the rounds space them so that all ranks
together spend at most :data:`CAPTURE_BUDGET` of their time on it), once per new process group (to
learn its name) and once per stall (to name the collective waited in). Nothing runs on the training
thread; every failure is counted in ``babysitter_internal_errors_total`` and logged once.
"""

from __future__ import annotations

import logging
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from babysitter.catalog import runtime as R
from babysitter.training import flight
from babysitter.training.flight import Capture, DumpError, Recorder
from babysitter.training.tracker import Tracker

__all__ = ["CAPTURE_BUDGET", "MAX_GROUPS", "CollectiveMonitor", "RoundCapture"]

log = logging.getLogger("babysitter")

#: Process groups a rank exports (the default group first, then by name).
MAX_GROUPS = 4
#: Fraction of wall time full dumps may take, summed over a round's captures.
CAPTURE_BUDGET = 0.01
#: Steps after which a recorder that recorded nothing counts as off.
_PROBE_STEPS = 20
#: A rank is stalled once no step finished for max(floor, this many median steps).
_STALL_STEPS = 5.0
#: The least a dump costs per entry of the buffer (measured: 13-40 us on a loaded 2-core VM, JSON
#: parse included): what the rounds assume before they measured, and never less.
_ENTRY_SECONDS = 10e-6
#: Seconds the reader watches a round's all_gather for its completion (lockstep ranks join within
#: milliseconds; ranks that drift apart get no stamp, and so no arrival score).
_STAMP_WAIT = 0.25


@dataclass(frozen=True)
class RoundCapture:
    """The default group's collectives as one full dump after a straggler round saw them.

    ``x``: the newest collective enqueued before the round was issued; ``arrivals``: sequence number
    to arrival value (enqueue time in seconds, or minus the GPU duration on NCCL: ``mode``).
    """

    round_index: int
    x: int | None
    arrivals: dict[int, float]
    mode: str
    capacity: int
    seconds: float


class CollectiveMonitor:
    """Reads the flight recorder for one tracker; start it with :meth:`start` (``watch()`` does).

    Args:
        tracker: this rank's tracker.
        recorder: the recorder access (default: this torch's dump functions).
        interval: seconds between reads of the groups' counters.
        stall_floor: seconds without a step after which this rank reports the collective it waits in
            (or ``5`` median steps, whichever is longer).
        enabled: what ``watch()`` did with ``TORCH_FR_BUFFER_SIZE`` (``set``, ``user``, ``off``), for
            the log line.
    """

    def __init__(
        self,
        tracker: Tracker,
        *,
        recorder: Recorder | None = None,
        interval: float = 1.0,
        stall_floor: float = 30.0,
        enabled: str = "set",
    ) -> None:
        if not interval > 0 or not stall_floor > 0:
            raise ValueError("interval and stall_floor must be positive seconds")
        self.tracker = tracker
        self.recorder = recorder
        self.interval = float(interval)
        self.stall_floor = float(stall_floor)
        self.enabled = enabled
        self.state = ""  # train_info{flight_recorder}: "", on, off, unavailable
        #: Set by the straggler rounds: seconds later than the median rank (None: not measured).
        self.lag: float | None = None
        self.reads = 0
        self.captures = 0
        self._excluded: set[str] = set()
        self._default = "0"
        self._default_learned = False
        self._probed = False
        self._groups: dict[str, flight.GroupStatus] = {}
        self._names: dict[str, tuple[str, str]] = {}
        self._unnamed_tried: set[str] = set()
        self._stuck: dict[str, flight.Entry] = {}
        self._stall_captured = False
        self._was_stalled = False
        self._request: tuple[int, int] | None = None
        self._completion: tuple[Any, list[float]] | None = None
        self._rounds: dict[int, RoundCapture] = {}
        #: Seconds a full dump for a straggler round takes (smoothed): the rounds space their dumps
        #: by it so that they take at most CAPTURE_BUDGET of the time.
        self.dump_seconds = (flight.buffer_size() or flight.DEFAULT_BUFFER) * _ENTRY_SECONDS
        #: Time spent in the rounds' dumps over the time since the first one (what it really cost).
        self.cost_fraction = 0.0
        self._first_round_capture: float | None = None
        self._round_dump_total = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> CollectiveMonitor:
        """Serve the metrics through the tracker and start the reader thread; returns self."""
        self.tracker.add_metrics_source(self.metrics)
        self.tracker.add_close_hook(self.stop)
        self._thread = threading.Thread(target=self._loop, name="babysitter-collectives", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (the tracker's close does this)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.poll()

    def exclude_group(self, name: str) -> None:
        """Leave process group ``name`` out (babysitter's own straggler group)."""
        self._excluded.add(name)

    # ------------------------------------------------------------------ the straggler rounds' side

    def request_capture(
        self,
        round_index: int,
        issued_ns: int,
        *,
        completion: tuple[Any, list[float]] | None = None,
        capture: bool = True,
    ) -> None:
        """Called on the training thread right after a straggler round was issued: stamp the instant
        the round's ``completion`` work completes into its list (wall seconds), then, with
        ``capture``, dump the recorder for the next round's samples."""
        self._completion = completion
        if capture:
            self._request = (round_index, issued_ns)
        self._wake.set()

    def round_capture(self, round_index: int) -> RoundCapture | None:
        """The capture taken for round ``round_index``, once ready (None otherwise)."""
        with self._lock:
            return self._rounds.get(round_index)

    # ------------------------------------------------------------------ reading

    def poll(self) -> None:
        """One pass of the reader (the thread calls it every ``interval``). Never raises."""
        try:
            self._poll()
        except Exception as exc:
            self.tracker.errors.record("flight_recorder", exc)

    def _dist(self) -> Any:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return dist

    def _say(self, state: str, why: str) -> None:
        if self.state == state:
            return
        self.state = state
        level = logging.INFO if state == "on" else logging.WARNING
        log.log(level, "babysitter: rank %d: flight recorder %s: %s", self._rank(), state, why)

    def _rank(self) -> int:
        return self.tracker.config.rank.rank

    def _stamp(self) -> None:
        """Watch the round's work for up to :data:`_STAMP_WAIT` s and stamp when it completes.

        Polling (every 0.5 ms) rather than a callback on its future: gloo aborts the process when a
        future with a callback fails at teardown. Every rank sees the same instant (the last rank
        joined), each on its own clock, late by at most the poll period and a GIL wait; the straggler
        rounds take the median over rounds of these stamps' differences (``arrival.ClockOffsets``).
        """
        completion, self._completion = self._completion, None
        if completion is None:
            return
        work, done = completion
        deadline = time.monotonic() + _STAMP_WAIT
        try:
            while time.monotonic() < deadline and not self._stop.is_set():
                if work.is_completed():
                    done[0] = flight.wall_ns() / 1e9
                    return
                time.sleep(0.0005)
        except Exception as exc:
            self.tracker.errors.record("straggler_clock", exc)

    def _poll(self) -> None:
        self._stamp()
        dist = self._dist()
        if dist is None:
            return
        if self.recorder is None:
            self.recorder = Recorder()
        if not self.recorder.api:
            self._say(
                "unavailable",
                "this torch has no flight recorder dump (torch >= 2.8 has one); "
                "straggler scores from step times, hang culprits only from ranks that stop answering",
            )
            return
        if not self._default_learned:
            self._learn_default(dist)
        size = flight.buffer_size()
        if size == 0:
            self._say(
                "off",
                "TORCH_FR_BUFFER_SIZE=0; straggler scores from step times, hang culprits only "
                "from ranks that stop answering",
            )
            return
        status = self._read(self.recorder.status)
        if status is None:
            return
        self.reads += 1
        self._groups = status.groups
        stalled = self.stalled()
        if not stalled:
            self._stall_captured = False
            if self._was_stalled:
                self._stuck = {}
        self._was_stalled = stalled
        request, self._request = self._request, None
        unnamed = [g for g in status.groups if g not in self._names and g not in self._unnamed_tried]
        outstanding = any(s.enqueued > s.completed for s in status.groups.values())
        probe = self.state == "" and not self._probed and self.tracker.steps >= _PROBE_STEPS
        if not (request or unnamed or probe or (stalled and outstanding and not self._stall_captured)):
            return
        capacity = size if size is not None else flight.DEFAULT_BUFFER
        if request is not None and capacity > flight.MAX_CAPTURE_BUFFER and not (stalled or unnamed or probe):
            self.tracker.errors.record(
                "flight_recorder_buffer",
                f"{capacity} entries: too slow to read every straggler round (at most "
                f"{flight.MAX_CAPTURE_BUFFER}); arrival scores off, hang culprits on",
            )
            return
        capture = self._read(self.recorder.capture)
        if capture is None:
            return
        self.captures += 1
        self._probed = self._probed or probe
        self._unnamed_tried.update(unnamed)
        if capture.has_entries:
            self._say(
                "on", f"{capacity} entries ({self._why_on()}); straggler scores from collective arrival"
            )
        elif probe and not capture.groups:
            self._say(
                "off",
                f"no collective recorded after {self.tracker.steps} steps (TORCH_FR_BUFFER_SIZE "
                "unset on a torch that starts it off, or set too late); straggler scores from step times, "
                "hang culprits only from ranks that stop answering",
            )
        self._names.update(capture.names)
        self._groups = capture.groups or self._groups
        if stalled:
            self._stall_captured = True
            self._stuck = self._outstanding(capture)
        if request is not None and capacity <= flight.MAX_CAPTURE_BUFFER:
            self._keep_round(request, capture, capacity)

    def _learn_default(self, dist: Any) -> None:
        try:
            self._default = str(dist.distributed_c10d._get_default_group().group_name)
        except Exception as exc:
            self.tracker.errors.record("flight_recorder_groups", exc)
        self._default_learned = True

    def _why_on(self) -> str:
        return {
            "set": "TORCH_FR_BUFFER_SIZE set by babysitter",
            "user": "the user's TORCH_FR_BUFFER_SIZE",
        }.get(self.enabled, "torch's default")

    def _read(self, how: Callable[[], Capture]) -> Capture | None:
        try:
            return how()
        except DumpError as exc:
            self.tracker.errors.record(f"flight_recorder_{exc.reason}", str(exc))
            return None

    def _keep_round(self, request: tuple[int, int], capture: Capture, capacity: int) -> None:
        round_index, issued_ns = request
        issued = issued_ns / 1e9
        default = [e for e in capture.entries if e.pg == self._default]
        nccl = any(e.backend == "nccl" for e in default)
        x = max((e.seq for e in default if e.created <= issued), default=None)
        if nccl:
            arrivals = {e.seq: -e.duration for e in default if e.duration is not None}
        else:
            arrivals = {e.seq: e.created for e in default}
        now = time.monotonic()
        self.dump_seconds = (
            capture.seconds if not self.dump_seconds else 0.7 * self.dump_seconds + 0.3 * capture.seconds
        )
        if self._first_round_capture is None:
            self._first_round_capture = now - capture.seconds
        self._round_dump_total += capture.seconds
        self.cost_fraction = self._round_dump_total / max(now - self._first_round_capture, 1e-9)
        kept = RoundCapture(
            round_index, x, arrivals, "duration" if nccl else "time", capacity, capture.seconds
        )
        with self._lock:
            self._rounds[round_index] = kept
            for old in [k for k in self._rounds if k < round_index - 4]:
                del self._rounds[old]

    def _outstanding(self, capture: Capture) -> dict[str, flight.Entry]:
        """Per group name, the entry of the oldest collective enqueued and not completed."""
        out: dict[str, flight.Entry] = {}
        by_key = {(e.pg_id, e.seq): e for e in capture.entries}
        for pg_id, status in capture.groups.items():
            if status.enqueued <= status.completed:
                continue
            entry = by_key.get((pg_id, status.completed + 1))
            name = self._names.get(pg_id, (None, ""))[0]
            if entry is not None:
                out[entry.pg] = entry
            elif name is not None:
                self.tracker.errors.record(
                    "flight_recorder_wrapped", f"group {name}: the entry waited in is gone"
                )
        return out

    def stalled(self) -> bool:
        """Whether no step finished for max(stall_floor, 5 median steps) (checkpoints, phases excluded)."""
        age = self.tracker.seconds_since_last_step()
        if age is None or self.tracker.closed:
            return False
        recent = self.tracker.recent_step_seconds(100)
        typical = statistics.median(recent) if len(recent) >= 2 else 0.0
        return age >= max(self.stall_floor, _STALL_STEPS * typical)

    # ------------------------------------------------------------------ reporting

    def _exported(self) -> list[tuple[str, str, flight.GroupStatus]]:
        """(name, pg_id, counters) of the groups this rank exports, the default group first.

        A group destroyed and created again in the same process (a new pg_id under the same name)
        counts once, by its newest pg_id."""
        newest: dict[str, tuple[int, str, flight.GroupStatus]] = {}
        for pg_id, status in self._groups.items():
            name = self._names.get(pg_id, (None, ""))[0]
            if name is None or name in self._excluded:
                continue
            order = int(pg_id) if pg_id.lstrip("-").isdigit() else -1
            if name not in newest or order > newest[name][0]:
                newest[name] = (order, pg_id, status)
        named = [(name, pg_id, status) for name, (_, pg_id, status) in newest.items()]
        named.sort(key=lambda item: (item[0] != self._default, len(item[0]), item[0]))
        if len(named) > MAX_GROUPS:
            self.tracker.errors.record(
                "flight_recorder_groups", f"{len(named)} process groups, exporting the first {MAX_GROUPS}"
            )
        return named[:MAX_GROUPS]

    def metrics(self, label_names: list[str], label_values: list[str]) -> list[Any]:
        """The collective families for the tracker's scrape (a tracker metrics source)."""
        groups = self._exported()
        out: list[Any] = []
        if groups:
            enqueued = R.COLLECTIVE_LAST_ENQUEUED.family(label_names)
            for name, _pg_id, status in groups:
                enqueued.add_metric([*label_values, name], float(status.enqueued))  # type: ignore[attr-defined]
            out.append(enqueued)
        stuck = self._stuck_now(groups)
        if stuck:
            family = R.COLLECTIVE_STUCK.family(label_names)
            for name, entry, status in stuck:
                labels = [
                    *label_values,
                    name,
                    entry.op if entry else "unknown",
                    str(entry.numel) if entry else "",
                    str(status.completed),
                ]
                family.add_metric(labels, float(status.completed + 1))  # type: ignore[attr-defined]
            out.append(family)
        if self.lag is not None:
            lag = R.COLLECTIVE_LAG.family(label_names)
            lag.add_metric(label_values, self.lag)  # type: ignore[attr-defined]
            out.append(lag)
        return out

    def _stuck_now(
        self, groups: list[tuple[str, str, flight.GroupStatus]]
    ) -> list[tuple[str, flight.Entry | None, flight.GroupStatus]]:
        if not (self.stalled() and self._stall_captured):
            return []  # not before the stall's dump named the collective (no "unknown" first)
        return [
            (name, self._stuck.get(name), status)
            for name, _pg_id, status in groups
            if status.enqueued > status.completed
        ]

    def info(self) -> str:
        """``train_info{flight_recorder}``: on, off, unavailable or empty (not distributed, not known)."""
        return self.state

    def describe(self) -> str:
        """What the hang report says about this rank's collectives."""
        lines = [
            f"flight recorder: {self.state or 'not read'} ({self.reads} reads, {self.captures} full dumps)"
        ]
        groups = self._exported()
        for name, _pg_id, status in groups:
            entry = self._stuck.get(name)
            line = f"  group {name}: last enqueued #{status.enqueued}, last completed #{status.completed}"
            if status.enqueued > status.completed:
                what = (
                    f"{entry.op} #{entry.seq} ({entry.numel} elements)"
                    if entry
                    else f"#{status.completed + 1}"
                )
                since = f" since {time.strftime('%H:%M:%S', time.gmtime(entry.created))} UTC" if entry else ""
                line += f" -> waiting in {what}{since}"
            lines.append(line)
        if not groups:
            lines.append("  no process group with recorded collectives")
        return "\n".join(lines) + "\n"
