"""The templates and the comment-line cache stay within their bounds in bytes really held, and one user's
churn never evicts an honest rank's entries (issue 31, point 6).

The attack: 60 endpoints of one user whose comment lines change at every scrape (a new skeleton per
family per scrape) grew the agent from 53 to 110 MiB against the documented 4 MiB (the bound counted
the skeletons' text, a ninth of what a template holds), and filled the shared comment-line cache
(4,096 entries, no eviction), so an honest rank's lines were read the slow way at every parse. Held
bytes are measured with tracemalloc; "unaffected" is shown as cache hits (what is parsed and read),
never as a timing.
"""

from __future__ import annotations

import gc
import os
import sys
import textwrap
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric

from babysitter import registration
from babysitter.export import text as export_text
from babysitter.export.text import render_text
from babysitter.node.workloads import exposition, share, trainers
from babysitter.node.workloads.fair_cache import MISSING, FairCache
from babysitter.node.workloads.templates import Templates
from babysitter.node.workloads.trainers import TrainersCollector, _parse
from node_helpers import scrape
from test_node_trainers_bound import TextServer
from unpriv import popen_as_nobody, public_tmp

MIB = 1024 * 1024


def _rank_text(run: str, rank: int, prefix: str = "train") -> bytes:
    """A rank's exposition as prometheus_client writes it: counters, gauges, a histogram (families named
    ``<prefix>_...``: a test whose comment lines no other test of the process has sent)."""
    registry = CollectorRegistry()
    labels = {"run": run, "rank": str(rank)}
    names = list(labels)
    Counter(f"{prefix}_steps", "Optimizer steps completed.", names, registry=registry).labels(**labels).inc(7)
    Gauge(f"{prefix}_mfu_ratio", "Model FLOPs utilization.", names, registry=registry).labels(**labels).set(
        0.4
    )
    for name in ("tokens", "samples", "data_wait_seconds"):
        Counter(f"{prefix}_{name}", f"{name} so far.", names, registry=registry).labels(**labels).inc(3)
    hist = Histogram(
        f"{prefix}_step_duration_seconds", "Step time.", names, buckets=(0.1, 0.5, 1, 5), registry=registry
    )
    hist.labels(**labels).observe(0.3)
    return generate_latest(registry)


def _churn_text(run: str, scrape_no: int, families: int = 15) -> bytes:
    """One scrape of a churning endpoint: every family's help names the endpoint and the scrape (a new
    skeleton and comment line each time), about 1,000 characters of it (within the 1,024 the parser
    remembers)."""
    out = []
    for f in range(families):
        help_ = f"{run} scrape {scrape_no} " + "x" * 940
        out.append(
            f'# HELP churn_{f} {help_}\n# TYPE churn_{f} gauge\nchurn_{f}{{run="{run}",rank="0"}} {f}\n'
        )
    return "".join(out).encode()


def _full(
    run: str, rank: int, uid: int, calls: list[bytes] | None = None
) -> tuple[registration.Endpoint, Callable[[bytes], list[Metric]]]:
    """A registration of ``run``/``rank`` by ``uid`` and the trainers collector's full way for it
    (parse and checks), which records what it parses in ``calls`` when given."""
    collector = TrainersCollector(Path("/nonexistent"))
    endpoint = registration.Endpoint(os.getpid(), float(uid), f"http://127.0.0.1:1/{run}", run, rank, 0)
    reg = registration.Registered(endpoint, uid, Path("/nonexistent/x.json"))

    def full(text: bytes) -> list[Metric]:
        if calls is not None:
            calls.append(text)
        return collector._bound(_parse(text), reg)

    return endpoint, full


def _held(measure: Callable[[], None]) -> int:
    """Bytes still allocated (tracemalloc) after ``measure`` ran, its garbage collected."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    measure()
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


@pytest.mark.slow
def test_templates_hold_no_more_than_their_bound_under_60_churning_endpoints() -> None:
    """60 endpoints of one user, each serving 15 families whose help changes at every scrape, next to
    an honest rank of another user, through the agent's 4 MiB templates. What the templates hold
    (tracemalloc) stays within 4 MiB at every scrape, and the honest rank's blocks come from their
    templates at every scrape after its first: the churn evicts only its own user's templates."""
    honest_calls: list[bytes] = []
    honest, honest_full = _full("honest", 0, 0, honest_calls)
    churners = [_full(f"churn{i}", 0, 1000) for i in range(60)]
    owners = {honest: 0, **{endpoint: 1000 for endpoint, _ in churners}}
    honest_blocks = [b.text for b in share.split_families(_rank_text("honest", 0))]
    kept: list[Templates] = []
    tracemalloc.start()
    try:
        held = []
        for n in range(12):
            served: list[object] = []

            def one_scrape(n: int = n, served: list[object] = served) -> None:
                if not kept:
                    kept.append(Templates(max_bytes=4 * MIB))
                templates = kept[0]
                templates.keep(owners)
                for block in honest_blocks:
                    served.extend(templates.serve(honest, block, honest_full))
                for endpoint, full in churners:
                    for block in share.split_families(_churn_text(endpoint.run, n)):
                        served.extend(templates.serve(endpoint, block.text, full))
                served.clear()

            held.append(_held(one_scrape))
            if n == 0:
                first = len(honest_calls)
        total = sum(held)
    finally:
        tracemalloc.stop()
    running = [sum(held[: i + 1]) for i in range(len(held))]
    assert max(running) <= 4 * MIB, [round(r / MIB, 2) for r in running]
    assert total > 2 * MIB, "the churn did fill the templates (the test measures something)"
    assert first == len(honest_blocks)
    assert len(honest_calls) == first, "an honest block was parsed again: its template was evicted"


def test_a_template_is_counted_as_what_it_holds(tmp_path: Path) -> None:
    """What :class:`Templates` counts is what tracemalloc finds it holds, within a quarter over (strings
    several templates share are counted in each) and never under: 40 registrations of a real rank's
    text, each block served twice (the second fill writes the rows a template keeps)."""
    text = _rank_text("r", 0)
    blocks = [b.text for b in share.split_families(text)]
    ranks = [_full("r", rank, 0) for rank in range(40)]
    kept: list[Templates] = []

    def fill() -> None:
        templates = Templates(max_bytes=64 * MIB)
        for endpoint, full in ranks:
            rank_blocks = [b.replace(b'rank="0"', f'rank="{endpoint.rank}"'.encode()) for b in blocks]
            for _ in range(2):
                for block in rank_blocks:
                    templates.serve(endpoint, block, full)
        kept.append(templates)

    tracemalloc.start()
    try:
        real = _held(fill)
    finally:
        tracemalloc.stop()
    counted = kept[0].size
    assert real <= counted <= 1.25 * real, (real, counted)


_CHURN = textwrap.dedent(
    """
    import os, socket, sys, threading, time
    from pathlib import Path
    from babysitter import registration
    reg, count, families = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    def body(run, n):
        out = []
        for f in range(families):
            help_ = f"{run} scrape {n} " + "x" * 940
            out.append(f'# HELP churn_{f} {help_}\\n# TYPE churn_{f} gauge\\nchurn_{f}{{run="{run}",rank="0"}} {f}\\n')
        return ("HTTP/1.0 200 OK\\r\\n\\r\\n" + "".join(out)).encode()
    def serve(sock, run):
        n = 0
        while True:
            conn, _ = sock.accept()
            try:
                conn.recv(65536)
                n += 1
                conn.sendall(body(run, n))
            except OSError:
                pass
            conn.close()
    pid = os.getpid()
    for i in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        threading.Thread(target=serve, args=(sock, f"churn{i}"), daemon=True).start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
        registration.register(reg, registration.Endpoint(
            pid, registration.process_start_time(pid), url, f"churn{i}", 0, 0))
    print("ready", flush=True)
    time.sleep(300)
    """
)


@pytest.fixture(name="shared")
def _shared() -> Iterator[Path]:
    for path in public_tmp():
        shared = path / "registry"
        shared.mkdir()
        shared.chmod(0o1777)  # as a trainer makes it (registration._write): every user registers there
        yield shared


@pytest.mark.slow
def test_a_churning_user_never_evicts_an_honest_ranks_templates_or_comment_lines(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the agent's trainers collector, as two users: nobody registers 60 endpoints whose 15
    families' help lines change at every fetch; after six scrapes of that churn, root's honest rank
    starts, with one family a template cannot stand for (a timestamp: parsed at every scrape). From
    its second scrape on, its other blocks are never parsed again (templates) and its comment lines
    are never read again (comment-line cache); and the memory the scrapes leave held (tracemalloc)
    stays within the two caches' bounds (4 MiB of templates, 2 MiB of comment lines) and 1 MiB."""
    parsed: list[bytes] = []
    read: list[str] = []
    real_parse, real_read = trainers._parse, exposition._read_header

    def counting_parse(body: bytes, *rest: object) -> list[Metric]:
        parsed.append(body)
        return real_parse(body, *rest)  # type: ignore[arg-type]

    def counting_read(line: str) -> object:
        read.append(line)
        return real_read(line)

    monkeypatch.setattr(trainers, "_parse", counting_parse)
    monkeypatch.setattr(exposition, "_read_header", counting_read)
    churn = popen_as_nobody(_CHURN, str(shared), "60", "15")
    honest_text = _rank_text("honest", 0, "honest").decode() + (
        "# HELP honest_stamped A family with timestamps.\n# TYPE honest_stamped gauge\n"
        'honest_stamped{run="honest",rank="0"} 1 1712345678000\n'
    )
    collector = TrainersCollector(shared, timeout=10.0)
    servers: list[TextServer] = []
    tracemalloc.start()
    try:
        assert churn.stdout is not None
        assert churn.stdout.readline().strip() == "ready", churn.stderr.read() if churn.stderr else ""
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(6):
            s = scrape(collector)
            assert len(s.find("churn_0")) == 60, "every churning endpoint is served"
        servers.append(TextServer(shared, "honest", 0, honest_text))
        per_scrape = []
        for _ in range(8):
            parsed.clear()
            read.clear()
            s = scrape(collector)
            assert s.find("honest_steps_total", run="honest") == [7.0]
            per_scrape.append(
                (
                    sum(b"honest" in body for body in parsed),
                    sum("churn" not in line for line in read),
                )
            )
        del s
        parsed.clear()  # this test's own records: not the agent's
        read.clear()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        churn.kill()
        churn.wait()
        for server in servers:
            server.stop()
    assert per_scrape[0][0] == len(share.split_families(honest_text.encode()))  # its first: all parsed
    assert per_scrape[1:] == [(1, 0)] * 7, per_scrape  # the stamped family only, its lines remembered
    bound = 4 * MIB + trainers.HEADER_CACHE_BYTES + MIB
    assert grown <= bound, f"{grown / MIB:.1f} MiB held"


def test_the_renderer_remembers_a_bounded_amount_of_header_text() -> None:
    """The agent's renderer remembers each family's ``# HELP``/``# TYPE`` lines: rotating help texts of
    1,000 characters filled its 4,096 entries with about 12 MiB. What it holds stays within 2 MiB and
    a little, whatever the help texts, and what it writes stays right."""
    for n in range(4000):
        family = Metric(f"churn_{n % 15}", f"{n} " + "x" * 1000, "gauge")
        family.add_sample(family.name, {}, float(n))
        assert render_text([family]).startswith(f"# HELP churn_{n % 15} {n} x".encode())
    held = sum(
        sys.getsizeof(key[2]) + sys.getsizeof(value[0]) + sys.getsizeof(value[1])
        for key, value in export_text._headers.items()
    )
    assert held <= 2.5 * MIB, f"{held / MIB:.1f} MiB"


# ------------------------------------------------------------------------------------ the cache itself


def test_the_cache_stays_within_bytes_and_entries_and_evicts_the_least_recently_used() -> None:
    cache: FairCache[int, str] = FairCache(max_bytes=10_000, max_entries=5)
    cache.keep({"a": 1})
    for key in range(5):
        cache.put("a", key, "v", 10)
    assert cache.get("a", 0) == "v"  # now the most recently used
    cache.put("a", 5, "v", 10)
    assert cache.entries == 5 and cache.get("a", 1) is MISSING and cache.get("a", 0) == "v"
    cache.put("a", 6, "big", 9_000)  # over the bytes: the least recently used go until it fits
    assert cache.size <= 10_000 and cache.get("a", 6) == "big"
    cache.put("a", 7, "huge", 20_000)  # larger than the whole bound: not kept, nothing evicted for it
    assert cache.get("a", 7) is MISSING and cache.get("a", 6) == "big"
    cache.keep({})
    assert (cache.size, cache.entries) == (0, 0)


@settings(max_examples=80, deadline=None)
@given(
    honest=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=6),
    churn=st.lists(
        st.tuples(st.integers(min_value=0, max_value=9), st.integers(min_value=1, max_value=3000)),
        max_size=300,
    ),
    users=st.integers(min_value=1, max_value=3),
)
def test_an_owner_within_its_share_never_loses_an_entry(
    honest: list[int], churn: list[tuple[int, int]], users: int
) -> None:
    """An honest owner puts entries that fit in its share; then 10 owners of ``users`` other users put
    anything. The cache never goes over its bounds, and the honest owner keeps every entry."""
    cache: FairCache[int, int] = FairCache(max_bytes=20_000, max_entries=200)
    owners: dict[object, object] = {"honest": "h", **{f"o{i}": f"u{i % users}" for i in range(10)}}
    cache.keep(owners)
    share_bytes = 20_000 / (users + 1)
    kept = []
    for key, size in enumerate(honest):
        if cache.held("honest")[0] + size + 144 <= share_bytes:
            cache.put("honest", key, key, size)
            kept.append(key)
    for n, (who, size) in enumerate(churn):
        cache.put(f"o{who}", n, n, size)
        assert cache.size <= 20_000 and cache.entries <= 200
    assert [k for k in kept if cache.get("honest", k) is MISSING] == []
