"""What slowed a slow episode, from a real Prometheus: each cause the report's --prometheus checks.

One TSDB (backfilled with promtool) holds five runs slowed for the same 20 minutes, each by one thing:
a straggler whose GPU's PCIe link trained at x8 of x16, a straggler whose host's InfiniBand port
counts symbol errors, every GPU power-braked (no straggler: all ranks alike), a straggler with nothing
wrong on its host, and nothing at all. ``attribute`` must charge each to its cause and name the rank,
host and GPU the evidence names (the throttle end to end, with a live agent, is in
``test_slowdown_e2e.py``).
"""

from __future__ import annotations

import math
import time

import pytest

from babysitter.catalog import fabric as F
from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.explain.queries import ExplainQueries
from babysitter.explain.slowdown import attribute, attribute_episode
from babysitter.generate.config import GenerateConfig
from babysitter.ledger.slowcause import Episode, SlowdownSplit
from babysitter.prom import PromClient, Sample
from test_scorecard_helpers import backfilled_prometheus

pytestmark = pytest.mark.prometheus

STEP = 15.0
HOUR = 3600.0
US = 1_000_000


def _line(name: str, labels: dict[str, str], value: float, t: float) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}} {value:g} {t:.0f}"


def _series(start: float, end: float) -> list[str]:
    """Two ranks per run, each on a GPU of its own host; what goes wrong, from 20 minutes before the end."""
    lines: list[str] = []
    bad_from = end - 1200
    times = [start + i * STEP for i in range(int((end - start) // STEP) + 1)]
    runs = {  # run -> (straggling rank, what is wrong on its host)
        "pcie": (1, "pcie"),
        "fabric": (1, "fabric"),
        "braked": (None, "throttle_all"),
        "straggler": (1, ""),
        "nothing": (None, ""),
    }
    for run, (slow, fault) in runs.items():
        for rank in (0, 1):
            host = f"{run}-h{rank}:9400"
            uuid = f"GPU-{run}-{rank}"
            trainer = {"cluster": "c1", "run": run, "rank": str(rank), "instance": host, "job": "node"}
            gpu = {"cluster": "c1", "instance": host, "job": "node", "gpu": "0", "uuid": uuid}
            gpu |= {"pci_bus_id": "0000:18:00", "model": "NVIDIA H100 80GB HBM3"}
            late = rank == slow
            for t in times:
                score = 1.5 if late and t >= bad_from else 1.0
                lines.append(_line(R.STRAGGLER_SCORE.name, trainer, score, t))
                lines.append(_line(T.INFO.name, {**trainer, "uuid": uuid}, 1, t))
                lines.append(_line(N.GPU_UP.name, gpu, 1, t))
                braked = fault == "throttle_all" and t >= bad_from
                lines.append(
                    _line(
                        N.GPU_CLOCK_EVENT_ACTIVE.name, {**gpu, "reason": "hw_power_brake_slowdown"}, braked, t
                    )
                )
                pcie = {"cluster": "c1", "instance": host, "job": "node", "pci_address": "0000:18:00.0"}
                narrow = fault == "pcie" and late and t >= bad_from
                lines.append(_line(F.PCIE_LINK_WIDTH.name, {**pcie, "kind": "gpu"}, 8 if narrow else 16, t))
                lines.append(_line(F.PCIE_LINK_MAX_WIDTH.name, {**pcie, "kind": "gpu"}, 16, t))
                port = {"cluster": "c1", "instance": host, "job": "node", "device": "mlx5_0", "port": "1"}
                errors = max(0.0, (t - bad_from) / 60) if fault == "fabric" and late else 0.0
                lines.append(_line(F.IB_PORT_ERRORS.name, {**port, "counter": "symbol_error"}, errors, t))
    return lines


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> object:
    workdir = tmp_path_factory.mktemp("attribution")
    end = math.floor(time.time() / 3600) * 3600 - 3600
    start = end - HOUR
    by_name: dict[str, list[str]] = {}
    for text in _series(start, end):
        by_name.setdefault(text.split("{", 1)[0], []).append(text)
    body = [item for name, texts in by_name.items() for item in (f"# TYPE {name} gauge", *texts)]
    path = workdir / "series.om"
    path.write_text("\n".join(body) + "\n# EOF\n")
    with backfilled_prometheus(workdir, [path], start=start, end=end, lookback="1m") as url:
        yield url, end


def _split(url: str, run: str, end: float) -> SlowdownSplit:
    """The last 20 minutes as one episode: 120 s beyond the ideal, nothing named by the ledger."""
    episode = Episode(0, round((end - 1200) * US), round(end * US), 120 * US, 1200 * US, 4000, 1, 4000)
    return attribute(PromClient(url), SlowdownSplit(episode.excess_us, [episode], 0.3, 0.01), run)


@pytest.mark.parametrize(
    ("run", "cause", "rank", "evidence"),
    [
        ("pcie", "pcie", 1, "PCIe link of gpu 0000:18:00.0 on pcie-h1:9400 at x8 of x16"),
        ("fabric", "fabric", 1, "mlx5_0 port 1 errors on fabric-h1:9400"),
        ("braked", "gpu_throttling", None, "hw_power_brake_slowdown 100% of the time"),
        ("straggler", "straggler", 1, "train_straggler_score of rank 1 averaged"),
        ("nothing", "unknown", None, "no rank slower than the others"),
    ],
)
def test_each_cause_is_charged_with_its_evidence(
    prom: tuple[str, float], run: str, cause: str, rank: int | None, evidence: str
) -> None:
    url, end = prom
    split = _split(url, run, end)
    (episode,) = split.episodes
    assert split.source == "prometheus"
    assert episode.cause == cause, episode.evidence
    assert episode.rank == rank
    assert any(evidence in line for line in episode.evidence), episode.evidence
    if rank is not None:
        assert episode.host == f"{run}-h{rank}:9400" and episode.gpu == f"GPU-{run}-{rank}"
    assert split.by_cause[cause] == pytest.approx(120.0)


def test_the_ledgers_culprit_is_checked_first(prom: tuple[str, float]) -> None:
    """An episode the straggler verdicts already charged to rank 1 keeps that rank; its host's narrow
    PCIe link makes the cause pcie."""
    url, end = prom
    episode = Episode(0, round((end - 1200) * US), round(end * US), 60 * US, 600 * US, 100, 1, 100)
    episode.cause, episode.rank, episode.host = "straggler", 1, "pcie-h1"
    split = attribute(PromClient(url), SlowdownSplit(episode.excess_us, [episode], 0.3, 0.01), "pcie")
    assert split.episodes[0].cause == "pcie" and split.episodes[0].rank == 1


def test_a_throttle_during_the_slow_part_of_a_merged_episode_is_charged() -> None:
    """An episode merged from a noisy step and, 18 s later, a 12 s throttled stretch spans 30 s; the
    GPU throttled for 40% of that span, all of the slow time. The throttle is judged against the slow
    time (the episode's slow share), not the span: a loaded CI run charged such an episode 0 s."""
    begin = 1_000_000.0
    # 12.6 s of slow steps (9 s ideal, 3.6 s beyond it) in a 30 s span.
    episode = Episode(0, round(begin * US), round((begin + 30) * US), round(3.6 * US), 9 * US, 90, 10, 200)
    assert episode.slow_share == pytest.approx(0.42)
    asked: list[str] = []

    def ask(expr: str, at: float) -> list[Sample]:
        asked.append(expr)
        if T.INFO.name in expr:
            return [Sample({"rank": "0", "uuid": "GPU-a", "instance": "t:1"}, 1.0)]
        if N.GPU_UP.name in expr:
            return [Sample({"uuid": "GPU-a", "gpu": "1", "instance": "h1:9400"}, 1.0)]
        if N.GPU_CLOCK_EVENT_ACTIVE.name in expr:
            return [Sample({"uuid": "GPU-a", "reason": "hw_thermal_slowdown"}, 0.4)]
        return []

    q = ExplainQueries("r", "c1", GenerateConfig())
    charged = attribute_episode(q, ask, episode, coverage=episode.slow_share)
    assert charged.cause == "gpu_throttling" and charged.gpu == "GPU-a", charged.evidence
    # Against the whole span (the old coverage of 1), 40% is under the 50% a throttle must cover.
    assert attribute_episode(q, ask, episode).cause == "unknown"
    assert any("[30s]" in expr for expr in asked)
