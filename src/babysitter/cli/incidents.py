"""``babysitter incidents``: the provider's report, per cluster and node, of every hardware incident and
what it cost, to attach to a support ticket (docs/incidents.md#the-providers-report).

Examples::

    babysitter incidents --prometheus http://127.0.0.1:9090 --window 7d --run-dirs '/shared/runs/*' \\
        --price provider-a=2.49 --price provider-b=3.10
    babysitter incidents --prometheus http://127.0.0.1:9090 --format csv > incidents.csv

Incidents come from Prometheus' record of its hardware alerts; their cost (downtime and lost progress
of the runs on the node, times their GPUs) from the runs' ledgers; their evidence from the alerts'
labels and the bundles gathered for them.
"""

from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path
from typing import Any

from babysitter.cli._prices import add_price_arguments, parse_prices
from babysitter.terminal import clean

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``incidents`` subcommand."""
    p = subparsers.add_parser(
        "incidents",
        help="the provider's report: hardware incidents per cluster and node, their evidence and cost",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="docs/incidents.md: what counts as an incident, how its cost is computed.",
    )
    p.add_argument("--prometheus", required=True, help="Prometheus URL (its ALERTS series are the incidents)")
    p.add_argument("--window", default="7d", help="how far back from --end (a duration: 24h, 7d; default 7d)")
    p.add_argument("--end", type=float, help="end of the window, Unix seconds (default: now)")
    p.add_argument("--cluster", help="only this cluster")
    add_price_arguments(p)
    p.add_argument("--run-dir", action="append", default=[], type=Path, help="a run directory (repeatable)")
    p.add_argument(
        "--run-dirs",
        action="append",
        default=[],
        metavar="GLOB",
        help="run directories by pattern (repeatable)",
    )
    p.add_argument(
        "--incidents-dir",
        action="append",
        default=[],
        type=Path,
        help="the remediator's incidents.dir, for the bundles of hosts' incidents (repeatable)",
    )
    p.add_argument("--lemon", type=int, default=2, help="incidents that flag a node as a lemon (default 2)")
    p.add_argument(
        "--component",
        action="append",
        choices=("gpu", "fabric", "host", "node", "storage"),
        help="alert components that count as hardware (default gpu, fabric, host)",
    )
    p.add_argument("--format", choices=("md", "csv", "json"), default="md", help="output format (default md)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per Prometheus request (default 30)")
    p.set_defaults(func=_main)


def _window(text: str) -> float:
    """A duration with days too (``7d``, ``2d12h``, ``90m``), in seconds."""
    import re

    from babysitter.generate.config import parse_duration

    match = re.fullmatch(r"(?:(\d+)d)?(.*)", text.strip())
    days, rest = (match.group(1), match.group(2)) if match else (None, text)
    try:
        seconds = int(days or 0) * 86400.0 + (float(parse_duration(rest)) if rest else 0.0)
    except ValueError:
        raise ValueError(f"--window {text!r}: not a duration (e.g. 7d, 2d12h, 24h, 90m)") from None
    if seconds <= 0:
        raise ValueError(f"--window {text!r}: must be longer than 0 (e.g. 7d, 24h)")
    return seconds


def _main(args: argparse.Namespace) -> int:
    from babysitter.incident.formats import to_csv, to_json, to_markdown
    from babysitter.incident.report import build_report
    from babysitter.prom import PromClient, PromError

    try:
        prices, default = parse_prices(args.price)
        window = _window(args.window)
        if args.lemon < 1:
            raise ValueError("--lemon: at least 1")
        prom = PromClient(args.prometheus, timeout=args.timeout)
    except ValueError as exc:
        sys.stderr.write(clean(f"babysitter incidents: {exc}") + "\n")
        return 2
    end = args.end if args.end is not None else time.time()
    run_dirs = list(args.run_dir)
    for pattern in args.run_dirs:
        run_dirs += [Path(p) for p in sorted(glob.glob(pattern)) if Path(p).is_dir()]
    try:
        report = build_report(
            prom,
            start=end - window,
            end=end,
            run_dirs=run_dirs,
            incident_dirs=args.incidents_dir,
            prices=prices,
            default_price=default,
            lemon=args.lemon,
            cluster=args.cluster,
            components=tuple(args.component or ("gpu", "fabric", "host")),
        )
    except PromError as exc:
        sys.stderr.write(clean(f"babysitter incidents: {exc}{exc.advice()}") + "\n")
        return 1
    if args.format == "json":
        sys.stdout.write(to_json(report))
    elif args.format == "csv":
        sys.stdout.write(to_csv(report))
    else:
        sys.stdout.write(to_markdown(report, currency=clean(args.currency)))
    return 0
