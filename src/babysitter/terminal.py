"""Text from outside, safe to print on an operator's terminal.

A run name, a host, a checkpoint path, a label value or a Prometheus answer is data someone else
wrote. Printed raw, its control characters drive the terminal: ``ESC[2J`` clears the screen,
``ESC]0;...BEL`` retitles the window, ``ESC]8;;URL`` makes a hyperlink, and the 8-bit forms of
the same (C1: U+0080-U+009F, ``0x9b`` is CSI) do so too on terminals that read them. Bidi overrides
(U+202A-U+202E, U+2066-U+2069, and the marks U+200E, U+200F, U+061C) reorder what is shown, so a
line can read differently from what it holds. :func:`clean` drops all of these; every command that
prints such values passes them through it, and puts them in rich as ``Text`` (never as markup, where
``[link=...]`` would become a hyperlink). JSON output is left as it is: JSON escapes every control
character, so ``--json`` stays faithful to what the files and servers hold.
"""

from __future__ import annotations

import logging
import re

__all__ = ["CleanFormatter", "clean"]

#: C0 controls but tab and newline, DEL, C1, the bidi marks, embeddings, overrides and isolates,
#: and lone surrogates (a file name that is not UTF-8, which no stream could encode).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SPACES = re.compile("[\t\n]")


def clean(value: object, *, multiline: bool = False) -> str:
    """``str(value)`` without control characters, bidi controls or lone surrogates (dropped).

    Tab and newline become a space, so a value stays on its line and cannot forge the next one;
    with ``multiline`` (a message that is several lines by design) they are kept.
    """
    text = value if isinstance(value, str) else str(value)
    if not multiline:
        text = _SPACES.sub(" ", text)
    return _UNSAFE.sub("", text)


class CleanFormatter(logging.Formatter):
    """A log formatter whose lines pass through :func:`clean` (a label value in a log line is data
    from outside too); the lines of a traceback stay lines."""

    def format(self, record: logging.LogRecord) -> str:
        return clean(super().format(record), multiline=True)
