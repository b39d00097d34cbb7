"""``babysitter top``: a live terminal view of runs and nodes (rich), from Prometheus or ``/metrics``.

Examples::

    babysitter top --prometheus http://127.0.0.1:9090
    babysitter top --metrics http://gpu-node-001:9946/metrics http://gpu-node-002:9946/metrics
    babysitter top --prometheus http://127.0.0.1:9090 --once     # one frame, then exit
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``top`` subcommand."""
    p = subparsers.add_parser(
        "top",
        help="live view of runs (MFU, goodput, step time, checkpoints, alerts) and nodes (GPUs, Xid)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="Prometheus server to query (sees alerts too)")
    source.add_argument(
        "--metrics",
        metavar="URL",
        nargs="+",
        help="node agent or tracker /metrics endpoints to fetch directly",
    )
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument("--window", default="1m", help="rate window for step time with --prometheus (default 1m)")
    p.add_argument(
        "--lookback",
        default="15m",
        help="with --prometheus, keep listing runs that stopped reporting this long ago (default 15m)",
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each request (default 5)")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds for all the requests of one frame together (default: twice --timeout)",
    )
    p.add_argument("--once", action="store_true", help="print one frame and exit (scripts, tests)")
    p.add_argument(
        "--no-hints",
        action="store_true",
        help="with --prometheus, do not explain runs whose MFU dropped (a one-line cause per run)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand: 0, 1 when a --once frame got nothing from any source, 2 for bad arguments."""
    if importlib.util.find_spec("rich") is None:
        from babysitter._install import pip_install_extra

        sys.stderr.write(f"babysitter top needs rich, in the report extra: {pip_install_extra('report')}\n")
        return 2
    from babysitter.views.top import MetricsSource, PrometheusSource, Source, run_top

    if not args.interval > 0 or not args.timeout > 0 or not (args.deadline is None or args.deadline > 0):
        sys.stderr.write("babysitter top: --interval, --timeout and --deadline must be positive\n")
        return 2
    try:
        source: Source = (
            PrometheusSource(
                args.prometheus,
                window=args.window,
                lookback=args.lookback,
                timeout=args.timeout,
                hints=not args.no_hints and not args.once,
                frame_deadline=args.deadline,
            )
            if args.prometheus
            else MetricsSource(args.metrics, timeout=args.timeout, frame_deadline=args.deadline)
        )
    except ValueError as exc:
        sys.stderr.write(f"babysitter top: {exc}\n")
        return 2
    return run_top(source, interval=args.interval, once=args.once)
