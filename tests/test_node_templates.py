"""A rank's blocks served from templates give what the full parse and checks give: samples, bytes, errors.

Each scrape's text is served twice, through :class:`Templates` (which goes the full way only for a
skeleton it has not seen or cannot stand for) and the full way alone, and the two must agree on
every scrape: the same families and samples, the same rendered bytes, or the same error.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest
from prometheus_client.core import Metric

from babysitter import registration
from babysitter.export.text import Lines, render_text
from babysitter.node.agent import Agent, merge_families
from babysitter.node.workloads import share
from babysitter.node.workloads.fetch import FetchError
from babysitter.node.workloads.templates import Templates
from babysitter.node.workloads.trainers import TrainersCollector, _parse
from node_helpers import parse_exposition
from test_node_trainers_bound import TextServer

OWNER = ("pid", 1.0, "http://127.0.0.1:1/metrics", "r", 0)


def _full(tmp_path: Path, run: str = "r", rank: int = 0):  # type: ignore[no-untyped-def]
    """The trainers collector's own parse and checks, bound to a registration of ``run``/``rank``."""
    collector = TrainersCollector(tmp_path / "unused")
    endpoint = registration.Endpoint(os.getpid(), 1.0, "http://127.0.0.1:1/metrics", run, rank, 0)
    reg = registration.Registered(endpoint, os.geteuid(), tmp_path / "x.json")
    calls: list[bytes] = []

    def full(text: bytes) -> list[Metric]:
        calls.append(text)
        return collector._bound(_parse(text), reg)

    return full, calls


def _serve(text: str, via) -> tuple[str, bytes | str]:  # type: ignore[no-untyped-def]
    """(samples, rendered bytes) of every block of ``text`` through ``via(block)``, or the error."""
    try:
        families: list[Metric] = []
        for block in share.split_families(text.encode()):
            families.extend(via(block.text))
        # Values as floats (the parser gives 1 for "1", a template 1.0: both render "1.0"); repr: NaN == NaN.
        samples = repr(
            [
                (f.name, f.documentation, f.type, [s._replace(value=float(s.value)) for s in f.samples])
                for f in families
            ]
        )
        dropped: list[str] = []
        return samples, render_text(merge_families(families, dedupe=False), on_duplicate=dropped.append)
    except FetchError as exc:
        return exc.reason, type(exc).__name__


def _registry(values: list[float], label: str) -> str:
    registry = CollectorRegistry()
    names = ["run", "rank", "gpu"]
    Counter("steps", "Steps with a \\ and a\nnewline.", names, registry=registry).labels("r", "0", label).inc(
        abs(values[0]) if math.isfinite(values[0]) else 1
    )
    Gauge("mfu_ratio", 'Quote " inside.', ["gpu"], registry=registry).labels(label).set(values[1])
    Gauge("plain", "No labels.", registry=registry).set(values[2])
    hist = Histogram("step_seconds", "h", ["gpu"], buckets=(0.1, 1.0), registry=registry)
    summ = Summary("save_seconds", "s", registry=registry)
    for value in values:
        if math.isfinite(value):
            hist.labels(label).observe(abs(value))
            summ.observe(abs(value))
    return generate_latest(registry).decode()


_NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20).map(float),
)
_TOKEN = st.sampled_from(
    ["1_0", "abc", "nan", "NaN", "+Inf", "-inf", "0x10", "1e5", "--1", "1.", ".5", "", "1,5"]
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    scrapes=st.lists(st.lists(_NUMBER, min_size=3, max_size=3), min_size=3, max_size=4),
    label=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6),
    garbage=st.one_of(st.none(), st.tuples(st.integers(min_value=0, max_value=40), _TOKEN)),
)
def test_templates_serve_what_the_full_way_serves(
    tmp_path: Path, scrapes: list[list[float]], label: str, garbage: tuple[int, str] | None
) -> None:
    """Real expositions whose values change at every scrape (any float, NaN and infinities, any
    label value); at the last scrape one value token may be replaced by garbage or an odd number."""
    full, _ = _full(tmp_path)
    templates = Templates()
    for n, values in enumerate(scrapes):
        text = _registry(values, label)
        if garbage is not None and n == len(scrapes) - 1:
            lines = text.split("\n")
            samples = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
            at = samples[garbage[0] % len(samples)]
            lines[at] = lines[at].rpartition(" ")[0] + " " + garbage[1]
            text = "\n".join(lines)
        ours = _serve(text, lambda block: templates.serve(OWNER, block, full))
        assert ours == _serve(text, full), f"scrape {n}"


ODD = [
    ('# TYPE a gauge\na{x="1"} 1 1712345678000\n', True),  # a timestamp
    ("# TYPE a gauge\na 1\r\n", True),  # a carriage return
    ("# TYPE a gauge\n a 1\n", True),  # a leading space
    ("# TYPE a gauge\na  1\n", False),  # two spaces (the parser's slow path): templated
    ("# TYPE a info\na 1\n", True),  # a kind the template does not stand for
    ('# TYPE a gauge\na{run="other"} 1\n', True),  # fails the endpoint (label_mismatch) every time
    ("# TYPE a gauge\na 1\nup 1\n", True),  # a reserved name dropped: the checks decide each time
    ('# TYPE a gauge\na{x="1"} 1\na{x="2"} 2\n', False),  # plain: templated
    ("a 1\nb 2\n", False),  # samples without comments
]


@pytest.mark.parametrize(("text", "every_time"), ODD)
def test_what_the_template_cannot_stand_for_goes_the_full_way_every_time(
    tmp_path: Path, text: str, every_time: bool
) -> None:
    full, calls = _full(tmp_path)
    templates = Templates()
    for _ in range(3):
        assert _serve(text, lambda block: templates.serve(OWNER, block, full)) == _serve(text, full)
    blocks = len(share.split_families(text.encode()))
    assert len(calls) == (6 if every_time else 4) * blocks  # the reference's 3, and ours: 3 or 1


def test_a_changed_skeleton_is_parsed_again_and_owners_gone_are_forgotten(tmp_path: Path) -> None:
    """New labels or a new help text make a new skeleton; keep() drops the templates of
    registrations gone; past its bound the least recently used go; all the while the output is right."""
    full, calls = _full(tmp_path)
    templates = Templates(max_bytes=4000)
    texts = [
        '# HELP a one\n# TYPE a gauge\na{x="1"} 1\n',
        '# HELP a one\n# TYPE a gauge\na{x="1"} 2\n',  # a value: from the template
        '# HELP a one\n# TYPE a gauge\na{x="2"} 2\n',  # a label: parsed
        '# HELP a two\n# TYPE a gauge\na{x="2"} 3\n',  # the help: parsed
        '# HELP a two\n# TYPE a gauge\na{x="2"} 4\n',  # from the template
    ]
    expected = [True, False, True, True, False]
    for text, parsed in zip(texts, expected, strict=True):
        before = len(calls)
        got = templates.serve(OWNER, text.encode(), full)
        assert (len(calls) > before) == parsed, text
        assert [(s.name, s.labels, float(s.value)) for f in got for s in f.samples] == [
            (s.name, s.labels, float(s.value)) for f in full(text.encode()) for s in f.samples
        ]
    other = ("other", *OWNER[1:])
    templates.serve(other, texts[0].encode(), full)
    templates.keep([other])
    before = len(calls)
    templates.serve(OWNER, texts[4].encode(), full)
    assert len(calls) == before + 1, "the gone owner's template was kept"
    for i in range(20):  # over 4000 bytes of templates: the oldest evicted, never wrong
        text = f'# TYPE a gauge\na{{x="{i}"}} {i}\n'.encode()
        assert [s.value for f in templates.serve(OWNER, text, full) for s in f.samples] == [float(i)]
    assert 0 < templates.size <= 4000 and templates.cache.evictions > 0


def test_lines_merge_across_ranks_and_duplicates_drop(tmp_path: Path) -> None:
    """Two ranks' blocks of one family render under one header; a series both serve, once (told)."""
    text = "# HELP a h\n# TYPE a gauge\na 1\n"
    served = []
    for rank in (0, 1):
        full, _ = _full(tmp_path, rank=rank)
        templates = Templates()
        templates.serve(OWNER, text.encode(), full)
        served.extend(templates.serve(OWNER, text.encode(), full))
    assert all(type(f) is Lines for f in served)
    full, _ = _full(tmp_path, rank=0)
    served.extend(Templates().serve(OWNER, text.encode(), full))  # rank 0 again, the full way
    dropped: list[str] = []
    body = render_text(merge_families(served, dedupe=False), on_duplicate=dropped.append).decode()
    assert body == '# HELP a h\n# TYPE a gauge\na{rank="0",run="r"} 1.0\na{rank="1",run="r"} 1.0\n'
    assert dropped == ["a"]
    assert [s.labels for f in merge_families(served) for s in f.samples] == [
        {"run": "r", "rank": "0"},
        {"run": "r", "rank": "1"},
    ]


def test_a_rank_turning_to_garbage_fails_once_templated_and_recovers(tmp_path: Path) -> None:
    """Through the agent's collector and a real endpoint: values served from the template change
    with the rank's; a value that is not a number fails the endpoint (protocol); good text again
    serves again."""
    reg = tmp_path / "reg"
    server = TextServer(reg, "r", 0, "# TYPE a gauge\na 1\n")
    try:
        agent = Agent([TrainersCollector(reg)])

        def a_and_success() -> tuple[list[float], float]:
            got = parse_exposition(agent.render().decode())
            return got.find("a"), got.value("babysitter_trainer_scrape_success", run="r", rank="0")

        assert a_and_success() == ([1.0], 1.0)
        server.body = b"# TYPE a gauge\na 2.5\n"
        assert a_and_success() == ([2.5], 1.0)
        server.body = b"# TYPE a gauge\na two\n"
        assert a_and_success() == ([], 0.0)
        server.body = b"# TYPE a gauge\na 3\n"
        assert a_and_success() == ([3.0], 1.0)
        agent.close()
    finally:
        server.stop()
