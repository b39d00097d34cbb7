"""The Kubernetes backend through the official client against a local HTTP stub of the API server.

No cluster runs here: the stub speaks the parts of the core/v1 API the backend uses (nodes, pods,
merge patches, deletes, ``dryRun``), so the real client library builds, sends and parses real
requests; the assertions read what reached the "API server".
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="the k8s extra (the official client)")

from babysitter.remediate.backends.base import BackendError
from babysitter.remediate.backends.kubernetes import KubernetesBackend
from babysitter.remediate.engine import REASON_PREFIX
from babysitter.remediate.policy import KubernetesOptions

TOKEN = "k8s-test-token-0123456789"  # noqa: S105 - a test token
JOBSET = "jobset.sigs.k8s.io/jobset-name"


def node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "annotations": {"keep": "me"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {},
    }


def pod(ns: str, name: str, host: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels},
        "spec": {"nodeName": host, "containers": [{"name": "train", "image": "trainer"}]},
        "status": {"phase": "Running"},
    }


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class FakeApiServer:
    """Nodes and pods in memory; every request recorded as (method, path, query, content type, body)."""

    def __init__(self) -> None:
        self.nodes = {n: node(n) for n in ("gpu-1", "gpu-2", "gpu-3")}
        self.pods = {
            ("ml", "llama-0"): pod("ml", "llama-0", "gpu-1", {JOBSET: "llama"}),
            ("ml", "notebook"): pod("ml", "notebook", "gpu-1", {"app": "jupyter"}),
            ("ml", "llama-1"): pod("ml", "llama-1", "gpu-2", {JOBSET: "llama"}),
        }
        self.requests: list[tuple[str, str, dict[str, list[str]], str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length)) if length else None

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                body = self._body() if method in ("PATCH", "POST", "DELETE") else None
                stub.requests.append((method, url.path, query, self.headers.get("Content-Type", ""), body))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 401})
                    return
                parts = url.path.strip("/").split("/")
                dry = query.get("dryRun") == ["All"]
                if parts[:3] == ["api", "v1", "nodes"]:
                    if len(parts) == 3:
                        self._send(
                            200,
                            {
                                "apiVersion": "v1",
                                "kind": "NodeList",
                                "metadata": {},
                                "items": list(stub.nodes.values()),
                            },
                        )
                        return
                    name = parts[3]
                    if name not in stub.nodes:
                        self._send(
                            404,
                            {
                                "kind": "Status",
                                "apiVersion": "v1",
                                "status": "Failure",
                                "code": 404,
                                "reason": "NotFound",
                            },
                        )
                        return
                    if method == "PATCH":
                        updated = merge(stub.nodes[name], body)
                        if not dry:
                            stub.nodes[name] = updated
                        self._send(200, updated)
                        return
                    self._send(200, stub.nodes[name])
                    return
                if parts == ["api", "v1", "pods"]:
                    selector = query.get("fieldSelector", [""])[0]
                    host = selector.partition("spec.nodeName=")[2]
                    items = [p for p in stub.pods.values() if not host or p["spec"]["nodeName"] == host]
                    self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
                    return
                if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "pods":
                    key_value = query.get("labelSelector", [""])[0].partition("=")
                    items = [
                        p
                        for (ns, _), p in stub.pods.items()
                        if ns == parts[3]
                        and (not key_value[0] or p["metadata"]["labels"].get(key_value[0]) == key_value[2])
                    ]
                    self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
                    return
                if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "pods":
                    key = (parts[3], parts[5])
                    if key not in stub.pods:
                        self._send(
                            404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}
                        )
                        return
                    found = stub.pods[key]
                    if method == "DELETE" and not dry:
                        del stub.pods[key]
                    elif method == "PATCH" and not dry:
                        stub.pods[key] = merge(found, body)
                    self._send(200, found)
                    return
                self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})

            def do_GET(self) -> None:
                self._route("GET")

            def do_PATCH(self) -> None:
                self._route("PATCH")

            def do_DELETE(self) -> None:
                self._route("DELETE")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_kubeconfig(kubeconfig: Path, stub: FakeApiServer) -> Path:
    """A kubeconfig for the official client: the stub's URL and the token it wants."""
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [{"name": "stub", "cluster": {"server": stub.url}}],
                "users": [{"name": "remediator", "user": {"token": TOKEN}}],
                "contexts": [{"name": "test", "context": {"cluster": "stub", "user": "remediator"}}],
            }
        )
    )
    return kubeconfig


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, KubernetesBackend]]:
    stub = FakeApiServer()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", stub)
    backend = KubernetesBackend(KubernetesOptions(kubeconfig=str(kubeconfig), timeout=10))
    yield stub, backend
    stub.close()


def test_drain_is_cordon_taint_and_reason(api: tuple[FakeApiServer, KubernetesBackend]) -> None:
    """One merge patch cordons, adds our taint next to the existing ones, and records the reason."""
    stub, backend = api
    assert backend.node_count() == 3
    out = backend.drain("gpu-1", REASON_PREFIX + "Xid 79 on GPU 3", dry_run=False)
    assert out.ok, out.detail
    method, path, query, ctype, _body = stub.requests[-1]
    assert (method, path, ctype) == ("PATCH", "/api/v1/nodes/gpu-1", "application/merge-patch+json")
    assert "dryRun" not in query
    n = stub.nodes["gpu-1"]
    assert n["spec"]["unschedulable"] is True
    assert {t["key"] for t in n["spec"]["taints"]} == {"nvidia.com/gpu", "babysitter.dev/remediation"}
    assert n["metadata"]["annotations"] == {
        "keep": "me",
        "babysitter.dev/remediation-reason": "babysitter: Xid 79 on GPU 3",
    }
    assert backend.is_drained("gpu-1") is True and backend.is_drained("gpu-2") is False


def test_undrain_removes_only_ours(api: tuple[FakeApiServer, KubernetesBackend]) -> None:
    """Undrain removes our taint, cordon and annotation; a node cordoned by someone else is left alone."""
    stub, backend = api
    assert backend.drain("gpu-1", REASON_PREFIX + "x", dry_run=False).ok
    assert backend.undrain("gpu-1", REASON_PREFIX, dry_run=False).ok
    n = stub.nodes["gpu-1"]
    assert not n["spec"].get("unschedulable")
    assert [t["key"] for t in n["spec"]["taints"]] == ["nvidia.com/gpu"]
    assert n["metadata"]["annotations"] == {"keep": "me"}
    stub.nodes["gpu-2"]["spec"]["unschedulable"] = True  # an operator's cordon
    refused = backend.undrain("gpu-2", REASON_PREFIX, dry_run=False)
    assert refused.refused == "not_ours"
    assert stub.nodes["gpu-2"]["spec"]["unschedulable"] is True
    assert not [r for r in stub.requests if r[0] == "PATCH" and r[1].endswith("gpu-2")]


def test_requeue_deletes_only_controller_owned_pods(api: tuple[FakeApiServer, KubernetesBackend]) -> None:
    """Pods of a JobSet on the node are the jobs; a bare notebook pod is never touched."""
    stub, backend = api
    assert backend.jobs_on("gpu-1") == ["ml/llama-0"]
    assert backend.running(["ml/llama-0", "ml/llama-1"], "gpu-1") == ["ml/llama-0"]
    out = backend.requeue("ml/llama-0", "x", dry_run=False)
    assert out.ok, out.detail
    method, path, query, _, _ = stub.requests[-1]
    assert (method, path) == ("DELETE", "/api/v1/namespaces/ml/pods/llama-0")
    assert query.get("gracePeriodSeconds") == ["30"]
    assert ("ml", "llama-0") not in stub.pods and ("ml", "notebook") in stub.pods


def test_a_jobs_nodes_are_its_pods_and_its_jobsets_other_pods(
    api: tuple[FakeApiServer, KubernetesBackend],
) -> None:
    """What remediate checks a stall's culprit host against (hosts_from: culprit): the nodes of the
    run's pod and of the other pods of its JobSet; a pod without an owner label is only its own."""
    stub, backend = api
    assert backend.nodes_of(["ml/llama-0"]) == ["gpu-1", "gpu-2"]
    listed = [r for r in stub.requests if r[1] == "/api/v1/namespaces/ml/pods"]
    assert [r[2]["labelSelector"] for r in listed] == [[f"{JOBSET}=llama"]]
    assert backend.nodes_of(["ml/notebook"]) == ["gpu-1"]
    assert backend.nodes_of([]) == []
    with pytest.raises(BackendError, match="read pod ml/gone"):
        backend.nodes_of(["ml/gone"])


def test_dry_run_goes_to_the_server_with_dry_run_all(api: tuple[FakeApiServer, KubernetesBackend]) -> None:
    """A dry run is checked by the API server (dryRun=All) and persists nothing."""
    stub, backend = api
    assert backend.drain("gpu-3", REASON_PREFIX + "x", dry_run=True).ok
    assert backend.requeue("ml/llama-1", "x", dry_run=True).ok
    assert [r[2].get("dryRun") for r in stub.requests if r[0] in ("PATCH", "DELETE")] == [["All"], ["All"]]
    assert "unschedulable" not in stub.nodes["gpu-3"]["spec"] and ("ml", "llama-1") in stub.pods


def test_api_errors_are_failed_actions(api: tuple[FakeApiServer, KubernetesBackend]) -> None:
    """A missing node is a failed action with the HTTP status, never an exception."""
    _, backend = api
    out = backend.drain("gpu-9", REASON_PREFIX + "x", dry_run=False)
    assert not out.ok and "404" in out.detail
    out = backend.requeue("ml/gone", "x", dry_run=False)
    assert not out.ok and "404" in out.detail
