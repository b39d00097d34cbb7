"""The incident bundle of a real 4-rank gloo job (torchrun, CPU): a hang, the remediator, a crash.

1. The hang: rank 2 is stopped (SIGSTOP); the others wait in the step's all_reduce. The bundle holds
   the answers of ranks 0, 1 and 3 (every thread's stack, from inside each process, and the flight
   recorder), records rank 2 as not answering, names the all_reduce they wait in, copies the
   watchdog's hang dumps and the ledger's last records; ``babysitter incident show`` reads it back.
2. ``babysitter remediate``'s engine gathers the bundle of the stall page before it drains, within its
   wait, and every audit record of the alert names the bundle.
3. The crash: rank 1 raises; torchrun tears the job down. The bundle of the page that follows records
   the four ranks as not answering and holds rank 1's crash record: the exception and where.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from babysitter.incident.gather import Gatherer, Limits, Target, incident_id
from babysitter.incident.read import load_incident
from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.incidents import IncidentHook
from babysitter.remediate.policy import parse_policy
from node_helpers import wait_for
from remediate_helpers import RecordingBackend, payload

pytestmark = [pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "incident_train.py"
STEP = SCRIPT.parent / "sgd_step.py"
RUN, STOPPED, CRASHED = "incident", 2, 1
WAIT = 8.0  # seconds the ranks have to answer: a loaded 2-core machine answers within ~2


def _alert(name: str, fingerprint: str, **labels: str) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {"alertname": name, "cluster": "c1", "run": RUN, **labels},
        "annotations": {"summary": f"{name} of run {RUN}."},
        "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fingerprint,
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "babysitter", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun not installed")
    tmp = tmp_path_factory.mktemp("incident")
    run_dir, out = tmp / RUN, tmp / "out"
    run_dir.mkdir()
    out.mkdir()
    log = (tmp / "train.log").open("wb")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "200"}
    train = subprocess.Popen(
        [*torchrun, str(SCRIPT), str(run_dir), str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    state: dict[str, Any] = {"tmp": tmp, "run_dir": run_dir, "out": out, "train": train, "stopped": []}
    try:
        wait_for(lambda: all((out / f"rank{r}.json").exists() for r in range(4)), timeout=180, interval=0.5)
        state["pids"] = {r: json.loads((out / f"rank{r}.json").read_text())["pid"] for r in range(4)}
        # Steps go by (the ledger holds progress) before any fault.
        ledger = run_dir / "babysitter-ledger.jsonl"
        wait_for(lambda: ledger.exists() and b'"k":"prog"' in ledger.read_bytes(), timeout=60, interval=0.5)
        yield state
    finally:
        for pid in state["stopped"]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        (out / "stop").write_text("")
        with contextlib.suppress(OSError):
            os.killpg(train.pid, signal.SIGTERM)
        try:
            train.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(train.pid, signal.SIGKILL)
            train.wait(timeout=10)
        log.close()


def _modes(path: Path) -> set[tuple[str, int]]:
    """(kind, permission bits) of everything under ``path``, itself included."""
    found = {("d", stat.S_IMODE(path.stat().st_mode))}
    for item in path.rglob("*"):
        info = item.lstat()
        found.add(("d" if stat.S_ISDIR(info.st_mode) else "f", stat.S_IMODE(info.st_mode)))
    return found


def test_a_hang_bundle_holds_every_live_ranks_stacks_and_the_stuck_collective(job: Any) -> None:
    run_dir, pids = job["run_dir"], job["pids"]
    os.kill(pids[STOPPED], signal.SIGSTOP)
    job["stopped"].append(pids[STOPPED])
    # The others wait in the step's all_reduce: their watchdogs (hang_floor 3 s) write their dumps.
    wait_for(lambda: len(list((run_dir / "hangs").glob("hang-*.txt"))) >= 3, timeout=90, interval=0.5)
    identity = incident_id(time.time(), "00000000000000a1")
    alert = {"name": "TrainingStalled", "labels": {"alertname": "TrainingStalled", "run": RUN}}
    began = time.monotonic()
    [bundle] = Gatherer(Limits(wait=WAIT)).gather([Target(run_dir, RUN)], incident=identity, alert=alert)
    took = time.monotonic() - began
    print(f"hang bundle: {bundle.describe()} in {took:.1f} s")
    assert bundle.complete and bundle.error is None
    assert bundle.world_size == 4 and bundle.answered == [0, 1, 3] and bundle.missing == [STOPPED]
    assert WAIT <= took < WAIT + 30  # it waited for the stopped rank, and no longer than its deadline
    folder = run_dir / "incidents" / identity
    assert _modes(folder) <= {("d", 0o700), ("f", 0o600)}

    incident = load_incident(run_dir, identity)
    stuck = incident.summary.stuck
    assert stuck is not None and stuck["op"] == "all_reduce" and stuck["group"] == "0"
    assert stuck["waiting"] == [0, 1, 3] and stuck["unknown"] == [STOPPED]
    for rank in (0, 1, 3):
        answer = incident.answers[rank]
        assert answer["pid"] == pids[rank] and answer["seconds_since_last_step"] > 2
        main = next(t for t in answer["threads"] if t["main"])
        # Stopped inside the script's step's all_reduce, seen from inside the process: each frame on the
        # way there, with the line it runs.
        assert any(f["function"] == "all_reduce" for f in main["frames"]), main["frames"][-4:]
        assert any(f["file"] == str(SCRIPT) and "allreduce_sgd_step" in f["code"] for f in main["frames"])
        assert any(f["file"] == str(STEP) and "all_reduce" in f["code"] for f in main["frames"])
        assert any(t["name"] == "babysitter-incidents" for t in answer["threads"])
        groups = answer["flight"]["groups"]
        assert any(g["enqueued"] == stuck["seq"] == g["completed"] + 1 for g in groups.values()), groups
    assert len(incident.hangs) >= 3 and all(n.startswith("hangs/hang-incident-rank") for n in incident.hangs)
    assert any(r.get("k") == "start" for r in incident.ledger)

    shown = _cli("incident", "show", str(run_dir), identity)
    assert shown.returncode == 0, shown.stderr
    print(shown.stdout)
    assert f"rank {STOPPED} did not answer" in shown.stdout
    assert f"Stuck collective: all_reduce #{stuck['seq']} of group 0" in shown.stdout
    assert "waiting in it: ranks 0, 1, 3" in shown.stdout
    # The innermost frame of the user's own code (a helper module of the script's, outside torch).
    assert f"{STEP.name}:" in shown.stdout and "dist.all_reduce(flat)" in shown.stdout
    as_json = json.loads(_cli("incident", "show", str(run_dir), identity, "--json").stdout)
    assert as_json["missing"] == [STOPPED] and sorted(as_json["ranks"]) == ["0", "1", "3"]
    listed = _cli("incident", "list", str(run_dir))
    assert identity in listed.stdout and "3/4 ranks answered, not 2" in listed.stdout


def test_the_remediator_gathers_the_bundle_before_it_drains_and_names_it(job: Any) -> None:
    tmp, run_dir = job["tmp"], job["run_dir"]
    audit = tmp / "audit.jsonl"
    policy = parse_policy(
        {
            "backend": "slurm",
            "audit_log": str(audit),
            "rails": {
                "rate_limit": {"actions": 5, "window": "10m"},
                "drain_cap": {"fraction": 0.5, "window": "1h"},
            },
            "incidents": {"wait": f"{int(WAIT)}s"},
            "rules": [{"name": "stall", "match": {"alertname": "TrainingStalled"}, "actions": ["drain"]}],
        }
    )
    backend = RecordingBackend(["n1", "n2"])
    remediator = Remediator(policy, backend, AuditLog(audit), force_dry_run=True)
    remediator.incidents = IncidentHook(policy.incidents, run_dir=lambda run: run_dir if run == RUN else None)
    page = _alert("TrainingStalled", "00000000000000b2", instance="n2:9400")
    notification = parse_notification(payload(page))
    began = time.monotonic()
    remediator.handle(notification)
    took = time.monotonic() - began
    assert took < WAIT + 30
    assert backend.calls == [("drain", "n2", True)]
    identity = incident_id(notification.alerts[0].starts_at, "00000000000000b2")
    folder = run_dir / "incidents" / identity
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    gathered = [r for r in records if r["event"] == "incident"]
    assert len(gathered) == 1 and gathered[0]["bundles"][0]["path"] == str(folder)
    assert gathered[0]["bundles"][0]["missing"] == [STOPPED] and gathered[0]["bundles"][0]["answered"] == 3
    action = next(r for r in records if r["event"] == "action")
    assert action["incident"] == [str(folder)] and action["host"] == "n2"
    # The bundle came before the drain: its summary was written before the action's record.
    assert (folder / "bundle.json").stat().st_mtime <= action["t"]
    # Alertmanager re-sends the alert in its next notification: no second bundle, no second wait.
    began = time.monotonic()
    remediator.handle(parse_notification(payload(page)))
    assert time.monotonic() - began < WAIT
    assert len([r for r in map(json.loads, audit.read_text().splitlines()) if r["event"] == "incident"]) == 1


def test_a_crashed_rank_leaves_its_exception_in_the_bundle_of_the_page_that_follows(job: Any) -> None:
    run_dir, out, pids, train = job["run_dir"], job["out"], job["pids"], job["train"]
    for pid in job["stopped"]:
        os.kill(pid, signal.SIGCONT)
    job["stopped"].clear()
    time.sleep(2)  # the job steps again
    (out / f"crash{CRASHED}").write_text("")
    train.wait(timeout=120)  # torchrun tears every rank down once one fails
    identity = incident_id(time.time(), "00000000000000c3")
    alert = {"name": "TrainingProcessExited", "labels": {"alertname": "TrainingProcessExited"}}
    [bundle] = Gatherer(Limits(wait=3)).gather([Target(run_dir, RUN)], incident=identity, alert=alert)
    assert bundle.complete and bundle.world_size == 4
    assert bundle.answered == [] and bundle.missing == [0, 1, 2, 3]
    incident = load_incident(run_dir, identity)
    first = incident.crashes[0]
    assert first["rank"] == CRASHED and first["pid"] == pids[CRASHED]
    assert (
        first["type"] == "builtins.RuntimeError" and first["message"] == f"injected fault on rank {CRASHED}"
    )
    assert first["frames"][-1]["file"] == str(SCRIPT) and "raise RuntimeError" in first["frames"][-1]["code"]
    shown = _cli("incident", "show", str(run_dir), identity).stdout
    assert f"Crash: rank {CRASHED} (pid {pids[CRASHED]}" in shown and "injected fault" in shown
    assert "Ranks: 0 of 4 answered" in shown
