"""``babysitter report RUN_DIR``: where a run's wall time went, from its goodput ledger, and why each
restart happened (with the notes ``babysitter remediate`` leaves next to the ledger).

Prints a table (rich), writes a PNG timeline (matplotlib) with ``--png``, or a JSON summary with
``--json``. rich and matplotlib are the ``report`` extra; they are imported only when needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from babysitter.ledger.advisor import ClusterRate, parse_cluster_rate
from babysitter.ledger.reader import DEFAULT_FILE_NAME
from babysitter.ledger.summary import summarize
from babysitter.views.report import render_png, render_table

__all__ = ["register", "run"]

_MISSING = "babysitter report needs the 'report' extra for {what}: pip install 'babysitter[report]' ({err})"


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
        type=float,
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
        "--gpus",
        type=_positive_int,
        default=None,
        help="GPUs of the job, to scale --cluster-rate (default: the world size the ledger recorded)",
    )
    p.set_defaults(func=run)


def _cluster_rate(text: str) -> ClusterRate:
    try:
        return parse_cluster_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
        _err(f"babysitter report: no ledger records in {summary.ledger}")
        return 1
    if args.json:
        sys.stdout.write(json.dumps(summary.to_json(), indent=2) + "\n")
    else:
        try:
            render_table(summary)
        except ImportError as exc:
            _err(_MISSING.format(what="the table", err=exc))
            return 2
    if args.png is not None:
        try:
            render_png(summary, args.png, now=args.now)
        except ImportError as exc:
            _err(_MISSING.format(what="--png", err=exc))
            return 2
        except OSError as exc:
            _err(f"babysitter report: cannot write {args.png}: {exc}")
            return 2
    return 0


def _err(message: str) -> None:
    sys.stderr.write(message + "\n")
