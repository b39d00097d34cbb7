"""The remediator gathers the incident's bundle before it acts, and its audit log names the bundle.

A firing alert that a rule matches, or whose name the policy's ``incidents.alerts`` lists, gets its
bundle when the remediator first hears of it, before any action (a deferred rule's action comes later,
on the same bundle). Bundles go into the run directories (``run_dirs``) of the alert's runs: its
``run`` label, else the runs the job map finds on its host; else into ``incidents.dir``. The id is the
alert's start and fingerprint (:func:`babysitter.training.incident_files.incident_id`), the one the
page carries.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from babysitter.incident.gather import Bundle, Gatherer, Target, incident_id
from babysitter.prom import PromClient
from babysitter.remediate.alerts import Alert
from babysitter.remediate.backends.base import BackendError
from babysitter.remediate.incident_options import IncidentOptions
from babysitter.remediate.policy import Policy
from babysitter.remediate.targets import CULPRIT_ANNOTATION

__all__ = ["IncidentHook", "hook_for"]

log = logging.getLogger(__name__)

_REMEMBERED = 4096
_MAX_RUNS = 8
#: Evidence-only gatherings waiting for the hook's thread at most.
_QUEUE = 64

#: ``done(bundles, source, error)``: what an evidence-only gathering found ("" error: it worked).
Done = Callable[[list[Bundle], str, str], None]


class IncidentHook:
    """Gathers one alert's bundles, once per firing episode (``alert.key``).

    Args:
        options: the policy's ``incidents:`` section.
        run_dir: a run's directory from its name (``RunNotes.run_dir``), None when it has none.
        host_label: the label naming an alert's host (``hosts.label``; ``instance``).
        cluster_label: the label naming its cluster.
        jobmap: for the runs on a host (``runs_on``), when the alert has no ``run`` label.
        prometheus: for the culprit host's state and the ranks' hosts.
    """

    def __init__(
        self,
        options: IncidentOptions,
        *,
        run_dir: Callable[[str], Path | None],
        host_label: str = "instance",
        cluster_label: str = "cluster",
        jobmap: Any = None,
        prometheus: PromClient | None = None,
    ) -> None:
        self.options = options
        self.run_dir = run_dir
        self.host_label = host_label
        self.cluster_label = cluster_label
        self.jobmap = jobmap
        self.gatherer = Gatherer(options.limits, prometheus=prometheus)
        self._done: OrderedDict[str, list[Bundle]] = OrderedDict()
        self._lock = threading.Lock()
        self._queued: set[str] = set()
        self._later: queue.Queue[tuple[Alert, Done]] = queue.Queue(_QUEUE)
        self._worker: threading.Thread | None = None

    def wants(self, alert: Alert, *, matched: bool) -> bool:
        """Whether ``alert`` gets a bundle: a firing alert a rule matched, or one ``alerts`` lists."""
        return (
            self.options.enabled and alert.status == "firing" and (matched or self.options.wants(alert.name))
        )

    def bundles(self, alert: Alert) -> list[Bundle] | None:
        """The bundles gathered for this alert's episode (None: none gathered)."""
        with self._lock:
            return self._done.get(alert.key)

    def gather_later(self, alert: Alert, done: Done) -> bool:
        """Gather an alert's evidence on the hook's own thread, for an alert no action waits on (a
        page that only pages must not hold the deciding thread for ``wait`` seconds); ``done(bundles,
        source, error)`` is called there. False when too many are queued (not gathered)."""
        with self._lock:
            if alert.key in self._done or alert.key in self._queued:
                return True
            self._queued.add(alert.key)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="remediate-incidents", daemon=True)
                self._worker.start()
        try:
            self._later.put_nowait((alert, done))
        except queue.Full:
            with self._lock:
                self._queued.discard(alert.key)
            return False
        return True

    def _work(self) -> None:
        while True:
            alert, done = self._later.get()
            try:
                bundles, source = self.gather(alert)
            except Exception as exc:  # reported through done(), never raised out of the thread
                bundles, source, error = [], "", f"{type(exc).__name__}: {exc}"
            else:
                error = ""
            finally:
                with self._lock:
                    self._queued.discard(alert.key)
            try:
                done(bundles, source, error)
            except Exception:
                log.exception("babysitter remediate: recording an incident failed")

    def gather(self, alert: Alert) -> tuple[list[Bundle], str]:
        """The alert's bundles (gathered now, or before for this episode) and where its runs came from."""
        with self._lock:
            done = self._done.get(alert.key)
        if done is not None:
            return done, "gathered before"
        targets, source = self._targets(alert)
        identity = incident_id(alert.starts_at, alert.fingerprint)
        value = alert.labels.get(self.cluster_label)
        cluster = (self.cluster_label, value) if value else None
        bundles = self.gatherer.gather(
            targets, incident=identity, alert=_alert_doc(alert), hosts=self._hosts(alert), cluster=cluster
        )
        with self._lock:
            self._done[alert.key] = bundles
            while len(self._done) > _REMEMBERED:
                self._done.popitem(last=False)
        return bundles, source

    def _hosts(self, alert: Alert) -> list[str]:
        """The instances whose state goes in the bundle: the page's culprits, else the alert's host."""
        named = [h.strip() for h in alert.annotations.get(CULPRIT_ANNOTATION, "").split(",") if h.strip()]
        own = alert.labels.get(self.host_label)
        return [h[:253] for h in (named or ([own] if own else []))]

    def _targets(self, alert: Alert) -> tuple[list[Target], str]:
        runs: list[str] = []
        source = ""
        if alert.labels.get("run"):
            runs, source = [alert.labels["run"]], "the alert's run label"
        elif self.jobmap is not None and alert.labels.get(self.host_label):
            try:
                runs = list(self.jobmap.runs_on(alert.labels[self.host_label]))[:_MAX_RUNS]
                source = "the runs the job map finds on the alert's host"
            except BackendError as exc:
                source = f"the job map failed: {exc}"
        targets = []
        for run in runs:
            folder = self.run_dir(run)
            if folder is not None:
                targets.append(Target(folder, run))
        if not targets and self.options.dir is not None:
            self.options.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            targets.append(Target(self.options.dir, None))
            source = (source + "; " if source else "") + "no run directory: the incidents dir"
        return targets, source


def _alert_doc(alert: Alert) -> dict[str, Any]:
    """What the bundle keeps of the alert: all of it (labels and annotations are bounded already)."""
    return {
        "name": alert.name,
        "status": alert.status,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "starts_at": alert.starts_at,
        "fingerprint": alert.fingerprint,
    }


def hook_for(
    policy: Policy, jobmap: Any = None, run_dir: Callable[[str], Path | None] | None = None
) -> IncidentHook | None:
    """The hook ``babysitter remediate`` runs with ``policy`` (None when its incidents are off, or when
    neither ``run_dirs`` nor ``incidents.dir`` says where bundles go); ``run_dir``: a run's directory
    (``RunNotes.run_dir`` of the policy's ``run_dirs``)."""
    options = policy.incidents
    if not options.enabled or (run_dir is None and options.dir is None):
        return None  # off, or nowhere to keep a bundle (no run_dirs, no incidents.dir)
    url = policy.jobs.prometheus_url
    return IncidentHook(
        options,
        run_dir=run_dir if run_dir is not None else (lambda _run: None),
        host_label=policy.hosts.label,
        cluster_label=policy.cluster_label,
        jobmap=jobmap,
        prometheus=PromClient(url, timeout=policy.jobs.timeout, max_bytes=8 * 1024 * 1024) if url else None,
    )
