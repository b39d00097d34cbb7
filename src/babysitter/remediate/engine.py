"""The remediator: from alerts to actions, through the policy, the rails and a backend, into the audit log.

One thread calls :meth:`Remediator.handle` for each notification and :meth:`Remediator.tick` now and then
(deferred alerts, ``firing_for``); decisions are therefore serialized and the rails are exact. Every
decision about an alert that matched a rule is audited: what was done (or would be, in a dry run),
why, for which alert, the commands and their results, and every refusal with its reason. Re-sent
alerts (Alertmanager repeats a group's alerts in every notification) are recognized by their
fingerprint and start time and acted on once.

An undrain on a resolved alert needs three things: the policy's rule for the alert asks for it
(``undrain_on_resolve``), this remediator drained the host for that very alert (the audit log keeps
each drain, its alert and its reason, and is read back at start), and the drain was real, not a dry
run's rehearsal. The scheduler is then asked to resume the node only while it still carries the
reason given at the drain (an operator's own drain since, whatever its text, is left alone).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from babysitter.catalog.remediate import ACTION_RESULTS, REFUSAL_REASONS, REMEDIATION_ACTIONS
from babysitter.remediate.alerts import Alert, Notification
from babysitter.remediate.audit import AuditLog, replay
from babysitter.remediate.backends.base import Backend, BackendError, Outcome
from babysitter.remediate.incidents import IncidentHook
from babysitter.remediate.jobmap import JobMap
from babysitter.remediate.policy import Policy, Rule
from babysitter.remediate.rails import Rails
from babysitter.remediate.targets import culprit_hosts, host_of, render_reason, valid_job

__all__ = ["REASON_PREFIX", "Remediation", "Remediator"]

log = logging.getLogger(__name__)

#: Every reason this remediator gives a scheduler starts with it; an undrain checks for it.
REASON_PREFIX = "babysitter: "
_ORDER = {"drain": 0, "requeue": 1, "annotate": 2}
_NODES_TTL = 300.0


@dataclass(frozen=True)
class _No:
    """Why a rail refuses an action: the ``reason`` label of ``remediation_refused_total`` and the
    audit log's detail."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Remediation:
    """A requeue that went through (or would have, in a dry run), for the run's ledger."""

    t: float
    action: str
    job: str
    host: str | None
    drained: str | None
    alert: Alert
    reason: str
    dry_run: bool
    #: Runs the job trains (the alert's ``run`` label, else those reporting from the host).
    runs: tuple[str, ...] = ()


class Remediator:
    """Applies ``policy`` with ``backend``; ``clock`` is injectable for tests."""

    def __init__(
        self,
        policy: Policy,
        backend: Backend,
        audit: AuditLog,
        *,
        jobmap: JobMap | None = None,
        clock: Callable[[], float] = time.time,
        on_remediation: Callable[[Remediation], None] | None = None,
        force_dry_run: bool = False,
    ) -> None:
        self.policy = policy
        self.backend = backend
        self.audit = audit
        self.jobmap = jobmap
        self.clock = clock
        self.on_remediation = on_remediation
        self.force_dry_run = force_dry_run
        self.rails = Rails(policy.rate_limit, policy.drain_cap)
        self._pending: dict[str, tuple[Alert, Rule, float]] = {}
        self._nodes: tuple[float, int] | None = None
        self._lock = threading.Lock()
        self._drained_now = 0
        self._refused: set[tuple[str, str, str, str | None]] = set()
        self._logged: dict[tuple[str, str], float] = {}
        self._cap_now: int | None = None
        self._cap_tried = -_NODES_TTL - 1.0
        self.actions: dict[tuple[str, str], int] = {
            (a, r): 0 for a in REMEDIATION_ACTIONS for r in ACTION_RESULTS
        }
        self.refusals: dict[tuple[str, str], int] = {
            (a, r): 0 for a in REMEDIATION_ACTIONS for r in REFUSAL_REASONS
        }
        self._replay()
        self._drained_now = len(self.rails.drained(self.clock()))

    # ------------------------------------------------------------------ state from the audit log

    def _replay(self) -> None:
        count = 0
        for record in replay(self.audit.path):
            if record.get("event") == "held":
                host, alert_key, key = record.get("host"), record.get("alert_key"), record.get("key")
                if isinstance(host, str) and isinstance(alert_key, str) and isinstance(key, str):
                    self.rails.hold(host, alert_key, key, float(record["t"]))
                continue
            if record.get("event") != "action":
                continue
            action, result = record.get("action"), record.get("result")
            if not isinstance(action, str) or result not in ("ok", "dry_run", "failed"):
                continue
            reason = record.get("reason")
            self.rails.record(
                action,
                key=record.get("key"),
                now=float(record["t"]),
                host=record.get("host"),
                job=record.get("job"),
                alert_key=record.get("alert_key"),
                done=result != "failed",
                reason=reason if isinstance(reason, str) else None,
                dry_run=result == "dry_run" or record.get("dry_run") is True,
            )
            count += 1
        if count:
            log.info("babysitter remediate: %d past actions read back from %s", count, self.audit.path)

    # ------------------------------------------------------------------ entry points

    def handle(self, notification: Notification) -> None:
        """Act on one notification's alerts (firing and resolved), in order."""
        for alert in notification.alerts:
            try:
                if alert.status == "resolved":
                    self._resolved(alert)
                else:
                    self._incident(alert)
                    self._firing(alert)
            except Exception as exc:  # one bad alert must not stop the others
                log.exception("babysitter remediate: alert %s failed", alert.name)
                self._audit("error", alert=alert.describe(), detail=f"{type(exc).__name__}: {exc}")

    def tick(self) -> None:
        """Act on deferred alerts whose ``firing_for`` has passed; forget those not heard of for too long."""
        now = self.clock()
        self._drained_now = len(self.rails.drained(now))
        if time.monotonic() - self._cap_tried > _NODES_TTL:
            self._cap_tried = time.monotonic()
            self.cap_nodes()  # keeps the cap gauge current (one cheap query every few minutes)
        for key, (alert, rule, seen) in list(self._pending.items()):
            if now - seen > self.policy.pending_ttl:
                del self._pending[key]
                self._audit_alert(
                    "forgotten",
                    alert,
                    rule,
                    detail="no notification for pending_ttl; never acted on",
                )
            elif now - alert.starts_at >= rule.firing_for:
                del self._pending[key]
                self._act(alert, rule)

    @property
    def pending(self) -> int:
        """Alerts waiting for their rule's ``firing_for``."""
        return len(self._pending)

    # ------------------------------------------------------------------ decisions

    def _firing(self, alert: Alert) -> None:
        rule = self.policy.rule_for(alert.labels)
        if rule is None:
            return
        now = self.clock()
        if now - alert.starts_at < rule.firing_for:
            if alert.key not in self._pending:
                self._audit_alert(
                    "deferred",
                    alert,
                    rule,
                    detail=f"acts once firing for {rule.firing_for:g} s",
                )
            self._pending[alert.key] = (alert, rule, now)
            return
        self._pending.pop(alert.key, None)
        self._act(alert, rule)

    def _resolved(self, alert: Alert) -> None:
        self._pending.pop(alert.key, None)
        rule = self.policy.rule_for(alert.labels)
        if rule is None or not rule.undrain_on_resolve:
            return
        host = host_of(alert.labels, self.policy.hosts)
        if host is None:
            return
        made = self.rails.made.get(host)
        if not self.rails.release(host, alert.key):
            return
        if made is None or (made.dry_run and not self._dry(rule)):
            detail = f"the drain of {host} for this alert was a dry run: nothing of ours to undo"
            self._refuse("undrain", _No("not_ours", detail), alert, rule, host=host)
            return
        self._undrain(alert, rule, host, made.reason or REASON_PREFIX)

    def _dry(self, rule: Rule) -> bool:
        return self.force_dry_run or self.policy.is_dry_run(rule)

    def _act(self, alert: Alert, rule: Rule) -> None:
        cluster = self.policy.cluster
        host = host_of(alert.labels, self.policy.hosts)
        culprits: list[str | None] = [host]
        why = ""
        held: tuple[frozenset[str] | None, str] | None = None
        if rule.hosts_from == "culprit":
            found, why = culprit_hosts(alert, self.policy.hosts, rule.max_culprit_hosts)
            culprits = list(found)
        for action in sorted(rule.actions, key=_ORDER.__getitem__):
            if cluster is not None and alert.labels.get(self.policy.cluster_label) != cluster:
                label = self.policy.cluster_label
                detail = f"{label}={alert.labels.get(label)!r}, this remediator serves {cluster!r}"
                self._refuse(action, _No("not_allowed", detail), alert, rule, host=host)
                continue
            if rule.hosts_from == "culprit" and action != "requeue" and not culprits:
                self._refuse(action, _No("no_target", why), alert, rule)
                continue
            if action == "requeue":
                self._requeue(alert, rule, host if rule.hosts_from == "alert" else None)
                continue
            for target in culprits:
                checked = ""
                if rule.hosts_from == "culprit" and target is not None:
                    held = held or self._run_hosts(alert)
                    hosts, checked = held
                    if hosts is None or target not in hosts:
                        run = alert.labels.get("run")
                        detail = (
                            checked
                            if hosts is None
                            else f"{target} holds none of run {run}'s ranks: {checked}"
                        )
                        self._refuse(action, _No("not_in_run", detail), alert, rule, host=target)
                        continue
                if action == "drain":
                    self._drain(alert, rule, target, why=why, checked=checked)
                else:
                    self._annotate(alert, rule, target)

    def _run_hosts(self, alert: Alert) -> tuple[frozenset[str] | None, str]:
        """The nodes that hold the alert's run's ranks, and what was checked (or None, and why not).

        Prometheus (the job map) gives the hosts serving the ranks that speak for the run (never a rank
        past the world size its rank 0 declares, nor one two hosts claim: ``generate/ranks.py``); where
        the run's jobs are known (a job label on the alert, else the job map's jobs on the run's GPUs)
        and the scheduler can tell their nodes, a host must be among those too (unless the policy says
        not to ask the scheduler: ``jobs.ask_scheduler: false``).
        """
        run = alert.labels.get("run")
        if not run:
            return None, "the alert has no run label: which hosts hold the run's ranks is unknown"
        if self.jobmap is None:
            return None, f"no job map (jobs.prometheus_url) to tell which hosts hold run {run}'s ranks"
        value = alert.labels.get(self.policy.cluster_label)
        cluster = (self.policy.cluster_label, value) if value else None
        try:
            instances = self.jobmap.instances_of(run, cluster)
        except BackendError as exc:
            return None, f"cannot tell which hosts hold run {run}'s ranks: {exc}"
        label = self.policy.hosts.label
        hosts = {h for i in instances if (h := host_of({label: i}, self.policy.hosts)) is not None}
        checked = f"its ranks report from {', '.join(sorted(hosts)[:8]) or 'no host'}"
        jobs, source = self._job_labels(alert), "alert label"
        try:
            if not jobs:
                jobs, source = [j for j in self.jobmap.jobs_of(run, cluster) if valid_job(j)], "job map"
        except BackendError as exc:
            return None, f"cannot tell run {run}'s jobs: {exc}"
        if not self.policy.jobs.ask_scheduler:  # the policy says the scheduler is not to be asked
            return frozenset(hosts), checked + " (the scheduler not asked: jobs.ask_scheduler is false)"
        try:
            nodes = self.backend.nodes_of(jobs) if jobs else None
        except BackendError as exc:
            return None, f"cannot tell the nodes of run {run}'s jobs {', '.join(jobs[:8])}: {exc}"
        if nodes is not None:
            hosts &= set(nodes)
            checked += f"; its jobs {', '.join(jobs[:8])} ({source}) hold {', '.join(nodes[:8]) or 'no node'}"
        return frozenset(hosts), checked

    def _key(self, alert: Alert, rule: Rule, action: str, target: str) -> str:
        return f"{alert.key}:{action}:{target}" + (":dry" if self._dry(rule) else "")

    # Each rail's check: None when it lets the action through.

    def _host_refusal(self, host: str) -> _No | None:
        allow = self.policy.allow
        if allow.hosts and not any(p.fullmatch(host) for p in allow.hosts):
            return _No("not_allowed", f"host {host} is not on allow.hosts")
        if allow.partitions:
            try:
                parts = self.backend.partitions_of(host) or []
            except BackendError as exc:
                return _No("not_allowed", f"cannot tell {host}'s partitions: {exc}")
            if not any(p.fullmatch(part) for part in parts for p in allow.partitions):
                return _No("not_allowed", f"host {host} is in partitions {parts}, none on allow.partitions")
        return None

    def _namespace_refusal(self, job: str) -> _No | None:
        namespace = self.backend.namespace_of(job)
        allowed = self.policy.allow.namespaces
        if namespace is not None and allowed and not any(p.fullmatch(namespace) for p in allowed):
            return _No("not_allowed", f"namespace {namespace} is not on allow.namespaces")
        return None

    def _rate_refusal(self, now: float) -> _No | None:
        if self.rails.rate_ok(now):
            return None
        rate = self.policy.rate_limit
        done = self.rails.actions_in_window(now)
        return _No("rate_limit", f"{done} disruptive actions within {rate.window:g} s (limit {rate.actions})")

    def _cap_refusal(self, host: str, now: float) -> _No | None:
        try:
            nodes = self._cluster_nodes()
        except BackendError as exc:
            return _No("drain_cap", f"cluster size unknown, refusing to drain blind: {exc}")
        if self.rails.cap_ok(host, now, nodes):
            return None
        drained = sorted(self.rails.drained(now))
        return _No(
            "drain_cap",
            f"{len(drained)} of {nodes} nodes drained within {self.policy.drain_cap.window:g} s "
            f"(cap {self.rails.cap_nodes(nodes)}): {', '.join(drained[:20])}",
        )

    def _missing(self, action: str, alert: Alert, rule: Rule, need: str) -> None:
        self._refuse(action, _No("missing_labels", f"{action} needs {need}"), alert, rule)

    def _drain(self, alert: Alert, rule: Rule, host: str | None, *, why: str = "", checked: str = "") -> None:
        if host is None:
            self._missing("drain", alert, rule, f"a host in label {self.policy.hosts.label!r}")
            return
        key = self._key(alert, rule, "drain", host)
        if self.rails.done(key):
            return
        refused = self._host_refusal(host)
        if refused is not None:
            self._refuse("drain", refused, alert, rule, host=host)
            return
        now = self.clock()
        if self.rails.held(host, now) and self._still_drained(host):
            self.rails.hold(host, alert.key, key, now)
            self._audit_alert(
                "held",
                alert,
                rule,
                action="drain",
                host=host,
                alert_key=alert.key,
                key=key,
                detail="already drained by this remediator; this alert holds it too",
            )
            return
        refused = self._rate_refusal(now) or self._cap_refusal(host, now)
        if refused is not None:
            self._refuse("drain", refused, alert, rule, host=host)
            return
        reason = render_reason(rule.reason, alert.labels, prefix=REASON_PREFIX)
        dry = self._dry(rule)
        outcome = self.backend.drain(host, reason, dry_run=dry, alert=alert.describe())
        extra = {"why": why} if why else {}
        if checked:
            extra["checked"] = checked
        self._done("drain", outcome, alert, rule, key=key, host=host, reason=reason, **extra)

    def _still_drained(self, host: str) -> bool:
        """Ask the scheduler (an operator may have resumed the node since); unknown counts as no."""
        try:
            return self.backend.is_drained(host) is True
        except BackendError:
            return False

    def _undrain(self, alert: Alert, rule: Rule, host: str, reason: str) -> None:
        refused = self._rate_refusal(self.clock())
        if refused is not None:
            self._refuse("undrain", refused, alert, rule, host=host)
            return
        outcome = self.backend.undrain(host, reason, dry_run=self._dry(rule), alert=alert.describe())
        if outcome.refused:
            self._refuse("undrain", _No(outcome.refused, outcome.detail), alert, rule, host=host)
            return
        self._done(
            "undrain",
            outcome,
            alert,
            rule,
            key=self._key(alert, rule, "undrain", host),
            host=host,
            reason="alert resolved",
        )

    def _requeue(self, alert: Alert, rule: Rule, host: str | None) -> None:
        dry = self._dry(rule)
        try:
            jobs, source, hosts = self._jobs(alert, host)
        except BackendError as exc:
            self._fail("requeue", alert, rule, host=host, detail=f"cannot find the jobs: {exc}")
            return
        if not jobs:
            if host is None and not alert.labels.get("run") and not self._job_labels(alert):
                self._missing(
                    "requeue",
                    alert,
                    rule,
                    f"a job label ({', '.join(self.policy.jobs.labels)}), a host or a run label",
                )
            else:
                detail = f"no job found for host {host} / run {alert.labels.get('run')}"
                self._refuse("requeue", _No("no_target", detail), alert, rule, host=host)
            return
        confirmed: list[tuple[str, str | None]] = []
        note = ""
        try:
            places: list[str | None] = [*hosts] if hosts else [None]
            for where in places:
                confirmed += [
                    (job, where) for job in self.backend.running(jobs, where) if (job, where) not in confirmed
                ]
        except BackendError as exc:
            if not dry:
                self._fail("requeue", alert, rule, host=host, detail=f"cannot confirm {jobs} run now: {exc}")
                return
            confirmed, note = [(job, host) for job in jobs], f" (unconfirmed: {exc})"
        if not confirmed:
            detail = f"{source} names {jobs}, none of which runs now" + (f" on {hosts}" if hosts else "")
            self._refuse("requeue", _No("no_target", detail), alert, rule, host=host)
            return
        reason = render_reason(rule.reason, alert.labels, prefix=REASON_PREFIX)
        for job, where in confirmed:
            key = self._key(alert, rule, "requeue", job)
            if self.rails.done(key):
                continue
            now = self.clock()
            if self.rails.recently_requeued(job, now):
                self._audit_alert(
                    "skipped",
                    alert,
                    rule,
                    action="requeue",
                    job=job,
                    detail="requeued for another alert within the rate window",
                )
                continue
            refused = (
                self._namespace_refusal(job)
                or (None if where is None else self._host_refusal(where))
                or self._rate_refusal(now)
            )
            if refused is not None:
                self._refuse("requeue", refused, alert, rule, host=where, job=job)
                continue
            outcome = self.backend.requeue(job, reason, dry_run=dry, alert=alert.describe())
            drained = host if "drain" in rule.actions else None
            self._done(
                "requeue",
                outcome,
                alert,
                rule,
                key=key,
                host=where,
                job=job,
                reason=reason + note,
                source=source,
            )
            if outcome.ok and self.on_remediation is not None:
                try:
                    runs = self._runs(alert)
                    self.on_remediation(
                        Remediation(now, "requeue", job, where, drained, alert, reason, dry, runs)
                    )
                except Exception as exc:
                    log.warning("babysitter remediate: recording the remediation for the run failed: %s", exc)

    def _annotate(self, alert: Alert, rule: Rule, host: str | None) -> None:
        jobs = self._job_labels(alert)
        if host is None and not jobs:
            self._missing(
                "annotate", alert, rule, f"a host in label {self.policy.hosts.label!r} or a job label"
            )
            return
        target = host or jobs[0]
        key = self._key(alert, rule, "annotate", target)
        if self.rails.done(key):
            return
        refused = None if host is None else self._host_refusal(host)
        if refused is not None:
            self._refuse("annotate", refused, alert, rule, host=host)
            return
        text = render_reason(rule.reason, alert.labels, prefix=REASON_PREFIX)
        dry, doc = self._dry(rule), alert.describe()
        if host is not None:
            outcome = self.backend.annotate_host(host, text, dry_run=dry, alert=doc)
        else:
            outcome = self.backend.annotate_job(jobs[0], text, dry_run=dry, alert=doc)
        job = None if host else jobs[0]
        self._done("annotate", outcome, alert, rule, key=key, host=host, job=job, reason=text)

    # ------------------------------------------------------------------ lookups

    def _job_labels(self, alert: Alert) -> list[str]:
        return [alert.labels[k] for k in self.policy.jobs.labels if valid_job(alert.labels.get(k, ""))]

    def _jobs(self, alert: Alert, host: str | None) -> tuple[list[str], str, list[str]]:
        """``(jobs, where they came from, hosts to confirm them on)``."""
        direct = self._job_labels(alert)
        if direct:
            return direct, "alert label", [host] if host else []
        instance = alert.labels.get(self.policy.hosts.label)
        if self.jobmap is not None:
            if host is not None and instance:
                found = [j for j in self.jobmap.jobs_on(instance, alert.labels) if valid_job(j)]
                if found:
                    return found, "node agent job map", [host]
            run = alert.labels.get("run")
            if run:
                cluster_value = alert.labels.get(self.policy.cluster_label)
                cluster = (self.policy.cluster_label, cluster_value) if cluster_value else None
                jobs: list[str] = []
                hosts: list[str] = []
                for inst in self.jobmap.instances_of(run, cluster):
                    where = host_of({self.policy.hosts.label: inst}, self.policy.hosts)
                    if where is None:
                        continue
                    hosts.append(where)
                    jobs += [j for j in self.jobmap.jobs_on(inst) if valid_job(j) and j not in jobs]
                if jobs:
                    return jobs, f"node agent job map of run {run}'s hosts", hosts
        if self.policy.jobs.ask_scheduler and host is not None:
            return [j for j in self.backend.jobs_on(host) if valid_job(j)], "scheduler", [host]
        return [], "", []

    def _runs(self, alert: Alert) -> tuple[str, ...]:
        if alert.labels.get("run"):
            return (alert.labels["run"],)
        instance = alert.labels.get(self.policy.hosts.label)
        if self.jobmap is None or not instance:
            return ()
        try:
            return tuple(self.jobmap.runs_on(instance))
        except BackendError as exc:
            log.warning("babysitter remediate: cannot tell which runs %s served: %s", instance, exc)
            return ()

    def _cluster_nodes(self) -> int:
        if self.policy.drain_cap.cluster_nodes is not None:
            self._cap_now = self.rails.cap_nodes(self.policy.drain_cap.cluster_nodes)
            return self.policy.drain_cap.cluster_nodes
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > _NODES_TTL:
            self._nodes = (now, self.backend.node_count())
            self._cap_now = self.rails.cap_nodes(self._nodes[1])
        return self._nodes[1]

    def cap_nodes(self) -> int | None:
        """The drain cap in nodes now, None when the cluster size is unknown."""
        try:
            return self.rails.cap_nodes(self._cluster_nodes())
        except BackendError:
            return None

    # ------------------------------------------------------------------ results

    def _count(self, table: dict[tuple[str, str], int], action: str, what: str) -> None:
        with self._lock:
            table[(action, what)] = table.get((action, what), 0) + 1

    def _refuse(
        self,
        action: str,
        no: _No,
        alert: Alert,
        rule: Rule,
        *,
        host: str | None = None,
        job: str | None = None,
    ) -> None:
        reason, detail = no.reason, no.detail
        seen = (alert.key, action, reason, job)
        if seen in self._refused:
            return  # the same refusal for the same alert episode, re-sent by Alertmanager
        if len(self._refused) > 100_000:
            self._refused.clear()
        self._refused.add(seen)
        self._count(self.actions, action, "refused")
        self._count(self.refusals, action, reason)
        self._audit_alert(
            "refused",
            alert,
            rule,
            action=action,
            reason=reason,
            host=host,
            job=job,
            detail=detail,
            dry_run=self._dry(rule),
        )
        now = time.monotonic()
        if now - self._logged.get((action, reason), -1e9) >= 60.0:
            self._logged[(action, reason)] = now
            log.warning(
                "babysitter remediate: refused %s for %s (%s): %s (further refusals for this reason: "
                "audit log and remediation_refused_total only, for a minute)",
                action,
                alert.name,
                reason,
                detail,
            )

    def _fail(self, action: str, alert: Alert, rule: Rule, *, host: str | None, detail: str) -> None:
        self._count(self.actions, action, "failed")
        self._audit_alert(
            "action",
            alert,
            rule,
            action=action,
            result="failed",
            host=host,
            alert_key=alert.key,
            detail=detail,
            dry_run=self._dry(rule),
        )
        log.error("babysitter remediate: %s for %s failed: %s", action, alert.name, detail)

    def _done(
        self,
        action: str,
        outcome: Outcome,
        alert: Alert,
        rule: Rule,
        *,
        key: str,
        host: str | None,
        reason: str,
        job: str | None = None,
        **extra: Any,
    ) -> None:
        dry = self._dry(rule)
        result = "dry_run" if dry and outcome.ok else "ok" if outcome.ok else "failed"
        now = self.clock()
        self.rails.record(
            action,
            key=key,
            now=now,
            host=host,
            job=job,
            alert_key=alert.key,
            done=outcome.ok,
            reason=reason,
            dry_run=dry,
        )
        self._drained_now = len(self.rails.drained(now))
        self._count(self.actions, action, result)
        self._audit_alert(
            "action",
            alert,
            rule,
            action=action,
            result=result,
            key=key,
            alert_key=alert.key,
            host=host,
            job=job,
            reason=reason,
            dry_run=dry,
            commands=[step.record() for step in outcome.steps],
            detail=outcome.detail,
            **extra,
        )
        level = logging.ERROR if result == "failed" else logging.INFO
        target = " ".join(f"{k}={v}" for k, v in (("host", host), ("job", job)) if v)
        why = f" ({extra['why']})" if extra.get("why") else ""
        log.log(
            level,
            "babysitter remediate: %s %s %s for %s: %s%s",
            action,
            target,
            result,
            alert.name,
            outcome.detail or reason,
            why,
        )

    def _audit_alert(self, event: str, alert: Alert, rule: Rule, **fields: Any) -> None:
        """An audit record about an alert that matched ``rule`` (and the bundle gathered for it)."""
        bundles = self.incidents.bundles(alert) if self.incidents is not None else None
        if bundles:
            fields.setdefault("incident", [str(b.path) for b in bundles])
        self._audit(event, alert=alert.describe(), rule=rule.name, **fields)

    #: Gathers each alert's incident bundle before any action (:mod:`babysitter.remediate.incidents`,
    #: set by ``babysitter remediate``); None: no bundles.
    incidents: IncidentHook | None = None

    def _incident(self, alert: Alert) -> None:
        """Gather the alert's bundle and audit it: before its rule's actions (bounded by the policy's
        ``incidents.wait``), or, for an alert no rule acts on, on the hook's own thread."""
        hook = self.incidents
        matched = self.policy.rule_for(alert.labels) is not None
        if hook is None or not hook.wants(alert, matched=matched):
            return
        cluster = self.policy.cluster
        if cluster is not None and alert.labels.get(self.policy.cluster_label) != cluster:
            return  # another cluster's alert: its remediator keeps its evidence
        if hook.bundles(alert) is not None:
            return  # this episode's bundle is in: Alertmanager re-sent the alert
        started = time.monotonic()
        if not matched:

            def done(bundles: list[Any], source: str, error: str) -> None:
                self._audit_incident(alert, bundles, source, time.monotonic() - started, error)

            if not hook.gather_later(alert, done):
                self._audit(
                    "incident", alert=alert.describe(), detail="too many incidents queued: not gathered"
                )
            return
        try:
            bundles, source = hook.gather(alert)
        except Exception as exc:  # evidence is worth a wait, never a missed action
            log.exception("babysitter remediate: gathering the incident of %s failed", alert.name)
            self._audit_incident(alert, [], "", time.monotonic() - started, f"{type(exc).__name__}: {exc}")
            return
        self._audit_incident(alert, bundles, source, time.monotonic() - started, "")

    def _audit_incident(
        self, alert: Alert, bundles: list[Any], source: str, seconds: float, error: str
    ) -> None:
        if error:
            self._audit("incident", alert=alert.describe(), detail=error)
            return
        self._audit(
            "incident",
            alert=alert.describe(),
            bundles=[b.describe() for b in bundles],
            runs_from=source,
            seconds=round(seconds, 3),
            detail="" if bundles else "no run directory and no incidents.dir: nothing gathered",
        )

    def _audit(self, event: str, **fields: Any) -> None:
        self.audit.write(event, t=self.clock(), **fields)

    def snapshot(self) -> Mapping[str, Any]:
        """Counters and gauges for the metrics endpoint."""
        with self._lock:
            return {
                "actions": dict(self.actions),
                "refusals": dict(self.refusals),
                "drained": self._drained_now,
                "cap": self._cap_now,
            }
