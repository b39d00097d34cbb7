"""``babysitter report RUN_DIR``: where a run's wall time went, from its goodput ledger, and why each
restart happened (with the notes ``babysitter remediate`` leaves next to the ledger).

Prints a table (rich), writes a PNG timeline (matplotlib) with ``--png``, or a JSON summary with
``--json``; either way it names the newest checkpoint that verifies, the one to resume from
(:mod:`babysitter.checkpoints.resume`; ``--verify`` reads every digest back first). rich and
matplotlib are the ``report`` extra; they are imported only when needed.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from babysitter import jsonout
from babysitter._install import pip_install_extra
from babysitter.checkpoints import checkpoint_statuses, resume_point
from babysitter.ledger.advisor import ClusterRate, parse_cluster_rate
from babysitter.ledger.reader import DEFAULT_FILE_NAME
from babysitter.ledger.summary import RunSummary, summarize
from babysitter.terminal import clean
from babysitter.views.report import render_checkpoints, render_png, render_table

__all__ = ["register", "run"]

_MISSING = "babysitter report needs the 'report' extra for {what}: {how} ({err})"


def register(subparsers: Any) -> None:
    """Add the ``report`` subcommand."""
    p = subparsers.add_parser(
        "report",
        help="goodput and badput by cause of a run, from its ledger (table, --png timeline, --json)",
        description="Goodput of a run across restarts: productive time, badput by cause, incarnations.",
    )
    p.add_argument("run_dir", type=Path, help="the run directory that holds the ledger")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout instead of the table")
    p.add_argument("--png", type=Path, metavar="PATH", help="also write a timeline PNG to PATH")
    p.add_argument(
        "--ledger", default=DEFAULT_FILE_NAME, help=f"ledger file name (default {DEFAULT_FILE_NAME})"
    )
    p.add_argument(
        "--now",
        type=_unix_time,
        default=None,
        help="Unix time to account up to for a running or down run (default: now)",
    )
    p.add_argument(
        "--stale-after",
        type=float,
        default=60.0,
        help="seconds after which another host's writer lock counts as dead (default 60)",
    )
    p.add_argument(
        "--cluster-rate",
        type=_cluster_rate,
        default=None,
        metavar="INTERRUPTIONS/GPU_HOURS",
        help="the cluster's measured interruptions over its GPU-hours (e.g. 12/40000): the checkpoint "
        "advice's rate while the run has seen fewer than 5 interruptions",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="also read back every digest of the run's checkpoints against their manifests (slow: reads "
        "every byte); without it sizes, headers and the node agent's verdicts decide which verifies",
    )
    p.add_argument(
        "--gpus",
        type=_positive_int,
        default=None,
        help="GPUs of the job, to scale --cluster-rate (default: the world size the ledger recorded)",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        default=None,
        help="split the slowdown by cause from the node agents' series there (GPU throttling, PCIe, "
        "fabric on the culprit's host); without it only the ledger's straggler verdicts name a cause",
    )
    p.add_argument("--cluster", default="", help="with --prometheus: the run's cluster, if run names repeat")
    p.add_argument("--timeout", type=float, default=30.0, help="with --prometheus: seconds a query")
    p.set_defaults(func=run)


def _cluster_rate(text: str) -> ClusterRate:
    try:
        return parse_cluster_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _unix_time(text: str) -> float:
    """A Unix time a clock can show (finite, after 1970, before 2242), else an argument error."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 2.0**33:
        raise argparse.ArgumentTypeError(f"must be a Unix time in seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; 0 on success, 1 for an empty or missing ledger, 2 when it cannot be read."""
    if "/" in args.ledger or args.ledger in ("", ".", ".."):
        _err(f"babysitter report: --ledger must be a file name, got {args.ledger!r}")
        return 2
    client = None
    if args.prometheus:
        from babysitter.prom import Deadline, PromClient

        try:
            client = PromClient(args.prometheus, timeout=args.timeout, deadline=Deadline(4 * args.timeout))
        except ValueError as exc:
            _err(f"babysitter report: --prometheus: {exc}")
            return 2
    if not args.run_dir.is_dir():
        what = "not a directory" if args.run_dir.exists() else "no such directory"
        _err(f"babysitter report: {what}: {args.run_dir} (give the run directory, where the ledger is)")
        return 1
    if not (args.run_dir / args.ledger).exists():
        _err(_no_ledger(args.run_dir, args.ledger))
        return 1
    try:
        summary = summarize(
            args.run_dir,
            file_name=args.ledger,
            now=args.now,
            stale_after=args.stale_after,
            keep_points=args.png is not None,
            gpus=args.gpus,
            cluster=args.cluster_rate,
        )
    except OSError as exc:
        _err(f"babysitter report: cannot read the ledger in {args.run_dir}: {exc}")
        return 2
    if summary.state == "empty":
        skipped = summary.invalid_lines + summary.torn_lines + summary.fenced_lines
        why = (
            f"{skipped} line(s) skipped as invalid, torn or fenced: the file is not a ledger "
            "babysitter wrote, or it was damaged"
            if skipped
            else "yet (rank 0 writes the first when training starts)"
        )
        where = _elsewhere(args.run_dir, args.ledger)
        _err(f"babysitter report: no ledger records in {summary.ledger} {why}{where}")
        return 1
    try:
        statuses = checkpoint_statuses(args.run_dir, file_name=args.ledger, now=args.now, deep=args.verify)
    except OSError as exc:
        _err(f"babysitter report: cannot check the checkpoints of {args.run_dir}: {exc}")
        statuses = []
    resume = resume_point(statuses)
    if client is not None:
        _attribute(summary, client, args.cluster)
    if args.json:
        out = summary.to_json()
        checkpoints = out.setdefault("checkpoints", {})
        assert isinstance(checkpoints, dict)
        checkpoints["resume"] = None if resume is None else resume.to_json()
        checkpoints["statuses"] = [s.to_json() for s in statuses]
        sys.stdout.write(jsonout.dumps(out, indent=2) + "\n")
    else:
        try:
            render_table(summary)
            render_checkpoints(statuses, resume)
        except ImportError as exc:
            _err(_MISSING.format(what="the table", how=pip_install_extra("report"), err=exc))
            return 2
    if args.png is not None:
        try:
            render_png(summary, args.png, now=args.now)
        except ImportError as exc:
            _err(_MISSING.format(what="--png", how=pip_install_extra("report"), err=exc))
            return 2
        except OSError as exc:
            _err(f"babysitter report: cannot write {args.png}: {exc}")
            return 2
        said = f"wrote {args.png} (timeline: incarnations, badput by cause, step time, MFU)\n"
        (sys.stderr if args.json else sys.stdout).write(said)  # --json keeps stdout JSON
    return 0


def _attribute(summary: RunSummary, client: Any, cluster: str) -> None:
    """Refine the slowdown split from Prometheus; a failure is said on stderr and in the split's note
    (the ledger's report stands without it)."""
    from babysitter.explain.slowdown import attribute
    from babysitter.prom import PromError

    if summary.slowdown is None or not summary.slowdown.episodes:
        return
    try:
        summary.slowdown = attribute(client, summary.slowdown, summary.run, cluster=cluster)
    except PromError as exc:
        _err(f"babysitter report: the slowdown's causes stay the ledger's: {exc}")
        summary.slowdown.note = f"Prometheus not used ({exc}); {summary.slowdown.note}"


def _elsewhere(run_dir: Path, file_name: str) -> str:
    """Where a ledger is, when ``run_dir`` holds none but a directory under it does (the demo's work
    directory keeps its run in run/)."""
    try:
        found = sorted(p.parent for p in run_dir.glob(f"*/{file_name}") if p.is_file())
    except OSError:
        return ""
    if not found:
        return ""
    return "; the ledger is in " + ", ".join(str(p) for p in found[:3]) + f": babysitter report {found[0]}"


def _no_ledger(run_dir: Path, file_name: str) -> str:
    """What to do when ``run_dir`` holds no ledger: what writes one, and where one may be instead."""
    elsewhere = _elsewhere(run_dir, file_name)
    named = "" if file_name == DEFAULT_FILE_NAME else " (the name --ledger gave)"
    return (
        f"babysitter report: no ledger in {run_dir}: it has no {file_name}{named}. A run writes its ledger "
        f"there when its training script calls babysitter.watch(..., run_dir=...) with this directory "
        f"(rank 0, next to the checkpoints); give the run_dir that run used" + (elsewhere or ".")
    )


def _err(message: str) -> None:
    sys.stderr.write(clean(message) + "\n")  # paths and errors name files others made
