"""The ``babysitter`` command: each subcommand lives in its own module under :mod:`babysitter.cli`.

A subcommand module exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a
callable taking the parsed namespace and returning an exit code. Modules keep heavy imports (torch,
matplotlib, pynvml) inside their functions so ``babysitter --help`` stays fast.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from babysitter.terminal import CleanFormatter, clean

__all__ = ["DEBUG_ENV", "main"]

#: Set (to anything but "" or "0") to see the traceback of an unexpected error (or pass --debug).
DEBUG_ENV = "BABYSITTER_DEBUG"
#: Exit status of an unexpected error (sysexits' EX_SOFTWARE): never one a command gives a meaning
#: (``checkpoint verify``'s 1 "does not verify", 2 "no manifest"), so no script mistakes a crash for one.
CRASH_STATUS = 70

#: Subcommand modules, in the order ``--help`` lists them.
_COMMANDS = (
    "demo",
    "report",
    "checkpoint",
    "top",
    "node_agent",
    "remediate",
    "incident",
    "incidents",
    "generate",
    "flops",
    "probe",
    "scorecard",
    "explain",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand module that is present."""
    from babysitter._version import __version__

    parser = _Parser(prog="babysitter", description="MFU and goodput observability for LLM training.")
    parser.add_argument("--version", action="version", version=f"babysitter {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        metavar="LEVEL",
        help="Python logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL (default INFO).",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"show the Python traceback of an unexpected error (or set {DEBUG_ENV}=1)",
    )
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


class _Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for a mistyped subcommand, choice or flag, and an unknown flag
    reported by the subcommand it was given to (its usage, not the top-level one)."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        choices = [str(c) for c in action.choices]
        close = difflib.get_close_matches(str(value), choices, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise argparse.ArgumentError(
            action, f"invalid choice: {value!r}.{hint} (choose from {', '.join(map(repr, choices))})"
        )

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chain = _chosen(self, parsed)
            options = sorted(
                {o for p in chain for a in p._actions for o in a.option_strings if o.startswith("--")}
            )
            hints = {}
            for extra in extras:
                flag = extra.split("=", 1)[0]
                close = (
                    difflib.get_close_matches(flag, options, n=2, cutoff=0.7) if flag.startswith("-") else []
                )
                if close:
                    hints[flag] = f"did you mean {' or '.join(close)}?"
            message = f"unrecognized arguments: {' '.join(extras)}"
            if len(hints) == 1 and len(extras) == 1:
                message += f" ({next(iter(hints.values()))})"
            elif hints:
                message += " (" + "; ".join(f"{flag}: {said}" for flag, said in hints.items()) + ")"
            chain[-1].error(message)
        return parsed

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {clean(message)}\n")


def _chosen(parser: argparse.ArgumentParser, namespace: Any) -> list[argparse.ArgumentParser]:
    """The parser and the subcommand parsers the arguments chose, outermost first."""
    chain = [parser]
    while True:
        subs = [a for a in chain[-1]._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(namespace, subs[0].dest, None) if subs and subs[0].dest != argparse.SUPPRESS else None
        if not subs or name not in subs[0].choices:
            return chain
        chain.append(subs[0].choices[name])


def _debugging(args: Any) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


#: A hint for the errors that say something about their cause; anything else is a bug to report.
_HINTS: tuple[tuple[type[BaseException], str], ...] = (
    (RecursionError, "an input nested too deeply (a JSON file?) for babysitter to read"),
    (MemoryError, "an input too large to read into memory"),
    (UnicodeError, "a file or a name that is not UTF-8"),
    (PermissionError, "no permission: run it as a user who may read (or write) that path"),
    (OSError, "a file, device or network error: check the path or address it names"),
)


def _crash(command: str, exc: BaseException) -> str:
    """The one line an unexpected error prints: what failed, a hint, where the traceback is."""
    what = clean(str(exc))
    if len(what) > 300:
        what = what[:300] + "..."
    hint = next((h for kind, h in _HINTS if isinstance(exc, kind)), "")
    hint = f"likely {hint}; " if hint else "this is a bug in babysitter or an input it does not handle; "
    prog = f"babysitter {command}" if command else "babysitter"
    return (
        f"{prog}: failed: {type(exc).__name__}{f': {what}' if what else ''} ({hint}rerun with "
        f"{DEBUG_ENV}=1 or `babysitter --debug{f' {command}' if command else ''} ...` for the traceback)\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script: never ends in a traceback (unless asked to with --debug)."""
    args: Any = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        handler = logging.StreamHandler()
        handler.setFormatter(CleanFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=args.log_level, handlers=[handler])
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return 2
        return int(func(args))
    except KeyboardInterrupt:
        sys.stderr.write("babysitter: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and nothing at exit either.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 1
    except Exception as exc:
        if _debugging(args):
            raise
        command = getattr(args, "command", None) or ""
        sys.stderr.write(_crash(command, exc))
        return CRASH_STATUS


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
