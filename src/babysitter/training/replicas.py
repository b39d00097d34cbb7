"""Replicas that agree: every N steps, a fingerprint of this rank's parameters against its replicas'.

Data-parallel replicas hold bit-identical parameters after every optimizer step (the all-reduced
gradients are the same bits on every rank, and so is the update). A rank whose parameters differ has
had a bit flipped in its memory or computed a wrong update: silent data corruption, which no loss
curve shows until much later. Megatron-LM checks this (``--check-weight-hash-across-dp-replicas-
interval``); this is the same check for any PyTorch loop, off the hot path.

How, step by step (``watch(replica_check_every=N)``):

1. At every N-th step, on the training thread, right after ``tracker.step()``: one integer sum per
   parameter of its raw bits (its bytes viewed as the widest integer words they divide into, summed
   with wrap-around on its device; any single flipped bit changes its parameter's sum), stacked into
   one device tensor and copied to pinned host memory without blocking (CUDA), with an event recorded
   after it. No host sync, no ``.item()``: the GPU does the sums when it gets to them. On CPU the
   sums are computed there and then (the cost per check is in ``benchmarks/results/checkpoints.md``).
2. One step later, every rank issues an asynchronous ``all_gather`` on a gloo group of
   ``[step, digest of the sums]`` (four int64): the fingerprint of step 1 if its event has
   completed, else "not ready". Every rank issues at the same step counts, so rounds pair up.
3. When a round completes (read on the next round or by the housekeeping thread, ~1 s), each rank
   compares the fingerprints of *its replicas* (:func:`default_replicas`; only ranks holding the same
   shard compare) for the same step. A rank whose fingerprint differs from the majority's (with two
   replicas: from the other's; both are named, nobody can tell which is wrong) exports
   ``train_replica_mismatch_step`` and logs it with its host and GPU; ``TrainingReplicaDiverged``
   pages with the rank, host and GPU.

Who compares with whom: ranks with the same tensor, context and pipeline coordinates, in the rank
order Megatron-LM (tp-cp-dp-pp) and torchtitan (pp, dp, cp, tp mesh) both use: ``tp`` fastest, then
``cp``, then ``dp``, then ``pp``. For DTensor parameters (FSDP2, tensor parallel) the mesh and the
placements say it: ranks that differ only along the mesh dimensions every parameter is replicated on.
Fully sharded data parallelism (FSDP, ZeRO-3) has no replicas (each rank holds its own shard): the
check has nothing to compare there, and says so. ``replica_ranks=`` overrides all of this.

Failures never reach training: a round that errors or stays pending past ``timeout`` turns the check
off on that rank with one log line (the others time out and follow), like the straggler exchange.
"""

from __future__ import annotations

import collections
import datetime
import hashlib
import logging
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from babysitter.catalog import integrity as I
from babysitter.flops.parallel import ParallelLayout
from babysitter.training.tracker import Tracker

__all__ = [
    "ReplicaChecker",
    "default_replicas",
    "dtensor_replicas",
    "odd_ones",
    "validate",
    "validate_every",
]

log = logging.getLogger("babysitter")

#: Integer words a tensor's bytes are summed as, widest first (the one its byte count divides).
_WORDS = ((8, "int64"), (4, "int32"), (2, "int16"), (1, "uint8"))


def _word_sum(torch: Any, tensor: Any) -> Any:
    """The wrapping sum of a tensor's raw bytes read as the widest integer words they divide into, as
    an int64 scalar on the tensor's device. Any single flipped bit changes it (by 2^k, never 0 modulo
    the word); the order of the additions does not (integer addition wraps, exactly). int64 and int32
    words are summed in their own width: widening int32 to int64 first is ten times slower on CPU."""
    flat = tensor.detach().reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    for width, name in _WORDS:
        if nbytes % width:
            continue
        word = getattr(torch, name)
        try:
            words = flat.view(word) if flat.element_size() == width else flat.view(torch.uint8).view(word)
        except RuntimeError:  # an offset into its storage that the wider word does not align with
            continue
        total = words.sum(dtype=word) if width >= 4 else words.sum(dtype=torch.int64)
        return total.to(torch.int64)
    return flat.view(torch.uint8).sum(dtype=torch.int64)


def validate_every(every: object) -> int:
    """``replica_check_every`` checked at setup: an int >= 1."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"replica_check_every must be an int >= 1 or None, got {every!r}")
    return every


def validate(model: object, every: object, ranks: object, rank: int) -> None:
    """Everything about ``watch(replica_check_every=..., replica_ranks=...)`` that can be wrong before
    the tracker starts: the interval, a model with parameters, ``replica_ranks`` holding this rank."""
    validate_every(every)
    if not callable(getattr(model, "parameters", None)):
        raise TypeError("replica_check_every needs the model: watch(model, replica_check_every=N)")
    if ranks is not None:
        _explicit(ranks, rank)


def default_replicas(rank: int, layout: ParallelLayout) -> list[int]:
    """The ranks holding the same parameters as ``rank``: same tp, cp and pp coordinates, every dp one
    (tp fastest, then cp, dp, pp: Megatron-LM's and torchtitan's order)."""
    inner = layout.tp * layout.cp
    stage_size = inner * layout.dp
    stage, within = divmod(rank, stage_size)
    offset = within % inner
    return [stage * stage_size + d * inner + offset for d in range(layout.dp)]


def dtensor_replicas(model: object, rank: int) -> list[int] | None:
    """The replicas of ``rank`` that the model's DTensor parameters' placements imply (ranks differing
    only along dimensions every parameter is replicated on); None when the model has no DTensors, or
    they live on different meshes."""
    dtensor_mod = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(dtensor_mod, "DTensor", None)
    parameters = getattr(model, "parameters", None)
    if dtensor is None or not callable(parameters):
        return None
    mesh: Any = None
    replicated: set[int] | None = None
    for param in parameters():
        if not isinstance(param, dtensor):
            continue
        if mesh is None:
            mesh = param.device_mesh
        elif param.device_mesh is not mesh and param.device_mesh != mesh:
            return None
        dims = {i for i, p in enumerate(param.placements) if p.is_replicate()}
        replicated = dims if replicated is None else replicated & dims
    if mesh is None or replicated is None:
        return None
    grid = mesh.mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    out = []
    for index in _indices(tuple(grid.shape)):
        if all(index[d] == coordinate[d] for d in range(len(index)) if d not in replicated):
            out.append(int(grid[index].item()))
    return sorted(out) if rank in out else None


def _indices(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for size in shape:
        out = [(*prefix, i) for prefix in out for i in range(size)]
    return out


def _explicit(ranks: object, rank: int) -> list[int]:
    """``replica_ranks=``: a sequence of ranks or a 1-D DeviceMesh; ValueError when it leaves ``rank`` out."""
    if hasattr(ranks, "mesh") and hasattr(ranks, "ndim"):
        if int(ranks.ndim) != 1:
            raise ValueError("replica_ranks: pass a 1-D DeviceMesh (e.g. mesh['dp_replicate'])")
        found = [int(r) for r in ranks.mesh.flatten().tolist()]
    elif isinstance(ranks, Sequence) and not isinstance(ranks, (str, bytes)):
        found = []
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                raise ValueError(f"replica_ranks must hold ranks (ints >= 0), got {r!r}")
            found.append(r)
    else:
        raise TypeError(
            f"replica_ranks must be a sequence of ranks or a DeviceMesh, got {type(ranks).__name__}"
        )
    if rank not in found:
        raise ValueError(f"replica_ranks {sorted(found)} must include this rank ({rank})")
    return sorted(set(found))


def odd_ones(fingerprints: dict[int, tuple[int, int]]) -> list[int]:
    """The ranks whose fingerprint is not the majority's; with a tie for the most common fingerprint
    (two replicas that differ) every rank in the tie. Empty when all agree."""
    counts = collections.Counter(fingerprints.values())
    if len(counts) <= 1:
        return []
    top = max(counts.values())
    leaders = [fp for fp, n in counts.items() if n == top]
    if len(leaders) == 1:
        return sorted(r for r, fp in fingerprints.items() if fp != leaders[0])
    return sorted(fingerprints)


class ReplicaChecker:
    """The replica check of one tracker (see the module doc)."""

    def __init__(
        self,
        tracker: Tracker,
        model: object,
        *,
        every: int,
        ranks: object = None,
        timeout: float = 300.0,
        max_pending: int = 8,
    ) -> None:
        self.tracker = tracker
        self.model = model
        self.every = validate_every(every)
        self.timeout = float(timeout)
        self.max_pending = max_pending
        self._ranks_arg = ranks
        self.enabled = False
        self.replicas: list[int] = []
        self.rank = tracker.config.rank.rank
        self.world_size = tracker.config.rank.world_size
        self.checks = 0
        self.mismatch_step: int | None = None
        self.disagreeing: list[int] = []
        self._torch: Any = None
        self._dist: Any = None
        self._group: Any = None
        self._params: list[Any] = []
        self._count = 0
        self._exchange_due = False
        self._fp: tuple[int, Any, Any] | None = None  # (step, host tensor, CUDA event or None)
        self._pending: deque[tuple[float, Any, list[Any]]] = deque()
        self._lock = threading.Lock()
        self._host = socket.gethostname()

    # ------------------------------------------------------------------ setup

    def start(self) -> bool:
        """Create the gloo group (a collective: every rank, the same point). True if the check is on."""
        try:
            return self._start()
        except (ValueError, TypeError):
            raise
        except Exception as exc:
            self.tracker.errors.record("replica_setup", exc)
            log.warning("babysitter: replica check off: setup failed: %r", exc)
            return False

    def _start(self) -> bool:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            log.info("babysitter: replica check off: torch.distributed is not initialized")
            return False
        world = int(dist.get_world_size())
        if world < 2:
            log.info("babysitter: replica check off: world size is 1")
            return False
        import torch

        self.rank, self.world_size = int(dist.get_rank()), world
        if self._ranks_arg is not None:
            replicas = _explicit(self._ranks_arg, self.rank)
        else:
            replicas = dtensor_replicas(self.model, self.rank) or default_replicas(
                self.rank, self.tracker.config.parallel
            )
        parameters = getattr(self.model, "parameters", None)
        if not callable(parameters):
            raise TypeError("replica_check_every needs the model: watch(model, replica_check_every=N)")
        params = [p for p in parameters() if p is not None]
        # Every rank creates the group, whatever it decides next: new_group is a collective.
        self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout))
        if len(replicas) < 2 or not params:
            why = "no parameters" if not params else "this rank's parameters have no replica (fully sharded?)"
            log.info("babysitter: replica check off on rank %d: %s", self.rank, why)
            return False
        self._dist, self._torch = dist, torch
        self.replicas = replicas
        self._params = params
        self.enabled = True
        self.tracker.add_metrics_source(self.metrics)
        self.tracker.add_housekeeping_hook(lambda _tracker: self.harvest())
        self.tracker.add_close_hook(self.close)
        log.info(
            "babysitter: replica check on: every %d steps, rank %d against replicas %s",
            self.every,
            self.rank,
            _ranges(self.replicas),
        )
        return True

    def attach(self) -> ReplicaChecker:
        """Drive the check from ``tracker.step()``: one more Python call per step, the work only every
        ``every`` steps. Framework callbacks call :meth:`after_step` instead."""
        if not self.enabled:
            return self
        inner = self.tracker.step
        after = self.after_step

        def step(*args: Any, **kwargs: Any) -> None:
            inner(*args, **kwargs)
            after()

        self.tracker.step = step  # type: ignore[method-assign]
        return self

    # ------------------------------------------------------------------ training thread

    def after_step(self) -> None:
        """Call on the training thread after each step."""
        if not self.enabled:
            return
        self._count += 1
        try:
            if self._exchange_due:
                self._exchange_due = False
                self._issue()
            if self._count % self.every == 0:
                self._fingerprint()
                self._exchange_due = True
        except Exception as exc:
            self._disable("check failed", exc)

    def _fingerprint(self) -> None:
        """Enqueue the per-parameter bit sums on the parameters' device; copy them to the host
        without blocking. The training thread never waits for the device here."""
        torch = self._torch
        with torch.no_grad():
            sums = [_word_sum(torch, p.to_local() if hasattr(p, "to_local") else p) for p in self._params]
            stacked = torch.stack(sums)
        step = self.tracker.global_step
        if stacked.device.type == "cuda":
            host = torch.empty(stacked.shape, dtype=torch.int64, pin_memory=True)
            host.copy_(stacked, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._fp = (step, host, event)
        else:
            self._fp = (step, stacked.to("cpu"), None)

    def _ready(self) -> tuple[int, int, int] | None:
        """(step, digest hi, digest lo) of the fingerprint once the device is done with it."""
        if self._fp is None:
            return None
        step, host, event = self._fp
        if event is not None and not event.query():
            return None
        self._fp = None
        digest = hashlib.blake2b(host.numpy().tobytes(), digest_size=16).digest()
        hi = int.from_bytes(digest[:8], "little", signed=True)
        lo = int.from_bytes(digest[8:], "little", signed=True)
        return step, hi, lo

    def _issue(self) -> None:
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self._disable(f"{len(self._pending)} rounds still pending", None)
                return
        torch = self._torch
        ready = self._ready()
        payload = torch.tensor([1, *ready] if ready else [0, 0, 0, 0], dtype=torch.int64)
        out = [torch.empty(4, dtype=torch.int64) for _ in range(self.world_size)]
        work = self._dist.all_gather(out, payload, group=self._group, async_op=True)
        with self._lock:
            self._pending.append((time.monotonic(), work, out))

    # ------------------------------------------------------------------ any thread

    def harvest(self) -> None:
        """Read the rounds that completed (training thread or housekeeping); never raises."""
        try:
            with self._lock:
                while self._pending:
                    issued, work, out = self._pending[0]
                    if not work.is_completed():
                        if time.monotonic() - issued > self.timeout:
                            self._disable(f"a round pending for over {self.timeout:.0f} s", None)
                        return
                    self._pending.popleft()
                    work.wait()
                    self._compare([row.tolist() for row in out])
        except Exception as exc:
            self._disable("round failed", exc)

    def _compare(self, rows: list[list[int]]) -> None:
        mine = rows[self.rank]
        if not mine[0]:
            return
        step = mine[1]
        fingerprints = {
            r: (rows[r][2], rows[r][3])
            for r in self.replicas
            if r < len(rows) and rows[r][0] and rows[r][1] == step
        }
        if len(fingerprints) < 2:
            return
        self.checks += 1
        odd = odd_ones(fingerprints)
        if self.rank in odd:
            if self.mismatch_step is None:
                self.mismatch_step = step
                gpu = self.tracker.gpu.get("uuid") or "no GPU"
                log.error(
                    "babysitter: rank %d (host %s, %s) holds parameters that differ from its data-parallel "
                    "replicas' at step %d (disagreeing: rank %s of %s): likely silent data corruption on "
                    "this rank's GPU or host",
                    self.rank,
                    self._host,
                    gpu,
                    step,
                    ", ".join(map(str, odd)),
                    _ranges(sorted(fingerprints)),
                )
        elif odd and odd != self.disagreeing:
            log.warning(
                "babysitter: replica check at step %d: rank %s disagree(s) with the others of %s",
                step,
                ", ".join(map(str, odd)),
                _ranges(sorted(fingerprints)),
            )
        if self.rank not in odd:
            self.mismatch_step = None
        self.disagreeing = odd

    def _disable(self, why: str, exc: BaseException | None) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self._pending.clear()
        self.tracker.errors.record("replica_check", exc if exc is not None else why)
        log.warning("babysitter: replica check off on rank %d: %s", self.rank, why)

    # ------------------------------------------------------------------ end and export

    def close(self, wait: float = 2.0) -> None:
        """Collect rounds that finish within ``wait`` seconds (the tracker's close calls this)."""
        deadline = time.monotonic() + wait
        while self._pending and self.enabled and time.monotonic() < deadline:
            self.harvest()
            time.sleep(0.01)

    def metrics(self, label_names: list[str], label_values: list[str]) -> list[Any]:
        """``train_replica_checks_total``, and ``train_replica_mismatch_step`` while this rank disagrees."""
        checks = I.REPLICA_CHECKS.family(label_names)
        checks.add_metric(label_values, float(self.checks))  # type: ignore[attr-defined]
        out = [checks]
        if self.mismatch_step is not None:
            step = I.REPLICA_MISMATCH_STEP.family(label_names)
            step.add_metric(label_values, float(self.mismatch_step))  # type: ignore[attr-defined]
            out.append(step)
        return out


def _ranges(ranks: list[int]) -> str:
    """``[0, 2, 4, 6]`` as ``ranks 0, 2, 4, 6``, long lists cut."""
    shown = ", ".join(map(str, ranks[:8]))
    return f"ranks {shown}{f' (+{len(ranks) - 8})' if len(ranks) > 8 else ''}"
