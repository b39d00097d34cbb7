"""Ledgers written by the previous format (schema version 1) are still read, with the same numbers.

``data/ledger/v1-run`` was written by the real tracker and writer of commit f4a2078 (see
``data/ledger/make_v1_ledger.py``) and ``data/ledger/v1-report.json`` is that code's
``babysitter report --json`` of it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from babysitter.ledger import LedgerWriter, read_ledger, summarize
from babysitter.ledger.records import SCHEMA_VERSION

DATA = Path(__file__).with_name("data") / "ledger"
LEDGER = "babysitter-ledger.jsonl"


def _same(got: object, want: object, where: str = "") -> None:
    """``got`` has every key ``want`` has, with the same value (new keys are allowed)."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        for key, value in want.items():
            _same(got.get(key), value, f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-9), where
    else:
        assert got == want, where


def test_a_version_1_ledger_reports_what_the_version_1_code_reported(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(DATA / "v1-run", run_dir)
    want = json.loads((DATA / "v1-report.json").read_text())
    want.pop("ledger")
    got = summarize(run_dir).to_json()
    _same(got, want)
    assert got["badput_seconds"]["data_stall"] > 0  # type: ignore[index]


def test_a_new_writer_continues_a_version_1_ledger(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(DATA / "v1-run", run_dir)
    before = summarize(run_dir).totals
    w = LedgerWriter(run_dir, run="v1-compat", flush_interval=0.02)
    try:
        assert w.wait_loaded(10)
        t0 = time.time()
        w.incarnation_start(time=t0, info={})
        w.progress(
            boundaries=[(36, t0 + 1), (37, t0 + 2)],
            data_wait_seconds=0.5,
            model_flops=0.0,
            peak_flops=None,
            data_waits=[0.25, 0.25],
        )
    finally:
        w.close(time=t0 + 3, clean=True)
    versions = [json.loads(line)["v"] for line in (run_dir / LEDGER).read_text().splitlines()]
    assert set(versions) == {1, SCHEMA_VERSION}
    assert versions == sorted(versions)
    summary = summarize(run_dir)
    assert summary.totals.restarts == before.restarts + 1
    assert summary.invalid_lines == summary.torn_lines == summary.fenced_lines == 0
    # The old incarnations keep their numbers; the new one adds its own stalls on top: the wait
    # before its first step (out of its startup) and the one inside its second.
    assert summary.totals.badput_seconds["data_stall"] == pytest.approx(
        before.badput_seconds["data_stall"] + 0.5, abs=1e-6
    )
    assert len(read_ledger(run_dir / LEDGER).records) > 0
