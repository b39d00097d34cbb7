"""Each rank answers an incident's request from inside its process: its thread stacks and flight recorder.

A gatherer (``babysitter remediate``, ``babysitter incident collect``) asks every rank of a run at once
by creating ``RUN_DIR/incidents/<id>/request.json`` (the directory is built aside and renamed into
place, so the request is there as soon as the name is). Every rank's tracker runs one daemon thread
(``babysitter-incidents``) that stats ``RUN_DIR/incidents`` once a ``interval`` (and lists it when it
changed, or every :data:`RESCAN` seconds: a network file system may cache the directory's times), and
answers a request of its own run whose deadline has not passed by writing ``ranks/rank<N>.json``:

* every Python thread's stack (``sys._current_frames()``: no signal, no ptrace, no external tool),
  innermost frames kept, the training thread marked;
* the flight recorder's view: each process group's last enqueued and completed collective and the
  newest entries (:class:`babysitter.training.flight.Recorder`), and the collective monitor's report;
* the step, the seconds since the last step, the pid, host and world size.

Never on the training thread and never blocking it: a stalled rank (the usual reason for the request)
answers as well as a healthy one, and a stopped or dead rank simply does not answer, which the
gatherer records. Bounded: an answer is cut to the request's ``rank_bytes`` (trimming entries, then
frames, then threads), at most :data:`MAX_PER_PASS` requests are answered per pass, and one capture
serves every request within :data:`REUSE` seconds, so a flood of requests costs a rank at most one
capture (a full flight-recorder dump holds the GIL about 20 us per entry) every few seconds.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import socket
import stat
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from babysitter import jsonout
from babysitter.training import incident_files as F
from babysitter.training.ticker import TrackerThread
from babysitter.training.tracker import Tracker

__all__ = [
    "ANSWER_VERSION",
    "DEFAULT_RANK_BYTES",
    "MAX_PER_PASS",
    "REQUEST_VERSION",
    "RESCAN",
    "REUSE",
    "IncidentResponder",
    "capture_stacks",
]

log = logging.getLogger("babysitter")

REQUEST_VERSION = 1
ANSWER_VERSION = 1
#: Seconds between full listings of ``incidents/`` even when its mtime did not change.
RESCAN = 10.0
#: Requests answered per pass at most (the newest first).
MAX_PER_PASS = 4
#: Seconds a capture is reused for further requests.
REUSE = 5.0
#: A request older than this is history, not a question (a restarted rank does not answer it).
MAX_AGE = 600.0
DEFAULT_RANK_BYTES = 256 * 1024
MIN_RANK_BYTES = 8 * 1024
MAX_RANK_BYTES = 4 * 1024 * 1024
_REQUEST_BYTES = 64 * 1024
_DONE_KEPT = 1024
_MAX_THREADS = 64
_MAX_FRAMES = 48
_MAX_ENTRIES = 32  # per process group
_MAX_GROUPS = 16
_MAX_TEXT = 200


def _text(value: object, limit: int = _MAX_TEXT) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def capture_stacks(max_threads: int = _MAX_THREADS, max_frames: int = _MAX_FRAMES) -> list[dict[str, Any]]:
    """Every Python thread's stack, innermost frame last, the main (training) thread first."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    out: list[dict[str, Any]] = []
    order = sorted(frames, key=lambda ident: (ident != main, ident == me, ident))
    for ident in order[:max_threads]:
        thread = threads.get(ident)
        summary = traceback.StackSummary.extract(
            traceback.walk_stack(frames[ident]), limit=max_frames, lookup_lines=True
        )
        summary.reverse()
        out.append(
            {
                "ident": ident,
                "name": _text(thread.name if thread else "<unknown>", 100),
                "daemon": bool(thread.daemon) if thread else False,
                "main": ident == main,
                "frames": [
                    {
                        "file": _text(f.filename, 300),
                        "line": f.lineno or 0,
                        "function": _text(f.name, 100),
                        "code": _text((f.line or "").strip()),
                    }
                    for f in summary
                ],
            }
        )
    return out


def _flight(api: Any) -> dict[str, Any]:
    """The flight recorder's groups and newest entries, or why there are none."""
    from babysitter.training.flight import DumpError, Recorder

    try:
        recorder = Recorder(api) if api is not None else Recorder()
        if not recorder.api:
            return {"state": "unavailable", "detail": "this torch has no flight recorder dump"}
        capture = recorder.capture()
    except DumpError as exc:
        return {"state": "unavailable", "detail": _text(exc)}
    groups: dict[str, Any] = {}
    for pg_id, status in list(capture.groups.items())[:_MAX_GROUPS]:
        name, desc = capture.names.get(pg_id, ("", ""))
        groups[pg_id] = {
            "name": _text(name, 100),
            "desc": _text(desc, 100),
            "enqueued": status.enqueued,
            "completed": status.completed,
        }
    entries: list[dict[str, Any]] = []
    for pg_id in groups:
        mine = sorted((e for e in capture.entries if e.pg_id == pg_id), key=lambda e: e.seq)
        entries += [
            {
                "pg_id": e.pg_id,
                "seq": e.seq,
                "op": e.op,
                "backend": e.backend,
                "numel": e.numel,
                "created": round(e.created, 6),
                "retired": e.retired,
                "duration": e.duration,
            }
            for e in mine[-_MAX_ENTRIES:]
        ]
    return {
        "state": "on" if capture.has_entries or groups else "empty",
        "groups": groups,
        "entries": entries,
        "skipped": capture.skipped,
        "seconds": round(capture.seconds, 6),
    }


def _fit(answer: dict[str, Any], limit: int) -> bytes:
    """The answer as JSON of at most ``limit`` bytes: entries, frames, then threads trimmed."""

    def encode() -> bytes:
        return (jsonout.dumps(answer, separators=(",", ":"), sort_keys=True) + "\n").encode()

    data = encode()
    if len(data) <= limit:
        return data
    answer = copy.deepcopy(answer)  # the capture is shared by the requests it answers
    answer["truncated"] = True
    flight = answer.get("flight") or {}
    for keep_entries, keep_frames, keep_threads in ((8, 24, 32), (2, 12, 16), (0, 6, 4), (0, 3, 1)):
        if isinstance(flight.get("entries"), list):
            flight["entries"] = flight["entries"][-keep_entries:] if keep_entries else []
        threads = answer.get("threads") or []
        answer["threads"] = threads[:keep_threads]
        for thread in answer["threads"]:
            thread["frames"] = thread["frames"][-keep_frames:]
        if isinstance(answer.get("collectives"), str):
            answer["collectives"] = answer["collectives"][: 200 * keep_frames]
        data = encode()
        if len(data) <= limit:
            return data
    keep = ("v", "id", "run", "rank", "world_size", "pid", "host", "time", "step")
    small = {k: answer[k] for k in keep if k in answer}
    small["truncated"] = True
    small["error"] = f"the answer did not fit in {limit} bytes"
    return encode_small(small)


def encode_small(value: dict[str, Any]) -> bytes:
    """A small answer as JSON (the last resort of :func:`_fit`)."""
    return (jsonout.dumps(value, separators=(",", ":"), sort_keys=True) + "\n").encode()


class IncidentResponder(TrackerThread):
    """Answers incident requests for one tracker; :meth:`start` runs it (``watch()`` does, with a run_dir).

    Args:
        tracker: this rank's tracker.
        run_dir: the run directory shared by the ranks (requests come in ``run_dir/incidents``).
        interval: seconds between looks at the directory.
        describe: the collective monitor's report (what this rank waits in), when it runs.
        flight_api: the flight recorder's dump functions (tests); default: this torch's.
    """

    def __init__(
        self,
        tracker: Tracker,
        run_dir: str | os.PathLike[str],
        *,
        interval: float = 1.0,
        describe: Callable[[], str] | None = None,
        flight_api: Any = None,
    ) -> None:
        if not interval > 0:
            raise ValueError("interval must be positive seconds")
        super().__init__(tracker, interval, "babysitter-incidents")
        self.incidents = Path(run_dir) / F.INCIDENTS
        self.describe = describe
        self.flight_api = flight_api
        self.answered = 0
        self.captures = 0
        self._done: OrderedDict[str, None] = OrderedDict()
        self._seen: tuple[int, int] | None = None
        self._scanned = -RESCAN
        self._capture: tuple[float, dict[str, Any]] | None = None

    def tick(self) -> int:
        return self.poll()

    def poll(self) -> int:
        """One look at the requests; how many were answered. Never raises."""
        try:
            return self._poll()
        except Exception as exc:
            self.tracker.errors.record("incident_answer", exc)
            return 0

    # ------------------------------------------------------------------ requests

    def _poll(self) -> int:
        try:
            info = os.lstat(self.incidents)
        except FileNotFoundError:
            return 0
        if not stat.S_ISDIR(info.st_mode):
            return 0  # a link or a file where the directory belongs: nobody's request
        now = time.monotonic()
        key = (info.st_ino, info.st_mtime_ns)
        if key == self._seen and now - self._scanned < RESCAN:
            return 0
        self._seen, self._scanned = key, now
        answered = 0
        with F.opened_dir(self.incidents) as top:
            fresh = [i for i in F.list_ids(top) if i not in self._done]
            for incident in reversed(fresh):  # newest first
                if answered >= MAX_PER_PASS:
                    self._seen = None  # look again next pass
                    break
                if self._answer(top, incident):
                    answered += 1
        return answered

    def _forget(self, incident: str) -> None:
        self._done[incident] = None
        while len(self._done) > _DONE_KEPT:
            self._done.popitem(last=False)

    def _answer(self, top: int, incident: str) -> bool:
        """Answer one request if it is for us and still open; True when an answer was written."""
        cfg = self.tracker.config
        try:
            with F.opened_dir(incident, dir_fd=top) as folder:
                try:
                    request = F.read_json(F.REQUEST, dir_fd=folder, limit=_REQUEST_BYTES)
                except FileNotFoundError:
                    self._forget(incident)  # a bundle of a rank-less incident, or one being removed
                    return False
                now = time.time()
                if not self._open(request, incident, now):
                    self._forget(incident)
                    return False
                limit = request.get("rank_bytes", DEFAULT_RANK_BYTES)
                if isinstance(limit, bool) or not isinstance(limit, int):
                    limit = DEFAULT_RANK_BYTES
                limit = max(MIN_RANK_BYTES, min(MAX_RANK_BYTES, limit))
                with F.opened_dir(F.RANKS, dir_fd=folder) as ranks:
                    name = F.rank_file(cfg.rank.rank)
                    try:
                        os.stat(name, dir_fd=ranks, follow_symlinks=False)
                        self._forget(incident)  # answered already (by this process before a restart?)
                        return False
                    except FileNotFoundError:
                        pass
                    answer = dict(self._captured(now))
                    answer.update(v=ANSWER_VERSION, id=incident, time=round(now, 6))
                    with contextlib.suppress(FileExistsError):
                        F.write_file(name, _fit(answer, limit), dir_fd=ranks)
        except (OSError, ValueError) as exc:
            self._forget(incident)
            self.tracker.errors.record("incident_answer", exc)
            return False
        self._forget(incident)
        self.answered += 1
        return True

    def _open(self, request: object, incident: str, now: float) -> bool:
        """Whether ``request`` is a well-formed, current request of this run."""
        if not isinstance(request, dict) or request.get("v") != REQUEST_VERSION:
            return False
        if request.get("id") != incident or request.get("run") != self.tracker.config.run:
            return False
        created, deadline = request.get("created"), request.get("deadline")
        if not (_number(created) and _number(deadline)):
            return False
        return now - MAX_AGE <= float(created) and now < float(deadline)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ what a rank says

    def _captured(self, now: float) -> dict[str, Any]:
        held = self._capture
        if held is not None and now - held[0] < REUSE:
            return held[1]
        captured = self._capture_now()
        self._capture = (now, captured)
        return captured

    def _capture_now(self) -> dict[str, Any]:
        cfg = self.tracker.config
        tracker = self.tracker
        self.captures += 1
        age = tracker.seconds_since_last_step()
        recent = tracker.recent_step_seconds(20)
        answer: dict[str, Any] = {
            "run": cfg.run,
            "rank": cfg.rank.rank,
            "world_size": cfg.rank.world_size,
            "local_rank": cfg.rank.local_rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "step": tracker.global_step,
            "steps": tracker.steps,
            "seconds_since_last_step": None if age is None else round(age, 3),
            "recent_step_seconds": [round(s, 6) for s in recent],
            "gpu": dict(tracker.gpu),
            "threads": capture_stacks(),
            "flight": _flight(self.flight_api),
        }
        if self.describe is not None:
            try:
                answer["collectives"] = self.describe()[:8000]
            except Exception as exc:
                tracker.errors.record("incident_answer", exc)
        return answer
