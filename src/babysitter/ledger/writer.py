"""The ledger writer: rank 0's :class:`~babysitter.training.events.RunEvents` sink, batched and crash-safe.

Callers (the tracker's housekeeping thread, checkpoint and phase context managers) only append to an
in-memory inbox under a tiny lock. A daemon thread turns the inbox into records every
``flush_interval`` seconds (at once at checkpoint and phase boundaries), folds them into the in-memory
timeline that the goodput metrics are computed from, and appends them to the ledger file with one
``write`` per batch (``fsync`` after a checkpoint save and at close). When the storage fails (read-only,
full, gone), the bytes stay in a bounded buffer and are retried; the failure is counted in
``babysitter_ledger_write_errors_total`` and logged once. Nothing here raises into training.

Only the holder of the run's lock writes. A writer that finds the lock held (another host's writer
that crashed less than ``stale_after`` ago, or a second process of the run) keeps its records and
retries until the lock is provably stale; one whose lock another writer took over stops for good. The
state is exported as ``babysitter_ledger_writer_state``. A writer whose file was deleted or replaced
under it (the inode of the path changed) goes on in a new file with a continuation segment.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
from prometheus_client.core import Metric

from babysitter.catalog import goodput as G
from babysitter.ledger.accounting import Accountant, Accounting
from babysitter.ledger.advisor import Advice, ClusterRate, advise_inputs, ledger_inputs, parse_cluster_rate
from babysitter.ledger.lock import LedgerLockedError, WriterLock
from babysitter.ledger.paths import ledger_path
from babysitter.ledger.reader import DEFAULT_FILE_NAME, read_timeline
from babysitter.ledger.records import (
    MAX_FLOAT,
    MAX_INT,
    SCHEMA_VERSION,
    Alive,
    CheckpointBegin,
    CheckpointEnd,
    CheckpointManifest,
    End,
    Hang,
    Op,
    PhaseBegin,
    PhaseEnd,
    Progress,
    Record,
    Renumber,
    Start,
    Straggler,
    encode,
    fence_tag,
    in_range,
    to_us,
)
from babysitter.ledger.timeline import Timeline

__all__ = ["ADVICE_REFRESH_SECONDS", "ENV_CLUSTER_RATE", "ENV_FLUSH", "WRITER_STATES", "LedgerWriter"]

#: Environment variable overriding the default flush interval (seconds).
ENV_FLUSH = "BABYSITTER_LEDGER_FLUSH_SECONDS"

#: Environment variable with the cluster's interruption rate, ``INTERRUPTIONS/GPU_HOURS`` (e.g.
#: ``12/40000``): the checkpoint advisor's fallback while the run has seen too few interruptions.
ENV_CLUSTER_RATE = "BABYSITTER_CLUSTER_RATE"

#: The checkpoint advice is recomputed at most this often (seconds): its inputs move slowly.
ADVICE_REFRESH_SECONDS = 60.0

log = logging.getLogger(__name__)

#: What ``babysitter_ledger_writer_state`` says: ``writing`` (holds the lock, the last write worked),
#: ``waiting`` (another writer's lock is not provably stale yet: records are kept, the lock retried),
#: ``failing`` (the storage fails: records are kept and retried), ``fenced`` (another writer took the
#: lock over: this one stopped for good).
WRITER_STATES = ("writing", "waiting", "failing", "fenced")

#: Lines dropped first when the unwritten buffer overflows (see ``_bound_buffer``).
_DROPPABLE = (b'{"v":%d,"k":"prog"' % SCHEMA_VERSION, b'{"v":%d,"k":"alive"' % SCHEMA_VERSION)
_PROG = _DROPPABLE[0]


@dataclass
class _Pending:
    """Step boundaries handed over by one ``progress()`` call (checked, waits in us per boundary)."""

    boundaries: list[tuple[int, float]]
    waits: list[int]
    flops: float
    peak: float | None
    dropped: int
    #: Tokens of each boundary's step (0: unknown), or None when the caller gave none.
    tokens: list[int] | None = None


class _NotLoaded(Exception):
    """The existing ledger is still being read."""


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


#: The largest number of seconds (a Unix time or a duration) the ledger holds in microseconds.
_MAX_SECONDS = MAX_INT / 1e6


def _time_ok(t: float) -> bool:
    """A Unix time the ledger can hold (finite, in range once in microseconds; NaN fails both tests)."""
    return (type(t) is float or type(t) is int) and 0 <= t <= _MAX_SECONDS


def _us(seconds: float) -> int | None:
    """A non-negative duration in us, None when it is not one the ledger can hold."""
    return to_us(seconds) if _time_ok(seconds) else None


def _process_start_time(pid: int, *, fallback: float) -> float:
    """When this process started, on the ``time.time()`` scale to about 10 ms.

    psutil's ``create_time()`` adds the start tick to a boot time rounded to whole seconds, which can
    put the start up to a second off; on Linux, measure the age against CLOCK_BOOTTIME instead.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(raw.rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return min(time.time() - age, fallback)
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        return min(float(psutil.Process(pid).create_time()), fallback)
    except (psutil.Error, OSError):
        return fallback


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"${name} must be a number of seconds, got {raw!r}") from None


class LedgerWriter:
    """Writes a run's goodput ledger and serves the goodput metrics computed from it.

    Constructed by the tracker on rank 0. Raises ValueError for bad options; neither a held lock (the
    writer waits for it, see ``babysitter_ledger_writer_state``) nor the storage ever raises.

    Args:
        run_dir: the run's directory on shared storage (created if missing).
        run: the run's name (recorded in every incarnation's start record).
        file_name: the ledger's file name inside ``run_dir``.
        flush_interval: seconds between batched writes (default ``$BABYSITTER_LEDGER_FLUSH_SECONDS`` or
            5): also the resolution of a crash's time of death, whose last seconds count as downtime.
        heartbeat_interval: seconds between lock heartbeats.
        stale_after: a lock on another host whose heartbeat is older than this is taken over (until
            then the writer keeps its records and retries every second or heartbeat).
        alive_interval: write a bare sign of life when nothing else was written for this long.
        max_pending_bytes: bound of the unwritten buffer while the storage fails.
        settle_seconds: steps older than this are classified once and cached (see accounting).
        cluster_rate: the cluster's interruptions per GPU-hours, the checkpoint advisor's fallback rate
            (default ``$BABYSITTER_CLUSTER_RATE``; a malformed value is logged, counted as ``bad_input``
            and ignored: it never costs the ledger).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        run: str,
        file_name: str = DEFAULT_FILE_NAME,
        flush_interval: float | None = None,
        heartbeat_interval: float = 10.0,
        stale_after: float = 60.0,
        alive_interval: float = 30.0,
        max_pending_bytes: int = 32 << 20,
        settle_seconds: float = 60.0,
        cluster_rate: ClusterRate | None = None,
    ) -> None:
        if flush_interval is None:
            flush_interval = _env_seconds(ENV_FLUSH, 5.0)
        if not isinstance(run, str) or not run:
            raise ValueError(f"run must be a non-empty string, got {run!r}")
        if not file_name or "/" in file_name or file_name in (".", "..") or "\x00" in file_name:
            raise ValueError(f"file_name must be a plain file name, got {file_name!r}")
        for name, value in (
            ("flush_interval", flush_interval),
            ("heartbeat_interval", heartbeat_interval),
            ("alive_interval", alive_interval),
            ("settle_seconds", settle_seconds),
        ):
            if not _finite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not _finite(stale_after) or stale_after < 3 * heartbeat_interval:
            raise ValueError(f"stale_after must be at least 3 heartbeat intervals, got {stale_after!r}")
        if max_pending_bytes < 1 << 16:
            raise ValueError("max_pending_bytes must be at least 64 KiB")
        self.run_dir = Path(run_dir)
        self.run = run
        self.path = self.run_dir / file_name
        self._directory = os.path.abspath(self.run_dir)  # checkpoint paths inside it go relative
        self._flush_interval = float(flush_interval)
        self._heartbeat_interval = float(heartbeat_interval)
        self._alive_interval = float(alive_interval)
        self._max_pending = int(max_pending_bytes)

        self._errors: dict[str, int] = {}
        self._warned = False
        self._noted: set[str] = set()
        self._dropped = 0
        self._inbox: list[Record | _Pending] = []
        self._inbox_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._wake = threading.Event()
        self._durable_wanted = False
        self._closing = False
        self._unwritten = bytearray()
        self._need_newline = False
        self._last_write = time.monotonic()
        self._last_heartbeat = 0.0
        self._last_attempt = 0.0
        self._retry_interval = min(self._heartbeat_interval, 1.0)
        self._fenced = False
        self._waiting = False
        self._failing = False
        self._started = False
        self._last_peak: float | None = None
        self._id = uuid.uuid4().hex[:16]
        self._tag = fence_tag(self._id)
        self._start: Start | None = None
        self._start_line = b""
        self._file_ident: tuple[int, int] | None = None
        self._fd = -1
        self._segments = 0
        self._segment_line = b""
        self._cluster_rate = cluster_rate
        #: (monotonic time, (incarnations, checkpoints of the newest), advice): recomputed when a save
        #: or a restart changed the inputs, else at most every ADVICE_REFRESH_SECONDS.
        self._advice: tuple[float, tuple[int, int], Advice] | None = None
        if cluster_rate is None and os.environ.get(ENV_CLUSTER_RATE, "").strip():
            try:
                self._cluster_rate = parse_cluster_rate(os.environ[ENV_CLUSTER_RATE])
            except ValueError as exc:
                self._note("bad_input", f"${ENV_CLUSTER_RATE} ignored: {exc}")

        with contextlib.suppress(OSError):
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = WriterLock(
            self.path.with_name(self.path.name + ".lock"), run=run, stale_after=stale_after
        )
        self._acquire(time.monotonic())

        self.timeline = Timeline(keep_points=False)
        self._skipped = {"torn": 0, "invalid": 0, "fenced": 0}
        self._settle = settle_seconds
        self._accountant = Accountant(self.timeline, settle_seconds=settle_seconds)
        self._loaded = threading.Event()
        # Reading a month-long ledger takes seconds: the writer thread does it, so watch() returns at
        # once; events posted meanwhile wait in the inbox, goodput metrics appear once it is read.
        self._thread = threading.Thread(target=self._loop, name="babysitter-ledger", daemon=True)
        self._thread.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Wait until the existing ledger has been read (goodput metrics are served from then on)."""
        return self._loaded.wait(timeout)

    def _load(self) -> None:
        try:
            timeline, existing = read_timeline(self.path, keep_points=False)
            with contextlib.suppress(OSError):
                st = os.stat(self.path)
                self._file_ident = (st.st_dev, st.st_ino)
            self._skipped = {
                "torn": existing.torn_lines,
                "invalid": existing.invalid_lines,
                "fenced": existing.fenced_lines,
            }
            self._need_newline = not existing.ends_with_newline
            if existing.torn_lines or existing.invalid_lines:
                log.warning(
                    "babysitter: ledger %s: skipped %d torn and %d invalid line(s) (a crash mid-write)",
                    self.path,
                    existing.torn_lines,
                    existing.invalid_lines,
                )
            accountant = Accountant(timeline, settle_seconds=self._settle)
            accountant.totals(now=time.time(), live=True, tail="exclude", hold=True)  # classify once
            with self._state_lock:
                self.timeline = timeline
                self._accountant = accountant
        except OSError as exc:
            self._error("read", exc)

    # ----------------------------------------------------------------- errors

    def _note(self, op: str, message: str) -> None:
        """Count an event that is not a storage failure; the first of each kind is logged."""
        self._errors[op] = self._errors.get(op, 0) + 1
        if op not in self._noted:
            self._noted.add(op)
            log.warning(
                "babysitter: goodput ledger %s: %s (counted in %s)",
                self.path,
                message,
                G.LEDGER_WRITE_ERRORS.name,
            )
        else:
            log.debug("babysitter: goodput ledger %s: %s", self.path, message)

    def _error(self, op: str, exc: BaseException) -> None:
        """Count a failure; the first one is logged as a warning, the rest at debug level."""
        self._errors[op] = self._errors.get(op, 0) + 1
        if not self._warned:
            self._warned = True
            log.warning(
                "babysitter: goodput ledger %s: %s failed (%s: %s); training goes on, records are kept "
                "and retried, further failures are counted in %s",
                self.path,
                op,
                type(exc).__name__,
                exc,
                G.LEDGER_WRITE_ERRORS.name,
            )
        else:
            log.debug("babysitter: ledger %s failed: %s", op, exc)

    def _post(self, item: Record | _Pending, *, now: bool = False) -> None:
        with self._inbox_lock:
            self._inbox.append(item)
        if now:
            self._wake.set()

    # ------------------------------------------------------------- RunEvents

    def incarnation_start(self, *, time: float, info: Mapping[str, object]) -> None:
        """Record that this process started tracking the run."""
        try:
            pid = os.getpid()
            pst = _process_start_time(pid, fallback=time)
            host = str(info.get("host") or socket.gethostname())
            record = Start(
                t=to_us(time),
                pst=to_us(min(pst, time)),
                id=self._id,
                host=host,
                pid=pid,
                run=self.run,
                info=dict(info),
                directory=self._directory,
            )
            self._start = record
            self._start_line = encode(record)
            self._started = True
            self._post(record, now=True)
        except Exception as exc:
            self._error("internal", exc)

    def progress(
        self,
        *,
        boundaries: Sequence[tuple[int, float]],
        data_wait_seconds: float,
        model_flops: float,
        peak_flops: float | None,
        data_waits: Sequence[float] | None = None,
        dropped: int = 0,
        tokens: Sequence[int] | None = None,
    ) -> None:
        """Buffer step boundaries (no I/O here). Boundaries, waits or counts the ledger cannot hold
        (a step outside ``[0, 2**53)``, a time that is not finite) are skipped and counted."""
        try:
            bad = False
            per = list(data_waits) if data_waits is not None else None
            if per is not None and len(per) != len(boundaries):
                per, bad = None, True
            toks = list(tokens) if tokens is not None else None
            if toks is not None and len(toks) != len(boundaries):
                toks, bad = None, True
            good: list[tuple[int, float]] = []
            waits: list[int] = []
            work: list[int] = []
            limit = _MAX_SECONDS
            for i, (step, t) in enumerate(boundaries):
                # Inline checks (this runs once per step): an in-range int step, a finite in-range time.
                if type(step) is not int or not 0 <= step <= MAX_INT or not _time_ok(t):
                    bad = True
                    continue
                good.append((step, t))
                if toks is not None:
                    count = toks[i]
                    work.append(count if type(count) is int and 0 <= count <= MAX_INT else 0)
                if per is not None:
                    wait = per[i]
                    if (type(wait) is float or type(wait) is int) and 0 <= wait <= limit:
                        waits.append(round(wait * 1_000_000))
                    else:
                        bad = True
                        waits.append(0)
            if not in_range(dropped):
                dropped, bad = 0, True
            if bad:
                self._errors["bad_input"] = self._errors.get("bad_input", 0) + 1
            if not good:
                return
            if per is None:  # one total for the call: spread over its boundaries
                share, rest = divmod(_us(data_wait_seconds) or 0, len(good))
                waits = [share + 1 if i < rest else share for i in range(len(good))]
            self._post(
                _Pending(
                    good,
                    waits,
                    model_flops if _finite(model_flops) and 0 < model_flops <= MAX_FLOAT else 0.0,
                    peak_flops if peak_flops is not None and _finite(peak_flops) and peak_flops > 0 else None,
                    dropped,
                    work if toks is not None else None,
                )
            )
        except Exception as exc:
            self._error("internal", exc)

    def checkpoint_begin(self, *, kind: Op, step: int, time: float, path: str | None) -> None:
        """Record the start of a checkpoint save or load."""
        try:
            where = ledger_path(path, self._directory)
            self._post(CheckpointBegin(t=to_us(time), op=kind, step=int(step), path=where), now=True)
        except Exception as exc:
            self._error("internal", exc)

    def checkpoint_end(
        self,
        *,
        kind: Op,
        step: int,
        time: float,
        ok: bool,
        nbytes: int | None,
        path: str | None,
        manifest: bool = False,
    ) -> None:
        """Record the end of a checkpoint save or load; a successful save is written durably."""
        try:
            size = nbytes if in_range(nbytes) else None
            record = CheckpointEnd(
                t=to_us(time),
                op=kind,
                step=int(step),
                ok=bool(ok),
                nbytes=size,
                path=ledger_path(path, self._directory),
                manifest=bool(manifest),
            )
            if kind == "save" and ok:
                self._durable_wanted = True
            self._post(record, now=True)
        except Exception as exc:
            self._error("internal", exc)

    def checkpoint_manifest(
        self,
        *,
        step: int,
        time: float,
        path: str | None,
        ok: bool,
        files: int,
        nbytes: int,
        alg: str | None,
        mid: str,
        why: str,
    ) -> None:
        """Record that a save's manifest was committed or not (written durably: resumes read it)."""
        try:
            record = CheckpointManifest(
                t=to_us(time),
                step=int(step),
                path=ledger_path(path, self._directory),
                ok=bool(ok),
                files=files if in_range(files) else 0,
                nbytes=nbytes if in_range(nbytes) else 0,
                alg=alg,
                mid=mid,
                why=why,
            )
            self._durable_wanted = True
            self._post(record, now=True)
        except Exception as exc:
            self._error("internal", exc)

    def phase_begin(self, *, name: str, time: float) -> None:
        """Record the start of a user-marked phase."""
        try:
            self._post(PhaseBegin(t=to_us(time), name=str(name)), now=True)
        except Exception as exc:
            self._error("internal", exc)

    def phase_end(self, *, name: str, time: float) -> None:
        """Record the end of a user-marked phase."""
        try:
            self._post(PhaseEnd(t=to_us(time), name=str(name)), now=True)
        except Exception as exc:
            self._error("internal", exc)

    def hang(self, *, time: float, step: int, seconds_since_step: float) -> None:
        """Record that the watchdog saw no step for far too long."""
        try:
            since = _us(seconds_since_step) or 0
            self._post(Hang(t=to_us(time), step=int(step), since=since), now=True)
        except Exception as exc:
            self._error("internal", exc)

    def renumber(self, *, time: float, by: int) -> None:
        """Every step this incarnation handed over so far is ``by`` higher in the loop's numbering."""
        try:
            if in_range(by) and by > 0:
                self._post(Renumber(t=to_us(time), by=by))
            else:
                self._errors["bad_input"] = self._errors.get("bad_input", 0) + 1
        except Exception as exc:
            self._error("internal", exc)

    def straggler(
        self, *, time: float, rank: int | None, score: float, host: str | None, gpu: str | None
    ) -> None:
        """Record the straggler exchange's slowest rank (None: no rank is slow any more)."""
        try:
            if rank is not None and not in_range(rank):
                self._errors["bad_input"] = self._errors.get("bad_input", 0) + 1
                return
            value = float(score) if _finite(score) and 0 <= score <= MAX_FLOAT else 0.0
            self._post(Straggler(t=to_us(time), rank=rank, score=value, host=host, gpu=gpu))
        except Exception as exc:
            self._error("internal", exc)

    def flush(self, *, durable: bool = False) -> None:
        """Ask the writer thread to write now (and fsync when ``durable``); does not wait."""
        if durable:
            self._durable_wanted = True
        self._wake.set()

    def close(self, *, time: float, clean: bool, timeout: float = 5.0) -> None:
        """Write the end record durably, release the lock; waits at most ``timeout`` seconds."""
        try:
            if self._closing:
                return
            if self._started:  # an end without our start would close the previous incarnation
                self._post(End(t=to_us(time), clean=bool(clean)))
            self._closing = True
            self._durable_wanted = True
            self._wake.set()
            if self._thread is not threading.current_thread():
                self._thread.join(timeout)
        except Exception as exc:
            self._error("internal", exc)

    @property
    def state(self) -> str:
        """One of :data:`WRITER_STATES`."""
        if self._fenced:
            return "fenced"
        if not self._lock.held:
            return "waiting" if self._waiting else "failing"
        return "failing" if self._failing else "writing"

    def metrics(
        self, label_names: Sequence[str], label_values: Sequence[str], now: float
    ) -> Iterable[Metric]:
        """Goodput, productive and badput seconds, restarts, and the ledger's own health."""
        names, values = list(label_names), list(label_values)
        out: list[Metric] = []
        try:
            if not self._loaded.is_set():
                raise _NotLoaded
            with self._state_lock:
                acc = self._accountant.totals(now=now, live=True, tail="exclude", hold=True)
                # The gauge is the report's view (steps not yet checkpointed count, as the run goes
                # on); the counters hold them back so that they never go down at a restart.
                view = self._accountant.totals(now=now, live=True, tail="exclude")
            goodput = G.GOODPUT.family(names)
            goodput.add_metric(values, view.goodput)  # type: ignore[attr-defined]
            productive = G.PRODUCTIVE_SECONDS.family(names)
            productive.add_metric(values, acc.productive_seconds)  # type: ignore[attr-defined]
            badput = G.BADPUT_SECONDS.family(names)
            for cause, seconds in acc.badput_seconds.items():
                badput.add_metric([*values, cause], seconds)  # type: ignore[attr-defined]
            restarts = G.RESTARTS.family(names)
            restarts.add_metric(values, float(acc.restarts))  # type: ignore[attr-defined]
            out += [goodput, productive, badput, restarts]
            out += self._step_metrics(names, values, now)
            out += self._advice_metrics(names, values, view)
        except _NotLoaded:
            pass
        except Exception as exc:
            self._error("metrics", exc)
        errors = G.LEDGER_WRITE_ERRORS.family(names)
        for op, count in sorted(self._errors.items()):
            errors.add_metric([*values, op], float(count))  # type: ignore[attr-defined]
        skipped = G.LEDGER_SKIPPED_LINES.family(names)
        # Counted once, when the ledger is read at start: a reason at 0 says nothing, and three zero
        # series would put rank 0 over its series budget (catalog.budget).
        for reason, count in sorted(self._skipped.items()):
            if count:
                skipped.add_metric([*values, reason], float(count))  # type: ignore[attr-defined]
        pending = G.LEDGER_PENDING_BYTES.family(names)
        pending.add_metric(values, float(len(self._unwritten)))  # type: ignore[attr-defined]
        dropped = G.LEDGER_DROPPED_RECORDS.family(names)
        dropped.add_metric(values, float(self._dropped))  # type: ignore[attr-defined]
        state = G.LEDGER_WRITER_STATE.family(names)
        state.add_metric([*values, self.state], 1.0)  # type: ignore[attr-defined]
        out += [errors, skipped, pending, dropped, state]
        return out

    def _step_metrics(self, names: list[str], values: list[str], now: float) -> list[Metric]:
        """MLGM's step metrics: the ideal step time, the step-time deviation, rolling goodput (the
        accountant's book as totals() brought it up to date; the window accounted afresh)."""
        out: list[Metric] = []
        with self._state_lock:
            book = self._accountant.slow
            gauges = ((G.IDEAL_STEP, book.ideal_seconds()), (G.STEP_DEVIATION, book.deviation_seconds()))
            windows = {
                label: self._accountant.window(now - seconds, now, now=now, live=True)
                for label, seconds in G.ROLLING_WINDOWS.items()
            }
        for spec, value in gauges:
            if value is not None:
                family = spec.family(names)
                family.add_metric(values, value)  # type: ignore[attr-defined]
                out.append(family)
        rolling = G.ROLLING_GOODPUT.family(names)
        for label, window in windows.items():
            if window.wall_us > 0:
                rolling.add_metric([*values, label], window.goodput)  # type: ignore[attr-defined]
        return [*out, rolling]

    def advice(self, totals: Accounting | None = None) -> Advice | None:
        """The checkpoint-interval advice from the ledger so far (recomputed after a save or a restart,
        else at most every :data:`ADVICE_REFRESH_SECONDS`); None until the existing ledger has been read."""
        if not self._loaded.is_set():
            return None
        clock = time.monotonic()
        with self._state_lock:
            incs = self.timeline.incarnations
            key = (len(incs), len(incs[-1].checkpoints) if incs else 0)
            cached = self._advice
            if cached is not None and cached[1] == key and clock - cached[0] < ADVICE_REFRESH_SECONDS:
                return cached[2]
            if totals is None:
                totals = self._accountant.totals(now=time.time(), live=True, tail="exclude")
            inputs = ledger_inputs(self.timeline, totals)
        advice = advise_inputs(inputs, self._cluster_rate)  # the rate's interval: outside the lock
        self._advice = (clock, key, advice)
        return advice

    def _advice_metrics(self, names: list[str], values: list[str], totals: Accounting) -> list[Metric]:
        """The advisor's gauges: the current interval once measured; the advice and the expected
        goodputs only while the rate rests on enough data (docs/checkpoint-interval.md)."""
        advice = self.advice(totals)
        if advice is None:
            return []
        out: list[Metric] = []
        if advice.current_interval_seconds is not None:
            current = G.CKPT_INTERVAL.family(names)
            current.add_metric(values, advice.current_interval_seconds)  # type: ignore[attr-defined]
            out.append(current)
        if not advice.sufficient or advice.recommended_interval_seconds is None:
            return out
        recommended = G.CKPT_INTERVAL_RECOMMENDED.family(names)
        recommended.add_metric(values, advice.recommended_interval_seconds)  # type: ignore[attr-defined]
        expected = G.CKPT_EXPECTED_GOODPUT.family(names)
        which = dict(
            zip(
                G.CKPT_INTERVAL_WHICH,
                (advice.expected_goodput_current, advice.expected_goodput_recommended),
                strict=True,
            )
        )
        for label, value in which.items():
            if value is not None:
                expected.add_metric([*values, label], value)  # type: ignore[attr-defined]
        return [*out, recommended, expected]

    # ------------------------------------------------------------ the thread

    @property
    def write_errors(self) -> int:
        """Failed ledger operations so far (all ops but bad input, metrics and the file or lock
        found deleted)."""
        skip = ("bad_input", "metrics", "file_lost", "lock_recreated")
        return sum(count for op, count in self._errors.items() if op not in skip)

    def _loop(self) -> None:
        try:
            self._load()
        except Exception as exc:
            self._error("internal", exc)
        finally:
            self._loaded.set()
        while True:
            self._wake.wait(self._flush_interval)
            self._wake.clear()
            closing = self._closing
            try:
                self._tick(closing=closing)
            except Exception as exc:
                self._error("internal", exc)
            if closing:
                if self._unwritten and not self._lock.held:
                    log.warning(
                        "babysitter: goodput ledger %s: closing without the lock (%s): %d bytes of "
                        "records not written",
                        self.path,
                        self.state,
                        len(self._unwritten),
                    )
                self._close_file()
                self._lock.release()
                return

    def _drain(self) -> list[Record]:
        with self._inbox_lock:
            items, self._inbox = self._inbox, []
        records: list[Record] = []
        batch: list[tuple[int, float]] = []
        waits: list[int] = []
        work: list[int] = []
        extra: list[tuple[int, int]] = []
        flops = 0.0
        peak: float | None = None

        def close_batch() -> None:
            nonlocal batch, waits, work, extra, flops, peak
            if batch:
                steps = tuple(s for s, _ in batch)
                ends = [to_us(t) for _, t in batch]
                for i in range(1, len(ends)):
                    ends[i] = max(ends[i], ends[i - 1])
                changed = peak is not None and peak != self._last_peak
                if changed:
                    self._last_peak = peak
                records.append(
                    Progress(
                        t=max(to_us(time.time()), ends[-1]),
                        steps=steps,
                        ends=tuple(ends),
                        data_wait=sum(waits),
                        model_flops=min(flops, MAX_FLOAT),
                        peak_flops=peak if changed else None,  # written only when it changes
                        waits=tuple(waits),  # each checked in progress()
                        extra=tuple(extra),
                        work=tuple(work) if any(work) else None,
                    )
                )
            batch, waits, work, extra, flops, peak = [], [], [], [], 0.0, None

        for item in items:
            if isinstance(item, _Pending):
                if item.dropped:
                    extra.append((len(batch), item.dropped))
                batch.extend(item.boundaries)
                waits.extend(item.waits)
                work.extend(item.tokens if item.tokens is not None else [0] * len(item.boundaries))
                flops += item.flops
                peak = item.peak if item.peak is not None else peak
            else:
                close_batch()
                records.append(item)
        close_batch()
        return records

    def _tick(self, *, closing: bool = False) -> None:
        records = self._drain()
        mono = time.monotonic()
        if not records and mono - self._last_write >= self._alive_interval and self.timeline.incarnations:
            records = [Alive(t=to_us(time.time()))]
        if records:
            lines: list[bytes] = []
            kept: list[Record] = []
            for record in records:
                try:
                    lines.append(encode(record, fence=self._tag))
                    kept.append(record)
                except (ValueError, TypeError, OverflowError) as exc:
                    self._error("encode", exc)
            with self._state_lock:
                self.timeline.extend(kept)
            self._unwritten += b"".join(lines)
            self._bound_buffer()
        if self._fenced:
            return
        if not self._lock.held:
            if closing or mono - self._last_attempt >= self._retry_interval:
                self._acquire(mono)
            if not self._lock.held:
                return
        if not self._unwritten:
            if mono - self._last_heartbeat >= self._heartbeat_interval:
                self._heartbeat(mono)
            return
        durable = self._durable_wanted or self._closing
        # The lock is checked (and touched) right before every write: a writer that lost it stops here.
        if self._heartbeat(mono):
            self._durable_wanted = False
            self._write(durable=durable)

    def _bound_buffer(self) -> None:
        """Keep the unwritten buffer under its bound while the storage fails: drop the oldest progress
        and sign-of-life lines first (down to 3/4 of the bound), so that incarnation starts, ends and
        checkpoints, which the accounting hinges on, survive longest."""
        if len(self._unwritten) <= self._max_pending:
            return
        target = self._max_pending * 3 // 4
        size = len(self._unwritten)
        lines = bytes(self._unwritten).split(b"\n")[:-1]  # the buffer holds whole lines only
        kept: list[bytes] = []
        for line in lines:
            if size > target and line.startswith(_DROPPABLE):
                size -= len(line) + 1
                self._dropped += 1
            else:
                kept.append(line)
        while kept and size > target:
            size -= len(kept[0]) + 1
            self._dropped += 1
            kept.pop(0)
        self._unwritten = bytearray(b"".join(line + b"\n" for line in kept))

    def _acquire(self, mono: float) -> None:
        """Try to take the lock (at start, then every retry interval while another writer has it)."""
        self._last_attempt = mono
        try:
            self._lock.acquire()
        except LedgerLockedError as exc:
            if not self._waiting:
                log.warning(
                    "babysitter: goodput ledger: %s; records are kept in memory (at most %d bytes) and "
                    'the lock retried; %s{state="waiting"} is 1 meanwhile',
                    exc,
                    self._max_pending,
                    G.LEDGER_WRITER_STATE.name,
                )
            self._waiting = True
            return
        except OSError as exc:
            self._waiting = False
            self._error("lock", exc)
            return
        if self._waiting:
            log.warning("babysitter: goodput ledger %s: the lock is free now; writing", self.path)
        self._waiting = False
        self._last_heartbeat = mono

    def _heartbeat(self, mono: float) -> bool:
        """Touch the lock (recreating it if it vanished); False once another writer has it."""
        self._last_heartbeat = mono
        try:
            try:
                result = self._lock.refresh()
            except FileNotFoundError:  # the run directory itself is gone: bring it back
                self.run_dir.mkdir(parents=True, exist_ok=True)
                result = self._lock.refresh()
        except OSError as exc:
            self._error("heartbeat", exc)
            return True  # still ours as far as we know; the write says whether the storage works
        if result == "lost":
            self._fenced = True
            log.warning(
                "babysitter: goodput ledger %s: another writer took the lock over; this process stops "
                'writing the ledger (%s{state="fenced"})',
                self.path,
                G.LEDGER_WRITER_STATE.name,
            )
            self._errors["lock_lost"] = self._errors.get("lock_lost", 0) + 1
            return False
        if result == "recreated":
            self._note("lock_recreated", "the lock file had vanished (run directory deleted?); taken again")
        return True

    def _file_replaced(self, fd: int, size: int) -> None:
        """The path is a new file (ours was deleted or replaced): go on in a continuation segment."""
        self._need_newline = False
        if size:
            with contextlib.suppress(OSError):
                self._need_newline = os.pread(fd, 1, size - 1) != b"\n"
        self._note("file_lost", "the ledger file was deleted or replaced; going on in a new segment")
        self._last_peak = None  # the new file states the peak FLOP/s again
        start = self._start
        if start is None or (self._start_line and self._start_line in self._unwritten):
            return  # our start is still to be written: the new file gets it anyway
        if self._segment_line and self._unwritten.startswith(self._segment_line):
            return  # the last segment's start is not written yet either: it still says it all
        self._segments += 1
        last_step = last_end = None
        resumed = None
        with self._state_lock:
            incs = self.timeline.incarnations
            inc = incs[-1] if incs and incs[-1].start.id == start.id else None
            if inc is not None:
                # The boundary before the first one still to be written: the last the lost file held.
                unwritten = 0
                for line in bytes(self._unwritten).split(b"\n"):
                    if line.startswith(_PROG):
                        with contextlib.suppress(ValueError, TypeError, KeyError):
                            obj = json.loads(line)
                            mixed = obj.get("dd")  # waits and gaps interleaved: 2n - 1 numbers
                            unwritten += (len(mixed) + 1) // 2 if mixed is not None else len(obj["d"]) + 1
                k = inc.n - unwritten
                if k >= 1:
                    last_step, last_end = inc.steps[k - 1], inc.ends[k - 1]
                resumed = inc.resume_step()
        segment = Start(
            t=to_us(time.time()),
            pst=start.pst,
            id=start.id,
            host=start.host,
            pid=start.pid,
            run=start.run,
            info=start.info,
            segment=self._segments,
            last_step=last_step,
            last_end=last_end,
            resumed=resumed,
            directory=start.directory,
        )
        try:
            self._segment_line = encode(segment)
        except (ValueError, TypeError) as exc:
            self._error("encode", exc)
            return
        self._unwritten[:0] = self._segment_line

    def _open(self) -> int:
        """The descriptor of the ledger file, reopened (in a new segment) when the path is no longer
        the file this writer appends to. Keeping it open keeps a deleted file's inode from being reused
        by its successor, so the check cannot be fooled."""
        lost = False
        if self._fd >= 0:
            try:
                mine = os.fstat(self._fd)
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino) and mine.st_nlink > 0:
                    return self._fd
            except OSError:
                pass
            lost = True
            self._close_file()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except FileNotFoundError:  # the run directory was deleted under us: bring it back
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, flags, 0o644)
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            if lost or (self._file_ident is not None and ident != self._file_ident):
                self._file_replaced(fd, st.st_size)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._file_ident = fd, ident
        return fd

    def _close_file(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def _write(self, *, durable: bool) -> None:
        written = 0
        prefix = data = b""
        try:
            fd = self._open()
            data = bytes(self._unwritten)
            prefix = b"\n" if self._need_newline else b""
            payload = prefix + data
            while written < len(payload):
                written += os.write(fd, payload[written:])
            self._need_newline = False
            del self._unwritten[: len(data)]
            self._last_write = time.monotonic()
            if self._failing:
                self._failing = False
                log.info("babysitter: goodput ledger %s: writes work again", self.path)
            if durable:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    self._error("fsync", exc)
        except OSError as exc:
            self._failing = True
            self._error("write", exc)
            done = max(0, written - len(prefix))
            if done:
                # Whole lines that made it stay written; a cut line is re-sent after a newline.
                last_nl = data.rfind(b"\n", 0, done)
                del self._unwritten[: last_nl + 1]
            self._need_newline = True  # the file's last line may be cut; a blank line is harmless
            self._close_file()  # reopened (and checked) at the next attempt
