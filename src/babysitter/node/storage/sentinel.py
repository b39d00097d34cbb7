"""The checkpoint sentinel: are the checkpoints the ledger says completed still there, and still what
was written?

Providers delete files (quota sweeps, expired scratch, a wrong ``rm``), storage truncates and flips
bits, and a save can die half-way; a run only learns it when it restarts from such a checkpoint, which
is worse than a deleted one: it fails late or trains on garbage. For each configured run directory the
sentinel reads the ledger's saves (:class:`babysitter.ledger.saves.SaveLog`), takes the last
``keep_last`` distinct steps that completed, and checks each path:

- **exists**: a file must exist and be at least ``nbytes`` long; a directory's regular files (walked
  without following symlinks) must sum to at least ``nbytes``. Larger is fine: frameworks and eval
  jobs add files to checkpoint directories after the save. Without a recorded ``nbytes`` only
  existence is checked. A record without a path or with a URL (``s3://...``) cannot be checked here,
  nor can a path outside the run directory (below): each is logged once and counted in
  ``checkpoint_unchecked``. A checkpoint that fails this is *missing*.
- **verifies** (where the tracker writes manifests, :mod:`babysitter.checkpoints`): its manifest is
  there (a save whose tracker promised one and whose process ended without committing it, or whose
  manifest thread found it incomplete, did not complete; one still being hashed gets
  ``manifest_grace`` seconds); every listed file has exactly its recorded size (every pass for the
  newest checkpoint, every ``walk_seconds`` for older ones); the headers check out (safetensors,
  ``torch.save`` zip, Hugging Face index; once per manifest); and the chunk digests match, read
  back within ``verify_bytes`` per pass (cached pages dropped first so the bytes come from the
  storage), newest checkpoint first, in a fixed random order per checkpoint (small files first), a
  sweep of each checkpoint every ``reverify_seconds``. A checkpoint that fails this is *corrupt*,
  with the file and the reason. So is a save that began and never ended (its process died, or was
  followed by another) whose path is there: a framework resuming from "the newest directory" would
  pick it.

**With the run owner's rights, inside the run directory.** The agent runs as root and the ledger and
manifests are written by users, so each run directory is checked by a worker process
(:mod:`.workers`) holding the rights of the one user who controls the directory (:mod:`.owner`;
``nobody`` when several users do), never root's for someone else's directory: what the sentinel reads,
stats or lists is what that user could, and every verdict, detail, log line and metric carries no
more than they could learn themselves. Checkpoint paths are taken relative to the run directory; an
absolute path counts only where it lies inside it (old ledgers wrote absolute paths), and symbolic
links are followed only while they stay inside (:mod:`.runcheck`). The agent must see the run
directory where the trainer wrote it (same mount point, or absolute paths are refused).

**Retention.** ``keep_last`` must not exceed how many checkpoints the training job keeps (Lightning's
``save_top_k``, HF's ``save_total_limit``): a checkpoint the job rotated away on purpose looks exactly
like one the provider deleted.

Exports ``checkpoint_missing{run}`` (how many of the checked ones are missing or too small),
``checkpoint_missing_newest_step{run}`` (the newest of those, while there is one),
``checkpoint_corrupt{run}`` and ``checkpoint_corrupt_newest_step{run,file,reason}`` (the same for
checkpoints that fail verification), ``checkpoint_newest_verified_age_seconds{run}``,
``checkpoint_ledger_up{run}``, ``checkpoint_unchecked{run}``, ``checkpoint_check_failing{run,reason}``
while a run's checks cannot finish (below), and the digest I/O it spends:
``checkpoint_verify_read_bytes_total`` against its stated ``checkpoint_verify_budget_bytes`` per pass.
``run`` is the name in the ledger's first start record, or the directory's name when there is none.
Each change of a verdict is also appended, by the worker as the run's user, to the run directory's
``babysitter-verdicts.jsonl`` (:mod:`babysitter.checkpoints.verdicts`) for ``babysitter report`` and
requeues.

**One run's files cost that run.** Each pass asks every run's worker at once and waits for each at
most ``run_timeout`` seconds (the worker stops its digest reads and directory walks at half of that,
to answer in time); a worker that does not answer is killed, one that runs out of its ``run_memory``
(``RLIMIT_AS``) or dies otherwise ends, and that run's checks are *failing*: its last complete check
keeps being served, ``checkpoint_check_failing{run,reason}`` appears, and its worker is started
again after one pass interval, then two, four... up to 15 minutes. Other runs are checked as if it
were not there. ``babysitter_collector_success`` stays what it was: whether the collector as a whole
works.

The passes run on a thread that ``collect()`` wakes when the last check is older than
``refresh_seconds``; ``collect()`` waits for it at most ``wait_seconds`` and otherwise serves the
previous result, so a hung mount never hangs the agent's scrape.

**Load on shared storage.** Each pass reads only the ledger bytes appended since the last one
(:class:`LedgerTail`), stats each checkpoint path, and walks a checkpoint directory again only when
its top-level entry changed or ``walk_seconds`` (300 s) passed: a deleted checkpoint (file or whole
directory) is flagged at the next pass, a shard lost inside a directory within ``walk_seconds``.
Digest reads stay within ``verify_bytes`` per pass (1 GiB by default: 34 MB/s at the default 30 s
pass; 0 turns them off), shared by the runs in their configured order (each run is granted what it
asked for after its last pass, the first pass everything left), or one 16 MiB chunk per few passes when
the budget is smaller than that; an idle pass saves nothing up. One sentinel per run is enough;
running it on every node of a job multiplies that load.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from prometheus_client.core import Metric

from babysitter.catalog import storage as S
from babysitter.checkpoints.digest import CHUNK
from babysitter.labels import sanitize_value
from babysitter.node.storage.owner import (
    Identity,
    Walk,
    agent_identity,
    decide,
    identity_for,
    nobody,
    private_groups,
)
from babysitter.node.storage.runcheck import (
    CheckpointCheck,
    LedgerTail,
    RunSettings,
    _Record,
    clean,
    directory_size,
    run_name,
    verify,
)
from babysitter.node.storage.workers import Worker, WorkerDied, WorkerSpec

__all__ = [
    "CheckpointCheck",
    "CheckpointSentinelCollector",
    "LedgerTail",
    "RunCheck",
    "directory_size",
    "run_name",
    "verify",
]

log = logging.getLogger(__name__)

_BACKOFF_MAX = 900.0  # seconds between a failing run's worker restarts, at most
_NOBODY_RETRY = 600.0  # seconds before a run found shared is tried as its owner again
_MIN_MEMORY = 32 << 20


@dataclass
class RunCheck:
    """The result of checking one run directory. ``failure``: why its checks cannot finish now (one of
    :data:`babysitter.catalog.storage.CHECK_FAILURE_REASONS`; then ``checks`` are the last complete
    ones, ``failing_seconds`` since)."""

    run_dir: Path
    run: str
    ledger_ok: bool
    detail: str = ""
    checks: list[CheckpointCheck] = field(default_factory=list)
    failure: str = ""
    failure_detail: str = ""
    failing_seconds: float = 0.0
    complete: bool = True  # False: never checked completely yet (only the failure is known)

    def newest_verified(self) -> CheckpointCheck | None:
        verified = [c for c in self.checks if c.verified]
        return max(verified, key=lambda c: c.time) if verified else None


@dataclass(frozen=True)
class _Gone:
    """No run directory there (or not one to check): ``why``."""

    why: str


_Outcome: TypeAlias = "dict[str, object] | WorkerDied | _Gone"


@dataclass
class _Run:
    """The agent's side of one run directory."""

    path: Path
    fallback: str
    worker: Worker | None = None
    name: str | None = None
    last: RunCheck | None = None
    failures: int = 0
    retry_at: float = 0.0
    failure: str = ""
    failure_detail: str = ""
    checked_at: float = field(default_factory=time.monotonic)
    demand: int | None = None
    walks: int = 0
    said: tuple[str, str] = ("", "")  # the identity last logged
    respawn_at: float = 0.0  # a worker running as nobody is replaced then (its owner may be alone now)
    nobody_why: str = ""  # a worker found someone besides the owner in control: nobody until...
    nobody_until: float = 0.0
    stuck: list[Worker] = field(default_factory=list)
    notes: set[str] = field(default_factory=set)


class _Workers:
    """Every worker process of one sentinel not reaped yet, so that they all end with it (``close()`` or
    garbage)."""

    def __init__(self) -> None:
        self.live: set[Worker] = set()

    def shutdown(self, grace: float = 0.5) -> None:
        workers, self.live = list(self.live), set()
        for worker in workers:
            worker.close()  # an idle worker exits on the end of its stream
        deadline = time.monotonic() + grace
        for worker in workers:
            if worker.reap(wait=max(0.0, deadline - time.monotonic())) is None:
                worker.kill()
        for worker in workers:
            worker.reap(wait=0.5)


class _Budget:
    """The digest bytes a pass may read, shared by the runs."""

    def __init__(self, per_pass: int) -> None:
        self.budget = per_pass
        self.read_bytes = 0
        self._credit = 0

    def begin_pass(self) -> int:
        # Budget a pass could not spend (a run's next chunk did not fit) carries over up to one chunk, so
        # a chunk larger than the budget still gets read, and no pass reads more than max(budget, chunk).
        self._credit = min(self._credit + self.budget, max(self.budget, CHUNK)) if self.budget > 0 else 0
        return self._credit

    def end_pass(self, used: int, starved: bool) -> None:
        self._credit = max(0, self._credit - used)
        self.read_bytes += used
        if not starved:
            self._credit = 0  # nothing was left to read: idle passes save up nothing


class CheckpointSentinelCollector:
    """The ``sentinel`` collector: verifies the last ``keep_last`` checkpoints of each run directory.

    ``read_ledger`` replaces the ledger's saves (for tests and other manifest formats; it runs in the
    run's worker); ``clock`` is wall time (ledger times are Unix seconds). ``verify_bytes``: digest bytes
    read per pass (0: sizes and structure only); ``reverify_seconds``: how often a verified
    checkpoint's digests are swept again; ``manifest_grace``: how long a promised manifest may take;
    ``abort_after``: how long a save may stay under way before it counts as aborted; ``verdicts``:
    append changed verdicts to the run directory's ``babysitter-verdicts.jsonl``; ``run_timeout``: how
    long a pass waits for one run's worker; ``run_memory``: bytes a worker may allocate beyond its size
    at start.
    """

    name = "sentinel"

    def __init__(
        self,
        run_dirs: Sequence[Path],
        *,
        keep_last: int = 3,
        refresh_seconds: float = 30.0,
        wait_seconds: float = 2.0,
        walk_seconds: float = 300.0,
        verify_bytes: int = 1 << 30,
        reverify_seconds: float = 6 * 3600.0,
        manifest_grace: float = 1800.0,
        abort_after: float = 3600.0,
        verdicts: bool = True,
        drop_cache: bool = True,
        run_timeout: float = 60.0,
        run_memory: int = 512 << 20,
        read_ledger: Callable[[Path], Sequence[_Record]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        if not refresh_seconds >= 0 or not wait_seconds >= 0 or not walk_seconds >= 0:
            raise ValueError("refresh_seconds, wait_seconds and walk_seconds must be >= 0")
        if isinstance(verify_bytes, bool) or not isinstance(verify_bytes, int) or verify_bytes < 0:
            raise ValueError(f"verify_bytes must be an int >= 0, got {verify_bytes!r}")
        if not reverify_seconds >= 0 or not manifest_grace >= 0 or not abort_after > 0:
            raise ValueError("reverify_seconds and manifest_grace must be >= 0, abort_after > 0")
        if not (math.isfinite(run_timeout) and run_timeout > 0):
            raise ValueError(f"run_timeout must be a positive number of seconds, got {run_timeout!r}")
        if isinstance(run_memory, bool) or not isinstance(run_memory, int) or run_memory < _MIN_MEMORY:
            raise ValueError(f"run_memory must be an int of at least {_MIN_MEMORY} bytes, got {run_memory!r}")
        paths = list(dict.fromkeys(Path(os.path.abspath(p)) for p in run_dirs))
        if not paths:
            raise ValueError("the checkpoint sentinel needs at least one run directory")
        self.run_dirs = paths
        self.keep_last = keep_last
        self._refresh = float(refresh_seconds)
        self._wait = float(wait_seconds)
        self.run_timeout = float(run_timeout)
        self.run_memory = run_memory
        self._read = read_ledger
        self.settings = RunSettings(
            keep_last=keep_last,
            walk_seconds=float(walk_seconds),
            reverify_seconds=float(reverify_seconds),
            manifest_grace=float(manifest_grace),
            abort_after=float(abort_after),
            refresh_seconds=float(refresh_seconds),
            verdicts=verdicts,
            drop_cache=drop_cache,
        )
        self.budget = _Budget(verify_bytes)
        self._runs = [_Run(p, sanitize_value(p.name) or "run") for p in paths]
        self._workers = _Workers()
        self._finalizer = weakref.finalize(self, self._workers.shutdown)
        self._clock = clock
        self._lock = threading.Lock()
        self._pass_lock = threading.Lock()
        self._results: list[RunCheck] = []
        self._checked_at: float | None = None
        self._busy = False
        self._kick = threading.Event()
        self._done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported: dict[tuple[Path, str], str] = {}  # what was last logged per (run dir, subject)
        if verify_bytes:
            per_second = verify_bytes / max(self._refresh, 1.0)
            log.info(
                "babysitter: checkpoint sentinel: verifying digests within %.0f MiB per pass (at most "
                "%.1f MB/s of reads at one pass every %.0f s), a sweep of each checkpoint every %.1f h",
                verify_bytes / (1 << 20),
                per_second / 1e6,
                self._refresh,
                reverify_seconds / 3600,
            )

    @property
    def walks(self) -> int:
        """Directory walks the current workers made (their size caches at work)."""
        return sum(run.walks for run in self._runs)

    def worker_pids(self) -> list[int]:
        """The pids of the live workers, in run order (for tests and benchmarks)."""
        return [run.worker.pid for run in self._runs if run.worker is not None]

    def start(self) -> None:
        """Start the pass thread (idempotent; ``collect()`` calls it)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._loop, name="babysitter-checkpoint-sentinel", daemon=True
            )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._finalizer()  # ends every worker, once

    def collect(self) -> Iterable[Metric]:
        self.start()
        now = time.monotonic()
        with self._lock:
            due = not self._busy and (self._checked_at is None or now - self._checked_at >= self._refresh)
            if due:
                self._busy = True
                self._done.clear()
                self._kick.set()
        if due:
            self._done.wait(self._wait)
        with self._lock:
            results = list(self._results)
        missing = S.CHECKPOINT_MISSING.family()
        missing_step = S.CHECKPOINT_MISSING_STEP.family()
        corrupt = S.CHECKPOINT_CORRUPT.family()
        corrupt_step = S.CHECKPOINT_CORRUPT_STEP.family()
        age = S.CHECKPOINT_NEWEST_VERIFIED_AGE.family()
        ledger_up = S.CHECKPOINT_LEDGER_UP.family()
        unchecked = S.CHECKPOINT_UNCHECKED.family()
        failing = S.CHECKPOINT_CHECK_FAILING.family()
        read = S.CHECKPOINT_VERIFY_READ.family()
        budget = S.CHECKPOINT_VERIFY_BUDGET.family()
        wall = self._clock()
        for result in results:
            if result.failure:
                failing.add_metric([result.run, result.failure], result.failing_seconds)  # type: ignore[attr-defined]
            if not result.complete:
                continue
            ledger_up.add_metric([result.run], 1.0 if result.ledger_ok else 0.0)  # type: ignore[attr-defined]
            checked = [c for c in result.checks if c.missing is not None]
            gone = [c.step for c in checked if c.missing]
            blind = [c for c in result.checks if c.missing is None]
            if checked:
                missing.add_metric([result.run], float(len(gone)))  # type: ignore[attr-defined]
            if gone:
                missing_step.add_metric([result.run], float(max(gone)))  # type: ignore[attr-defined]
            if blind:
                unchecked.add_metric([result.run], float(len(blind)))  # type: ignore[attr-defined]
            bad = [c for c in result.checks if c.corrupt]
            if checked:
                corrupt.add_metric([result.run], float(len(bad)))  # type: ignore[attr-defined]
            if bad:
                worst = max(bad, key=lambda c: c.step)
                labels = [result.run, sanitize_value(worst.file) or "-", worst.reason or "incomplete"]
                corrupt_step.add_metric(labels, float(worst.step))  # type: ignore[attr-defined]
            newest = result.newest_verified()
            if newest is not None:
                age.add_metric([result.run], max(0.0, wall - newest.time))  # type: ignore[attr-defined]
        read.add_metric([], float(self.budget.read_bytes))  # type: ignore[attr-defined]
        budget.add_metric([], float(self.budget.budget))  # type: ignore[attr-defined]
        return [
            missing,
            missing_step,
            corrupt,
            corrupt_step,
            age,
            ledger_up,
            unchecked,
            failing,
            read,
            budget,
        ]

    # --- passes -------------------------------------------------------------------------------------

    def check_now(self) -> list[RunCheck]:
        """One pass over every run directory, on the calling thread (what the pass thread does)."""
        with self._pass_lock:
            return self._pass()

    def _loop(self) -> None:
        while True:
            self._kick.wait()
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                results = self.check_now()
            except Exception:  # a bug: keep the previous results, try again next time
                log.exception("babysitter: checkpoint sentinel check failed")
                results = None
            with self._lock:
                if results is not None:
                    self._results = results
                self._checked_at = time.monotonic()
                self._busy = False
            self._done.set()

    def _pass(self) -> list[RunCheck]:
        wall = self._clock()
        credit = self.budget.begin_pass()
        asked: list[_Run] = []
        for run in self._runs:
            self._reap(run)
            if self._prepare(run):
                asked.append(run)
        grants: dict[int, int] = {}
        left = credit
        for run in asked:  # in configured order: each gets what it asked for, while there is some
            grant = left if run.demand is None else min(run.demand, left)
            grants[id(run)] = grant
            left -= grant
        replies = self._exchange(asked, grants, wall)
        used, starved = 0, False
        for run in asked:
            reply = replies.get(id(run))
            grant = grants[id(run)]
            if isinstance(reply, _Gone):  # no directory there: nothing to check, nothing read
                run.last = RunCheck(run.path, run.name or run.fallback, False, reply.why)
                self._succeeded(run)
                continue
            if isinstance(reply, WorkerDied) or reply is None:
                died = reply if isinstance(reply, WorkerDied) else WorkerDied("timeout")
                self._failed(run, died.reason, died.detail)
                used += grant  # it may have read all of it before it died
                continue
            try:
                result, spent, hungry = self._accept(run, reply, grant)
            except _Failed as failed:  # it says why it could not finish
                self._failed(run, failed.reason, failed.detail)
                used += grant
                continue
            except ValueError as exc:  # an answer that is not one: the worker is not trusted again
                self._failed(run, "crashed", f"a malformed answer ({exc})")
                used += grant
                continue
            used += spent
            starved = starved or hungry
            run.last = result
        self.budget.end_pass(used, starved)
        results: list[RunCheck] = []
        labels: set[str] = set()
        for run in self._runs:
            result = self._result(run)
            if result.run in labels:  # two directories with one run name: keep series apart
                result.run = sanitize_value(str(run.path)) or result.run
            labels.add(result.run)
            results.append(result)
            if result.complete and not result.failure:
                self._log_changes(result)
        return results

    def _prepare(self, run: _Run) -> bool:
        """Start ``run``'s worker when it needs one; whether to ask it this pass."""
        now = time.monotonic()
        if run.worker is not None and run.respawn_at and now >= run.respawn_at:
            # Checked as nobody for a while: is its owner alone in control now?
            self._stop_worker(run)
        if run.worker is None and now < run.retry_at:
            return False  # failing, and not yet tried again
        if run.worker is None:
            return self._spawn(run)
        return True

    def _spawn(self, run: _Run) -> bool:
        if run.stuck:  # a killed worker has not exited (blocked in the kernel): no second one
            self._failed(run, "timeout", "the previous worker has not exited yet")
            return False
        identity = None if os.geteuid() == 0 else agent_identity()
        spec = WorkerSpec(run.path, identity, self.settings, self.run_memory, self._read)
        try:
            run.worker = Worker.start(spec)
        except OSError as exc:
            self._failed(run, "crashed", f"cannot start a worker: {exc.strerror or exc}")
            return False
        self._workers.live.add(run.worker)
        run.demand = None
        run.walks = 0
        run.respawn_at = 0.0
        return True

    def _identity(self, run: _Run, found: Walk) -> Identity:
        """The credentials for ``run`` whose worker, still root, walked its path and found ``found``."""
        identity = identity_for(decide(found, private_groups()))
        now = time.monotonic()
        if run.nobody_why and now < run.nobody_until and identity.uid is not None:
            identity = nobody(run.nobody_why)
        if identity.owner is None and identity.uid is not None:  # nobody: try its owner again later
            run.respawn_at = now + _NOBODY_RETRY
        if (identity.label, identity.why) != run.said:
            run.said = (identity.label, identity.why)
            if identity.why:
                log.warning(
                    "babysitter: checkpoint sentinel: checking %s as nobody: %s", run.path, identity.why
                )
            else:
                log.info("babysitter: checkpoint sentinel: checking %s as %s", run.path, identity.label)
        return identity

    def _exchange(self, asked: list[_Run], grants: dict[int, int], wall: float) -> dict[int, _Outcome]:
        """Ask every worker at once; their answers, or why none came, within ``run_timeout``.

        A worker started for this pass first says what its walk as root found; it is then told whose
        credentials to take, and asked. A worker that finds its run directory replaced, or someone
        besides its owner in control, is replaced once within the pass (then as ``nobody``)."""
        deadline = time.monotonic() + self.run_timeout
        limit = (64 << 10) + self.keep_last * 2 * 8192
        out: dict[int, _Outcome] = {}
        pending: dict[int, _Run] = {}
        restarted: set[int] = set()
        with selectors.DefaultSelector() as selector:

            def send(run: _Run, message: dict[str, object]) -> bool:
                assert run.worker is not None
                try:
                    run.worker.send(message)
                except WorkerDied as died:
                    out[id(run)] = died
                    selector.unregister(run.worker.sock)
                    del pending[id(run)]
                    return False
                return True

            def ask(run: _Run) -> None:
                assert run.worker is not None
                request: dict[str, object] = {
                    "wall": float(wall),
                    "credit": grants[id(run)],
                    "seconds": max(0.0, deadline - time.monotonic()),
                }
                if send(run, request):
                    run.worker.state = "asked"

            def watch(run: _Run) -> None:
                assert run.worker is not None
                selector.register(run.worker.sock, selectors.EVENT_READ, run)
                pending[id(run)] = run
                if run.worker.state == "ready":
                    ask(run)

            def handle(run: _Run, message: dict[str, object]) -> None:
                worker = run.worker
                assert worker is not None
                if worker.state == "hello":
                    try:
                        found = Walk.from_json(message.get("walk"))
                    except ValueError as exc:
                        out[id(run)] = WorkerDied("crashed", f"a malformed walk ({exc})")
                        return
                    if not found.exists:  # nothing to check: the worker ends, the run says why
                        out[id(run)] = _Gone(found.why)
                        self._stop_worker(run)
                        return
                    worker.identity = self._identity(run, found)
                    selector.register(worker.sock, selectors.EVENT_READ, run)
                    pending[id(run)] = run
                    if send(run, {"identity": worker.identity.to_json()}):
                        ask(run)
                    return
                worker.state = "ready"  # answered: it waits for the next pass's request
                reason = message.get("reason")
                if (
                    message.get("ok") is False
                    and reason in ("mismatch", "moved")
                    and id(run) not in restarted
                ):
                    restarted.add(id(run))
                    self._stop_worker(run)
                    if reason == "mismatch":
                        run.nobody_why = (
                            clean(str(message.get("detail", "")), 300) or "someone else controls it"
                        )
                        run.nobody_until = time.monotonic() + _NOBODY_RETRY
                    if self._spawn(run):
                        watch(run)
                    else:
                        out[id(run)] = WorkerDied(run.failure or "crashed", run.failure_detail)
                    return
                out[id(run)] = message

            for run in asked:
                watch(run)
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in selector.select(min(left, 1.0)):
                    run = key.data
                    worker = run.worker
                    if worker is None or id(run) not in pending or key.fileobj is not worker.sock:
                        continue
                    try:
                        message = worker.receive(limit)
                    except WorkerDied as died:
                        out[id(run)] = died
                        selector.unregister(worker.sock)
                        del pending[id(run)]
                        continue
                    if message is None:
                        continue
                    selector.unregister(worker.sock)
                    del pending[id(run)]
                    handle(run, message)
        for run in pending.values():
            out[id(run)] = WorkerDied("timeout", f"no answer within {self.run_timeout:g} s")
        return out

    def _accept(self, run: _Run, reply: dict[str, object], grant: int) -> tuple[RunCheck, int, bool]:
        """A worker's answer as a result: (the run's check, digest bytes read, whether it wanted more);
        ValueError for anything but an answer."""
        if reply.get("ok") is not True:
            reason = reply.get("reason")
            if reason in ("memory", "error", "privileges"):
                raise _Failed(str(reason), clean(str(reply.get("detail", "")), 300))
            raise ValueError(f"reason {str(reason)[:40]!r}")
        ledger_ok, detail, checks = reply.get("ledger_ok"), reply.get("detail", ""), reply.get("checks")
        if type(ledger_ok) is not bool or type(detail) is not str or type(checks) is not list:
            raise ValueError("bad fields")
        if len(checks) > 2 * self.keep_last:
            raise ValueError("too many checks")
        parsed = [CheckpointCheck.from_json(c) for c in checks]
        name = reply.get("run")
        if name is not None and type(name) is not str:
            raise ValueError("bad run name")
        numbers = [reply.get(k, 0) for k in ("used", "demand", "walks")]
        if not all(type(n) is int and n >= 0 for n in numbers):
            raise ValueError("bad counts")
        spent, demand, walks = (int(n) for n in numbers)  # type: ignore[call-overload]
        notes = reply.get("notes", [])
        if type(notes) is not list or not all(type(n) is str for n in notes):
            raise ValueError("bad notes")
        for note in notes[:8]:
            text = clean(note, 300)
            if text not in run.notes and len(run.notes) < 64:
                run.notes.add(text)
                log.warning("babysitter: checkpoint sentinel: %s: %s", run.path, text)
        if name:
            run.name = sanitize_value(name[:256]) or run.fallback
        run.demand = demand
        run.walks = walks
        self._succeeded(run)
        result = RunCheck(run.path, run.name or run.fallback, ledger_ok, clean(detail, 512), parsed)
        return result, min(spent, grant), bool(reply.get("starved", False))

    def _succeeded(self, run: _Run) -> None:
        if run.failure:
            log.info("babysitter: checkpoint sentinel: %s is checked again", run.path)
        run.failures, run.failure, run.failure_detail = 0, "", ""
        run.checked_at = time.monotonic()

    def _failed(self, run: _Run, reason: str, detail: str = "") -> None:
        """The run's checks could not finish: end its worker, try again after a backoff."""
        self._stop_worker(run, kill=True)
        run.failures += 1
        backoff = min(max(self._refresh, 1.0) * 2 ** (run.failures - 1), _BACKOFF_MAX)
        run.retry_at = time.monotonic() + backoff
        run.failure, run.failure_detail = reason, detail
        log.warning(
            "babysitter: checkpoint sentinel: the checks of %s failed (%s%s); its last complete check is "
            "served, its worker starts again in %.0f s",
            run.path,
            reason,
            f": {detail}" if detail else "",
            backoff,
        )

    def _stop_worker(self, run: _Run, *, kill: bool = False) -> None:
        worker, run.worker = run.worker, None
        if worker is None:
            return
        worker.close()
        if kill:
            worker.kill()
        if worker.reap(wait=0.2) is None:
            worker.kill()
            if worker.reap(wait=0.1) is None:
                run.stuck.append(worker)  # blocked in the kernel: reaped at a later pass, or at close
                return
        self._workers.live.discard(worker)

    def _reap(self, run: _Run) -> None:
        for worker in [w for w in run.stuck if w.reap() is not None]:
            run.stuck.remove(worker)
            self._workers.live.discard(worker)

    def _result(self, run: _Run) -> RunCheck:
        name = run.name or run.fallback
        last = run.last
        if last is None:
            result = RunCheck(run.path, name, False, "not checked yet", complete=False)
        else:
            result = RunCheck(last.run_dir, name, last.ledger_ok, last.detail, list(last.checks))
        if run.failure:
            result.failure = run.failure
            result.failure_detail = run.failure_detail
            result.failing_seconds = max(0.0, time.monotonic() - run.checked_at)
        return result

    # --- logs ---------------------------------------------------------------------------------------

    def _log_changes(self, result: RunCheck) -> None:
        self._report(result.run_dir, "ledger", "" if result.ledger_ok else result.detail, result.run)
        current = {"ledger"}
        for check in result.checks:
            problem = "" if check.missing is False and not check.corrupt else check.detail
            subject = f"step {check.step}"
            current.add(subject)
            self._report(result.run_dir, subject, problem, result.run, check.path)
        for key in [k for k in self._reported if k[0] == result.run_dir and k[1] not in current]:
            del self._reported[key]  # steps that left the last K: forget them (bounded memory)

    def _report(self, run_dir: Path, subject: str, problem: str, run: str, path: str = "") -> None:
        key = (run_dir, subject)
        previous = self._reported.get(key)
        if previous == problem or (previous is None and not problem):
            return
        self._reported[key] = problem
        where = f"run {run!r} ({run_dir}) {subject}" + (f" at {path!r}" if path else "")
        if problem:
            log.warning("babysitter: checkpoint sentinel: %s: %s", where, problem)
        else:
            log.info("babysitter: checkpoint sentinel: %s is fine again", where)


class _Failed(ValueError):
    """A worker that says it failed (memory, error, privileges): not a malformed answer."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
