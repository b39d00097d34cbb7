"""``babysitter scorecard``: clusters or providers side by side, from Prometheus.

Examples::

    babysitter scorecard --prometheus http://prometheus:9090 --window 30d
    babysitter scorecard --prometheus http://prometheus:9090 --by provider --mfu-match 'model="llama3-8b"' \\
        --png scorecard.png --json scorecard.json
    babysitter scorecard --prometheus http://prometheus:9090 --price provider-a=2.49 --price provider-b=3.10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from babysitter import jsonout
from babysitter.cli._prices import add_price_arguments, parse_prices
from babysitter.terminal import clean

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``scorecard`` subcommand."""
    p = subparsers.add_parser(
        "scorecard",
        help="clusters side by side from Prometheus: MFU, goodput, interruptions, Xid, checkpoint, storage",
        description=__doc__.split("\n\n")[0].replace("``", "") if __doc__ else None,
    )
    p.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus (or Thanos/Mimir) base URL")
    p.add_argument("--window", default="30d", help="time range to score, a Prometheus duration (default 30d)")
    p.add_argument(
        "--by", default="cluster", help="label that tells clusters apart (default cluster; e.g. provider)"
    )
    p.add_argument(
        "--mfu-match",
        default="",
        metavar="MATCHERS",
        help="matchers naming the model config MFU is compared for, e.g. 'model=\"llama3-8b\"' (the "
        "run-level rules keep such labels when generated with GenerateConfig.run_labels)",
    )
    p.add_argument(
        "--tracker-selector",
        default="",
        metavar="MATCHERS",
        help="extra matchers on the training roll-up rules (labels: cluster, run, run labels)",
    )
    p.add_argument(
        "--node-selector",
        default="",
        metavar="MATCHERS",
        help="extra matchers on the node roll-up rules (label: cluster)",
    )
    p.add_argument(
        "--rate-window",
        default="5m",
        help="rate window the recording rules were generated with (default 5m, the default config's)",
    )
    p.add_argument("--step", default="5m", help="resolution of time-integrated queries (default 5m)")
    p.add_argument("--at", type=float, default=None, help="Unix time the window ends at (default now)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per query (default 60)")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds for all its queries together (default: twice --timeout)",
    )
    add_price_arguments(p)
    p.add_argument("--json", metavar="PATH", help="write the scorecard as JSON ('-': stdout, no table)")
    p.add_argument("--png", type=Path, metavar="PATH", help="also write a PNG chart")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """0 with a scorecard, 1 when Prometheus has no data for any cluster, 2 for errors."""
    from babysitter.prom import Deadline, PromClient, PromError
    from babysitter.scorecard import QuerySet, build_scorecard
    from babysitter.views.scorecard import render_png, render_table

    try:
        prices, default_price = parse_prices(args.price)
        deadline = Deadline(args.deadline if args.deadline is not None else 2 * args.timeout)
        client = PromClient(args.prometheus, timeout=args.timeout, deadline=deadline)
        queries = QuerySet(
            window=args.window,
            by=args.by,
            mfu_match=args.mfu_match,
            tracker_selector=args.tracker_selector,
            node_selector=args.node_selector,
            rate_window=args.rate_window,
            step=args.step,
        )
    except ValueError as exc:
        _err(str(exc))
        return 2
    try:
        card = build_scorecard(
            client,
            queries,
            at=args.at,
            prices=prices,
            default_price=default_price,
            currency=clean(args.currency),
        )
    except PromError as exc:
        _err(f"{exc}{exc.advice()}")
        return 2
    if not card.clusters:
        _err(f"no series with a {args.by!r} label in the last {args.window} at {args.prometheus}")
        return 1
    text = jsonout.dumps(card.to_dict(), indent=2, sort_keys=True)
    if args.json == "-":
        sys.stdout.write(text + "\n")
    else:
        render_table(card)
    try:
        if args.json and args.json != "-":
            Path(args.json).write_text(text + "\n", encoding="utf-8")
        if args.png:
            render_png(card, args.png)
    except OSError as exc:
        _err(f"cannot write output: {exc}")
        return 2
    except ImportError as exc:
        _err(f"--png needs matplotlib ({exc})")
        return 2
    return 0


def _err(message: str) -> None:
    sys.stderr.write(f"babysitter scorecard: {clean(message)}\n")  # messages quote Prometheus' answers
