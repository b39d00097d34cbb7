"""A host-wide bound on what the agent serves from trainers, shared fairly between users.

Per-endpoint caps alone add up: 4 users x 64 registrations x 1,999 series made one agent serve half
a million series in 9-13 s, past the scrape timeout, and the whole host's data was lost. So every
scrape has a budget, in series and in bytes, for all trainers together, split max-min fair: first
between the users (uids) with something to serve, then between each user's registrations, in each
one's dominant share (the larger of its share of the series and of the bytes: long label values buy
no more). A user who asks for less than an equal share keeps all of it and what is left goes to the
others (progressive filling), so no user, however many endpoints they register, can push another
user's trainers out; a user can only crowd their own.

The unit of what is kept or dropped is a family's block of text (its ``# HELP``/``# TYPE`` lines and
samples), in the order the endpoint serves them, so a histogram is never cut in half; families that do
not fit are dropped (counted, logged once) and are never parsed, which is what keeps the worst case
cheap: text is counted with C-speed scans, only what is served is parsed.

The fetch side is bounded too: each endpoint's read limit is its equal share of a host-wide read
budget (by user, then registration), never below a floor far above what a tracker serves, so a
round reads a bounded number of bytes however many endpoints are registered.
"""

from __future__ import annotations

import collections
import heapq
import re
from collections.abc import Hashable, Sequence
from typing import NamedTuple, TypeVar

__all__ = ["Block", "count_series", "fair_pick", "read_limits", "split_families"]

U = TypeVar("U", bound=Hashable)

_SAMPLE = re.compile(rb"^[ \t]*[^#\s]", re.MULTILINE)
#: A line's start, as a family's comment (group 1: its name) or as a sample.
_LINE = re.compile(rb"^(?:#[ \t]+(?:HELP|TYPE)[ \t]+(\S+)|[ \t]*[^#\s])", re.MULTILINE)


def fair_pick(
    owners: Sequence[U], blocks: Sequence[Sequence[Block]], *, max_series: int, max_bytes: int
) -> list[list[Block]]:
    """The blocks each endpoint may serve (in its order), at most ``max_series`` samples and
    ``max_bytes`` bytes in all: progressive filling, max-min fair in each owner's dominant share
    (the larger of its share of the series and of the bytes), first between owners, then between
    one owner's endpoints. The owner with the least served so far takes the next block of its
    least-served endpoint; a block that does not fit what is left is dropped and the next one tried,
    so one big family never shuts a small one out. ``owners[i]`` owns ``blocks[i]``."""
    served = [[b for b in bs if b.series] for bs in blocks]
    if sum(b.series for bs in served for b in bs) <= max_series and (
        sum(b.size for bs in served for b in bs) <= max_bytes
    ):
        return served  # everything fits (every scrape of a host within its budget): nothing to share
    return _fill(owners, served, max_series=max_series, max_bytes=max_bytes)


def _fill(
    owners: Sequence[U], served: list[list[Block]], *, max_series: int, max_bytes: int
) -> list[list[Block]]:
    """:func:`fair_pick`'s progressive filling of the non-empty blocks ``served``."""
    kept: list[list[Block]] = [[] for _ in served]
    queues = [collections.deque(bs) for bs in served]
    uid_share: dict[U, float] = {}
    ep_share = [0.0] * len(served)
    mine: dict[U, list[tuple[float, int]]] = {}
    for i, owner in enumerate(owners):
        if queues[i]:
            mine.setdefault(owner, []).append((0.0, i))
            uid_share[owner] = 0.0
    turns = [(0.0, n, owner) for n, owner in enumerate(mine)]
    heapq.heapify(turns)
    series_left, bytes_left = max_series, max_bytes
    while turns and series_left > 0 and bytes_left > 0:
        _, order, owner = heapq.heappop(turns)
        _, i = heapq.heappop(mine[owner])
        block = queues[i].popleft()
        if block.series <= series_left and block.size <= bytes_left:
            kept[i].append(block)
            series_left -= block.series
            bytes_left -= block.size
            cost = max(block.series / max_series, block.size / max_bytes)
            ep_share[i] += cost
            uid_share[owner] += cost
        if queues[i]:
            heapq.heappush(mine[owner], (ep_share[i], i))
        if mine[owner]:
            heapq.heappush(turns, (uid_share[owner], order, owner))
    return kept


def read_limits(owners: Sequence[U], *, budget: int, floor: int, cap: int) -> list[int]:
    """Bytes each endpoint may send this round: an equal share of ``budget`` per owner, then per
    endpoint of that owner, at least ``floor`` and at most ``cap``. Known before anything is read."""
    counts: dict[U, int] = {}
    for owner in owners:
        counts[owner] = counts.get(owner, 0) + 1
    per_owner = budget // max(len(counts), 1)
    return [min(cap, max(floor, per_owner // counts[owner])) for owner in owners]


class Block(NamedTuple):
    """One family's text as served (its comment lines and samples), its sample count and size."""

    text: bytes
    series: int
    #: The family its ``# HELP``/``# TYPE`` lines name ("" for samples before any).
    name: str = ""

    @property
    def size(self) -> int:
        """Bytes of text."""
        return len(self.text)


def split_families(body: bytes) -> list[Block]:
    """The blocks of an exposition, in order: a new block starts where ``# HELP``/``# TYPE`` name a
    family other than the current one. Samples before any such line, or of untyped families without
    one, stay in the block they follow (all or nothing, as an endpoint that omits them deserves).
    The agent splits every rank's text each scrape: text as exporters write it (no blank lines, no
    line starting with whitespace) is split line by line with bytes methods; any other text by one
    scan of a regular expression over the line starts, which gives the same blocks."""
    if _plain(body):
        return _split_plain(body)
    blocks: list[Block] = []
    start, name, current, series = 0, "", None, 0
    for match in _LINE.finditer(body):
        meta = match.group(1)
        if meta is None:
            series += 1
        elif meta != current:
            cut = match.start()
            if cut > start:
                blocks.append(Block(body[start:cut], series, name))
            start, name, current, series = cut, meta.decode("utf-8", "replace"), meta, 0
    if len(body) > start:
        blocks.append(Block(body[start:], series, name))
    return blocks


_SPACES = b" \t\n\r\x0b\x0c"  # what \s matches in a bytes pattern
_META = re.compile(rb"#[ \t]+(?:HELP|TYPE)[ \t]+(\S+)")
_HELP_TYPE = (b"# HELP ", b"# TYPE ")


_ODD_LINE = re.compile(rb"\n[ \t\n\r\x0b\x0c]")  # a line (after the first) that is blank or starts with \s


def _plain(body: bytes) -> bool:
    """No blank line and no line that starts with whitespace (except an empty last one)."""
    return bool(body) and body[0] not in _SPACES and _ODD_LINE.search(body) is None


def _split_plain(body: bytes) -> list[Block]:
    """:func:`split_families` of a :func:`_plain` body: each line is a comment or a sample."""
    blocks: list[Block] = []
    start, at, name, current, series = 0, 0, "", None, 0
    for line in body.split(b"\n"):
        if line.startswith(b"#"):
            if line.startswith(_HELP_TYPE) and line[7:8] and line[7] not in _SPACES:
                meta: bytes | None = line[7:].split(None, 1)[0]
            else:
                match = _META.match(line)
                meta = match.group(1) if match is not None else None
            if meta is not None and meta != current:
                if at > start:
                    blocks.append(Block(body[start:at], series, name))
                start, name, current, series = at, meta.decode("utf-8", "replace"), meta, 0
        elif line:
            series += 1
        at += len(line) + 1
    if len(body) > start:
        blocks.append(Block(body[start:], series, name))
    return blocks


def count_series(body: bytes) -> int:
    """Sample lines in an exposition (non-blank, not a comment), counted without parsing: for a
    :func:`_plain` body, its lines less its comment lines (C-speed counts); else by a regex scan."""
    if _plain(body):
        lines = body.count(b"\n") + (not body.endswith(b"\n"))
        return lines - body.count(b"\n#") - (body[:1] == b"#")
    return len(_SAMPLE.findall(body))
