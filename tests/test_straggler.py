"""Straggler scores: the arithmetic, the off switches, and a real lockstep exchange under torchrun."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import babysitter
from babysitter.training.straggler import StragglerMonitor, scores

SCRIPT = Path(__file__).parent / "scripts" / "straggler_lockstep.py"


def test_scores_are_each_median_over_the_median_rank() -> None:
    assert scores([1.0, 1.0, 2.0]) == [1.0, 1.0, 2.0]
    assert scores([2.0, 4.0, 6.0, 8.0]) == [0.4, 0.8, 1.2, 1.6]  # median of four: 5
    # a rank without data (no steps yet: NaN) has no score and does not move the others'
    assert scores([1.0, math.nan, 3.0]) == [0.5, None, 1.5]
    assert scores([math.nan, 0.0]) == [None, None]


def test_waits_for_torch_distributed_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """watch() before init_process_group: the exchange waits, checking only at round boundaries."""
    tracker = babysitter.watch(run="st", port=-1, hang_timeout=None)
    try:
        monitor = StragglerMonitor(tracker, every=5)
        with caplog.at_level(logging.INFO, logger="babysitter"):
            assert monitor.start() is False
            assert monitor.waiting and not monitor.enabled
            assert monitor.attach() is monitor
            for _ in range(20):
                tracker.step()
        assert [r.getMessage() for r in caplog.records if "straggler" in r.getMessage()] == [
            "babysitter: straggler scores wait for torch.distributed: the exchange starts at the first "
            "round boundary (every 5 steps) after init_process_group"
        ]
        assert monitor.score is None and monitor.rounds == 0 and monitor.waiting
        assert tracker.steps == 20
    finally:
        tracker.close()


def test_watch_with_straggler_every_but_no_process_group_trains_normally() -> None:
    tracker = babysitter.watch(run="st2", port=-1, hang_timeout=None, straggler_every=4)
    try:
        for _ in range(10):
            tracker.step(tokens=3)
        assert tracker.steps == 10
    finally:
        tracker.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"every": 1}, "interval"),
        ({"every": 2.5}, "interval"),
        ({"timeout": 0}, "timeout"),
        ({"max_pending": 0}, "max_pending"),
    ],
)
def test_bad_options_fail_at_setup(kwargs: dict[str, object], match: str) -> None:
    tracker = babysitter.watch(run="st3", port=-1, hang_timeout=None)
    try:
        with pytest.raises(ValueError, match=match):
            StragglerMonitor(tracker, **kwargs)  # type: ignore[arg-type]
    finally:
        tracker.close()
    with pytest.raises(ValueError, match="straggler_every"):
        babysitter.watch(run="st4", port=-1, straggler_every=1)


@pytest.mark.slow
def test_lockstep_ranks_have_equal_step_times_but_the_work_score_flags_the_slow_one(tmp_path: Path) -> None:
    """Under a per-step all-reduce every rank's step takes as long as the slowest; the exchange of work
    time (what the callbacks measure) still singles out the slow rank, next to training's own
    collectives on the default group, without a deadlock. The flight recorder is off here
    (TORCH_FR_BUFFER_SIZE=0, watch() after init_process_group): the documented fallback, said once
    per rank in the log and in train_info."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "0"}
    done = subprocess.run(
        [*argv, str(SCRIPT), str(tmp_path), "60", "1"], capture_output=True, timeout=180, check=False, env=env
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["rounds"] >= 4 for r in ranks), ranks
    assert all(r["recorder"] == r["train_info"] == "off" and r["source"] == "work" for r in ranks), ranks
    said = [line for line in done.stderr.decode().splitlines() if "flight recorder off" in line]
    assert len(said) == 4, said  # once per rank from each of its two readers (watch()'s and the script's)
    assert all("TORCH_FR_BUFFER_SIZE=0; straggler scores from step times" in line for line in said), said
    steps = [r["median_step"] for r in ranks]
    assert max(steps) / min(steps) < 1.2, ranks  # step time alone cannot tell them apart
    assert ranks[1]["score"] > 1.2 and ranks[0]["score"] < 0.9, ranks  # 2 ranks: the median is their mean
