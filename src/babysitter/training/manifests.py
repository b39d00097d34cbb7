"""Checkpoint manifests from inside a training rank: after the save, off the training thread, bounded.

``with tracker.checkpoint_save(step=s, path=p):`` is all it takes. Once the block ends without an
error the save's path goes to one daemon thread (``babysitter-manifest``), which lists, checks and
hashes what was written and commits the manifest (:func:`babysitter.checkpoints.build_manifest`;
who writes what under several ranks is said there). Rank 0 tells the ledger how it went (``ckv``).

What it costs the training, and why no more:

* ``mode="background"`` (the default): the training thread only enqueues. The thread runs at the
  lowest CPU priority (nice 19, Linux threads are scheduled one by one) and ``hashlib`` releases the
  GIL while it hashes and reads, so the training thread keeps its core; the cost is that core's share
  of one CPU and the read-back of the checkpoint (from the page cache when it is still there).
  ``benchmarks/bench_checkpoints.py`` measures the step time while it runs.
* ``mode="blocking"``: the manifest is made inside the save's block, before its timer stops: the
  save's blocking time (``checkpoint_save`` badput) includes the hashing. For a training script that
  must not go on before its checkpoint is known to be whole.
* ``mode="off"``, or ``manifest=False`` for one save.
* At most ``max_queued`` saves wait (a save that would exceed it gets no manifest, counted as
  ``failed``); at close the tracker waits up to ``close_wait`` seconds for what is queued.
* ``handle.manifest_after(future)`` (``torch.distributed.checkpoint.async_save``): hashing waits
  until the future is done, so it never hashes a save still being written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from babysitter.catalog import integrity as I
from babysitter.checkpoints import BuildResult, build_manifest
from babysitter.checkpoints.digest import ALGORITHM, CHUNK, check_chunk
from babysitter.training.config import manifest_mode
from babysitter.training.tracker import CheckpointHandle, Tracker

__all__ = ["ManifestWriter"]

log = logging.getLogger("babysitter")

_FUTURE_POLL = 0.1


@dataclass
class _Job:
    step: int
    path: str
    future: Any
    queued: float
    generation: int = 0


class ManifestWriter:
    """The manifest side of one tracker's checkpoint saves (``tracker.checkpoint_observer``)."""

    def __init__(
        self,
        tracker: Tracker,
        *,
        mode: str = "background",
        alg: str | None = ALGORITHM,
        chunk: int = CHUNK,
        part_wait: float = 60.0,
        max_queued: int = 4,
        close_wait: float = 120.0,
        future_timeout: float = 3600.0,
    ) -> None:
        self.tracker = tracker
        self.mode = manifest_mode(mode)
        self.alg = alg
        self.chunk = check_chunk(chunk)
        self.part_wait = part_wait
        self.close_wait = close_wait
        self.future_timeout = future_timeout
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max_queued)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.results: dict[str, int] = {}
        self.last: BuildResult | None = None
        self._pending = 0
        self._blocked: dict[int, tuple[_Job, BuildResult]] = {}
        #: Saves begun per path: a job whose path saw a newer save stops (its files are being replaced).
        self._generation: dict[str, int] = {}
        self._idle = threading.Event()
        self._idle.set()

    # ------------------------------------------------------------------ the tracker's calls

    def _mode(self, handle: CheckpointHandle) -> str:
        return self.mode if handle.manifest is None else handle.manifest

    def expects(self, handle: CheckpointHandle) -> bool:
        """Whether a manifest of this save will be written (the ledger records the promise)."""
        return handle.kind == "save" and handle.path is not None and self._mode(handle) != "off"

    def before_save(self, handle: CheckpointHandle) -> None:
        """A save began (the training thread): a manifest still being made for the same path is
        abandoned, since this save is overwriting what it hashes."""
        if handle.kind != "save" or handle.path is None:
            return
        path = _path(handle)
        with self._lock:
            self._generation[path] = self._generation.get(path, 0) + 1
            if len(self._generation) > 4096:  # unique paths per save: only the newest matter
                self._generation = dict(list(self._generation.items())[-1024:])

    def _job(self, handle: CheckpointHandle) -> _Job:
        path = _path(handle)
        return _Job(handle.step, path, handle.future, time.monotonic(), self._generation.get(path, 0))

    def in_block(self, handle: CheckpointHandle) -> None:
        """Inside the save's block, before its timer stops: make the manifest now in blocking mode
        (told to the ledger after the save's end record, in :meth:`after_save`)."""
        if self.expects(handle) and self._mode(handle) == "blocking":
            self._blocked[id(handle)] = (job := self._job(handle), self._make(job))

    def after_save(self, handle: CheckpointHandle, ok: bool) -> None:
        """After the save's block (the training thread): queue the manifest in background mode."""
        made = self._blocked.pop(id(handle), None)
        if made is not None:
            self._finish(*made)
            return
        if not ok or not self.expects(handle) or self._mode(handle) != "background":
            return
        self._start()
        with self._lock:
            self._pending += 1
            self._idle.clear()
        job = self._job(handle)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._done()
            self._count("failed")
            self._report(handle.step, _path(handle), BuildResult("failed", why="too many manifests queued"))

    # ------------------------------------------------------------------ the thread

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="babysitter-manifest", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # the lowest priority, for this thread only
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._finish(job, self._make(job))
            except Exception as exc:  # a bug: counted, and the thread goes on
                self.tracker.errors.record("manifest", exc)
            finally:
                self._done()

    def _wait_future(self, job: _Job) -> str:
        """'' once the job's future is done, else why not."""
        future = job.future
        if future is None:
            return ""
        deadline = time.monotonic() + self.future_timeout
        while not future.done():
            if self._stop.is_set() or time.monotonic() > deadline:
                return "the save's future did not finish"
            time.sleep(_FUTURE_POLL)
        exception = getattr(future, "exception", None)
        if callable(exception):
            try:
                exc = exception()
            except Exception as err:  # torch futures raise their error from exception()/value()
                exc = err
            if exc is not None:
                return f"the save failed: {type(exc).__name__}: {exc}"
        return ""

    def _make(self, job: _Job) -> BuildResult:
        why = self._wait_future(job)
        if why:
            return BuildResult("failed", why=why)
        config = self.tracker.config
        return build_manifest(
            job.path,
            run=config.run,
            step=job.step,
            rank=config.rank.rank,
            alg=self.alg,
            chunk=self.chunk,
            part_wait=self.part_wait,
            stop=self._stop,
            cancelled=lambda: self._generation.get(job.path, 0) != job.generation,
        )

    def _finish(self, job: _Job, result: BuildResult) -> None:
        self.last = result
        self._count(result.kind)
        self._report(job.step, job.path, result)

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending <= 0:
                self._pending = 0
                self._idle.set()

    def _count(self, kind: str) -> None:
        with self._lock:
            self.results[kind] = self.results.get(kind, 0) + 1

    def _report(self, step: int, path: str, result: BuildResult) -> None:
        if result.kind == "failed":
            log.warning(
                "babysitter: no manifest for the checkpoint of step %d at %s: %s (it will not count as "
                "verified; counted in %s)",
                step,
                path,
                result.why,
                I.CKPT_MANIFESTS.name,
            )
        elif result.kind == "manifest":
            log.info(
                "babysitter: manifest of step %d committed: %d files, %d bytes hashed in %.1f s",
                step,
                len(result.manifest.files) if result.manifest else 0,
                result.hashed_bytes,
                result.seconds,
            )
        if result.kind not in ("manifest", "failed"):
            return
        manifest = result.manifest
        try:
            self.tracker._events.checkpoint_manifest(
                step=step,
                time=time.time(),
                path=path,
                ok=result.kind == "manifest",
                files=len(manifest.files) if manifest else 0,
                nbytes=manifest.nbytes if manifest else 0,
                alg=manifest.alg if manifest else self.alg,
                mid=result.mid,
                why=result.why,
            )
        except Exception as exc:
            self.tracker.errors.record("ledger", exc)

    # ------------------------------------------------------------------ end and export

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every queued manifest is done (tests, close)."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        """Finish what is queued (at most ``close_wait`` seconds), then stop the thread."""
        if self._thread is None:
            return
        if not self._idle.wait(self.close_wait):
            log.warning(
                "babysitter: closing with checkpoint manifests still being made after %.0f s; the "
                "newest checkpoint(s) will not count as verified",
                self.close_wait,
            )
        self._stop.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(timeout=2.0)

    def metrics(self, label_names: list[str], label_values: list[str]) -> list[Any]:
        """``train_checkpoint_manifests_total{result}`` and the last job's seconds (a metrics source)."""
        with self._lock:
            counts = dict(self.results)
        if not counts:
            return []
        total = I.CKPT_MANIFESTS.family(label_names)
        for kind in I.MANIFEST_RESULTS:
            if kind in counts:
                total.add_metric([*label_values, kind], float(counts[kind]))  # type: ignore[attr-defined]
        out = [total]
        if self.last is not None:
            seconds = I.CKPT_MANIFEST_SECONDS.family(label_names)
            seconds.add_metric(label_values, self.last.seconds)  # type: ignore[attr-defined]
            out.append(seconds)
        return out


def _path(handle: CheckpointHandle) -> str:
    return os.path.abspath(os.fspath(handle.path))  # type: ignore[arg-type]
