"""Which jobs and runs an alert is about: the node agent's job map and the tracker's series in Prometheus.

The node agent exports ``gpu_job_info{instance, gpu, uuid, ..., hpc_job}`` from the per-GPU job files a
Slurm prolog writes, and every training rank's series carry the ``instance`` of the agent that serves
them. So, through Prometheus: host -> jobs (optionally only those on the alert's GPU), host -> runs,
run -> hosts, and run -> jobs (the jobs on its ranks' GPUs). A host whose agent is down is looked up
over the ``lookback`` window instead of now.

A run's hosts and jobs come only from the ranks that speak for it (``generate/ranks.py``): a rank past
the world size its rank 0 declares, or one two hosts claim, is left out, so a user on another host who
serves a rank of someone else's run never makes its host one of the run's (to be drained, or to have
its jobs requeued).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import eq, select
from babysitter.generate.ranks import RankRecords
from babysitter.prom import Deadline, PromClient, PromError
from babysitter.remediate.backends.base import BackendError

__all__ = ["JobMap", "PrometheusJobMap"]

_MAX_RESPONSE = 4 * 1024 * 1024
#: The generated rules' list of ranks that do not speak for their run.
_EXCLUDED = RankRecords(GenerateConfig()).excluded


class JobMap(Protocol):
    """What the remediator asks of a job map (:class:`PrometheusJobMap`; tests give a fake)."""

    def jobs_on(self, instance: str, labels: Mapping[str, str] | None = None) -> list[str]: ...

    def runs_on(self, instance: str) -> list[str]: ...

    def instances_of(self, run: str, cluster: tuple[str, str] | None = None) -> list[str]: ...

    def jobs_of(self, run: str, cluster: tuple[str, str] | None = None) -> list[str]: ...


class PrometheusJobMap:
    """Queries one Prometheus (``url``): each request within ``timeout``, each lookup (now, then over
    the lookback) within twice that, so a Prometheus that drips cannot hold the deciding thread."""

    def __init__(self, url: str, *, lookback: float, timeout: float, cluster_label: str = "cluster") -> None:
        # The policy checked that the URL is http(s); a job map's answers are small.
        self._client = PromClient(url, timeout=timeout, max_bytes=_MAX_RESPONSE)
        self.url = self._client.url
        self.lookback = f"{max(1, int(lookback))}s"
        self.timeout = timeout
        self._on = f"on ({cluster_label}, run, rank)"

    def _labels(self, expr: str, label: str) -> list[str]:
        """``label`` of each series of one query, within the deadline."""
        client = self._client.within(Deadline(2 * self.timeout))
        try:
            samples = client.query(expr)
        except PromError as exc:
            raise BackendError(f"Prometheus query failed: {exc}") from None
        return sorted({value for s in samples if (value := s.labels.get(label))})

    def _speaking(self, selector: str, matchers: Sequence[str]) -> str:
        """The series of ``selector`` of ranks that speak for their run: now unless excluded now; for
        ranks no longer reported, as last seen within the lookback unless excluded at any time in it
        (a rank that served for a moment and exited is still judged)."""
        excluded = f"{_EXCLUDED}{{{', '.join(matchers)}}}"
        lb, on = self.lookback, self._on
        return (
            f"({selector} unless {on} {excluded})\nor\n"
            f"(last_over_time({selector}[{lb}]) unless {on} {selector} "
            f"unless {on} last_over_time({excluded}[{lb}]))"
        )

    def _values(self, expr: str, label: str) -> list[str]:
        """``label`` of each series of ``expr`` now, else over the lookback window."""
        client = self._client.within(Deadline(2 * self.timeout))
        for form in (expr, f"last_over_time({expr}[{self.lookback}])"):
            found: list[str] = []
            try:
                samples = client.query(f"count by ({label}) ({form})")
            except PromError as exc:
                raise BackendError(f"Prometheus query failed: {exc}") from None
            for sample in samples:
                value = sample.labels.get(label)
                if value and value not in found:
                    found.append(value)
            if found:
                return sorted(found)
        return []

    def jobs_on(self, instance: str, labels: Mapping[str, str] | None = None) -> list[str]:
        """Job ids the agent at ``instance`` maps to its GPUs (only the alert's GPU when it names one)."""
        matchers = [eq("instance", instance)]
        for key in ("uuid", "gpu"):
            if labels and labels.get(key):
                matchers.append(eq(key, labels[key]))
                break
        return self._values(select(N.GPU_JOB, *matchers), "hpc_job")

    def runs_on(self, instance: str) -> list[str]:
        """Runs whose ranks report through the agent at ``instance``."""
        return self._values(select(T.STEPS, eq("instance", instance)), "run")

    def instances_of(self, run: str, cluster: tuple[str, str] | None = None) -> list[str]:
        """Agent instances (hosts) the run's ranks report through: the ranks that speak for it, now or
        (ranks no longer reported: stopped, exited, their host lost) within the lookback."""
        matchers = [eq("run", run), *([eq(*cluster)] if cluster is not None else [])]
        speaking = self._speaking(select(T.STEPS, *matchers), matchers)
        return self._labels(f"count by (instance) (\n{speaking}\n)", "instance")

    def jobs_of(self, run: str, cluster: tuple[str, str] | None = None) -> list[str]:
        """Job ids the job map gives the GPUs of the run's ranks that speak for it (their ``train_info``
        names each rank's GPU): the scheduler's jobs that run the run, none on CPU or without a job map."""
        matchers = [eq("run", run), *([eq(*cluster)] if cluster is not None else [])]
        ranks = self._speaking(select(T.INFO, *matchers, 'uuid!=""'), matchers)
        jobs = select(N.GPU_JOB, 'uuid!=""')
        gpus = f"group by (uuid) (\n{ranks}\n)"
        return self._labels(
            f"count by (hpc_job) ({jobs} and on (uuid) {gpus})\n"
            f"or count by (hpc_job) (last_over_time({jobs}[{self.lookback}]) and on (uuid) {gpus})",
            "hpc_job",
        )
