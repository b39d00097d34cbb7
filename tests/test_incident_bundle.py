"""The incident bundle's bounds and its safety, without a distributed job (tests/test_incident_torchrun.py
has the real one): how many bundles, how big a rank's answer, what a rank answers, links planted in the
run directory, the owner of what a root gatherer writes, the policy section, the remediator's hook and
the command line's errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import babysitter
from babysitter.incident.gather import Gatherer, Limits, MiB, Target, incident_id
from babysitter.incident.read import load_incident
from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.incidents import IncidentHook
from babysitter.remediate.policy import PolicyError, parse_policy
from babysitter.training import incident_files as F
from babysitter.training.crash import KEEP, write_record
from babysitter.training.incidents import MAX_PER_PASS, IncidentResponder, _fit
from babysitter.training.tracker import Tracker
from remediate_helpers import RecordingBackend, payload

RUN = "bounds"
RESERVE = 4 * MiB  # what a bundle keeps for all but the ranks' answers (gather._RESERVE)


@pytest.fixture
def tracker(tmp_path: Path) -> Iterator[Tracker]:
    """A rank with a run directory whose requests only the test answers (no responder thread)."""
    t = babysitter.watch(
        run=RUN, port=-1, run_dir=tmp_path / RUN, hang_timeout=None, flush_interval=0.1, incidents=False
    )
    for _ in range(3):
        t.step(tokens=1)
    t.housekeep()  # the ledger's start record (world size 1) is on disk
    yield t
    t.close()


def _ask(
    run_dir: Path, incident: str, *, run: str = RUN, created: float | None = None, ttl: float = 30
) -> None:
    """A request as a gatherer leaves it (built aside, renamed into place)."""
    top = run_dir / F.INCIDENTS
    top.mkdir(mode=0o700, exist_ok=True)
    tmp = top / f".{incident}.tmp"
    (tmp / F.RANKS).mkdir(parents=True)
    now = time.time() if created is None else created
    request = {"v": 1, "id": incident, "run": run, "created": now, "deadline": now + ttl, "rank_bytes": 65536}
    (tmp / F.REQUEST).write_text(json.dumps(request))
    tmp.rename(top / incident)


def _ids(n: int, start: float = 1.7e9) -> list[str]:
    return [incident_id(start + 60 * i, f"{i:016x}") for i in range(n)]


def _answering(responder: IncidentResponder, done: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not done.is_set():
            responder.poll()
            time.sleep(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


# ------------------------------------------------------------------------------------------ bounds


def test_only_the_newest_bundles_are_kept(tmp_path: Path) -> None:
    gatherer = Gatherer(Limits(wait=1, max_incidents=3))
    ids = _ids(5)
    for incident in ids:
        [bundle] = gatherer.gather(
            [Target(tmp_path, None)], incident=incident, alert={"name": "GpuXidCritical"}
        )
        assert bundle.complete and bundle.error is None
    assert F.list_ids(tmp_path / F.INCIDENTS) == ids[-3:]
    # A build its gatherer left behind goes after an hour; one under way stays.
    top = tmp_path / F.INCIDENTS
    (top / ".old.1.tmp").mkdir()
    os.utime(top / ".old.1.tmp", (time.time() - 7200, time.time() - 7200))
    (top / ".new.2.tmp").mkdir()
    gatherer.gather([Target(tmp_path, None)], incident=_ids(6)[-1], alert=None)
    assert not (top / ".old.1.tmp").exists() and (top / ".new.2.tmp").exists()
    assert len(F.list_ids(top)) == 3


def test_a_ranks_answer_is_cut_to_its_share_of_the_bundle(tracker: Tracker, tmp_path: Path) -> None:
    run_dir = tmp_path / RUN
    share = 16 * 1024
    # A big flight recorder (2,000 entries) and ten threads deep in recursion: far more than the share.
    entries = [
        {
            "record_id": i,
            "pg_id": 0,
            "process_group": ["0", "default_pg"],
            "collective_seq_id": i,
            "profiling_name": "gloo:all_reduce",
            "time_created_ns": 1_700_000_000_000_000_000 + i,
            "input_sizes": [[1024]],
            "retired": True,
        }
        for i in range(2000)
    ]
    dump = json.dumps(
        {
            "pg_status": {"0": {"last_enqueued_collective": 1999, "last_completed_collective": 1999}},
            "entries": entries,
        }
    )
    responder = IncidentResponder(tracker, run_dir, flight_api={"generic": lambda _e, _a: dump})
    release = threading.Event()

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        else:
            release.wait(30)

    threads = [threading.Thread(target=deep, args=(40,), daemon=True) for _ in range(10)]
    for thread in threads:
        thread.start()
    done = threading.Event()
    _answering(responder, done)
    try:
        whole = _fit(dict(responder._capture_now()), 1 << 30)
        assert len(whole) > 3 * share  # uncut, it would not fit
        limits = Limits(wait=10, max_bytes=RESERVE + share)
        [bundle] = Gatherer(limits).gather([Target(run_dir, RUN)], incident=_ids(1)[0], alert=None)
    finally:
        done.set()
        release.set()
    assert bundle.answered == [0] and bundle.missing == []
    answer_file = bundle.path / F.RANKS / "rank0.json"
    answer = json.loads(answer_file.read_text())
    assert answer_file.stat().st_size <= share and answer["truncated"] is True
    main = next(t for t in answer["threads"] if t["main"])
    assert main["frames"], "the training thread's innermost frames are what is kept longest"
    assert bundle.bytes <= limits.max_bytes


def test_a_rank_answers_only_its_runs_open_requests_a_few_per_pass_from_one_capture(
    tracker: Tracker, tmp_path: Path
) -> None:
    run_dir = tmp_path / RUN
    responder = IncidentResponder(tracker, run_dir, flight_api={})
    old, foreign, expired, *fresh = _ids(4 + 2 * MAX_PER_PASS, start=time.time() - 3600)
    _ask(run_dir, old, created=time.time() - 3600, ttl=7200)  # history, not a question
    _ask(run_dir, foreign, run="someone-else")
    _ask(run_dir, expired, ttl=-1)
    bad = fresh.pop()
    (run_dir / F.INCIDENTS / bad / F.RANKS).mkdir(parents=True)
    (run_dir / F.INCIDENTS / bad / F.REQUEST).write_text("[1, 2")
    for incident in fresh:
        _ask(run_dir, incident)
    assert responder.poll() == MAX_PER_PASS
    assert responder.poll() == len(fresh) - MAX_PER_PASS
    assert responder.poll() == 0
    answered = {p.parent.parent.name for p in (run_dir / F.INCIDENTS).glob("*/ranks/rank0.json")}
    assert answered == set(fresh)
    assert responder.captures == 1  # one capture answered them all (within REUSE seconds)
    # The malformed request is skipped and counted (babysitter_internal_errors_total), never raised.
    assert tracker.errors.counts().get("incident_answer", 0) == 1


# ------------------------------------------------------------------------------------------ links


def test_links_planted_in_the_run_directory_are_never_followed(tracker: Tracker, tmp_path: Path) -> None:
    run_dir = tmp_path / RUN
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "hang-x.txt").write_text("SECRET")
    # incidents/ itself a link: nothing is written through it.
    (run_dir / F.INCIDENTS).symlink_to(secret)
    [bundle] = Gatherer(Limits(wait=1)).gather([Target(run_dir, RUN)], incident=_ids(1)[0], alert=None)
    assert bundle.error is not None and not bundle.complete
    assert sorted(p.name for p in secret.iterdir()) == ["hang-x.txt"]
    (run_dir / F.INCIDENTS).unlink()
    # hangs/ a link to a directory, and a hang dump that is a link: neither is copied.
    (run_dir / "hangs").symlink_to(secret)
    [bundle] = Gatherer(Limits(wait=1)).gather([Target(run_dir, RUN)], incident=_ids(2)[1], alert=None)
    assert bundle.complete and not (bundle.path / "hangs").exists()
    (run_dir / "hangs").unlink()
    (run_dir / "hangs").mkdir()
    (run_dir / "hangs" / "hang-link.txt").symlink_to(secret / "hang-x.txt")
    # A rank file that is a link to a secret, and one far over the share: neither is read.
    incident = _ids(3)[2]
    planted = threading.Event()

    def plant() -> None:
        ranks = run_dir / F.INCIDENTS / incident / F.RANKS
        deadline = time.monotonic() + 10
        while not ranks.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        (ranks / "rank0.json").symlink_to(secret / "hang-x.txt")
        (ranks / "rank1.json").write_bytes(b" " * (5 * MiB))
        planted.set()

    threading.Thread(target=plant, daemon=True).start()
    [bundle] = Gatherer(Limits(wait=2)).gather([Target(run_dir, RUN)], incident=incident, alert=None)
    assert planted.is_set() and bundle.complete
    assert not (bundle.path / "hangs").exists()
    every = b"".join(p.read_bytes() for p in bundle.path.rglob("*") if p.is_file() and not p.is_symlink())
    assert b"SECRET" not in every
    summary = json.loads((bundle.path / F.BUNDLE).read_text())
    assert any("rank 0's answer is not usable" in n for n in summary["notes"])
    assert any("rank 1's answer is not usable" in n for n in summary["notes"])
    assert summary["stuck"] is None


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files away")
def test_a_root_gatherer_gives_the_bundle_to_the_runs_owner(tmp_path: Path) -> None:
    run_dir = tmp_path / "owned"
    run_dir.mkdir()
    os.chown(run_dir, 65534, 65534)
    [bundle] = Gatherer(Limits(wait=1)).gather([Target(run_dir, "owned")], incident=_ids(1)[0], alert={})
    assert bundle.complete
    owned = [run_dir / F.INCIDENTS, *(run_dir / F.INCIDENTS).rglob("*")]
    assert {(p.stat().st_uid, p.stat().st_gid) for p in owned} == {(65534, 65534)}
    assert {stat.S_IMODE(p.stat().st_mode) for p in owned} <= {0o700, 0o600}


# ------------------------------------------------------------------------------------------ crash


def test_crash_records_are_kept_and_bounded(tracker: Tracker, tmp_path: Path) -> None:
    run_dir = tmp_path / RUN
    try:
        raise ValueError("bad batch")
    except ValueError as exc:
        path = write_record(tracker, run_dir, ValueError, exc, exc.__traceback__)
    assert path is not None
    record = json.loads(path.read_text())
    assert record["type"] == "builtins.ValueError" and record["message"] == "bad batch"
    assert record["frames"][-1]["function"] == "test_crash_records_are_kept_and_bounded"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    folder = path.parent
    for i in range(KEEP + 5):
        (folder / f"rank9-pid{i}-x.json").write_text("{}")
        os.utime(folder / f"rank9-pid{i}-x.json", (1e9 + i, 1e9 + i))
    try:
        raise ValueError("again")
    except ValueError as exc:
        write_record(tracker, run_dir, ValueError, exc, exc.__traceback__)
    assert len(list(folder.iterdir())) == KEEP


# ------------------------------------------------------------------------------------------ policy


def _policy(tmp_path: Path, **extra: Any) -> Any:
    return parse_policy(
        {
            "backend": "slurm",
            "audit_log": str(tmp_path / "audit.jsonl"),
            "rails": {
                "rate_limit": {"actions": 5, "window": "10m"},
                "drain_cap": {"fraction": 0.5, "window": "1h"},
            },
            "rules": [{"name": "xid", "match": {"alertname": "GpuXidCritical"}, "actions": ["drain"]}],
            **extra,
        }
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"wiat": "5s"}, "incidents: unknown key(s) wiat"),
        ({"wait": "10m"}, "incidents.wait: at most 5m"),
        ({"max_mb": 1}, "incidents.max_mb: expected an integer >= 5"),
        ({"alerts": ["("]}, "incidents.alerts[0]: bad regular expression"),
    ],
)
def test_a_bad_incidents_section_is_refused_naming_its_key(
    tmp_path: Path, section: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        _policy(tmp_path, incidents=section)


def test_the_remediator_gathers_for_listed_alerts_without_a_rule_and_acts_when_gathering_fails(
    tmp_path: Path,
) -> None:
    """An alert no rule acts on gets its bundle on the hook's own thread: the deciding thread does not
    wait for ranks that never answer (a run of two ranks, none alive, a 4 s wait)."""
    runs = tmp_path / "runs"
    run_dir = runs / "r2"
    run_dir.mkdir(parents=True)
    start = {"v": 2, "k": "start", "t": 1, "pst": 1, "id": "abcd", "host": "n1", "pid": 1, "run": "r2"}
    (run_dir / "babysitter-ledger.jsonl").write_text(json.dumps({**start, "info": {"world_size": 2}}) + "\n")
    policy = _policy(tmp_path, incidents={"wait": "4s"})
    backend = RecordingBackend(["n1"])
    remediator = Remediator(policy, backend, AuditLog(policy.audit_log), force_dry_run=True)
    remediator.incidents = IncidentHook(
        policy.incidents, run_dir=lambda run: runs / run if run == "r2" else None
    )
    alert = {
        "status": "firing",
        "labels": {"alertname": "TrainingStalled", "run": "r2"},
        "annotations": {"summary": "no step for 5m"},
        "startsAt": "2026-01-01T12:00:00Z",
        "fingerprint": "0123456789abcdef",
    }
    began = time.monotonic()
    remediator.handle(parse_notification(payload(alert)))
    remediator.handle(parse_notification(payload(alert)))  # re-sent while it is gathered: once
    assert time.monotonic() - began < 3  # not the 4 s the ranks are given
    identity = "20260101T120000Z-0123456789abcdef"
    summary = run_dir / F.INCIDENTS / identity / F.BUNDLE
    deadline = time.monotonic() + 30
    while not (summary.exists() and policy.audit_log.exists()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert json.loads(summary.read_text())["missing"] == [0, 1]
    assert backend.calls == []  # no rule: evidence only
    resolved = {**alert, "status": "resolved", "fingerprint": "fedcba9876543210"}
    remediator.handle(parse_notification(payload(resolved)))
    assert F.list_ids(run_dir / F.INCIDENTS) == [identity]

    class Broken(IncidentHook):
        def gather(self, alert: Any) -> Any:
            raise OSError("disk full")

    remediator.incidents = Broken(policy.incidents, run_dir=lambda _run: None)
    xid = {**alert, "labels": {"alertname": "GpuXidCritical", "instance": "n1:9400", "xid": "79"}}
    remediator.handle(parse_notification(payload(xid)))
    assert backend.calls == [("drain", "n1", True)]  # evidence is worth a wait, never a missed action
    records = [json.loads(line) for line in policy.audit_log.read_text().splitlines()]
    assert [r["event"] for r in records] == ["incident", "incident", "action"]
    assert records[0]["bundles"][0]["missing"] == [0, 1]
    assert records[1]["detail"] == "OSError: disk full" and "incident" not in records[2]


# ------------------------------------------------------------------------------------------ the CLI


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "babysitter", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_cli_says_what_is_wrong_without_a_traceback(tmp_path: Path) -> None:
    gatherer = Gatherer(Limits(wait=1))
    ids = _ids(2)
    for incident in ids:
        gatherer.gather([Target(tmp_path, None)], incident=incident, alert={"name": "GpuDown\x1b[2J"})
    bad = _cli("incident", "show", str(tmp_path), "../../etc")
    assert bad.returncode == 2 and "is not an incident id" in bad.stderr and "Traceback" not in bad.stderr
    unknown = _cli("incident", "show", str(tmp_path), _ids(3)[2])
    assert unknown.returncode == 2 and f"newest: {ids[0]}, {ids[1]}" in unknown.stderr
    nodir = _cli("incident", "list", str(tmp_path / "nope"))
    assert nodir.returncode == 2 and "is not a directory" in nodir.stderr
    listed = _cli("incident", "list", str(tmp_path))
    assert listed.returncode == 0 and "\x1b" not in listed.stdout and "GpuDown[2J" in listed.stdout
    as_json = json.loads(_cli("incident", "list", str(tmp_path), "--json").stdout)
    assert [item["id"] for item in as_json] == ids
    shown = json.loads(_cli("incident", "show", str(tmp_path), ids[1], "--json").stdout)
    assert shown["complete"] is True and shown["run"] is None


def test_collect_gathers_a_bundle_by_hand(tmp_path: Path) -> None:
    run_dir = tmp_path / "byhand"
    script = (
        "import time, babysitter, sys\n"
        f"t = babysitter.watch(run='byhand', port=-1, run_dir={str(run_dir)!r}, hang_timeout=None)\n"
        "t.step(tokens=1); print('ready', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        done = _cli("incident", "collect", str(run_dir), "--wait", "20", "--json")
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["answered"] == 1 and result["missing"] == [] and result["complete"] is True
        incident = load_incident(run_dir, result["id"])
        assert incident.answers[0]["pid"] == proc.pid
    finally:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def test_a_world_too_large_for_the_bundle_stops_at_its_size(tmp_path: Path) -> None:
    """At the smallest share a rank may have, 16,384 ranks would overrun any bundle: once the ranks'
    part is used, further answers are dropped (deleted, noted), and the bundle stays within its size."""
    run_dir = tmp_path / "huge"
    run_dir.mkdir()
    start = {"v": 2, "k": "start", "t": 1, "pst": 1, "id": "abcd", "host": "h", "pid": 1, "run": "huge"}
    (run_dir / "babysitter-ledger.jsonl").write_text(
        json.dumps({**start, "info": {"world_size": 16384}}) + "\n"
    )
    incident = _ids(1)[0]
    ranks_part = 40 * 1024
    limits = Limits(wait=3, max_bytes=RESERVE + ranks_part)

    def answer_all() -> None:
        ranks = run_dir / F.INCIDENTS / incident / F.RANKS
        deadline = time.monotonic() + 10
        while not ranks.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        request = json.loads((ranks.parent / F.REQUEST).read_text())
        assert request["rank_bytes"] == 8 * 1024  # the smallest share
        for rank in range(12):
            body = {"rank": rank, "world_size": 16384, "pad": "x" * (7 * 1024)}
            (ranks / f"rank{rank}.json").write_text(json.dumps(body))

    threading.Thread(target=answer_all, daemon=True).start()
    [bundle] = Gatherer(limits).gather([Target(run_dir, "huge")], incident=incident, alert=None)
    assert bundle.complete and len(bundle.answered) == 12
    kept = sorted(p.name for p in (bundle.path / F.RANKS).iterdir())
    assert 0 < len(kept) < 12
    summary = json.loads((bundle.path / F.BUNDLE).read_text())
    assert any("answers dropped" in note for note in summary["notes"])
    assert len(summary["unusable"]) == 12 - len(kept)
    assert sum(p.stat().st_size for p in bundle.path.rglob("*") if p.is_file()) <= limits.max_bytes


def test_a_rank_ignores_an_incidents_link_quietly(tracker: Tracker, tmp_path: Path) -> None:
    run_dir = tmp_path / RUN
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_dir / F.INCIDENTS).symlink_to(elsewhere)
    responder = IncidentResponder(tracker, run_dir, flight_api={})
    assert responder.poll() == 0 and responder.poll() == 0
    assert tracker.errors.counts().get("incident_answer", 0) == 0
    assert list(elsewhere.iterdir()) == []
