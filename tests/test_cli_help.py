"""``--help`` reads as plain text: no RST markup from the docstrings it is cut from (issue 22)."""

from __future__ import annotations

import argparse
import re

from babysitter.cli import build_parser


def test_no_rst_markup_in_any_help() -> None:
    """````babysitter top```` and :mod:`x` stay in the docstrings; every subcommand's --help is plain."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    pages = {"babysitter": parser.format_help()}
    pages.update({name: command.format_help() for name, command in sub.choices.items()})
    assert {"top", "remediate", "node-agent", "explain", "demo"} <= set(pages)
    for name, page in pages.items():
        assert "``" not in page, (name, page)
        assert not re.search(r":[a-z]+:`", page), (name, page)
    assert "babysitter top: a live terminal view" in " ".join(pages["top"].split())
