"""The ``babysitter`` command: each subcommand lives in its own module under :mod:`babysitter.cli`.

A subcommand module exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a
callable taking the parsed namespace and returning an exit code. Modules keep heavy imports (torch,
matplotlib, pynvml) inside their functions so ``babysitter --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from collections.abc import Sequence

__all__ = ["main"]

#: Subcommand modules, in the order ``--help`` lists them.
_COMMANDS = (
    "demo",
    "report",
    "checkpoint",
    "top",
    "node_agent",
    "remediate",
    "generate",
    "flops",
    "probe",
    "scorecard",
    "explain",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand module that is present."""
    from babysitter._version import __version__

    parser = argparse.ArgumentParser(
        prog="babysitter", description="MFU and goodput observability for LLM training."
    )
    parser.add_argument("--version", action="version", version=f"babysitter {__version__}")
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"babysitter.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"babysitter.cli.{name}":
                continue
            raise
        module.register(sub)
    for command in sub.choices.values():
        _plain_help(command)
    for choice in sub._choices_actions:
        choice.help = _plain(choice.help)
    return parser


def _plain(text: str | None) -> str | None:
    """Help text without the RST markup of the docstrings it is cut from (````x````, :mod:`x`)."""
    if text is None:
        return None
    text = re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", text)
    return re.sub(r"``([^`]*)``", r"\1", text)


def _plain_help(parser: argparse.ArgumentParser) -> None:
    parser.description = _plain(parser.description)
    parser.epilog = _plain(parser.epilog)
    for action in parser._actions:
        action.help = _plain(action.help)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
