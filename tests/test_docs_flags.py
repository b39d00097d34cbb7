"""Every ``babysitter <command> --flag`` the docs show exists on that command.

An outside check once found two documented flags that did not exist; users copy commands from the
README, the guides, the runbooks and the deployment files verbatim. This reads each command line
(code spans, code blocks with their backslash continuations, YAML/unit/JSON deployment files) that
starts with ``babysitter <command>`` and checks each ``--flag`` on it against the command's parser.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from babysitter.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
#: Where users read commands: the README, docs (runbooks included), deployment files, examples.
SOURCES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted(p for p in (ROOT / "exporters").rglob("*") if p.is_file()),
    *sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file()),
    *sorted((ROOT / "benchmarks" / "results").glob("*.md")),
]
_COMMAND = re.compile(r"(?:^|[\s`'\"(\[,=])babysitter\s+([a-z][a-z-]*)((?:\\\n|[^\n`'\"])*)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9.-]*[a-z0-9])")


def _commands() -> dict[str, dict[str, str]]:
    """Each subcommand's option strings (with the parser's own --help)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: dict[str, dict[str, str]] = {}
    for name, command in sub.choices.items():
        options = {opt for action in command._actions for opt in action.option_strings}
        nested = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        for action in nested:  # `babysitter checkpoint verify ...`
            for inner in action.choices.values():
                options |= {opt for a in inner._actions for opt in a.option_strings}
        found[name] = dict.fromkeys(options, name)
    return found


def _uses(path: Path) -> list[tuple[int, str, str]]:
    """(line, command, flag) for every flag on a ``babysitter <command>`` line of ``path``."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return []
    uses = []
    for m in _COMMAND.finditer(text):
        command, rest = m.group(1), m.group(2)
        # A following "babysitter x" on the same line starts its own command.
        rest = rest.split(" babysitter ", 1)[0]
        line = text.count("\n", 0, m.start(1)) + 1
        uses.extend((line, command, flag) for flag in _FLAG.findall(rest))
    return uses


def test_the_check_finds_commands_and_knows_a_bad_flag(tmp_path: Path) -> None:
    """The reader sees continued lines and code spans, and a flag no parser has is caught."""
    doc = tmp_path / "x.md"
    doc.write_text(
        "Run `babysitter report RUN --json` then\n"
        "```sh\nbabysitter node-agent --listen-address 0.0.0.0:9946 \\\n  --path.sysfs /host/sys\n```\n"
        "and babysitter explain --no-such-flag.\n"
    )
    uses = _uses(doc)
    assert (1, "report", "--json") in uses
    assert (3, "node-agent", "--path.sysfs") in uses
    known = _commands()
    bad = [(c, f) for _, c, f in uses if f not in known.get(c, {})]
    assert bad == [("explain", "--no-such-flag")]


def test_every_documented_flag_exists() -> None:
    known = _commands()
    problems = []
    seen = 0
    for path in SOURCES:
        for line, command, flag in _uses(path):
            if command not in known:
                continue  # prose ("babysitter does ..."), not a command
            seen += 1
            if flag not in known[command]:
                problems.append(f"{path.relative_to(ROOT)}:{line}: babysitter {command} {flag}")
    assert seen > 50, "the docs show babysitter commands with flags"
    assert not problems, "documented flags that do not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize("command", ["report", "node-agent", "explain", "top", "remediate", "generate"])
def test_the_commands_the_docs_name_exist(command: str) -> None:
    assert command in _commands()
