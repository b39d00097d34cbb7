"""What the tracker tells a run's event sink (the goodput ledger), and what it reads back.

The tracker never calls a sink on the per-step hot path: step boundaries are buffered in memory and
handed over in batches by the tracker's housekeeping thread; checkpoint and phase events are called from
their context managers. A sink must not raise (the tracker guards it anyway) and must not block for long.
Times are Unix seconds (``time.time()`` scale), step numbers are global steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from prometheus_client.core import Metric

from babysitter.ledger.records import Op

__all__ = ["CheckpointKind", "NullEvents", "RunEvents"]

#: A checkpoint save or load: the ledger's vocabulary, which the sink records as it is.
CheckpointKind = Op


class RunEvents(Protocol):
    """A sink for run events; the ledger implements it, :class:`NullEvents` ignores everything."""

    def incarnation_start(self, *, time: float, info: Mapping[str, object]) -> None:
        """This process started tracking the run (``info``: host, pid, world_size, version, ...)."""

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
        """Steps finished since the last call: ``(global_step, unix_time_of_step_end)`` in order;
        the time spent blocked on the input pipeline, and the model FLOPs this rank did, over the same
        stretch; this rank's dense peak FLOP/s (None when unknown) so MFU can be plotted later.

        ``data_waits``: the same wait split by boundary (the wait inside each step, the wait before the
        first step in the first boundary), so that a stall is booked on the step it happened in.
        ``dropped``: boundaries before the first one that the tracker could not keep one by one; their
        time is in the first boundary's step. ``tokens``: the tokens of each boundary's step (0 where
        unknown), so the slowdown baseline follows a change of the step's work."""

    def checkpoint_begin(self, *, kind: CheckpointKind, step: int, time: float, path: str | None) -> None:
        """A checkpoint save or load of ``step`` started (blocking part)."""

    def checkpoint_end(
        self,
        *,
        kind: CheckpointKind,
        step: int,
        time: float,
        ok: bool,
        nbytes: int | None,
        path: str | None,
        manifest: bool = False,
    ) -> None:
        """The checkpoint save or load of ``step`` ended, successfully or not; ``manifest``: the
        tracker will write the save's manifest (a save without one did not complete)."""

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
        """The manifest of the save of ``step`` at ``path`` was committed (``ok``) or not (``why``);
        called from the tracker's manifest thread."""

    def phase_begin(self, *, name: str, time: float) -> None:
        """A user-marked phase (``eval``, ...) started."""

    def phase_end(self, *, name: str, time: float) -> None:
        """The phase ended."""

    def hang(self, *, time: float, step: int, seconds_since_step: float) -> None:
        """The watchdog found no step finished for far longer than usual."""

    def renumber(self, *, time: float, by: int) -> None:
        """The training loop numbers steps ``by`` higher than every step handed over so far said
        (the tracker adopted the loop's numbers after a restart without ``checkpoint_load``)."""

    def straggler(
        self, *, time: float, rank: int | None, score: float, host: str | None, gpu: str | None
    ) -> None:
        """The straggler exchange's slowest rank (``rank`` None: no rank is slow any more), with its
        host and GPU when known: the evidence that names the cause of slow steps."""

    def flush(self, *, durable: bool = False) -> None:
        """Write buffered events; ``durable`` also fsyncs (checkpoint completion, shutdown)."""

    def close(self, *, time: float, clean: bool) -> None:
        """The tracker is closing; ``clean`` when training ended normally."""

    def metrics(
        self, label_names: Sequence[str], label_values: Sequence[str], now: float
    ) -> Iterable[Metric]:
        """Metric families to add to the tracker's scrape (goodput, restarts, ledger errors)."""
        ...


class NullEvents:
    """The sink used when no ledger is configured (and on ranks other than 0)."""

    def incarnation_start(self, *, time: float, info: Mapping[str, object]) -> None:
        """Ignored."""

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
        """Ignored."""

    def checkpoint_begin(self, *, kind: CheckpointKind, step: int, time: float, path: str | None) -> None:
        """Ignored."""

    def checkpoint_end(
        self,
        *,
        kind: CheckpointKind,
        step: int,
        time: float,
        ok: bool,
        nbytes: int | None,
        path: str | None,
        manifest: bool = False,
    ) -> None:
        """Ignored."""

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
        """Ignored."""

    def phase_begin(self, *, name: str, time: float) -> None:
        """Ignored."""

    def phase_end(self, *, name: str, time: float) -> None:
        """Ignored."""

    def hang(self, *, time: float, step: int, seconds_since_step: float) -> None:
        """Ignored."""

    def renumber(self, *, time: float, by: int) -> None:
        """Ignored."""

    def straggler(
        self, *, time: float, rank: int | None, score: float, host: str | None, gpu: str | None
    ) -> None:
        """Ignored."""

    def flush(self, *, durable: bool = False) -> None:
        """Ignored."""

    def close(self, *, time: float, clean: bool) -> None:
        """Ignored."""

    def metrics(
        self, label_names: Sequence[str], label_values: Sequence[str], now: float
    ) -> Iterable[Metric]:
        """No metrics."""
        return ()
