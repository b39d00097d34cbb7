"""``babysitter generate``: write dashboards, rules, promtool tests and docs; ``--check`` for CI."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def _default_out() -> Path:
    """The repository root when run from a checkout (where the committed files live), else the cwd."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "babysitter").is_dir():
            return parent
    return Path.cwd()


def register(subparsers: Any) -> None:
    """Add the ``generate`` subcommand."""
    parser = subparsers.add_parser(
        "generate",
        help="generate Grafana dashboards, Prometheus rules, promtool tests and docs from the catalog",
        description="Write dashboards/*.json, alerts/*.yaml, alerts/tests/*.yaml, docs/metrics.md and "
        "docs/runbooks/README.md from the metric catalog. Output is deterministic.",
    )
    parser.add_argument("--out", type=Path, default=None, help="output root (default: the repository root)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and show what differs when the files under --out are stale",
    )
    parser.add_argument(
        "--profile",
        default="default",
        choices=("default", "fast"),
        help="'fast' shrinks windows and for: durations for end-to-end tests and demos (no promtool tests)",
    )
    parser.add_argument(
        "--runbook-url-pattern",
        default=None,
        metavar="PATTERN",
        help="runbook link of every alert, {alert} standing for its name (default: docs/runbooks/{alert}.md)",
    )
    parser.add_argument(
        "--dcgm-xid-source",
        default=None,
        choices=("field", "exp", "none"),
        help="dcgm-exporter mode: Xids from DCGM_FI_DEV_XID_ERRORS (field, the default), "
        "DCGM_EXP_XID_ERRORS_COUNT (exp) or not mapped (none: the agent's kernel-log Xids); "
        "see docs/dcgm-exporter.md",
    )
    parser.add_argument(
        "--dcgm-selector",
        default=None,
        metavar="MATCHERS",
        help="dcgm-exporter mode: matchers selecting its series, e.g. 'job=\"dcgm-exporter\"' (default: any)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate or check; returns the exit code."""
    from babysitter.generate import profile
    from babysitter.generate.writer import check, render, write

    out: Path = args.out if args.out is not None else _default_out()
    config = profile(args.profile)
    changes = {
        name: value
        for name, value in (
            ("runbook_url_pattern", args.runbook_url_pattern),
            ("dcgm_xid_source", args.dcgm_xid_source),
            ("dcgm_selector", args.dcgm_selector),
        )
        if value is not None
    }
    if changes:
        import dataclasses

        try:
            config = dataclasses.replace(config, **changes)
        except ValueError as exc:
            log.error("babysitter generate: %s", exc)
            return 2
    files = render(config)
    if args.check:
        stale = check(out, files)
        if not stale:
            _say(f"babysitter generate: {len(files)} generated files under {out} are up to date")
            return 0
        _say(f"babysitter generate --check: {len(stale)} of the generated files under {out} are stale:")
        for item in stale:
            _say(f"  {item.state:8} {item.path}")
        for item in stale:
            if item.diff:
                _say(item.diff)
        sys.stderr.write("Run `babysitter generate` and commit the result.\n")
        return 1
    try:
        touched = write(out, files)
    except OSError as exc:
        log.error("babysitter generate: cannot write under %s: %s", out, exc)
        return 1
    for path in touched:
        _say(f"  wrote {path}")
    _say(f"babysitter generate: {len(touched)} of {len(files)} files changed under {out}")
    return 0


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
