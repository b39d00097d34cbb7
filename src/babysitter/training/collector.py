"""Rendering a tracker's state as Prometheus metric families, at scrape time.

Nothing here runs on the training thread: the collector asks the tracker for a snapshot (which folds
the step ring) and turns it into families named by the catalog.

Each rank exports what the catalog says it does (``MetricSpec.ranks``): the per-rank series every
rank, the run's view (global step, loss, MFU gauge, timestamps, step-time quantiles) rank 0 alone.
That keeps a rank within the series budget of :mod:`babysitter.catalog.budget`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from babysitter.catalog import selfmon as S
from babysitter.catalog import train as T
from babysitter.catalog._spec import MetricSpec
from babysitter.training.histogram import HistogramSnapshot
from babysitter.training.tracker import Tracker, TrackerSnapshot

__all__ = ["TrackerCollector"]


def _summary(
    spec: MetricSpec,
    names: list[str],
    values: list[str],
    snap: HistogramSnapshot,
    recent: Sequence[float] = (),
) -> Metric:
    """A summary: ``_sum`` and ``_count``, plus the spec's quantiles of ``recent`` when given."""
    family = spec.family()
    labels = dict(zip(names, values, strict=True))
    if recent:
        ordered = sorted(recent)
        for q in spec.quantiles:
            value = ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
            family.samples.append(Sample(spec.name, {**labels, "quantile": f"{q:g}"}, value))
    family.samples.append(Sample(f"{spec.name}_sum", labels, float(snap.sum)))
    family.samples.append(Sample(f"{spec.name}_count", labels, float(snap.count)))
    return family


class TrackerCollector:
    """A prometheus_client collector over one :class:`~babysitter.training.tracker.Tracker`."""

    def __init__(
        self, tracker: Tracker, *, port: int | None = None, requested_port: int | None = None
    ) -> None:
        self._tracker = tracker
        config = tracker.config
        self._names = ["run", "rank", *config.labels]
        self._values = [config.run, str(config.rank.rank), *config.labels.values()]
        self._rank0 = config.rank.rank == 0
        # Without declared recomputation hardware FLOPs are model FLOPs: HFU would repeat MFU.
        self._hfu = config.flops.hardware is not None and config.flops.hardware != config.flops.model
        self.port = port
        self.requested_port = requested_port

    def describe(self) -> list[Metric]:
        """Nothing to pre-register: names are checked unique in the catalog instead."""
        return []

    def collect(self) -> Iterator[Metric]:
        """All families; a failure is counted and the self-metrics are still served."""
        try:
            snap = self._tracker.snapshot()
            yield from self._families(snap)
            yield from self._tracker.event_metrics(self._names, self._values)
        except Exception as exc:
            self._tracker.errors.record("collect", exc)
        yield from self._self_metrics()

    def _families(self, s: TrackerSnapshot) -> Iterator[Metric]:
        names, values = self._names, self._values

        rank0 = self._rank0

        def one(spec: MetricSpec, value: float | None) -> Iterator[Metric]:
            if value is None or (spec.ranks == "rank0" and not rank0):
                return
            family = spec.family(names)
            family.add_metric(values, float(value))  # type: ignore[attr-defined]
            yield family

        yield from one(T.STEPS, s.steps)
        yield from one(T.STEP, s.step)
        recent = s.recent_steps if rank0 else ()
        yield _summary(T.STEP_DURATION, names, values, s.step_duration, recent)
        yield from one(T.LAST_STEP_TIMESTAMP, s.last_step_time)
        yield from one(T.TOKENS, s.tokens)
        yield from one(T.SAMPLES, s.samples or None)
        yield from one(T.MODEL_FLOPS, s.model_flops)
        yield from one(T.PEAK_FLOPS, s.peak_flops)
        yield from one(T.MFU, s.mfu)
        if self._hfu:
            yield from one(T.HARDWARE_FLOPS, s.hardware_flops)
            yield from one(T.HFU, s.hfu)
        yield from one(T.DATA_WAIT, s.data_wait_seconds)
        if s.phase_seconds and rank0:
            phases = T.PHASE_SECONDS.family(names)
            for phase, seconds in sorted(s.phase_seconds.items()):
                phases.add_metric([*values, phase], seconds)  # type: ignore[attr-defined]
            yield phases
        if s.checkpoint_save is not None:
            yield _summary(T.CKPT_SAVE_DURATION, names, values, s.checkpoint_save)
        if s.checkpoint_load is not None:
            yield _summary(T.CKPT_LOAD_DURATION, names, values, s.checkpoint_load)
        yield from one(T.CKPT_BYTES, s.checkpoint_bytes)
        yield from one(T.CKPT_LAST_SUCCESS, s.checkpoint_last_success)
        yield from one(T.CKPT_FAILURES, s.checkpoint_failures)
        yield from one(T.LOSS, s.loss)
        yield from one(T.NONFINITE_LOSS, s.nonfinite_loss)
        yield from one(T.RUN_START_TIMESTAMP, s.start_time)
        yield from one(T.WORLD_SIZE, self._tracker.config.rank.world_size)
        info = T.INFO.family(names)
        info.add_metric(values, s.info)  # type: ignore[attr-defined]
        yield info

    def _self_metrics(self) -> Iterator[Metric]:
        names, values = self._names, self._values
        errors = S.INTERNAL_ERRORS.family(names)
        for where, count in sorted(self._tracker.errors.counts().items()):
            errors.add_metric([*values, where], float(count))  # type: ignore[attr-defined]
        yield errors
        rejected = S.INPUT_REJECTED.family(names)
        for reason, count in sorted(self._tracker.rejected.counts().items()):
            rejected.add_metric([*values, reason], float(count))  # type: ignore[attr-defined]
        yield rejected
        fallback = self.requested_port not in (None, 0) and self.port != self.requested_port
        if self.port is not None and fallback:
            port = GaugeMetricFamily(S.EXPORTER_PORT.name, S.EXPORTER_PORT.help, labels=[*names, "requested"])
            port.add_metric([*values, str(self.requested_port)], float(self.port))
            yield port
