"""Promises the docs made that no test checked (issue 21, "not verified yet"), each checked here as the
docs state it, with real parts.

- docs/goodput.md, "One writer per run": a restart on another host after a crash writes within
  ``stale_after`` (60 s by default) of the crashed writer's last heartbeat: the shipped defaults,
  with the lock of a writer on another host name.
- the same section: a writer paused between its check and its write (SIGSTOP), whose lock is taken
  over meanwhile, wakes up (SIGCONT) fenced: nothing it writes afterwards counts, and it stops.
- docs/security.md, "The HTTP servers": HTTPS on the agent and the tracker with a certificate from a
  CA (openssl, no self-signed leaf): a real Prometheus scrapes the agent over TLS and refuses a
  certificate of another CA; the agent fetches an HTTPS tracker it can verify and refuses one it
  cannot; a tracker that requires client certificates refuses a client without one; the Prometheus
  client's deadline sockets speak TLS too.
- docs/remediate.md, "Backends": ``babysitter remediate`` itself (webhook, policy, rails, audit) drives
  the Kubernetes backend through the official client against a fake API server (cordon, taint and
  reason, delete of the controller-owned pod only, uncordon on resolve) and the script backend with
  a real program (drain, requeue, undrain, each with its JSON document).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import babysitter
from babysitter.catalog import node as N
from babysitter.ledger import LedgerWriter, read_ledger, summarize
from babysitter.ledger.records import Progress
from babysitter.node.agent import Agent, Server
from babysitter.node.config import ConfigError, add_arguments, load_config
from babysitter.node.daemon import build
from babysitter.node.workloads.trainers import TrainersCollector
from babysitter.prom.deadline import open_until, tls_context
from node_helpers import scrape, wait_for
from promkit import PrometheusServer
from remediate_helpers import alert, payload
from test_ledger_lock import LEDGER, _other_host_lock, _state

TOKEN = "promise-token-0123456789abcdef"  # noqa: S105 - a test token


# ------------------------------------------------------------------------------------ the ledger lock


def test_a_restart_on_another_host_writes_within_60_s_of_the_crash(tmp_path: Path) -> None:
    """With the shipped defaults (heartbeat 10 s, stale_after 60 s): another host's writer crashed 57 s
    after its last heartbeat; the restarted writer waits (its records kept), then takes the lock and
    writes everything once the heartbeat is 60 s old, a few seconds later, not a retry period more."""
    lock = tmp_path / (LEDGER + ".lock")
    _other_host_lock(lock, age=57.0)
    crashed_at = time.time() - 57.0
    w = LedgerWriter(tmp_path, run="r")
    try:
        assert w.wait_loaded(10)
        w.incarnation_start(time=time.time(), info={})
        w.progress(boundaries=[(1, time.time())], data_wait_seconds=0.0, model_flops=0.0, peak_flops=None)
        wait_for(lambda: _state(w) == "waiting", timeout=5)
        wait_for(
            lambda: (tmp_path / LEDGER).exists() and len(read_ledger(tmp_path / LEDGER).records) >= 2, 15
        )
        written_at = time.time()
        assert json.loads(lock.read_text())["host"] == socket.gethostname()  # the lock is ours now
    finally:
        w.close(time=time.time(), clean=True)
    assert 60.0 <= written_at - crashed_at < 60.0 + 3.0  # stale_after, plus the 1 s retry and a flush


_PAUSED_WRITER = textwrap.dedent(
    """
    import socket, sys, time
    from pathlib import Path
    socket.gethostname = lambda: "host-a"  # this writer runs on another host than the test
    from babysitter.ledger import LedgerWriter
    w = LedgerWriter(Path(sys.argv[1]), run="r", flush_interval=0.02, heartbeat_interval=0.1)
    assert w.wait_loaded(10)
    w.incarnation_start(time=time.time(), info={})
    for k in range(1, 4):
        w.progress(boundaries=[(k, time.time())], data_wait_seconds=0.0, model_flops=0.0, peak_flops=None)
    time.sleep(0.5)
    print("written", flush=True)
    sys.stdin.readline()  # the test stops us here, takes the lock over, and resumes us
    for k in range(1000, 1040):
        w.progress(boundaries=[(k, time.time())], data_wait_seconds=0.0, model_flops=0.0, peak_flops=None)
        time.sleep(0.02)
    time.sleep(0.5)
    state = [s.labels["state"] for f in w.metrics(["run"], ["r"], time.time()) for s in f.samples
             if s.name == "babysitter_ledger_writer_state" and s.value == 1]
    print("state", *state, flush=True)
    w.close(time=time.time(), clean=True)
    """
)


def test_a_paused_writer_that_wakes_up_after_a_takeover_is_fenced(tmp_path: Path) -> None:
    """Writer A (another host) is stopped with SIGSTOP; B judges its lock stale and takes it over; A is
    resumed with SIGCONT and writes 40 more steps: none of them lands in the run (readers drop what A
    wrote after B's start, or A never writes it), and A reports itself fenced and stops."""
    a = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_WRITER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    b: LedgerWriter | None = None
    try:
        assert a.stdout is not None and a.stdin is not None
        assert a.stdout.readline().strip() == "written", a.stderr.read() if a.stderr else ""
        os.kill(a.pid, signal.SIGSTOP)
        a.stdin.write("go\n")
        a.stdin.flush()
        time.sleep(1.2)  # A's last heartbeat is now older than B's stale_after
        b = LedgerWriter(tmp_path, run="r", flush_interval=0.02, heartbeat_interval=0.1, stale_after=1.0)
        assert b.wait_loaded(10)
        b.incarnation_start(time=time.time(), info={})
        for k in range(4, 10):
            b.progress(boundaries=[(k, time.time())], data_wait_seconds=0.0, model_flops=0.0, peak_flops=None)
        wait_for(lambda: _state(b) == "writing", timeout=10)  # type: ignore[arg-type]
        b.flush()
        os.kill(a.pid, signal.SIGCONT)
        out, err = a.communicate(timeout=30)
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            a.wait()
        if b is not None:
            b.close(time=time.time(), clean=True)
    assert a.returncode == 0, err[-2000:]
    assert "state fenced" in out, out
    summary = summarize(tmp_path)
    steps = [s for r in read_ledger(tmp_path / LEDGER).records if isinstance(r, Progress) for s in r.steps]
    counted = [s for inc in summary.timeline.incarnations for s in inc.steps]
    assert not [s for s in counted if s >= 1000], "a fenced writer's steps were counted"
    assert list(summary.timeline.incarnations[-1].steps) == list(range(4, 10))
    if any(s >= 1000 for s in steps):  # a line A wrote between its check and its write: dropped, counted
        assert summary.fenced_lines > 0


# ------------------------------------------------------------------------------------ TLS


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "1", "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d,
    )  # fmt: skip


def _leaf(d: Path, name: str, ca: str) -> None:
    (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d,
    )  # fmt: skip


@pytest.fixture(scope="module", name="pki")
def _pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: no certificates to test TLS with")
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "evil")
    _leaf(d, "server", "ca")
    _leaf(d, "client", "ca")
    _leaf(d, "impostor", "evil")
    return d


@pytest.fixture(name="tls_tracker")
def _tls_tracker(pki: Path, tmp_path: Path) -> Iterator[babysitter.Tracker]:
    tls = babysitter.TLSConfig(str(pki / "server.pem"), str(pki / "server.key"))
    tracker = babysitter.watch(
        port=0,
        tls=tls,
        registry_dir=tmp_path / "reg",
        ledger=False,
        hang_timeout=None,
        run="tls",
        peak_flops=1e12,
    )
    tracker.step(tokens=4)
    yield tracker
    tracker.close()


def test_tls_agent_scraped_by_prometheus_and_https_tracker_fetched_by_the_agent(
    pki: Path, tmp_path: Path, tls_tracker: babysitter.Tracker
) -> None:
    """The tracker serves HTTPS; the agent fetches it, verifying it against the CA (and refuses it as
    tls without the CA); the agent serves HTTPS, a real Prometheus scrapes it with the CA (up 1, the
    tracker's series through it) and refuses it with another CA (up 0)."""
    assert tls_tracker.metrics_url is not None and tls_tracker.metrics_url.startswith("https://127.0.0.1:")
    reg = tmp_path / "reg"
    verifying = TrainersCollector(reg, timeout=5.0, ca_file=str(pki / "ca.pem"))
    blind = TrainersCollector(reg, timeout=5.0)  # the system's CAs: the test CA is not one of them
    assert scrape(verifying).value("babysitter_trainer_scrape_success", run="tls") == 1
    refused = scrape(blind)
    assert refused.value("babysitter_trainer_scrape_success", run="tls") == 0
    assert refused.value("babysitter_trainer_scrape_errors_total", run="tls", reason="tls") == 1

    agent = Agent([verifying], collector_timeout=10.0)
    server = Server.start(
        agent, "127.0.0.1", 0, certfile=str(pki / "server.pem"), keyfile=str(pki / "server.key")
    )
    jobs = [
        {
            "job_name": name,
            "scheme": "https",
            "tls_config": {"ca_file": str(pki / ca)},
            "static_configs": [{"targets": [server.address]}],
        }
        for name, ca in (("good-ca", "ca.pem"), ("other-ca", "evil.pem"))
    ]
    try:
        with PrometheusServer(tmp_path, extra_scrape_configs=jobs) as prom:
            prom.wait_for('up{job="good-ca"} == 1')
            prom.wait_for('up{job="other-ca"} == 0')
            assert prom.wait_for('train_steps_total{job="good-ca", run="tls"}')
            assert prom.query('train_steps_total{job="other-ca"}') == []
            # ...and the Prometheus client's deadline sockets over TLS: verified, and refused without the CA.
            status, body = open_until(
                urllib.request.Request(server.url),  # noqa: S310 - https, loopback
                10.0,
                max_bytes=1 << 20,
                context=tls_context(str(pki / "ca.pem")),
            )
            assert status == 200 and b"train_steps_total" in body
            with pytest.raises(urllib.error.URLError) as refused_tls:
                open_until(urllib.request.Request(server.url), 10.0, max_bytes=1 << 20)  # noqa: S310 - https
            assert isinstance(refused_tls.value.reason, ssl.SSLCertVerificationError)
    finally:
        server.stop()
        agent.close()


def test_a_tracker_that_requires_client_certificates_refuses_others(pki: Path, tmp_path: Path) -> None:
    """TLSConfig(client_cafile=...): a client with a certificate of the CA is served; one without a
    certificate, or with another CA's, is refused in the handshake."""
    tls = babysitter.TLSConfig(
        str(pki / "server.pem"), str(pki / "server.key"), client_cafile=str(pki / "ca.pem")
    )
    tracker = babysitter.watch(
        port=0,
        tls=tls,
        registry_dir=tmp_path / "reg",
        ledger=False,
        hang_timeout=None,
        run="mtls",
        peak_flops=1e12,
    )
    try:
        url = tracker.metrics_url
        assert url is not None

        def get(cert: str | None) -> bytes:
            context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
            if cert is not None:
                context.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
            with urllib.request.urlopen(url, timeout=10, context=context) as response:  # noqa: S310 - loopback
                return bytes(response.read())

        assert b"train_steps_total" in get("client")
        for cert in (None, "impostor"):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                get(cert)
        # The node agent, built from its flags: with a client certificate of the CA it fetches the
        # tracker; without one, or with another CA's, the fetch fails as tls.
        agents = {}
        for cert in ("client", None, "impostor"):
            flags = ["--simulate", "1", "--registry-dir", str(tmp_path / "reg"), "--kmsg-path", ""]
            flags += ["--trainer-ca-file", str(pki / "ca.pem")]
            if cert is not None:
                flags += ["--trainer-cert-file", str(pki / f"{cert}.pem")]
                flags += ["--trainer-key-file", str(pki / f"{cert}.key")]
            parser = argparse.ArgumentParser()
            add_arguments(parser)
            agents[cert] = build(load_config(parser.parse_args(flags), environ={}))
        try:
            tracker.step()
            got = {cert: scrape(built.agent) for cert, built in agents.items()}
        finally:
            for built in agents.values():
                built.close()
        assert got["client"].value(N.TRAINER_SCRAPE_SUCCESS.name, run="mtls") == 1
        assert got["client"].value("train_steps_total", run="mtls", rank="0") == 1
        for cert in (None, "impostor"):
            assert got[cert].value(N.TRAINER_SCRAPE_SUCCESS.name, run="mtls") == 0, cert
            assert got[cert].value(N.TRAINER_SCRAPE_ERRORS.name, run="mtls", reason="tls") == 1, cert
    finally:
        tracker.close()


def test_a_trainer_client_certificate_needs_its_key_and_must_load(pki: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ConfigError, match="--trainer-key-file"):
        load_config(parser.parse_args(["--trainer-cert-file", str(pki / "client.pem")]), environ={})
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    flags = ["--simulate", "1", "--kmsg-path", "", "--trainer-cert-file", str(garbage)]
    flags += ["--trainer-key-file", str(pki / "client.key")]
    with pytest.raises(ValueError, match="cannot load trainer client certificate"):
        build(load_config(parser.parse_args(flags), environ={}))


# ------------------------------------------------------------------------------------ remediate backends


def _serve_remediate(
    tmp: Path, policy: dict[str, object], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    (tmp / "policy.json").write_text(json.dumps(policy))
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    port_file = tmp / "remediate.addr"
    argv = [sys.executable, "-m", "babysitter", "remediate", "--policy", str(tmp / "policy.json")]
    argv += ["--listen-address", "127.0.0.1:0", "--port-file", str(port_file), "--token-file", str(token)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=(tmp / "remediate.log").open("wb"), env=env
    )
    wait_for(lambda: (port_file.exists() and port_file.read_text().strip()) or proc.poll() is not None, 30)
    assert proc.poll() is None, (tmp / "remediate.log").read_text()[-2000:]
    return proc, f"http://{port_file.read_text().strip()}/alerts"


def _post(url: str, body: dict[str, object], token: str | None = TOKEN) -> int:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


_RAILS = {"rate_limit": {"actions": 10, "window": "10m"}, "drain_cap": {"fraction": 0.5, "window": "1h"}}


def test_remediate_drives_kubernetes_through_the_official_client(tmp_path: Path) -> None:
    """An Xid page for gpu-1: one PATCH cordons, taints and records the reason, one DELETE removes the
    JobSet's pod there (not the notebook, which nothing would recreate); its resolve uncordons. A
    request without the token changes nothing."""
    pytest.importorskip("kubernetes", reason="the k8s extra (the official client)")
    from test_remediate_k8s import FakeApiServer, write_kubeconfig

    stub = FakeApiServer()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", stub)
    policy = {
        "backend": "kubernetes",
        "kubernetes": {"kubeconfig": str(kubeconfig), "timeout": "10s"},
        "audit_log": str(tmp_path / "audit.jsonl"),
        "rails": _RAILS,
        "hosts": {"label": "node"},
        "rules": [
            {
                "match": {"alertname": "GpuXidCritical"},
                "actions": ["drain", "requeue"],
                "reason": "Xid {xid}",
                "undrain_on_resolve": True,
            }
        ],
    }
    proc, url = _serve_remediate(tmp_path, policy)
    firing = alert("GpuXidCritical", fingerprint="beef", node="gpu-1", xid="79")
    try:
        assert _post(url, payload(firing), token=None) == 401
        assert _post(url, payload(firing)) == 200
        wait_for(lambda: ("ml", "llama-0") not in stub.pods, 30)
        assert _post(url, payload({**firing, "status": "resolved"})) == 200
        wait_for(lambda: not stub.nodes["gpu-1"].get("spec", {}).get("unschedulable"), 30)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        stub.close()
    changes = [(m, p) for m, p, _q, _c, _b in stub.requests if m in ("PATCH", "DELETE")]
    assert changes == [
        ("PATCH", "/api/v1/nodes/gpu-1"),
        ("DELETE", "/api/v1/namespaces/ml/pods/llama-0"),
        ("PATCH", "/api/v1/nodes/gpu-1"),
    ]
    drain = next(b for m, _p, _q, _c, b in stub.requests if m == "PATCH")
    assert drain["spec"]["unschedulable"] is True
    assert any(t["key"] == "babysitter.dev/remediation" for t in drain["spec"]["taints"])
    assert ("ml", "notebook") in stub.pods and ("ml", "llama-1") in stub.pods
    assert all(
        t["key"] != "babysitter.dev/remediation" for t in stub.nodes["gpu-1"]["spec"].get("taints") or []
    )


def test_remediate_drives_a_script_with_the_documented_json(tmp_path: Path) -> None:
    """The script backend through the receiver: drain and requeue for the page (the job from the alert),
    undrain for its resolve, each one run of the program with the action and the JSON document."""
    log = tmp_path / "calls.jsonl"
    hook = tmp_path / "hook.py"
    hook.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], 'doc': json.load(sys.stdin)}}) + '\\n')\n"
    )
    hook.chmod(0o755)
    policy = {
        "backend": "script",
        "script": {"path": str(hook)},
        "audit_log": str(tmp_path / "audit.jsonl"),
        "rails": {**_RAILS, "drain_cap": {"fraction": 0.5, "window": "1h", "cluster_nodes": 8}},
        "jobs": {"labels": ["slurm_job"]},
        "rules": [
            {
                "match": {"alertname": "GpuDown"},
                "actions": ["drain", "requeue"],
                "reason": "GPU {gpu} lost",
                "undrain_on_resolve": True,
            }
        ],
    }
    proc, url = _serve_remediate(tmp_path, policy)
    firing = alert("GpuDown", fingerprint="cafe", instance="n7:9400", gpu="3", slurm_job="4242")
    try:
        assert _post(url, payload(firing)) == 200
        wait_for(lambda: log.exists() and len(log.read_text().splitlines()) == 2, 30)
        assert _post(url, payload({**firing, "status": "resolved"})) == 200
        wait_for(lambda: len(log.read_text().splitlines()) == 3, 30)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c["argv"], c["doc"]["host"], c["doc"]["job"]) for c in calls] == [
        (["drain"], "n7", None),
        (["requeue"], None, "4242"),
        (["undrain"], "n7", None),
    ]
    assert calls[0]["doc"]["reason"] == "babysitter: GPU 3 lost" == calls[2]["doc"]["reason"]
    assert (
        calls[0]["doc"]["alert"]["labels"]["alertname"] == "GpuDown" and calls[0]["doc"]["dry_run"] is False
    )
