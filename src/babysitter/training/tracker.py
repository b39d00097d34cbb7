"""The in-process tracker: a hot path of plain field updates, and everything else off it.

``step()`` runs once per optimizer step on the training thread. It reads the host clock, adds a few
integers, writes five slots of a preallocated ring and, on CUDA, records one event. It takes no
lock, reads no tensor, does no I/O and cannot raise into training. A housekeeping thread (and every
scrape) folds the ring into histograms, feeds the run ledger, reads the loss and CUDA events once
they are ready, and computes windowed MFU.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar

from babysitter._version import __version__
from babysitter.catalog import goodput as G
from babysitter.catalog import train as T
from babysitter.ledger.records import MAX_INT as _MAX_STEP
from babysitter.training.config import TrackerConfig, manifest_mode
from babysitter.training.events import NullEvents, RunEvents
from babysitter.training.histogram import Histogram, HistogramSnapshot
from babysitter.training.loss import LossReader
from babysitter.training.nonfinite import RING as _LOSS_RING
from babysitter.training.nonfinite import NonFiniteWatch
from babysitter.training.tally import Tally
from babysitter.training.timing import CudaStepTimer

__all__ = ["CheckpointHandle", "CheckpointObserver", "Tracker", "TrackerSnapshot"]

log = logging.getLogger("babysitter")
_HOST = socket.gethostname()

_RING = 1 << 16  # step boundaries kept between folds: ~65k steps per flush interval
_MASK = _RING - 1
_MAX_PHASES = 16
_LMASK = _LOSS_RING - 1
if _LMASK != 1023:  # step() spells the loss ring's mask as a literal (a global lookup per step less)
    raise RuntimeError("the loss ring changed size: update the mask in Tracker.step")
_perf_ns = time.perf_counter_ns

Item = TypeVar("Item")


@dataclass(frozen=True)
class TrackerSnapshot:
    """Everything an exporter renders, read consistently at one moment."""

    time: float
    steps: int
    step: int
    last_step_time: float | None
    #: This rank's share of its data-parallel replica's tokens and samples (replica / (tp x pp x cp)).
    tokens: float
    samples: float
    tokens_per_second: float | None
    model_flops: float | None
    hardware_flops: float | None
    peak_flops: float | None
    mfu: float | None
    hfu: float | None
    data_wait_seconds: float
    phase_seconds: dict[str, float]
    step_duration: HistogramSnapshot
    #: The durations of the most recent steps, oldest first (rank 0's step-time quantiles).
    recent_steps: tuple[float, ...]
    checkpoint_save: HistogramSnapshot | None
    checkpoint_load: HistogramSnapshot | None
    checkpoint_bytes: int
    checkpoint_last_success: float | None
    checkpoint_failures: int
    loss: float | None
    nonfinite_loss: int
    start_time: float
    info: dict[str, str]
    internal_errors: dict[str, int]
    input_rejected: dict[str, int]


class CheckpointHandle:
    """What ``with tracker.checkpoint_save(...) as ckpt`` yields: set ``nbytes``/``path`` once known.

    ``nbytes`` is the size on disk (all files of a sharded checkpoint); the node agent's checkpoint
    sentinel checks that what the ledger lists is still there with at least that size, and with
    manifests (:mod:`babysitter.training.manifests`) that it matches what was written.
    ``manifest``: this save's manifest mode (None: the tracker's). :meth:`manifest_after` makes the
    manifest wait for an asynchronous save's future.
    """

    __slots__ = ("future", "kind", "manifest", "nbytes", "path", "step")

    def __init__(
        self, kind: str, step: int, nbytes: int | None, path: str | None, manifest: str | None = None
    ) -> None:
        self.kind = kind
        self.step = step
        self.nbytes = nbytes
        self.path = path
        self.manifest = manifest
        self.future: Any = None

    def manifest_after(self, future: Any) -> None:
        """Hash the save once ``future`` is done (``torch.distributed.checkpoint.async_save``'s, or any
        object with ``done()``): the files are still being written when the block ends."""
        self.future = future


class CheckpointObserver(Protocol):
    """What the tracker tells about each checkpoint save (the manifest writer implements it)."""

    def before_save(self, handle: CheckpointHandle) -> None:
        """A save's block began."""
        ...

    def expects(self, handle: CheckpointHandle) -> bool:
        """Whether a manifest of this save will be written (recorded in the ledger)."""
        ...

    def in_block(self, handle: CheckpointHandle) -> None:
        """The save's body ended without an error; its timer still runs."""
        ...

    def after_save(self, handle: CheckpointHandle, ok: bool) -> None:
        """The save's block ended (its timer stopped)."""
        ...

    def close(self) -> None:
        """The tracker closes: finish what is under way (before the ledger closes)."""
        ...


class _Timed:
    """Base of the checkpoint and phase context managers: they pause the step clock."""

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker
        self._t0 = 0

    def _elapsed_ns(self) -> int:
        return _perf_ns() - self._t0


class _CheckpointContext(_Timed):
    def __init__(self, tracker: Tracker, handle: CheckpointHandle) -> None:
        super().__init__(tracker)
        self._handle = handle

    def __enter__(self) -> CheckpointHandle:
        self._t0 = _perf_ns()
        self._tracker._checkpoint_begin(self._handle)
        return self._handle

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self._tracker._checkpoint_written(self._handle)
        self._tracker._checkpoint_end(self._handle, self._elapsed_ns(), ok=exc_type is None)


class _PhaseContext(_Timed):
    def __init__(self, tracker: Tracker, name: str) -> None:
        super().__init__(tracker)
        self._name = name

    def __enter__(self) -> None:
        self._t0 = _perf_ns()
        self._tracker._phase_begin(self._name)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._tracker._phase_end(self._name, self._elapsed_ns())


class Tracker:
    """Per-process training metrics. Create it with :func:`babysitter.watch`.

    >>> tracker = babysitter.watch(model, tokens_per_step=batch * seq_len, dtype="bf16")
    >>> for batch in tracker.data(loader):
    ...     loss = train_step(batch)
    ...     tracker.step(loss=loss)
    """

    def __init__(
        self,
        config: TrackerConfig,
        *,
        events: RunEvents | None = None,
        cuda_timer: CudaStepTimer | None = None,
        loss_reader: LossReader | None = None,
    ) -> None:
        self.config = config
        self._share = config.parallel.share
        self.errors = Tally("internal error")
        self.rejected = Tally("invalid input skipped")
        self._events: RunEvents = events if events is not None else NullEvents()
        self._timer = cuda_timer
        self._loss_reader = loss_reader if loss_reader is not None else LossReader()
        self._wall0 = time.time()
        self._perf0 = _perf_ns()
        self.start_time = self._wall0
        # --- hot-path state: written only by the training thread ---
        self._n = 0
        self._step = 0
        self._tokens = 0
        self._samples = 0
        self._default_tokens = config.tokens_per_step or 0
        self._default_samples = config.samples_per_step or 0
        self._data_wait_ns = 0
        self._stall_ns = 0  # the data wait outside checkpoints and phases: what the ledger books
        self._pause_ns = 0
        #: True once the loop's own step numbers set or agreed with the counter (a step= it passed, a
        #: checkpoint load, a save whose step matched): until then a far-off step number is adopted.
        self._numbered = False
        #: ``(boundary index, offset, what)``: boundaries before the index are renumbered at the next fold.
        self._adopt: tuple[int, int, str] | None = None
        self._step_mismatch_said = False
        self._mfu_said = False
        self._tokens_said = False
        self._loss: object = None
        self._r_t = [0] * _RING
        self._r_tok = [0] * _RING
        self._r_pause = [0] * _RING
        self._r_step = [0] * _RING
        self._r_wait = [0] * _RING
        # Every step's loss, or (loss, gradient norm), by reference, read off the hot path.
        self._r_loss: list[object] = [None] * _LOSS_RING
        self._l_scanned = 0
        # --- folded state: guarded by _lock (housekeeping thread and scrapes) ---
        self._lock = threading.Lock()
        self._folded = 0
        self._fold_tokens = 0
        self._fold_data_wait_ns = 0
        self._fold_stall_ns = 0
        # Sum and count only (quantiles come from the recent steps); see catalog.train.STEP_QUANTILES.
        self._step_hist = Histogram(())
        self._recent_steps: deque[float] = deque(maxlen=T.STEP_QUANTILE_STEPS)
        self._save_hist: Histogram | None = None
        self._load_hist: Histogram | None = None
        self._ckpt_bytes = 0
        self._ckpt_last_success: float | None = None
        self._ckpt_failures = 0
        self._phase_ns: dict[str, int] = {}
        self._active_pauses = 0  # checkpoints/phases under way (the step clock is paused)
        self._housekeeping_hooks: list[Callable[[Tracker], None]] = []
        self._metrics_sources: list[Callable[[list[str], list[str]], Iterable[Any]]] = []
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._close_hooks: list[Callable[[], None]] = []
        #: Set by :func:`babysitter.watch`: the registry holding this tracker's collector, and the
        #: URL its metrics are served on (None without an HTTP endpoint).
        self.registry: Any = None
        self.metrics_url: str | None = None
        #: Set by :func:`babysitter.watch` on a CUDA rank: its GPU's ``uuid`` and ``pci_bus_id``
        #: (``training/gpu.py``), exported in ``train_info``; empty values elsewhere.
        self.gpu: dict[str, str] = dict.fromkeys(T.GPU_INFO_LABELS, "")
        #: Set by :func:`babysitter.watch`: the checkpoint manifests' writer (None: no manifests).
        self.checkpoint_observer: CheckpointObserver | None = None
        self._nonfinite = NonFiniteWatch(
            lambda: f"rank {config.rank.rank} of run {config.run!r} (host {_HOST})",
            getattr(self._loss_reader, "_training_stream", None),
        )
        self._metrics_sources.append(self._nonfinite.metrics)
        #: Set by :func:`babysitter.watch`: whether torch's flight recorder is read
        #: (``training/collectives.py``), exported as ``train_info{flight_recorder}``.
        self.flight_recorder: Callable[[], str] = lambda: ""

    # ------------------------------------------------------------------ hot path

    def step(
        self,
        tokens: int | None = None,
        samples: int | None = None,
        loss: object = None,
        *,
        step: int | None = None,
        grad_norm: object = None,
    ) -> None:
        """Mark the end of one optimizer step. Never raises, never synchronizes the device.

        ``tokens``/``samples``: of this rank's data-parallel replica in this step, i.e. the batch
        this rank took part in (default: ``tokens_per_step`` / ``samples_per_step`` from
        :func:`watch`); the tracker credits this rank with its share under tensor, pipeline or
        context parallelism. Pass Python ints (``batch.numel()`` is free, a tensor sum is not).
        ``loss``: a number or a (device) tensor, read later off the hot path. ``step``: the global
        step just completed, when the training loop knows it better. ``grad_norm``: the step's
        gradient norm (``clip_grad_norm_``'s result, a tensor is fine), read off the hot path like
        the loss: with the loss it tells at which step this rank stopped being finite.
        """
        try:
            now = _perf_ns()
            n = self._n
            if tokens is None:
                self._tokens += self._default_tokens
            elif tokens.__class__ is int and tokens >= 0:
                self._tokens += tokens
            else:
                self._add_slow("tokens", tokens)
            if samples is None:
                self._samples += self._default_samples
            elif samples.__class__ is int and samples >= 0:
                self._samples += samples
            else:
                self._add_slow("samples", samples)
            if step is None:
                self._step += 1
            else:
                self._set_step(step)
            if loss is not None:
                self._loss = loss
            j = n & _MASK
            self._r_t[j] = now
            self._r_tok[j] = self._tokens
            self._r_pause[j] = self._pause_ns
            self._r_step[j] = self._step
            self._r_wait[j] = self._stall_ns
            # One store (a tuple only when a gradient norm comes too): where NaN began, read later.
            self._r_loss[n & 1023] = loss if grad_norm is None else (loss, grad_norm)
            if self._timer is not None:
                self._timer.mark(n)
            self._n = n + 1
        except Exception as exc:
            self.errors.record("step", exc)

    def data(self, iterable: Iterable[Item]) -> Iterator[Item]:
        """Yield from ``iterable``, counting the time spent blocked waiting for each item.

        The ledger books the wait on the step it falls in; a wait inside a checkpoint or a phase (an
        eval loop fed through ``data()``) is already that interval's badput and is not booked again.
        The loader's own exceptions propagate unchanged: they belong to the training script.
        """
        iterator = iter(iterable)
        while True:
            t0 = _perf_ns()
            try:
                item = next(iterator)
            except StopIteration:
                return
            wait = _perf_ns() - t0
            self._data_wait_ns += wait
            if not self._active_pauses:
                self._stall_ns += wait
            yield item

    def add_data_wait(self, seconds: float) -> None:
        """Add input-pipeline wait measured elsewhere (a framework callback that cannot wrap the
        loader). Never raises; a negative or non-float value is skipped and counted."""
        if seconds.__class__ is float and 0.0 <= seconds < 1e9:
            wait = int(seconds * 1e9)
            self._data_wait_ns += wait
            if not self._active_pauses:
                self._stall_ns += wait
        else:
            self.rejected.record("data_wait_invalid", f"seconds={seconds!r}")

    # ------------------------------------------------------------ slow paths

    def _add_slow(self, what: str, value: object) -> None:
        """Non-int or negative counts: accept integral non-negative numbers, count the rest."""
        if value.__class__ is bool:
            self.rejected.record(f"{what}_not_a_number", f"{what}={value!r}")
            return
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.rejected.record(f"{what}_not_a_number", f"{what} of type {type(value).__name__}")
            return
        if hasattr(value, "device"):  # a tensor: float() just synchronized a device tensor; refuse
            self.rejected.record(f"{what}_is_tensor", f"pass {what} as a Python int (e.g. batch.numel())")
            return
        if not math.isfinite(number):
            self.rejected.record(f"{what}_not_finite", f"{what}={value!r}")
            return
        if number < 0:
            self.rejected.record(f"{what}_negative", f"{what}={value!r}")
            return
        count = int(number)
        if count != number:
            self.rejected.record(f"{what}_not_integral", f"{what}={value!r}")
            return
        if what == "tokens":
            self._tokens += count
        else:
            self._samples += count

    def _set_step(self, step: object) -> None:
        if step.__class__ is not int:
            self.rejected.record("step_not_int", f"step={step!r}")
            self._step += 1
        elif not 0 <= step <= _MAX_STEP:
            self.rejected.record("step_out_of_range", f"step={step!r} is not in [0, 2**53)")
            self._step += 1
        elif step <= self._step and self._n > 0:  # type: ignore[operator, unused-ignore]
            self.rejected.record("step_not_increasing", f"step {step} after {self._step}")
            self._step += 1
        else:
            if not self._numbered and self._n > 0 and step > self._step + 2:  # type: ignore[operator, unused-ignore]
                self._adopt = (self._n, step - self._step - 1, f"step(step={step})")  # type: ignore[operator, unused-ignore]
            self._numbered = True
            self._step = step  # type: ignore[assignment, unused-ignore]

    def _follow(self, step: int, what: str) -> None:
        """A step number the loop gave a checkpoint save: adopt it when the counter is the tracker's
        own and far behind (a restart without ``checkpoint_load``: the tracker counted from 0, the
        loop from its resume step), so the ledger books the restart's lost progress right."""
        if not self._numbered and step > self._step + 1:
            self._adopt = (self._n, step - self._step, what)
            self._step = step
            self._numbered = True
        elif abs(step - self._step) <= 1:
            self._numbered = True
        elif not self._step_mismatch_said:
            self._step_mismatch_said = True
            log.warning(
                "babysitter: %s while the tracker's step is %d: recorded as given. Lost progress after a "
                "restart is computed from these step numbers, so they must count optimizer steps as "
                "tracker.step() does (pass step= to tracker.step() to set the tracker's); logged once",
                what,
                self._step,
            )

    # ----------------------------------------------- checkpoints and phases

    def checkpoint_save(
        self,
        step: int | None = None,
        nbytes: int | None = None,
        path: str | None = None,
        *,
        manifest: bool | str | None = None,
    ) -> _CheckpointContext:
        """Time the blocking part of a checkpoint save: ``with tracker.checkpoint_save(step=s) as c:``.

        An exception in the body counts as a failed save and propagates. Set ``c.nbytes`` and
        ``c.path`` inside the block if they are only known after writing. With a ``path``, the save's
        manifest is written as ``watch(checkpoint_manifest=...)`` says, or as ``manifest`` says for
        this save (``"background"``, ``"blocking"``, ``"off"``; True/False).
        """
        checked = self._checked_step(step)
        if step is not None:
            self._follow(checked, f"checkpoint_save(step={checked})")
        mode = None if manifest is None else manifest_mode(manifest, "manifest")
        return _CheckpointContext(self, CheckpointHandle("save", checked, nbytes, path, manifest=mode))

    def checkpoint_load(self, step: int | None = None, path: str | None = None) -> _CheckpointContext:
        """Time a checkpoint load; on success the step counter continues from ``step``.

        When the step is only known once the checkpoint is read, set it inside the block:
        ``with tracker.checkpoint_load(path=p) as c: state = torch.load(p); c.step = state["step"]``.
        """
        return _CheckpointContext(self, CheckpointHandle("load", self._checked_step(step), None, path))

    def phase(self, name: str) -> _PhaseContext:
        """Mark a non-training phase (``"eval"``...): its time is kept out of step time and MFU."""
        if not isinstance(name, str) or not name.isidentifier() or len(name) > 32:
            raise ValueError(f"phase name must be a short identifier such as 'eval', got {name!r}")
        return _PhaseContext(self, name)

    def _checked_step(self, step: int | None) -> int:
        if step is None:
            return self._step
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _MAX_STEP:
            raise ValueError(f"step must be an int in [0, 2**53), got {step!r}")
        return step

    def _checkpoint_begin(self, handle: CheckpointHandle) -> None:
        self._active_pauses += 1
        observer = self.checkpoint_observer
        if observer is not None and handle.kind == "save":
            try:
                observer.before_save(handle)
            except Exception as exc:
                self.errors.record("manifest", exc)
        try:
            # Hand the ledger every step up to this checkpoint before the checkpoint itself, so a
            # crash right after the save cannot leave those steps unrecorded (checkpoints are rare
            # and slow: folding here costs nothing that matters).
            self.fold()
            self._events.checkpoint_begin(
                kind=handle.kind,  # type: ignore[arg-type]
                step=handle.step,
                time=time.time(),
                path=_absolute(handle.path),
            )
        except Exception as exc:
            self.errors.record("ledger", exc)

    def _checkpoint_written(self, handle: CheckpointHandle) -> None:
        """The body of a save ended without an error, its timer still running (a blocking manifest)."""
        observer = self.checkpoint_observer
        if observer is None or handle.kind != "save":
            return
        try:
            observer.in_block(handle)
        except Exception as exc:
            self.errors.record("manifest", exc)

    def _checkpoint_end(self, handle: CheckpointHandle, elapsed_ns: int, *, ok: bool) -> None:
        self._active_pauses -= 1
        observer = self.checkpoint_observer if handle.kind == "save" else None
        try:
            self._pause_ns += elapsed_ns
            seconds = elapsed_ns / 1e9
            nbytes = handle.nbytes
            if nbytes is not None and (nbytes.__class__ is not int or not 0 <= nbytes <= _MAX_STEP):
                self.rejected.record("checkpoint_nbytes_invalid", f"nbytes={nbytes!r}")
                nbytes = None
            with self._lock:
                if handle.kind == "save":
                    if self._save_hist is None:
                        self._save_hist = Histogram(())
                    self._save_hist.observe(seconds)
                    if ok:
                        self._ckpt_bytes += nbytes or 0
                        self._ckpt_last_success = time.time()
                    else:
                        self._ckpt_failures += 1
                else:
                    if self._load_hist is None:
                        self._load_hist = Histogram(())
                    self._load_hist.observe(seconds)
            step = handle.step  # the block may set it: a load learns its step from the checkpoint
            if step.__class__ is not int or not 0 <= step <= _MAX_STEP:
                self.rejected.record("checkpoint_step_invalid", f"step={step!r}")
                handle.step = self._step
            if handle.kind == "load" and ok:
                self._step = handle.step
                self._nonfinite.reset()  # a rollback: what was not finite before is behind us
                self._numbered = True
            self._events.checkpoint_end(
                kind=handle.kind,  # type: ignore[arg-type]
                step=handle.step,
                time=time.time(),
                ok=ok,
                nbytes=nbytes,
                path=_absolute(handle.path),
                manifest=ok and observer is not None and observer.expects(handle),
            )
            if ok and handle.kind == "save":
                self._events.flush(durable=True)
        except Exception as exc:
            self.errors.record("checkpoint", exc)
        if observer is not None:
            try:
                observer.after_save(handle, ok)
            except Exception as exc:
                self.errors.record("manifest", exc)

    def _phase_begin(self, name: str) -> None:
        self._active_pauses += 1
        try:
            self.fold()
            self._events.phase_begin(name=name, time=time.time())
        except Exception as exc:
            self.errors.record("ledger", exc)

    def _phase_end(self, name: str, elapsed_ns: int) -> None:
        self._active_pauses -= 1
        try:
            self._pause_ns += elapsed_ns
            with self._lock:
                if name not in self._phase_ns and len(self._phase_ns) >= _MAX_PHASES:
                    self.rejected.record("too_many_phases", name)
                    name = "other"
                self._phase_ns[name] = self._phase_ns.get(name, 0) + elapsed_ns
            self._events.phase_end(name=name, time=time.time())
        except Exception as exc:
            self.errors.record("phase", exc)

    # ------------------------------------------------------ off the hot path

    def _wall(self, perf_ns: int) -> float:
        return self._wall0 + (perf_ns - self._perf0) / 1e9

    def fold(self) -> None:
        """Fold new step boundaries into the histogram and the ledger (housekeeping, scrapes)."""
        with self._lock:
            self._fold_locked()

    def _fold_locked(self) -> bool:
        """Fold; True when step boundaries were handed to the ledger."""
        n = self._n
        start = self._folded
        dropped = 0
        if n - start > _RING:
            # More steps than the ring holds since the last fold (~65k steps per flush interval): the
            # oldest boundaries are gone, but not their count or their time, which the ledger folds
            # into the first boundary kept (cumulative waits make its data wait exact too).
            dropped = n - start - _RING
            self.errors.record("ring_overrun", f"{dropped} step boundaries not folded one by one")
            start = n - _RING
        r_t, r_pause, r_step, r_wait = self._r_t, self._r_pause, self._r_step, self._r_wait
        if self._adopt is not None:
            self._apply_adoption(start, n)
        boundaries: list[tuple[int, float]] = []
        waits: list[float] = []
        work: list[int] = []
        r_tok = self._r_tok
        stall = self._fold_stall_ns
        oldest = max(0, n - _RING)
        for i in range(start, n):
            j = i & _MASK
            if self._timer is None and i > oldest:
                k = (i - 1) & _MASK
                active_ns = (r_t[j] - r_t[k]) - (r_pause[j] - r_pause[k])
                seconds = max(active_ns, 0) / 1e9
                self._step_hist.observe(seconds)
                self._recent_steps.append(seconds)
            boundaries.append((r_step[j], self._wall(r_t[j])))
            waits.append((r_wait[j] - stall) / 1e9)
            stall = r_wait[j]
            # The step's tokens from the ring's running count (its predecessor overwritten: unknown).
            work.append(r_tok[j] - r_tok[(i - 1) & _MASK] if i > oldest else r_tok[j] if i == 0 else 0)
        self._folded = n
        if self._timer is not None:
            for seconds in self._timer.drain():
                self._step_hist.observe(seconds)
                self._recent_steps.append(seconds)
        tokens = self._r_tok[(n - 1) & _MASK] if n else 0
        data_wait_ns = self._data_wait_ns
        if boundaries:
            flops = self.config.flops.model
            try:
                self._events.progress(
                    boundaries=boundaries,
                    data_wait_seconds=(data_wait_ns - self._fold_data_wait_ns) / 1e9,
                    model_flops=self._share((tokens - self._fold_tokens) * flops) if flops else 0.0,
                    peak_flops=self.config.peak.flops_per_second,
                    data_waits=waits,
                    dropped=dropped,
                    tokens=work,
                )
            except Exception as exc:
                self.errors.record("ledger", exc)
            self._fold_tokens = tokens
            self._fold_data_wait_ns = data_wait_ns
            self._fold_stall_ns = stall
        return bool(boundaries)

    def _apply_adoption(self, start: int, n: int) -> None:
        """Renumber what the tracker counted itself: in the ledger (what it holds) and in the ring."""
        assert self._adopt is not None
        at, offset, what = self._adopt
        self._adopt = None
        if offset <= 0:
            return
        try:
            self._events.renumber(time=time.time(), by=offset)
        except Exception as exc:
            self.errors.record("ledger", exc)
        r_step = self._r_step
        for i in range(start, min(at, n)):
            r_step[i & _MASK] += offset
        log.warning(
            "babysitter: %s while this process's tracker had counted %d step(s) itself: adopting the "
            "training loop's step numbers (+%d), so the ledger books this restart's resume step and lost "
            "progress right. Call tracker.checkpoint_load(step=...) around the restore to also time it "
            "(and pass step= to tracker.step()); logged once",
            what,
            at,
            offset,
        )

    def _window_rate(self) -> float | None:
        """Tokens per second of active (non-paused) time over the sliding window; None if unknown.

        The window ends at the newest step boundary, or at now when no step finished for more than
        twice the window's mean step time (a stall pulls the rate down, as ``rate()`` in PromQL would).
        """
        n = self._n
        if n < 2:
            return None
        r_t, r_tok, r_pause = self._r_t, self._r_tok, self._r_pause
        newest = (n - 1) & _MASK
        t_end, tok_end, pause_end = r_t[newest], r_tok[newest], r_pause[newest]
        horizon = t_end - int(self.config.mfu_window * 1e9)
        # The window starts at the oldest boundary inside it (at least one step back). Boundaries
        # are in time order, so a binary search finds it: a scrape costs the same at 10 or 10,000
        # steps per window.
        lo, hi = max(0, n - _RING + 1), n - 2
        while lo < hi:
            mid = (lo + hi) // 2
            if r_t[mid & _MASK] >= horizon:
                hi = mid
            else:
                lo = mid + 1
        first = lo
        j = first & _MASK
        steps = n - 1 - first
        active = (t_end - r_t[j]) - (pause_end - r_pause[j])
        if active <= 0 or tok_end == r_tok[j]:
            return 0.0 if active > 0 else None
        now = _perf_ns()
        stalled = now - t_end - (self._pause_ns - pause_end)
        if stalled > 2 * active / steps:
            active += stalled
        return (tok_end - r_tok[j]) / (active / 1e9)

    def snapshot(self) -> TrackerSnapshot:
        """Fold, then read every exported value."""
        with self._lock:
            self._fold_locked()
            n = self._n
            flops = self.config.flops
            peak = self.config.peak.flops_per_second
            # This rank's share of its replica's tokens, and so of the FLOPs (see flops.parallel).
            share = self._share
            tokens = self._tokens
            rate = self._window_rate() if tokens > 0 else None
            if rate is not None:
                rate = share(rate)
            mfu = hfu = None
            if rate is not None and peak and flops.model is not None and flops.hardware is not None:
                mfu = rate * flops.model / peak
                hfu = rate * flops.hardware / peak
            try:
                self._loss_reader.poll(self._loss)
            except Exception as exc:
                self.errors.record("loss", exc)
                self._loss = None
            return TrackerSnapshot(
                time=time.time(),
                steps=n,
                step=self._step,
                last_step_time=self._wall(self._r_t[(n - 1) & _MASK]) if n else None,
                tokens=share(tokens),
                samples=share(self._samples),
                tokens_per_second=rate,
                model_flops=share(tokens * flops.model) if flops.model is not None else None,
                hardware_flops=share(tokens * flops.hardware) if flops.hardware is not None else None,
                peak_flops=peak,
                mfu=mfu,
                hfu=hfu,
                data_wait_seconds=self._data_wait_ns / 1e9,
                phase_seconds={k: v / 1e9 for k, v in self._phase_ns.items()},
                step_duration=self._step_hist.snapshot(),
                recent_steps=tuple(self._recent_steps),
                checkpoint_save=self._save_hist.snapshot() if self._save_hist else None,
                checkpoint_load=self._load_hist.snapshot() if self._load_hist else None,
                checkpoint_bytes=self._ckpt_bytes,
                checkpoint_last_success=self._ckpt_last_success,
                checkpoint_failures=self._ckpt_failures,
                loss=self._loss_reader.value,
                nonfinite_loss=self._loss_reader.nonfinite,
                start_time=self.start_time,
                info=self.info(),
                internal_errors=self.errors.counts(),
                input_rejected=self.rejected.counts(),
            )

    def info(self) -> dict[str, str]:
        """Static facts exported as ``train_info``."""
        config = self.config
        return {
            "version": __version__,
            "python": sys.version.split()[0],
            "device": config.peak.device,
            "peak_dtype": config.peak.dtype,
            "world_size": str(config.rank.world_size),
            "local_rank": str(config.rank.local_rank),
            "flops_source": config.flops.source,
            **config.parallel.labels(),
            **self.gpu,
            "flight_recorder": self.flight_recorder(),
        }

    def event_metrics(self, label_names: list[str], label_values: list[str]) -> Iterable[Any]:
        """Metric families from the run-event sink (the ledger's goodput) and added sources, guarded."""
        families: list[Any] = []
        try:
            families.extend(self._events.metrics(label_names, label_values, time.time()))
        except Exception as exc:
            self.errors.record("ledger_metrics", exc)
        for source in list(self._metrics_sources):
            try:
                families.extend(source(label_names, label_values))
            except Exception as exc:
                self.errors.record("metrics_source", exc)
        return families

    def goodput(self) -> float | None:
        """The run's goodput so far, as ``train_goodput_ratio`` shows it (rank 0 with a ledger);
        None without a ledger or before it is read. Off the hot path: it runs the ledger's accounting."""
        try:
            for family in self._events.metrics((), (), time.time()):
                if family.name == G.GOODPUT.name and family.samples:
                    return float(family.samples[0].value)
        except Exception as exc:
            self.errors.record("ledger_metrics", exc)
        return None

    # ------------------------------------------ extension points (watchdog, stragglers, exporters)

    def add_housekeeping_hook(self, hook: Callable[[Tracker], None]) -> None:
        """Call ``hook(tracker)`` after every housekeeping pass (off the training thread, guarded)."""
        self._housekeeping_hooks.append(hook)

    def add_metrics_source(self, source: Callable[[list[str], list[str]], Iterable[Any]]) -> None:
        """Add metric families to every scrape: ``source(label_names, label_values)``, guarded."""
        self._metrics_sources.append(source)

    def seconds_since_last_step(self) -> float | None:
        """Host seconds since the newest step boundary (or since watch() before the first step),
        not counting checkpoint and phase time; None while a checkpoint or phase is under way."""
        if self._active_pauses > 0:
            return None
        n = self._n
        if n == 0:
            return (_perf_ns() - self._perf0 - self._pause_ns) / 1e9
        j = (n - 1) & _MASK
        return (_perf_ns() - self._r_t[j] - (self._pause_ns - self._r_pause[j])) / 1e9

    def recent_step_seconds(self, limit: int = 100) -> list[float]:
        """Host durations of up to ``limit`` most recent steps, oldest first, pauses excluded."""
        n = self._n
        count = max(0, min(limit, n - 1, _RING - 1))
        r_t, r_pause = self._r_t, self._r_pause
        out: list[float] = []
        for i in range(n - count, n):
            j, k = i & _MASK, (i - 1) & _MASK
            out.append(max(0, (r_t[j] - r_t[k]) - (r_pause[j] - r_pause[k])) / 1e9)
        return out

    def record_straggler(self, rank: int | None, score: float, host: str | None, gpu: str | None) -> None:
        """Tell the run ledger which rank the others wait for (None: none any more); the straggler
        exchange's call on rank 0, at a round (every N steps), never per step."""
        try:
            self._events.straggler(time=time.time(), rank=rank, score=score, host=host, gpu=gpu)
        except Exception as exc:
            self.errors.record("ledger", exc)

    def record_hang(self, seconds_since_step: float) -> None:
        """Tell the run ledger that no step finished for ``seconds_since_step`` (the watchdog's call)."""
        try:
            self._events.hang(time=time.time(), step=self._step, seconds_since_step=seconds_since_step)
        except Exception as exc:
            self.errors.record("ledger", exc)

    # --------------------------------------------------------- lifecycle

    def start_housekeeping(self) -> None:
        """Start the thread that folds state and feeds the ledger every ``flush_interval``."""
        self._thread = threading.Thread(
            target=self._housekeep_loop, name="babysitter-housekeeping", daemon=True
        )
        self._thread.start()

    def _housekeep_loop(self) -> None:
        while not self._stop.wait(self.config.flush_interval):
            self.housekeep()

    def _scan_losses_locked(self) -> None:
        """Hand every step's loss and gradient norm since the last pass to the non-finite watch."""
        n = self._n
        start = self._l_scanned
        if n - start > _LOSS_RING:
            self._nonfinite.dropped += n - start - _LOSS_RING
            start = n - _LOSS_RING
        entries: list[tuple[int, object, object]] = []
        r_loss, r_step = self._r_loss, self._r_step
        for i in range(start, n):
            k = i & _LMASK
            value = r_loss[k]
            if value is None:
                continue
            r_loss[k] = None
            if value.__class__ is tuple:
                entries.append((r_step[i & _MASK], *value))
            else:
                entries.append((r_step[i & _MASK], value, None))
        self._l_scanned = n
        self._nonfinite.scan(entries)

    def housekeep(self) -> None:
        """One pass: fold the ring, read the loss, run the hooks. Never raises.

        New steps are written to the ledger now, not at the writer's next timer: a SIGKILL then
        loses at most one ``flush_interval`` of progress, right after a checkpoint too (the writer's
        timer restarts at each checkpoint's write, so its next batch came a whole timer later).
        Scrapes fold too but do not ask for a write: their steps go out with the next pass.
        """
        try:
            with self._lock:
                folded = self._fold_locked()
                try:
                    self._loss_reader.poll(self._loss)
                except Exception as exc:
                    self.errors.record("loss", exc)
                    self._loss = None
                try:
                    self._scan_losses_locked()
                except Exception as exc:
                    self.errors.record("nonfinite", exc)
            if folded:
                self._events.flush()
        except Exception as exc:
            self.errors.record("housekeeping", exc)
        self._check_mfu()
        self._check_tokens()
        for hook in list(self._housekeeping_hooks):
            try:
                hook(self)
            except Exception as exc:
                self.errors.record("housekeeping_hook", exc)

    def _check_tokens(self) -> None:
        """Say once when steps go by and no token is counted although FLOPs per token are known:
        FLOPs are tokens x FLOPs per token, so train_model_flops_total and MFU stay empty (a loop that
        never passes tokens, a callback whose batches hold no token ids)."""
        if self._tokens_said or self._n < 3 or self._tokens or not self.config.flops.model:
            return
        self._tokens_said = True
        log.warning(
            "babysitter: %d steps and no tokens counted, so train_model_flops_total and MFU are not "
            "reported: pass tokens_per_step= (the tokens of this rank's replica per optimizer step) to "
            "watch() or the callback, or tokens= to tracker.step(); logged once",
            self._n,
        )

    def _check_mfu(self) -> None:
        """Say once when MFU comes out above 1: no device beats its dense peak, so the peak (or the
        FLOPs per token) is wrong, and every MFU of the run with it (issue 22)."""
        if self._mfu_said:
            return
        peak, flops = self.config.peak.flops_per_second, self.config.flops.model
        if not peak or not flops or self._n < 3:
            return
        try:
            rate = self._window_rate()
        except Exception as exc:
            self.errors.record("mfu_check", exc)
            return
        if rate is None:
            return
        mfu = self._share(rate) * flops / peak
        if mfu > 1.0:
            self._mfu_said = True
            log.warning(
                "babysitter: MFU is %.2f, above 1: the peak FLOP/s (%.3g, %s for %s on %s) is below "
                "what this rank achieves, or the model FLOPs per token (%.3g, %s) are too high. Check "
                "peak_flops=, device= and dtype= (the dense peak of the dtype the matmuls run in) and "
                "flops_per_token=; logged once",
                mfu,
                peak,
                self.config.peak.source,
                self.config.peak.dtype,
                self.config.peak.device,
                flops,
                self.config.flops.source,
            )

    def close(self, *, clean: bool = True) -> None:
        """Flush everything, close the ledger, stop serving metrics. Idempotent, never raises."""
        if self._closed:
            return
        self._closed = True
        if self.checkpoint_observer is not None:  # its last manifests go to the ledger before it closes
            try:
                self.checkpoint_observer.close()
            except Exception as exc:
                self.errors.record("close", exc)
        try:
            self._stop.set()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(timeout=5.0)
            self.housekeep()
            self._events.close(time=time.time(), clean=clean)
        except Exception as exc:
            self.errors.record("close", exc)
        for hook in list(self._close_hooks):
            try:
                hook()
            except Exception as exc:
                self.errors.record("close", exc)

    def _after_fork_in_child(self) -> None:
        """In a child forked from this process: export nothing, write nothing, never block.

        The parent's threads do not exist in the child and its locks may be held forever, so the
        child's tracker is closed without running anything: no ledger record (the parent owns the
        ledger), no unregistration (the registration is the parent's), no server shutdown (the
        child's copies of the sockets are closed by the server's own fork handler). ``step()`` stays
        harmless. A child that trains calls :func:`babysitter.watch` again for its own tracker.
        """
        self._lock = threading.Lock()
        self._closed = True
        self._stop = threading.Event()
        self._thread = None
        self._close_hooks.clear()
        self._housekeeping_hooks.clear()
        self._events = NullEvents()
        self.checkpoint_observer = None
        self.metrics_url = None

    def add_close_hook(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` at close (the exporters release their port and registration this way)."""
        self._close_hooks.append(hook)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(clean=exc_type is None)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    @property
    def steps(self) -> int:
        """Steps this process has marked."""
        return self._n

    @property
    def global_step(self) -> int:
        """The current global step."""
        return self._step

    def __repr__(self) -> str:
        config = self.config
        return f"<Tracker run={config.run!r} rank={config.rank.rank} steps={self._n}>"


def _absolute(path: object) -> str | None:
    """Checkpoint paths go to the sink absolute (the ledger stores those inside the run directory
    relative to it: :mod:`babysitter.ledger.paths`)."""
    if path is None:
        return None
    return str(os.path.abspath(os.fspath(path)))  # type: ignore[call-overload]
