"""What a trainer may serve through the agent (issue 21, points 1-3): never a family, label or series
the agent, Prometheus or the scrape config owns; never more than a fair share of a host-wide budget;
never for longer than the scrape that asked for it allows.

Every test here failed on the code before the fix (see the module docstrings of the fix commits):
``probe_*``, ``babysitter_xid_source_up``, ``up``, ``ALERTS`` and recording-rule names went through,
``instance="<another host>"`` was re-served as given, one user's 8,000 series were all served next to
another's, and the scrape-timeout header was ignored.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from babysitter import catalog
from babysitter.catalog import node as N
from babysitter.node.agent import Agent, Server
from babysitter.node.workloads import share
from babysitter.node.workloads.trainers import TrainersCollector
from node_helpers import Scrape, parse_exposition, scrape
from test_node_trainers_hostile import RawServer
from unpriv import NOBODY, popen_as_nobody, public_tmp

UID = str(os.geteuid())


class TextServer(RawServer):
    """A loopback endpoint serving fixed exposition text (or dripping forever), registered like a
    tracker with ``run`` and ``rank``."""

    def __init__(self, directory: Path, run: str, rank: int, body: str, *, drip: bool = False) -> None:
        self.body = body.encode()
        self.drip = drip
        super().__init__(self._answer)
        self.path = self.register(directory, run, rank)

    def _answer(self, conn: socket.socket, stopped: threading.Event) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        while self.drip and not stopped.is_set():
            conn.sendall(b"#")
            time.sleep(0.1)
        conn.sendall(self.body)


@pytest.fixture(name="reg")
def _reg(tmp_path: Path) -> Path:
    return tmp_path / "registry"


def _families(body: str) -> list[str]:
    return [line.split()[2] for line in body.splitlines() if line.startswith("# TYPE")]


def _agent_family_text() -> str:
    """One sample of every name a trainer must not serve: every catalog entry that is not a training
    process's (each exposed name: histograms' buckets too), Prometheus' own series, a recording rule,
    dcgm-exporter's. Every sample carries the registered run and rank, so only the name decides."""
    lines = []
    for spec in catalog.ALL:
        if spec.source in ("tracker", "self"):
            continue
        labels = ",".join(f'{name}="x"' for name in spec.labels if name not in ("run", "rank"))
        inner = ('run="r",rank="0",' + labels).rstrip(",")
        lines.append(f"{spec.name}{{{inner}}} 1")
        if spec.kind == "histogram":
            lines.append(f'{spec.name}_bucket{{{inner},le="+Inf"}} 1')
    lines += [
        'up{run="r",rank="0"} 0',
        'scrape_duration_seconds{run="r",rank="0"} 1',
        'ALERTS{run="r",rank="0",alertname="GpuXidCritical",alertstate="firing"} 1',
        'run:train_mfu_ratio:rate5m{run="r",cluster="c1"} 0.99',
        'DCGM_FI_DEV_XID_ERRORS{run="r",rank="0",gpu="0"} 79',
        'train_steps_total{run="r",rank="0"} 5',
    ]
    # The monitoring's own series its alerts read (before: served, and a trainer paged "rule
    # evaluation failing" or "Alertmanager fails to deliver" on its host's behalf).
    from babysitter.generate.alerts.monitoring import FOREIGN_SERIES

    lines += [f'{name}{{run="r",rank="0"}} 7' for name in FOREIGN_SERIES]
    return "\n".join(lines) + "\n"


def test_no_agent_or_prometheus_family_gets_through(reg: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Point 2: every agent family in the catalog (probe_*, babysitter_xid_source_up, storage_*...),
    ``up``, ``scrape_*``, ``ALERTS``, a recording rule's name and dcgm-exporter's are dropped from what a
    trainer serves; its own train_steps_total is served. Derived from the catalog: a new agent family
    is covered the day it is added."""
    server = TextServer(reg, "r", 0, _agent_family_text())
    collector = TrainersCollector(reg, timeout=2.0)
    try:
        with caplog.at_level(logging.WARNING, logger="babysitter"):
            s = scrape(collector)
            scrape(collector)
    finally:
        server.stop()
    assert s.value("train_steps_total", run="r", rank="0") == 5
    served = {name for name, labels in s.series(run="r")} - {
        N.TRAINER_SCRAPE_SUCCESS.name,
        N.TRAINER_SCRAPE_DURATION.name,
        N.TRAINER_RANK.name,
    }
    assert served == {"train_steps_total"}, served
    dropped = s.value(N.TRAINER_SERIES_DROPPED.name, owner_uid=UID, reason="reserved")
    assert dropped == len(_agent_family_text().splitlines()) - 1
    # one line per name, not one per scrape
    lines = [r.getMessage() for r in caplog.records if "reserved for" in r.getMessage()]
    assert any("babysitter_xid_source_up" in line for line in lines)
    assert len(lines) == len(set(lines))


@pytest.mark.parametrize("label", ["instance", "job"])
def test_a_trainer_cannot_set_where_a_series_comes_from(reg: Path, label: str) -> None:
    """Point 1: ``instance="<host B>"`` (or ``job``) on a trainer's sample would let a user on host A
    write into host B's series under ``honor_labels``: the whole endpoint is refused as label_mismatch,
    nothing of it served. (A ``__`` label is not Prometheus text at all: refused as protocol.)"""
    body = f'train_steps_total{{run="r",rank="0",{label}="gpu-node-002:9946"}} 1e9\n'
    body += 'train_loss{run="r",rank="0"} 1\n'
    server = TextServer(reg, "r", 0, body)
    try:
        s = scrape(TrainersCollector(reg, timeout=2.0))
    finally:
        server.stop()
    assert s.find("train_steps_total") == []
    assert s.find("train_loss") == []
    assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="r") == 0
    assert s.value(N.TRAINER_SCRAPE_ERRORS.name, run="r", reason="label_mismatch") == 1


# ------------------------------------------------------------------------------------ the host budget


def _bulk(run: str, rank: int, families: int, per_family: int) -> str:
    out = []
    for f in range(families):
        out.append(f"# HELP bulk_{f} filler\n# TYPE bulk_{f} gauge\n")
        out.extend(f'bulk_{f}{{run="{run}",rank="{rank}",i="{i}"}} 1\n' for i in range(per_family))
    return "".join(out)


_GREEDY = textwrap.dedent(
    """
    import os, socket, sys, threading, time
    from pathlib import Path
    from babysitter import registration
    reg, count, families, per_family = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    def body(run):
        out = []
        for f in range(families):
            out.append(f"# HELP bulk_{f} filler\\n# TYPE bulk_{f} gauge\\n")
            out.extend(f'bulk_{f}{{run="{run}",rank="0",i="{i}"}} 1\\n' for i in range(per_family))
        return ("HTTP/1.0 200 OK\\r\\n\\r\\n" + "".join(out)).encode()
    def serve(sock, payload):
        while True:
            conn, _ = sock.accept()
            try:
                conn.recv(65536)
                conn.sendall(payload)
            except OSError:
                pass
            conn.close()
    pid = os.getpid()
    for i in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        threading.Thread(target=serve, args=(sock, body(f"greedy{i}")), daemon=True).start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
        registration.register(reg, registration.Endpoint(
            pid, registration.process_start_time(pid), url, f"greedy{i}", 0, 0))
    print("ready", flush=True)
    time.sleep(120)
    """
)


@pytest.fixture(name="shared")
def _shared() -> Iterator[Path]:
    for path in public_tmp():
        yield path / "registry"


def test_one_user_cannot_push_another_out(shared: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Point 3, as two users: nobody registers 8 endpoints of 1,000 series each (each within the
    per-endpoint cap of 2,000); root registers two small trainers and one greedy one. With the default
    host budget (2,048 series) the agent serves root's small trainers whole, splits the rest max-min
    fair (per user, then per registration), serves no more than the budget in all, drops whole
    families only, and counts what it dropped per user, logging it once per registration."""
    small = [TextServer(shared, f"small{i}", 0, _bulk(f"small{i}", 0, 3, 20)) for i in range(2)]
    root_greedy = TextServer(shared, "rootbig", 0, _bulk("rootbig", 0, 10, 100))
    other = popen_as_nobody(_GREEDY, str(shared), "8", "10", "100")
    collector = TrainersCollector(shared, timeout=5.0)
    try:
        assert other.stdout is not None
        assert other.stdout.readline().strip() == "ready", other.stderr.read() if other.stderr else ""
        with caplog.at_level(logging.WARNING, logger="babysitter"):
            first = scrape(collector)
            s = scrape(collector)
    finally:
        other.kill()
        other.wait()
        for server in (*small, root_greedy):
            server.stop()
    budget = 2048

    def served(run_prefix: str) -> int:
        return sum(
            1
            for name, labels in s.series()
            if name.startswith("bulk_") and labels["run"].startswith(run_prefix)
        )

    # root asks 2 x 60 + 1,000, nobody 8 x 1,000, of a budget of 2,048: filled fairly, one family at a
    # time to whoever has the least so far, each user ends within one family (100) of the other.
    # Root's small trainers are smaller than any share and served whole.
    assert served("small") == 120
    assert served("rootbig") == 900
    assert served("greedy") == 1000
    assert served("") <= budget
    per_endpoint = [sum(1 for n, _ in s.series(run=f"greedy{i}") if n.startswith("bulk_")) for i in range(8)]
    assert sorted(per_endpoint) == [100] * 6 + [200] * 2  # per registration: each gets its turn
    families = {(labels["run"], name) for name, labels in s.series() if name.startswith("bulk_")}
    for run, name in families:  # whole families: every sample of each one served
        size = 20 if run.startswith("small") else 100
        assert sum(1 for n, _ in s.series(run=run) if n == name) == size
    dropped_root = s.value(N.TRAINER_SERIES_DROPPED.name, owner_uid=UID, reason="budget")
    dropped_other = s.value(N.TRAINER_SERIES_DROPPED.name, owner_uid=str(NOBODY), reason="budget")
    assert dropped_root == 2 * 100  # per scrape: two so far
    assert dropped_other == 2 * 7000
    assert first.value(N.TRAINER_SCRAPE_SUCCESS.name, run="greedy3") == 1
    lines = [r.getMessage() for r in caplog.records if "host-wide" in r.getMessage()]
    assert len(lines) == 9  # once per registration that lost series, not once per scrape


# ------------------------------------------------------------------------------------ scrape timeout


def test_the_fetch_deadline_follows_the_scrape_timeout_header(reg: Path) -> None:
    """Prometheus says how long it waits (X-Prometheus-Scrape-Timeout-Seconds): with a 1 s scrape
    timeout the trainers are given 0.5 s, not the configured 3 s, so the scrape answers in time with
    the honest trainer in it. Without the header the configured timeout applies."""
    drip = TextServer(reg, "drip", 0, "", drip=True)
    honest = TextServer(reg, "honest", 0, 'train_steps_total{run="honest",rank="0"} 3\n')
    agent = Agent([TrainersCollector(reg, timeout=3.0)], collector_timeout=10.0)
    server = Server.start(agent, "127.0.0.1", 0)

    def get(headers: dict[str, str]) -> Scrape:
        request = urllib.request.Request(server.url, headers=headers)  # noqa: S310 - loopback
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            return parse_exposition(response.read().decode())

    try:
        told = get({"X-Prometheus-Scrape-Timeout-Seconds": "1"})
        untold = get({})
    finally:
        server.stop()
        agent.close()
        drip.stop()
        honest.stop()
    for s in (told, untold):
        assert s.value("train_steps_total", run="honest") == 3
        assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="drip") == 0
    told_s = told.value(N.TRAINER_SCRAPE_DURATION.name, run="drip")
    untold_s = untold.value(N.TRAINER_SCRAPE_DURATION.name, run="drip")
    assert told_s < 1.0  # 0.5 s of the 1 s Prometheus allows...
    assert untold_s > 2.5  # ...against the 3 s configured


# ------------------------------------------------------------------------------------ the arithmetic


_BLOCKS = st.lists(st.tuples(st.integers(1, 200), st.integers(1, 20_000)), max_size=8)


@given(
    st.lists(st.tuples(st.integers(0, 4), _BLOCKS), max_size=12),
    st.integers(1, 3000),
    st.integers(1, 200_000),
)
def test_fair_pick_is_fair_between_users_and_within_budget(
    endpoints: list[tuple[int, list[tuple[int, int]]]], max_series: int, max_bytes: int
) -> None:
    """Never over either budget; every block kept in its endpoint's order; and a user who asks for
    less than an equal share, less one block (the granularity), gets all of it however the others ask."""
    owners = [owner for owner, _ in endpoints]
    blocks = [[share.Block(b"x" * size, series) for series, size in bs] for _, bs in endpoints]
    kept = share.fair_pick(owners, blocks, max_series=max_series, max_bytes=max_bytes)
    assert sum(b.series for k in kept for b in k) <= max_series
    assert sum(b.size for k in kept for b in k) <= max_bytes
    for k, bs in zip(kept, blocks, strict=True):
        ids = [id(b) for b in bs]
        assert [ids.index(id(b)) for b in k] == sorted(ids.index(id(b)) for b in k)
    users = set(owners)
    if not users:
        return
    step = max((max(b.series / max_series, b.size / max_bytes) for bs in blocks for b in bs), default=0.0)
    for user in users:
        mine = [b for owner, bs in zip(owners, blocks, strict=True) if owner == user for b in bs]
        demand = max(sum(b.series for b in mine) / max_series, sum(b.size for b in mine) / max_bytes)
        if demand <= 1 / len(users) - step:
            got = [b for owner, k in zip(owners, kept, strict=True) if owner == user for b in k]
            assert len(got) == len(mine)


@given(
    st.lists(st.tuples(st.integers(0, 4), _BLOCKS), max_size=12),
    st.integers(1, 3000),
    st.integers(1, 200_000),
)
def test_fair_pick_takes_everything_when_everything_fits_as_the_filling_would(
    endpoints: list[tuple[int, list[tuple[int, int]]]], max_series: int, max_bytes: int
) -> None:
    """The shortcut when the host is within its budget (every ordinary scrape) keeps what progressive
    filling keeps, block for block."""
    owners = [owner for owner, _ in endpoints]
    blocks = [[share.Block(b"x" * size, series) for series, size in bs] for _, bs in endpoints]
    served = [[b for b in bs if b.series] for bs in blocks]
    kept = share.fair_pick(owners, blocks, max_series=max_series, max_bytes=max_bytes)
    assert kept == share._fill(owners, served, max_series=max_series, max_bytes=max_bytes)
    roomy = share.fair_pick(owners, blocks, max_series=10**6, max_bytes=10**9)
    assert roomy == share._fill(owners, served, max_series=10**6, max_bytes=10**9) == served


def test_fair_pick_counts_long_lines_against_their_user() -> None:
    """A user whose few series are huge (long label values) uses up its share in bytes, not the
    others': the other user's many small series are all served."""
    big = [[share.Block(b"x" * 60_000, 1)] * 8 for _ in range(4)]
    small = [[share.Block(b"x" * 100, 2)] * 50]
    kept = share.fair_pick([1] * 4 + [2], big + small, max_series=2048, max_bytes=1 << 20)
    assert sum(b.series for b in kept[4]) == 100
    assert sum(b.size for k in kept for b in k) <= 1 << 20


def test_read_limits_bound_the_round() -> None:
    """Per user then per endpoint, floored and capped: 4 users x 64 endpoints read at most 32 MiB."""
    owners = [u for u in range(4) for _ in range(64)]
    limits = share.read_limits(owners, budget=32 << 20, floor=64 << 10, cap=512 << 10)
    assert sum(limits) <= 32 << 20
    assert set(limits) == {128 << 10}
    assert share.read_limits([1, 2], budget=32 << 20, floor=64 << 10, cap=512 << 10) == [512 << 10] * 2


def test_family_blocks_parse_like_the_whole() -> None:
    """Splitting at HELP/TYPE lines and parsing the blocks gives the families the whole text gives."""
    from prometheus_client.parser import text_string_to_metric_families

    text = 'loose{a="1"} 1\n' + _bulk("r", 0, 3, 4) + "# TYPE h histogram\n"
    text += 'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\nh_count 2\n# HELP z z\nz 1\n'
    blocks = share.split_families(text.encode())
    assert [b.name for b in blocks] == ["", "bulk_0", "bulk_1", "bulk_2", "h", "z"]
    assert [b.series for b in blocks] == [1, 4, 4, 4, 4, 1]
    whole = [(f.name, f.samples) for f in text_string_to_metric_families(text)]
    parts = [(f.name, f.samples) for b in blocks for f in text_string_to_metric_families(b.text.decode())]
    assert parts == whole


def _split_by_cuts(body: bytes) -> list[tuple[bytes, int, str]]:
    """The reference split (the agent's first one): find the cuts, then count each block's samples."""
    import itertools
    import re

    meta = re.compile(rb"^#[ \t]+(?:HELP|TYPE)[ \t]+(\S+)", re.MULTILINE)
    sample = re.compile(rb"^[ \t]*[^#\s]", re.MULTILINE)
    cuts: list[tuple[int, str]] = [(0, "")]
    current: bytes | None = None
    for match in meta.finditer(body):
        if match.group(1) != current:
            current = match.group(1)
            cuts.append((match.start(), current.decode("utf-8", "replace")))
    cuts.append((len(body), ""))
    return [
        (body[a:b], len(sample.findall(body[a:b])), name)
        for (a, name), (b, _) in itertools.pairwise(cuts)
        if b > a
    ]


_LINES = st.sampled_from(
    [
        "# HELP a x", "# TYPE a counter", "# HELP b y\\n", "#  TYPE  b gauge", "#\tHELP a", "# EOF",
        "# TYPE", "#HELP a", "a 1", 'a{x="#"} 2', "  b 3", "\t# HELP c", "", " ", "\r", "c\x00 1",
        "# HELP \xe9 x", "#", "b_sum 1 12", 'a{y="\\n# HELP b"} 1',
    ]
)  # fmt: skip


@given(st.lists(_LINES, max_size=40), st.booleans())
def test_one_pass_split_gives_the_reference_blocks(lines: list[str], newline: bool) -> None:
    """The single-scan split cuts and counts exactly where the two-pass one did, on any mix of
    comments, samples, blanks and junk."""
    body = ("\n".join(lines) + ("\n" if newline else "")).encode()
    got = [(b.text, b.series, b.name) for b in share.split_families(body)]
    assert got == _split_by_cuts(body)
    assert sum(b.series for b in share.split_families(body)) == share.count_series(body)


_PLAIN_LINES = st.sampled_from(
    [
        "# HELP a x", "# TYPE a counter", "# HELP b y", "#  TYPE  b gauge", "#\tHELP a z", "# EOF",
        "# HELP ", "# HELP  a", "# HELP \x0ba", "# TYPE a\x0cgauge", "#HELP a", "#", "a 1", 'a{x="#"} 2',
        "b_sum 1 12", "c\r 1", "# HELP \xe9 x", 'a{y="\\n# HELP b"} 1', "# TYPE c", "c 3",
    ]
)  # fmt: skip


@given(st.lists(_PLAIN_LINES, min_size=1, max_size=40), st.booleans())
def test_the_split_of_plain_text_gives_the_reference_blocks(lines: list[str], newline: bool) -> None:
    """Text with no blank line and no line starting with whitespace (as exporters write it) is split
    and counted line by line with bytes methods: exactly where the reference cuts and counts."""
    body = ("\n".join(lines) + ("\n" if newline else "")).encode()
    assert share._plain(body)
    got = [(b.text, b.series, b.name) for b in share.split_families(body)]
    assert got == _split_by_cuts(body)
    assert sum(b.series for b in share.split_families(body)) == share.count_series(body)
    assert share.count_series(body) == len(re.findall(rb"^[ \t]*[^#\s]", body, re.MULTILINE))
