"""``babysitter generate``: write dashboards, rules, promtool tests and docs; ``--check`` for CI."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["register", "run", "runbook_base_from_urls"]

log = logging.getLogger(__name__)


def _checkout() -> Path | None:
    """The repository root when run from a checkout (editable or ``PYTHONPATH=src``), else None: a
    copy installed into a virtual environment inside a clone writes to the current directory."""
    from babysitter._install import checkout

    return checkout()


def _default_out() -> Path:
    """The repository root when run from a checkout (where the committed files live), else the cwd."""
    return _checkout() or Path.cwd()


# [project.urls] keys, in order: a runbook directory as it is, or a repository whose docs/runbooks/
# a forge shows under blob/main (GitHub; GitLab and Gitea redirect the same path).
_RUNBOOK_KEYS = ("runbooks",)
_REPOSITORY_KEYS = ("repository", "source", "source code", "code")


def _project_urls() -> dict[str, str]:
    """``[project.urls]`` of the checkout's pyproject.toml, else the installed distribution's
    Project-URL metadata; keys lower-cased."""
    root = _checkout()
    if root is not None and sys.version_info >= (3, 11):
        import tomllib

        urls = tomllib.loads((root / "pyproject.toml").read_text()).get("project", {}).get("urls", {})
        return {str(k).lower(): str(v) for k, v in urls.items()}
    from importlib import metadata

    try:
        entries = metadata.metadata("babysitter").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return {}
    pairs = (entry.split(",", 1) for entry in entries if "," in entry)
    return {k.strip().lower(): v.strip() for k, v in pairs}


def runbook_base_from_urls(urls: dict[str, str]) -> str | None:
    """The runbook directory's URL from a project's URLs (lower-cased keys), or None."""
    for key in _RUNBOOK_KEYS:
        if key in urls:
            return urls[key].rstrip("/")
    for key in _REPOSITORY_KEYS:
        if key in urls:
            return urls[key].rstrip("/").removesuffix(".git") + "/blob/main/docs/runbooks"
    return None


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
        "--runbook-base-url",
        default=None,
        metavar="URL",
        help="absolute URL of the runbook directory (default: from the repository URL in pyproject.toml's "
        "[project.urls]: <Repository>/blob/main/docs/runbooks, or its Runbooks entry)",
    )
    parser.add_argument(
        "--runbook-url-pattern",
        default=None,
        metavar="PATTERN",
        help="runbook link of every alert, {alert} standing for its name; a relative pattern is joined "
        "to the base URL (default: {alert}.md)",
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
    from babysitter.generate.config import DEFAULT_RUNBOOK_BASE_URL
    from babysitter.generate.writer import check, render, write

    out: Path = args.out if args.out is not None else _default_out()
    config = profile(args.profile)
    base = args.runbook_base_url or runbook_base_from_urls(_project_urls()) or config.runbook_base_url
    pattern = args.runbook_url_pattern or config.runbook_url_pattern
    xid_source = args.dcgm_xid_source or config.dcgm_xid_source
    selector = config.dcgm_selector if args.dcgm_selector is None else args.dcgm_selector
    wanted = (base, pattern, xid_source, selector)
    if wanted != (
        config.runbook_base_url,
        config.runbook_url_pattern,
        config.dcgm_xid_source,
        config.dcgm_selector,
    ):
        import dataclasses

        try:
            config = dataclasses.replace(
                config,
                runbook_base_url=base,
                runbook_url_pattern=pattern,
                dcgm_xid_source=xid_source,
                dcgm_selector=selector,
            )
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
    if config.runbook_url("X").startswith(DEFAULT_RUNBOOK_BASE_URL):
        sys.stderr.write(
            f"babysitter generate: runbook links point at {DEFAULT_RUNBOOK_BASE_URL}, which never resolves: "
            "pass --runbook-base-url or set [project.urls] Repository in pyproject.toml\n"
        )
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
