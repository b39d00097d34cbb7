"""Which jobs and runs an alert is about: the node agent's job map and the tracker's series in Prometheus.

The node agent exports ``gpu_job_info{instance, gpu, uuid, ..., hpc_job}`` from the per-GPU job files a
Slurm prolog writes, and every training rank's series carry the ``instance`` of the agent that serves
them. So, through Prometheus: host -> jobs (optionally only those on the alert's GPU), host -> runs,
and run -> hosts. A host whose agent is down is looked up over the ``lookback`` window instead of now.
"""

from __future__ import annotations

from collections.abc import Mapping

from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.generate.promql import eq, select
from babysitter.prom import Deadline, PromClient, PromError
from babysitter.remediate.backends.base import BackendError

__all__ = ["PrometheusJobMap"]

_MAX_RESPONSE = 4 * 1024 * 1024


class PrometheusJobMap:
    """Queries one Prometheus (``url``): each request within ``timeout``, each lookup (now, then over
    the lookback) within twice that, so a Prometheus that drips cannot hold the deciding thread."""

    def __init__(self, url: str, *, lookback: float, timeout: float) -> None:
        # The policy checked that the URL is http(s); a job map's answers are small.
        self._client = PromClient(url, timeout=timeout, max_bytes=_MAX_RESPONSE)
        self.url = self._client.url
        self.lookback = f"{max(1, int(lookback))}s"
        self.timeout = timeout

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
        """Agent instances (hosts) the run's ranks report through."""
        matchers = [eq("run", run)]
        if cluster is not None:
            matchers.append(eq(*cluster))
        return self._values(select(T.STEPS, *matchers), "instance")
