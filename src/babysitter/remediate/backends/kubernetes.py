"""Kubernetes through the official Python client: cordon + taint a node, delete a failed training pod.

Drain: one merge patch of the node sets ``spec.unschedulable`` (what ``kubectl cordon`` does), adds
the policy's taint and records the reason in the annotation ``<taint key>-reason``; undrain removes
all three, only when that annotation is still there (a node an operator cordoned stays cordoned).
Requeue: delete the pod (``namespace/name``) of a JobSet or PyTorchJob on the node, so that its
controller creates a new one elsewhere; pods without one of the policy's owner labels have no such
controller and are never deleted. Dry runs go to the API server with ``dryRun=All``: it checks the
request (and RBAC) without persisting anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from babysitter.remediate.backends.base import AlertDoc, BackendError, Outcome, Step
from babysitter.remediate.policy import KubernetesOptions

__all__ = ["KubernetesBackend"]

_MERGE = "application/merge-patch+json"


class KubernetesBackend:
    """The Kubernetes backend; ``api`` (a ``CoreV1Api``) may be given, else built from the options."""

    name = "kubernetes"

    def __init__(self, options: KubernetesOptions, api: Any = None) -> None:
        self.options = options
        self._api = api if api is not None else _core_api(options)
        self._reason_key = f"{options.taint_key}-reason"

    # ------------------------------------------------------------------ queries

    def _call(self, what: str, func: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, _request_timeout=self.options.timeout, **kwargs)
        except Exception as exc:
            raise BackendError(f"{what}: {_short(exc)}") from None

    def node_count(self) -> int:
        nodes = self._call("list nodes", self._api.list_node)
        return len(nodes.items or [])

    def partitions_of(self, host: str) -> list[str] | None:
        return None

    def _pods(self, host: str) -> list[Any]:
        pods = self._call(
            f"list pods on {host}",
            self._api.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={host}",
        )
        return [
            pod
            for pod in pods.items or []
            if any(key in (pod.metadata.labels or {}) for key in self.options.owner_labels)
            and (pod.status is None or pod.status.phase in ("Running", "Pending", "Unknown", "Failed"))
        ]

    def is_drained(self, host: str) -> bool | None:
        node = self._call(f"read node {host}", self._api.read_node, host)
        return bool(node.spec.unschedulable)

    def jobs_on(self, host: str) -> list[str]:
        return [f"{pod.metadata.namespace}/{pod.metadata.name}" for pod in self._pods(host)]

    def running(self, jobs: Sequence[str], host: str | None) -> list[str]:
        if host is None:
            return []  # a pod is found through its node; a bare name says nothing about where it runs
        live = set(self.jobs_on(host))
        return [job for job in jobs if job in live]

    def namespace_of(self, job: str) -> str | None:
        return job.split("/", 1)[0] if "/" in job else None

    def nodes_of(self, jobs: Sequence[str]) -> list[str] | None:
        nodes: set[str] = set()
        for job in jobs:
            namespace, _, name = job.partition("/")
            if not name:
                continue
            pod = self._call(f"read pod {job}", self._api.read_namespaced_pod, name, namespace)
            labels = pod.metadata.labels or {}
            owner = next(((key, labels[key]) for key in self.options.owner_labels if key in labels), None)
            pods = [pod]
            if owner is not None:  # the job's other pods: its JobSet's or PyTorchJob's
                listed = self._call(
                    f"list pods of {owner[0]}={owner[1]}",
                    self._api.list_namespaced_pod,
                    namespace,
                    label_selector=f"{owner[0]}={owner[1]}",
                )
                pods += listed.items or []
            nodes.update(p.spec.node_name for p in pods if p.spec is not None and p.spec.node_name)
        return sorted(nodes)

    # ------------------------------------------------------------------ actions

    def _patch(
        self, what: str, func: Any, name: str, body: dict[str, Any], *, dry_run: bool, **kw: Any
    ) -> Step:
        step = Step(what + (" (dryRun=All)" if dry_run else ""))
        try:
            func(
                name,
                body=body,
                dry_run="All" if dry_run else None,
                _content_type=_MERGE,
                _request_timeout=self.options.timeout,
                **kw,
            )
            step.ok, step.code = True, 200
        except Exception as exc:
            step.ok, step.code, step.output = False, getattr(exc, "status", None), _short(exc)
        return step

    def drain(self, host: str, reason: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        try:
            node = self._call(f"read node {host}", self._api.read_node, host)
        except BackendError as exc:
            return Outcome(False, detail=str(exc))
        taints = [_taint_dict(t) for t in (node.spec.taints or []) if t.key != self.options.taint_key]
        taints.append(
            {"key": self.options.taint_key, "value": "drained", "effect": self.options.taint_effect}
        )
        body = {
            "metadata": {"annotations": {self._reason_key: reason}},
            "spec": {"unschedulable": True, "taints": taints},
        }
        step = self._patch(
            f"PATCH node {host}: cordon, taint {self.options.taint_key}",
            self._api.patch_node,
            host,
            body,
            dry_run=dry_run,
        )
        return Outcome(bool(step.ok), [step], detail=step.output)

    def undrain(self, host: str, prefix: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        try:
            node = self._call(f"read node {host}", self._api.read_node, host)
        except BackendError as exc:
            return Outcome(False, detail=str(exc))
        reason = (node.metadata.annotations or {}).get(self._reason_key)
        if reason is None or not reason.startswith(prefix.strip()):
            return Outcome(False, detail=f"node {host} carries no drain of ours", refused="not_ours")
        taints = [_taint_dict(t) for t in (node.spec.taints or []) if t.key != self.options.taint_key]
        body = {
            "metadata": {"annotations": {self._reason_key: None}},
            "spec": {"unschedulable": None, "taints": taints or None},
        }
        step = self._patch(
            f"PATCH node {host}: uncordon, untaint", self._api.patch_node, host, body, dry_run=dry_run
        )
        return Outcome(bool(step.ok), [step], detail=step.output)

    def requeue(self, job: str, reason: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        namespace, _, name = job.partition("/")
        step = Step(
            f"DELETE pod {job} (grace {self.options.grace_seconds}s)" + (" (dryRun=All)" if dry_run else "")
        )
        try:
            self._api.delete_namespaced_pod(
                name,
                namespace,
                grace_period_seconds=self.options.grace_seconds,
                dry_run="All" if dry_run else None,
                _request_timeout=self.options.timeout,
            )
            step.ok, step.code = True, 200
        except Exception as exc:
            step.ok, step.code, step.output = False, getattr(exc, "status", None), _short(exc)
        return Outcome(bool(step.ok), [step], detail=step.output)

    def _note(self, text: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {f"{self.options.taint_key}-note": text}}}

    def annotate_host(self, host: str, text: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        what = f"PATCH node {host}: annotate"
        step = self._patch(what, self._api.patch_node, host, self._note(text), dry_run=dry_run)
        return Outcome(bool(step.ok), [step], detail=step.output)

    def annotate_job(self, job: str, text: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        namespace, _, name = job.partition("/")
        patch = self._api.patch_namespaced_pod
        step = self._patch(
            f"PATCH pod {job}: annotate", patch, name, self._note(text), dry_run=dry_run, namespace=namespace
        )
        return Outcome(bool(step.ok), [step], detail=step.output)


def _taint_dict(taint: Any) -> dict[str, Any]:
    out = {"key": taint.key, "effect": taint.effect}
    if getattr(taint, "value", None) is not None:
        out["value"] = taint.value
    return out


def _short(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _core_api(options: KubernetesOptions) -> Any:
    try:
        from kubernetes import client, config
    except ImportError:
        from babysitter._install import pip_install_extra

        raise BackendError(
            f"the kubernetes backend needs the official client: {pip_install_extra('k8s')}"
        ) from None
    configuration = client.Configuration()
    if options.in_cluster:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call,unused-ignore]
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call,unused-ignore]
            config_file=options.kubeconfig, context=options.context, client_configuration=configuration
        )
    return client.CoreV1Api(client.ApiClient(configuration))
