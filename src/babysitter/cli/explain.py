"""``babysitter explain``: why did a run's MFU or tokens/s drop? Ranked causes with their evidence.

Examples::

    babysitter explain --prometheus http://prometheus:9090 --run llama-7b --since 30m
    babysitter explain --prometheus http://prometheus:9090 --run llama-7b --at 2026-12-01T14:30Z \\
        --json why.json
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from babysitter import jsonout
from babysitter.terminal import clean

__all__ = ["register", "run"]


def _duration(text: str) -> float:
    from babysitter.generate.config import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return float(seconds)


def _time(text: str) -> float:
    """Unix seconds, or an ISO 8601 time (UTC unless it names its offset)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time (Unix seconds or ISO 8601 such as 2026-12-01T14:30Z): {text!r}"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def register(subparsers: Any) -> None:
    """Add the ``explain`` subcommand."""
    p = subparsers.add_parser(
        "explain",
        help="why a run's MFU or tokens/s dropped: ranked causes with evidence, from Prometheus",
        description=__doc__.split("\n\n")[0].replace("``", "") if __doc__ else None,
    )
    p.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus (or Thanos/Mimir) base URL")
    p.add_argument("--run", required=True, help="the run label of the run to explain")
    p.add_argument("--cluster", default="", help="its cluster label, when run names repeat across clusters")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--at", type=_time, metavar="TIME", help="end of the window (Unix seconds or ISO 8601)")
    when.add_argument(
        "--since", type=_duration, metavar="DURATION", help="explain the last DURATION (e.g. 30m), ending now"
    )
    p.add_argument(
        "--window",
        type=_duration,
        default=1800.0,
        metavar="DURATION",
        help="window length with --at (default 30m)",
    )
    p.add_argument(
        "--baseline",
        type=_duration,
        default=3600.0,
        metavar="DURATION",
        help="what the window is compared with: this long before it (default 1h)",
    )
    p.add_argument(
        "--rate-window",
        default=None,
        help="rate window the recording rules were generated with (default: read from the rules the "
        "Prometheus has loaded)",
    )
    p.add_argument(
        "--cluster-label",
        default="cluster",
        help="the label that tells clusters apart, as the rules were generated (default cluster)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per query (default 30)")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds for all its queries together (default: twice --timeout)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the answer as JSON ('-': stdout only)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """0 with an answer (causes or nothing found), 1 when there are no series of the run, 2 for errors."""
    from babysitter.explain import explain
    from babysitter.explain.rules import detect_rules
    from babysitter.generate.config import GenerateConfig
    from babysitter.prom import Deadline, PromClient, PromError

    window = args.since if args.since is not None else args.window
    end = args.at if args.at is not None else time.time()
    try:
        deadline = Deadline(args.deadline if args.deadline is not None else 2 * args.timeout)
        client = PromClient(args.prometheus, timeout=args.timeout, deadline=deadline)
        if args.rate_window is not None:
            cfg = GenerateConfig(cluster_label=args.cluster_label, rate_window=args.rate_window)
            how = f"rate window {args.rate_window}, as given"
        else:
            GenerateConfig(cluster_label=args.cluster_label)  # a bad label fails before any query
            loaded = detect_rules(client, end, cluster_label=args.cluster_label)
            cfg, how = loaded.cfg, loaded.how
        answer = explain(
            client,
            args.run,
            end=end,
            window=window,
            baseline=args.baseline,
            cluster=args.cluster,
            cfg=cfg,
            rules=how,
        )
    except ValueError as exc:
        _err(str(exc))
        return 2
    except PromError as exc:
        _err(f"{exc}{exc.advice()}")
        return 2
    if answer.tokens_per_second is None and answer.baseline_tokens_per_second is None:
        _err(f"no series of run {args.run!r} at {args.prometheus} in the window or its baseline")
        return 1
    text = jsonout.dumps(answer.to_dict(), indent=2, sort_keys=True)
    if args.json == "-":
        sys.stdout.write(text + "\n")
        return 0
    # Run names, label values and rule names come from Prometheus: cleaned line by line.
    sys.stdout.write("\n".join(clean(line) for line in answer.lines()) + "\n")
    if args.json:
        try:
            Path(args.json).write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            _err(f"cannot write {args.json}: {exc}")
            return 2
    return 0


def _err(message: str) -> None:
    sys.stderr.write(f"babysitter explain: {clean(message)}\n")  # messages quote Prometheus' answers
