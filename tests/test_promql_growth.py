"""The counter-growth expressions the hard-fault alerts read, evaluated by promtool on hand-made series.

``growth`` (Xid, ECC: a new series counts whole) and ``increased`` (fabric and AER counters: an agent's
first reading is the past) each read the value before the window once; this pins what they return in
every case their docstrings name, with the values worked out by hand from those docstrings: steady,
grown, born in the window, reset, and back after a gap longer than the lookback (found over
``memory``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from babysitter.generate.promql import growth, unit_test
from babysitter.generate.rules_fabric import increased
from gen_helpers import promtool, require_promtool

#: One sample a minute; evaluated at 30m over a 15m window: "before" is the last value at or before 15m.
SERIES = (
    ('c{s="steady"}', "3+0x40"),
    ('c{s="grew"}', "3+0x20 5+0x20"),  # 3 until 20m, 5 from 21m
    ('c{s="born"}', "_x20 2+0x20"),  # first seen at 20m, at 2
    ('c{s="born_grew"}', "_x20 2+0x5 4+0x14"),  # first seen at 20m at 2, 4 from 26m
    ('c{s="born_zero"}', "_x20 0+0x20"),
    ('c{s="reset_lower"}', "5+0x20 1+0x20"),  # 5, then 1 from 21m (the driver reloaded)
    ('c{s="reset_grew"}', "5+0x20 1+0x5 3+0x14"),  # 5, 1 from 21m, 3 from 27m
    ('c{s="reset_zero"}', "5+0x20 0+0x20"),
    ('c{s="gap"}', "4+0x5 _x20 6+0x15"),  # 4 until 5m, nothing 6m-25m, 6 from 26m
    ('c{s="gap_same"}', "4+0x5 _x20 4+0x15"),
)

#: growth: now minus the value before where that is lower; all of it for a series born in the window
#: or below its value before (reset); after a gap, the value before the gap (within memory).
GROWTH = {"grew": 2, "born": 2, "born_grew": 4, "reset_lower": 1, "reset_grew": 3, "gap": 2}
#: increased: now minus the value before; a series born in the window, or reset in it, counts from its
#: lowest reading in the window.
INCREASED = {"grew": 2, "born_grew": 2, "reset_grew": 2, "gap": 2}


def _promtool(tmp_path: Path, expr: str, want: dict[str, int]) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on ``expr`` returning exactly ``want`` (series ``s`` -> value) at 30m."""
    require_promtool()
    cases = [(expr, [(f'{{s="{s}"}}', v) for s, v in sorted(want.items())])]
    test = unit_test(SERIES, cases, eval_time="30m")
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"rule_files": [], "tests": [test]}))
    return promtool(["test", "rules", "t.yaml"], tmp_path)


def _run(tmp_path: Path, expr: str, want: dict[str, int]) -> None:
    result = _promtool(tmp_path, expr, want)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_growth_counts_new_series_and_resets_whole_and_finds_the_value_before_a_gap(tmp_path: Path) -> None:
    _run(tmp_path, growth("c", "15m"), GROWTH)


def test_increased_counts_from_the_first_reading_of_a_new_or_reset_series(tmp_path: Path) -> None:
    _run(tmp_path, increased("c", "15m"), INCREASED)


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """Not vacuous: the same harness fails on a value one off, and on a missing series."""
    for want in ({**GROWTH, "grew": 3}, {k: v for k, v in GROWTH.items() if k != "gap"}):
        assert _promtool(tmp_path, growth("c", "15m"), want).returncode != 0, want
