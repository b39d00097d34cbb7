"""The loop from fault to resumed training, on a real Slurm cluster, for the three fault classes
(tests/loop_helpers.py has the stack): a crashed rank, an Xid 79, a stopped rank. Each is paged, its
bundle gathered, its node drained where the node is to blame, its job requeued, and the job resumes from
the checkpoint the remediator's note names (the newest that verifies), with no human step; the ledger
and ``babysitter report`` give each restart its cause, time to detect and time to recover.

The fast profile (1 s scrapes, short windows) keeps it within a few minutes; benchmarks/bench_loop.py
runs the same loop at the shipped settings and records MTTR per fault class.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loop_helpers import ORDER, run_loop

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.prometheus]


def test_each_fault_class_goes_from_page_to_resumed_training_with_its_bundle(tmp_path: Path) -> None:
    measured, report, loop = run_loop(tmp_path, "fast", ORDER, timeout=300)
    for m in measured:
        print(
            f"{m.fault}: node {m.node}, alert +{m.seconds(m.alert_start)}, bundle +{m.seconds(m.bundle_at)}, "
            f"acted +{m.seconds(m.acted)} {m.actions}, resumed +{m.mttr} from step {m.resume_step}"
        )
    assert [m.fault for m in measured] == list(ORDER), loop.tail()
    by = {m.fault: m for m in measured}
    for m in measured:
        assert m.mttr is not None, (m, loop.tail())
        assert m.alert_start is not None and m.acted is not None and m.alert_start <= m.acted <= m.resumed  # type: ignore[operator]
        # Resumed from the checkpoint the remediator's note named: the newest that verified.
        assert m.note_resume_step is not None and m.resume_step == m.note_resume_step, m
        # The bundle came before the action, and it is in the run directory.
        assert m.bundle is not None and m.bundle_at is not None and m.bundle_at <= m.acted, m
        assert Path(m.bundle["path"]).parent == loop.run_dir / "incidents"
        assert (Path(m.bundle["path"]) / "bundle.json").exists()
        assert any(a.startswith(f"requeue {loop.job}") for a in m.actions), m.actions
    assert any(a == f"drain {by['xid'].node}" for a in by["xid"].actions), by["xid"].actions
    assert any(a == f"drain {by['hang'].node}" for a in by["hang"].actions), by["hang"].actions
    assert not any(a.startswith("drain") for a in by["crash"].actions)  # a crash is not the node's fault
    # The stopped rank did not answer; the crashed one was gone.
    assert by["hang"].bundle is not None and 1 in by["hang"].bundle["missing"]
    assert by["crash"].bundle is not None and by["crash"].bundle["missing"]
    # The report: one restart per fault, each with its cause and times.
    restarts = report["restart_list"]
    assert len(restarts) == len(ORDER)
    assert [r["remediation"]["alert"] for r in restarts] == [m.alert for m in measured]
    assert all(r["time_to_detect_seconds"] is not None and r["time_to_recover_seconds"] for r in restarts)
