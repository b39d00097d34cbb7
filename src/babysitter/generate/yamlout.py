"""A tiny, deterministic YAML emitter for rule and test files (no PyYAML at run time).

Only what Prometheus rule files need: mappings (insertion order kept, since rule files read better
with ``alert`` before ``expr``), sequences, strings, numbers, booleans and null. Multi-line strings
(PromQL) become literal blocks; other strings are plain when that is unambiguous, else JSON-quoted
(a JSON string is a valid YAML double-quoted scalar).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence

__all__ = ["YamlValue", "dump"]

YamlValue = object

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./@-]*$")
#: Characters YAML does not allow raw in a document (JSON already escapes those below 0x20).
_NON_PRINTABLE = re.compile("[\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def dump(value: YamlValue) -> str:
    """``value`` as a YAML document ending in a newline."""
    lines: list[str] = []
    _emit(value, 0, lines)
    return "\n".join(lines) + "\n"


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"cannot write {value!r} as YAML")
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:  # YAML 1.1 floats need a dot: 1e+20 -> 1.0e+20
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _RESERVED:
            return value
        if (
            "'" not in value and value.isascii() and value.isprintable() and value == value.strip()
        ):  # PromQL reads better without escaped quotes
            return f"'{value}'"
        return _NON_PRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _is_block(value: object) -> bool:
    return (isinstance(value, Mapping) and bool(value)) or (
        isinstance(value, Sequence) and not isinstance(value, str) and bool(value)
    )


def _literal(text: str, indent: int) -> list[str] | None:
    """Lines of a ``|-`` literal block, or None when the text cannot round-trip as one."""
    if "\n" not in text or text != text.strip() or any(line != line.rstrip() for line in text.split("\n")):
        return None
    if not text.replace("\n", "").isprintable():
        return None
    pad = " " * indent
    return ["|-", *[pad + line if line else "" for line in text.split("\n")]]


def _inline(value: object, indent: int) -> tuple[str, list[str]]:
    """The text after ``key:`` or ``-`` and the continuation lines, for a non-block value."""
    if isinstance(value, Mapping):
        return "{}", []
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[]", []
    if isinstance(value, str):
        block = _literal(value, indent)
        if block is not None:
            return block[0], block[1:]
    return _scalar(value), []


def _emit(value: object, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if not _is_block(value) and not isinstance(value, str) and isinstance(value, (Mapping, Sequence)):
        lines.append(pad + ("{}" if isinstance(value, Mapping) else "[]"))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"mapping keys must be strings, got {key!r}")
            name = _scalar(key)
            if _is_block(item):
                lines.append(f"{pad}{name}:")
                child = indent if isinstance(item, Sequence) else indent + 2
                _emit(item, child, lines)
            else:
                head, rest = _inline(item, indent + 2)
                lines.append(f"{pad}{name}: {head}")
                lines.extend(rest)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for item in value:
            if isinstance(item, Mapping) and item:
                sub: list[str] = []
                _emit(item, indent + 2, sub)
                lines.append(f"{pad}- {sub[0][indent + 2 :]}")
                lines.extend(sub[1:])
            elif _is_block(item):
                lines.append(f"{pad}-")
                _emit(item, indent + 2, lines)
            else:
                head, rest = _inline(item, indent + 4)
                lines.append(f"{pad}- {head}")
                lines.extend(rest)
    else:
        head, rest = _inline(value, indent + 2)
        lines.append(f"{pad}{head}")
        lines.extend(rest)
