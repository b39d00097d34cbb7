"""``babysitter demo``: the whole stack babysitting a real (tiny, CPU) training run, in one command.

Starts a node agent with simulated GPUs, a tiny GPT training on CPU with the tracker writing a goodput
ledger and checkpoints, Prometheus with the generated rules and Alertmanager paging the demo's own
receiver; plays a scenario of faults; prints pages as they arrive; ends with the goodput report.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from babysitter._install import pip_install_extra

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="run the whole stack on a tiny CPU training with scripted faults, pages and the goodput report",
        description=__doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else None,
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="seconds to play (default: the scenario's; faults after it are skipped)",
    )
    p.add_argument(
        "--scenario",
        type=Path,
        default=None,
        metavar="FILE",
        help="scenario JSON file (default: the built-in one, see examples/demo-scenario.json)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="after the report, leave the stack running (for Grafana) until Ctrl-C",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        metavar="DIR",
        help="work directory (run dir, logs, configs, report PNG); default: a new temp dir",
    )
    p.add_argument(
        "--prometheus-bin", default=None, metavar="PATH", help="Prometheus binary (default: search)"
    )
    p.add_argument(
        "--alertmanager-bin", default=None, metavar="PATH", help="Alertmanager binary (default: search)"
    )
    p.add_argument(
        "--alertmanager-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="Alertmanager routing to run with, receivers pointed at the demo "
        "(default: the shipped exporters/alertmanager.yml)",
    )
    p.add_argument(
        "--pace",
        type=float,
        default=0.1,
        metavar="S",
        help="minimum seconds per training step, to leave CPU for the rest (default 0.1)",
    )
    p.add_argument("--strict", action="store_true", help="exit 3 when a scripted fault was not paged (CI)")
    p.set_defaults(func=run)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; 2 for a bad scenario or option or a missing Python package."""
    # Every missing package at once, each with its way in: torch first (babysitter never installs
    # one), then the demo extra (rich, matplotlib, PyYAML for the shipped Alertmanager routing).
    wanted = {"torch": "torch", "rich": "rich", "matplotlib": "matplotlib", "yaml": "PyYAML"}
    missing = [name for module, name in wanted.items() if importlib.util.find_spec(module) is None]
    if missing:
        ways = []
        if "torch" in missing:
            ways.append(
                "install torch first (the CPU build: pip install torch==2.13.0 --index-url "
                "https://download.pytorch.org/whl/cpu; PyPI's is the CUDA build)"
            )
        if len(missing) > ("torch" in missing):
            ways.append(f"add babysitter's demo extra: {pip_install_extra('demo')}")
        sys.stderr.write(f"babysitter demo needs {', '.join(missing)}: {'; then '.join(ways)}\n")
        return 2
    from rich.console import Console

    from babysitter.demo.runner import DemoOptions, run_demo
    from babysitter.demo.scenario import default_scenario, load_scenario

    try:
        scenario = load_scenario(args.scenario) if args.scenario else default_scenario()
    except ValueError as exc:
        sys.stderr.write(f"babysitter demo: {exc}\n")
        return 2
    if args.duration is not None:
        if not 10 <= args.duration <= 24 * 3600:
            sys.stderr.write("babysitter demo: --duration must lie between 10 and 86400 seconds\n")
            return 2
        scenario, dropped = scenario.truncated(args.duration)
        for event in dropped:
            sys.stderr.write(
                f"babysitter demo: --duration {args.duration:g} skips the fault at {event.at:g}s: "
                f"{event.describe()}\n"
            )
    if not 0 <= args.pace <= 10:
        sys.stderr.write("babysitter demo: --pace must lie between 0 and 10 seconds\n")
        return 2
    if args.alertmanager_config is not None:
        from babysitter.demo.routing import RoutingError, load_routing

        try:
            load_routing(args.alertmanager_config)
        except RoutingError as exc:
            sys.stderr.write(f"babysitter demo: --alertmanager-config: {exc}\n")
            return 2
    # Piped (a CI log), lines are 140 columns unless $COLUMNS says otherwise; on a terminal, its width.
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) >= 40 else 140
    console = Console() if sys.stdout.isatty() else Console(width=width)
    options = DemoOptions(
        scenario=scenario,
        workdir=args.workdir,
        keep=args.keep,
        prometheus_bin=args.prometheus_bin,
        alertmanager_bin=args.alertmanager_bin,
        strict=args.strict,
        pace=args.pace,
        alertmanager_config=args.alertmanager_config,
    )
    return run_demo(options, console)
