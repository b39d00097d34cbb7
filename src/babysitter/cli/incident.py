"""``babysitter incident list|show|collect``: the bundles of a run's incidents (docs/incidents.md).

Examples::

    babysitter incident list /shared/runs/llama-7b
    babysitter incident show /shared/runs/llama-7b 20260101T120000Z-0123456789abcdef
    babysitter incident collect /shared/runs/llama-7b --prometheus http://127.0.0.1:9090

``show`` takes the id the page carries (the alert's start and fingerprint). ``collect`` gathers a
bundle now, by hand or from a job's epilog: every live rank answers within ``--wait`` seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from babysitter.terminal import clean

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``incident`` subcommand with ``list``, ``show`` and ``collect``."""
    p = subparsers.add_parser(
        "incident",
        help="list, show or gather the evidence bundles of a run's incidents",
        description="The evidence kept before a restart: each rank's stacks, the stuck collective, the host.",
    )
    sub = p.add_subparsers(dest="incident_command", metavar="ACTION")
    ls = sub.add_parser("list", help="the run's incidents, oldest first")
    ls.add_argument("run_dir", type=Path, help="the run directory (where the ledger is)")
    ls.add_argument("--json", action="store_true", help="print them as JSON")
    ls.set_defaults(func=_list)
    show = sub.add_parser(
        "show", help="one incident: stuck collective, each rank's frames, the host's faults"
    )
    show.add_argument("run_dir", type=Path, help="the run directory")
    show.add_argument("id", help="the incident's id, as the page and `incident list` give it")
    show.add_argument("--json", action="store_true", help="print it as JSON")
    show.set_defaults(func=_show)
    collect = sub.add_parser("collect", help="gather a bundle now (by hand, or from a job's epilog)")
    collect.add_argument("run_dir", type=Path, help="the run directory")
    collect.add_argument("--run", help="the run's name (default: the run directory's name)")
    collect.add_argument("--wait", type=float, default=10.0, help="seconds the ranks have to answer (10)")
    collect.add_argument("--prometheus", help="Prometheus URL, for the hosts' state and the ranks' hosts")
    collect.add_argument(
        "--host",
        action="append",
        default=[],
        help="an instance whose node agent's state to keep (repeatable)",
    )
    collect.add_argument("--json", action="store_true", help="print the result as JSON")
    collect.set_defaults(func=_collect)
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])


def _say(line: str) -> None:
    sys.stdout.write(clean(line) + "\n")


def _list(args: argparse.Namespace) -> int:
    from babysitter import jsonout
    from babysitter.incident.read import IncidentError, list_incidents
    from babysitter.incident.text import list_lines

    try:
        items = list_incidents(args.run_dir)
    except IncidentError as exc:
        sys.stderr.write(clean(f"babysitter incident list: {exc}") + "\n")
        return 2
    if args.json:
        sys.stdout.write(jsonout.dumps([s.to_json() for s in items], indent=2) + "\n")
        return 0
    for line in list_lines(items):
        _say(line)
    return 0


def _show(args: argparse.Namespace) -> int:
    from babysitter import jsonout
    from babysitter.incident.read import IncidentError, load_incident
    from babysitter.incident.text import show_lines

    try:
        incident = load_incident(args.run_dir, args.id)
    except IncidentError as exc:
        sys.stderr.write(clean(f"babysitter incident show: {exc}") + "\n")
        return 2
    if args.json:
        sys.stdout.write(jsonout.dumps(incident.to_json(), indent=2, default=str) + "\n")
        return 0
    for line in show_lines(incident):
        _say(line)
    return 0


def _collect(args: argparse.Namespace) -> int:
    import secrets

    from babysitter import jsonout
    from babysitter.incident.gather import Gatherer, Limits, Target, incident_id

    if not 0 < args.wait <= 300:
        sys.stderr.write("babysitter incident collect: --wait must be between 0 and 300 seconds\n")
        return 2
    prom = None
    if args.prometheus:
        from babysitter.prom import PromClient

        try:
            prom = PromClient(args.prometheus, timeout=10.0)
        except ValueError as exc:
            sys.stderr.write(clean(f"babysitter incident collect: {exc}") + "\n")
            return 2
    run = args.run or args.run_dir.resolve().name
    now = time.time()
    identity = incident_id(now, secrets.token_hex(8))
    alert = {"name": "manual", "labels": {"alertname": "manual", "run": run}, "starts_at": now}
    gatherer = Gatherer(Limits(wait=args.wait), prometheus=prom)
    try:
        bundle = gatherer.gather(
            [Target(args.run_dir, run)], incident=identity, alert=alert, hosts=args.host
        )[0]
    except ValueError as exc:
        sys.stderr.write(clean(f"babysitter incident collect: {exc}") + "\n")
        return 2
    if args.json:
        sys.stdout.write(jsonout.dumps(bundle.describe(), indent=2) + "\n")
    elif bundle.error:
        sys.stderr.write(clean(f"babysitter incident collect: {bundle.error}") + "\n")
    else:
        missing = f"; did not answer: {', '.join(map(str, bundle.missing))}" if bundle.missing else ""
        _say(
            f"{bundle.id}: {len(bundle.answered)} of {bundle.world_size or '?'} ranks answered in "
            f"{bundle.seconds:.1f} s{missing} ({bundle.path})"
        )
    return 1 if bundle.error else 0
