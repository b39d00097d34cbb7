"""The scorecard: PromQL against a real Prometheus holding 7 days of two simulated clusters.

The clusters differ in speed (MFU), fault rate (restarts, Xid errors), checkpoint bandwidth and
storage latency; the scorecard must find each number the simulation put in and rank the better
cluster first. Unit tests cover parsing, validation and rendering.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import pytest
import yaml

from babysitter.cli import build_parser
from babysitter.generate import GenerateConfig
from babysitter.generate.rules import recording_groups
from babysitter.prom import PromClient, PromError
from babysitter.scorecard import METRICS, ClusterScore, QuerySet, Scorecard, duration_seconds
from babysitter.views.scorecard import format_value, render_png, render_table
from test_scorecard_helpers import (
    DAY,
    MODEL,
    SimCluster,
    backfilled_prometheus,
    expected_interruptions,
    openmetrics_days,
    rule_stages,
)

GOOD = SimCluster(
    name="provider-a",
    mfu=0.45,
    goodput=0.93,
    restart_every_hours=120,
    xids={"restart_app": 2},
    checkpoint_bytes_per_second=2e9,
    storage_seconds=0.05,
    probe_peak_ratio=0.78,
    slowdown=0.02,
)
BAD = SimCluster(
    name="provider-b",
    mfu=0.36,
    goodput=0.71,
    restart_every_hours=12,
    xids={"reset_gpu": 12, "restart_app": 20, "reboot": 3},
    checkpoint_bytes_per_second=3e8,
    storage_seconds=0.4,
    probe_peak_ratio=0.61,
    probe_busbw=40e9,
    probe_storage_write=2e8,
    probe_lemons=1,
    other_model_mfu=0.9,
    slowdown=0.08,
    straggler_rank=2,
)
DAYS = 7
STEP = 1800.0


class TestDurations:
    def test_units(self) -> None:
        """Prometheus' one-unit durations convert to seconds."""
        assert duration_seconds("30d") == 30 * DAY
        assert duration_seconds("5m") == 300
        assert duration_seconds("2w") == 14 * DAY

    @pytest.mark.parametrize("text", ["", "30", "d", "1h30m", "0d", "-1d", "3 d"])
    def test_rejects(self, text: str) -> None:
        """Anything else is a clear setup error."""
        with pytest.raises(ValueError, match="duration"):
            duration_seconds(text)


class TestQuerySet:
    def test_bad_label_and_braces_rejected(self) -> None:
        """A grouping label that is not a label name, or matchers with braces, fail at setup."""
        with pytest.raises(ValueError, match="--by"):
            QuerySet(by="cluster-name")
        with pytest.raises(ValueError, match="without braces"):
            QuerySet(mfu_match='{model="x"}')

    def test_mfu_match_only_narrows_mfu(self) -> None:
        """The model-config matchers select the MFU series; goodput and faults stay cluster-wide."""
        q = QuerySet(mfu_match='model="llama3-8b"')
        assert 'model="llama3-8b"' in q.mfu()
        assert "llama3-8b" not in q.goodput()
        assert "llama3-8b" not in q.xid_errors()

    def test_group_label_everywhere(self) -> None:
        """Every query groups by the chosen label (clusters or providers)."""
        q = QuerySet(by="provider")
        for expr in (q.mfu(), q.goodput(), q.gpu_hours(), q.restarts(), q.xid_errors(), q.storage_p99()):
            assert "by (provider" in expr


class TestClient:
    def test_scheme_checked(self) -> None:
        """Only http(s) URLs are accepted (no file: or custom schemes)."""
        with pytest.raises(ValueError, match="http"):
            PromClient("file:///etc/passwd")

    def test_unreachable_is_prom_error(self) -> None:
        """A Prometheus that is not there gives PromError, not a traceback."""
        from promkit import free_port

        client = PromClient(f"http://127.0.0.1:{free_port()}", timeout=2)
        with pytest.raises(PromError):
            client.query("up")

    def test_cli_unreachable_exit_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The command reports an unreachable Prometheus on one line and exits 2."""
        from promkit import free_port

        args = build_parser().parse_args(["scorecard", "--prometheus", f"http://127.0.0.1:{free_port()}"])
        assert args.func(args) == 2
        assert "babysitter scorecard:" in capsys.readouterr().err

    @pytest.mark.parametrize("price", ["provider-a=", "cheap", "-1", "inf", "nan"])
    def test_cli_bad_price_exit_2(self, price: str, capsys: pytest.CaptureFixture[str]) -> None:
        """A price that is not a finite number >= 0 is a setup error naming it, before any query."""
        argv = ["scorecard", "--prometheus", "http://127.0.0.1:1", "--price", price]
        args = build_parser().parse_args(argv)
        assert args.func(args) == 2
        assert f"--price {price!r}" in capsys.readouterr().err


class TestRender:
    def test_format(self) -> None:
        """Cells: ratios as percent, bandwidth with SI prefixes, latency in ms under a second."""
        assert format_value(0.4512, "ratio") == "45.1%"
        assert format_value(2.5e9, "Bps") == "2.5 GB/s"
        assert format_value(0.05, "s") == "50.0 ms"
        assert format_value(None, "s") == "-"

    def test_table_and_png_without_data(self, tmp_path: Path) -> None:
        """A cluster with almost no data still renders (dashes), and the PNG is a real PNG."""
        card = Scorecard(
            "cluster", "30d", 0.0, [ClusterScore("a", rank=1, goodput=0.5), ClusterScore("b", rank=2)]
        )
        from io import StringIO

        out = StringIO()
        render_table(card, out)
        assert "goodput" in out.getvalue()
        assert "50.0%" in out.getvalue()
        render_png(card, tmp_path / "s.png")
        assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A Prometheus holding DAYS days of the two clusters (module-scoped: the backfill takes seconds)."""
    workdir = tmp_path_factory.mktemp("scorecard")
    end = math.floor(time.time() / 7200) * 7200 - 7200
    files = openmetrics_days([GOOD, BAD], workdir, end=end, days=DAYS, step=STEP)
    # The scorecard reads the recording rules: backfill them as Prometheus would have evaluated them
    # (rate window 2h, the model kept on run-level rules), each after the rules it reads.
    groups = recording_groups(GenerateConfig(rate_window="2h", run_labels=("model",)))
    q = QuerySet(window=f"{DAYS}d", rate_window="2h", step="30m", mfu_match=f'model="{MODEL}"')
    queries = [getattr(q, m)() for m in dir(QuerySet) if not m.startswith("_") and callable(getattr(q, m))]
    stages = []
    for index, chunk in enumerate(rule_stages(groups, [x for x in queries if isinstance(x, str)])):
        path = workdir / f"rules-{index}.yaml"
        path.write_text(yaml.safe_dump({"groups": [{"name": f"stage-{index}", "rules": chunk}]}))
        stages.append(path)
    start = end - DAYS * DAY
    # The simulation samples every 30 min: a 30 min lookback lets instant selectors see each sample
    # until the next, as 15 s scrapes would. Not more: a backfilled rule series has no staleness
    # marker, and with 35 min the Xid rule's last sample of a 2 h window was read again by the next
    # 2 h step of the scorecard's subquery whenever the group's evaluation offset was over 25 min,
    # counting that error twice (CI: restart_app 3 for 2).
    with backfilled_prometheus(
        workdir, files, stages, start=start, end=end, eval_interval="30m", lookback="30m"
    ) as url:
        yield url, end, workdir


def _card_json(
    url: str, end: float, tmp_path: Path, *extra: str, match: str = f'model="{MODEL}"'
) -> dict[str, object]:
    out = tmp_path / "card.json"
    argv = ["scorecard", "--prometheus", url, "--window", f"{DAYS}d", "--at", str(end)]
    argv += ["--rate-window", "2h", "--step", "30m", "--json", str(out), "--mfu-match", match, *extra]
    args: argparse.Namespace = build_parser().parse_args(argv)
    assert args.func(args) == 0
    return json.loads(out.read_text())  # type: ignore[no-any-return]


@pytest.mark.prometheus
@pytest.mark.slow
class TestBackfilledClusters:
    def test_ranks_good_cluster_first(self, backfilled: tuple[str, float, Path], tmp_path: Path) -> None:
        """The faster, more reliable cluster ranks first and wins every column."""
        url, end, _ = backfilled
        card = _card_json(
            url, end, tmp_path, "--mfu-match", f'model="{MODEL}"', "--png", str(tmp_path / "card.png")
        )
        clusters = card["clusters"]
        assert isinstance(clusters, list)
        assert [c["cluster"] for c in clusters] == [GOOD.name, BAD.name]
        assert [c["rank"] for c in clusters] == [1, 2]
        best = card["best"]
        assert isinstance(best, dict)
        assert set(best) == {m.key for m in METRICS}
        for key, winner in best.items():
            assert winner == GOOD.name, key
        assert (tmp_path / "card.png").stat().st_size > 10_000

    def test_numbers_match_the_simulation(self, backfilled: tuple[str, float, Path], tmp_path: Path) -> None:
        """Each column equals what the simulation put in (counters: within increase()'s extrapolation)."""
        url, end, _ = backfilled
        # A price for one cluster and a default for the others: GPU-hours lost (the ledger's badput,
        # every cause, times the run's ranks) at each cluster's price.
        card = _card_json(
            url, end, tmp_path, "--price", f"{BAD.name}=3.5", "--price", "2", "--currency", "EUR"
        )
        assert card["currency"] == "EUR"
        by_name = {c["cluster"]: c for c in card["clusters"]}  # type: ignore[union-attr]
        for sim, price in ((GOOD, 2.0), (BAD, 3.5)):
            got = by_name[sim.name]
            lost = (1 - sim.goodput) * sim.ranks * DAYS * 24
            assert got["gpu_hours_lost"] == pytest.approx(lost, rel=0.01)
            assert got["price_per_gpu_hour"] == price
            assert got["money_lost"] == pytest.approx(lost * price, rel=0.01)
            assert got["mfu"] == pytest.approx(sim.mfu, rel=1e-3)
            assert got["goodput"] == pytest.approx(sim.goodput, rel=1e-3)
            # GPU time lost to slow steps next to failures, and the slow part by its likely cause: the
            # straggling rank where one straggles, else unknown.
            assert got["slowdown_share"] == pytest.approx(sim.slowdown, rel=1e-3)
            assert got["failure_share"] == pytest.approx(1 - sim.goodput - sim.slowdown, rel=1e-3)
            cause = "unknown" if sim.straggler_rank is None else "straggler"
            assert got["slowdown_by_cause"] == {cause: pytest.approx(sim.slowdown, rel=0.02)}
            assert got["effective_mfu"] == pytest.approx(sim.mfu * sim.goodput, rel=1e-3)
            assert got["checkpoint_bytes_per_second"] == pytest.approx(
                sim.checkpoint_bytes_per_second, rel=1e-3
            )
            assert got["storage_p99_seconds"] == pytest.approx(sim.storage_seconds, rel=1e-3)
            assert got["gpu_hours"] == pytest.approx(sim.gpus * DAYS * 24, rel=0.01)
            assert got["rank_hours"] == pytest.approx(sim.ranks * DAYS * 24, rel=0.01)
            assert got["interruptions_per_1000_gpu_hours"] == pytest.approx(
                expected_interruptions(sim, DAYS), rel=0.1
            )
            for action, count in sim.xids.items():
                assert got["xid_by_action"][action] == pytest.approx(count, rel=0.1, abs=0.5), action
            assert got["probe_peak_ratio"] == pytest.approx(sim.probe_peak_ratio)
            assert got["probe_lemons"] == sim.probe_lemons
            assert got["probe_busbw_bytes_per_second"] == pytest.approx(sim.probe_busbw)
            assert got["probe_storage_write_bytes_per_second"] == pytest.approx(sim.probe_storage_write)

    def test_mfu_needs_the_model_match(self, backfilled: tuple[str, float, Path], tmp_path: Path) -> None:
        """Without --mfu-match, a run of another model enters MFU: the median over runs moves."""
        url, end, _ = backfilled
        card = _card_json(url, end, tmp_path, match="")
        bad = next(c for c in card["clusters"] if c["cluster"] == BAD.name)  # type: ignore[union-attr]
        assert bad["mfu"] == pytest.approx((BAD.mfu + 0.9) / 2, rel=1e-3)
        assert card["mfu_match"] == ""

    def test_group_by_other_label_and_empty(
        self, backfilled: tuple[str, float, Path], tmp_path: Path
    ) -> None:
        """Grouping by a label no series has finds no clusters: exit 1 with a message, not a crash."""
        url, end, _ = backfilled
        argv = ["scorecard", "--prometheus", url, "--window", f"{DAYS}d", "--at", str(end)]
        argv += ["--by", "provider"]
        args = build_parser().parse_args(argv)
        assert args.func(args) == 1

    def test_table_output(
        self, backfilled: tuple[str, float, Path], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The default output is a table with both clusters, best first, and Xid rates by action."""
        url, end, _ = backfilled
        argv = ["scorecard", "--prometheus", url, "--window", f"{DAYS}d", "--at", str(end)]
        argv += ["--rate-window", "2h", "--step", "30m", "--mfu-match", f'model="{MODEL}"']
        args = build_parser().parse_args(argv)
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert out.index(f"#1 {GOOD.name}") < out.index(f"#2 {BAD.name}")
        assert "reset_gpu" in out
        assert "GPU-hours lost" in out and "USD lost" not in out  # no --price: no money row
