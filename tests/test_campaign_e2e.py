"""The CI campaign: three faults on the simulated cluster, the fast profile, graded end to end.

Real parts: three node agents (simulated GPUs, fake sysfs trees), a three-rank lockstep gloo job
under torchrun registered on them, Prometheus with the generated fast-profile rules, Alertmanager
with the shipped routing, ``babysitter remediate --dry-run``; a planned restart or a slow but healthy
save in the quiet time. It fails when a fault is missed, when a page names the wrong place (or none),
when anything pages in healthy time, when a fault pages more than once or the remediator would have
done the wrong thing: babysitter.campaign.score grades it, and its table is the
failure message. benchmarks/results/campaign.md has the full campaigns.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from babysitter.campaign.cluster import ClusterOptions, campaign_config
from babysitter.campaign.play import play
from babysitter.campaign.report import markdown, to_json
from babysitter.campaign.schedule import Shape, build_schedule, short, timing_for
from promkit import ALERTMANAGER, PROMETHEUS, require_binary

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

#: The faults: a GPU off the bus (the job dies with it and is requeued), a deleted checkpoint, a
#: stopped rank (the hang must name it and its host).
FAULTS = ("xid79", "ckpt_deleted", "hang")
#: Seed 18 draws two slow saves as the quiet stretches' noise: a 159 s schedule, where seed 2's eval
#: phase (22.5 s, and the quiet kept after it) made 179 s and the test 186 s in CI, past the issue's
#: 3 minutes. The full campaigns (benchmarks/results/campaign.md) play the eval phases and restarts.
SEED = 18


def test_a_short_campaign_pages_every_fault_naming_its_place_and_nothing_else(tmp_path: Path) -> None:
    require_binary(PROMETHEUS, "prometheus")
    require_binary(ALERTMANAGER, "alertmanager")
    if shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun not installed")
    timing = short(timing_for("fast"))
    schedule = build_schedule(SEED, campaign_config("fast"), timing, Shape(), kinds=FAULTS)
    outcome = play(ClusterOptions(workdir=tmp_path, profile="fast"), schedule, timing)
    table = markdown([to_json(outcome, label="CI campaign")])
    s = outcome.score.summary
    assert s["detected"] == s["faults"] == len(FAULTS), table
    assert (s["culprit_wrong"], s["culprit_unnamed"]) == (0, 0), table
    assert (s["false_pages"], s["wrong_place"], s["left_over"]) == (0, 0, 0), table
    # One page per fault (issue 34: at most 1.2 pager notifications per fault), none resolved while
    # its fault lasts, and what the dry-run remediator planned is what each fault needed: the GPU's
    # host and the stopped rank's host drained and the job requeued, nothing for the checkpoint.
    assert s["notifications_per_fault"] <= 1.2 and s["resolved_mid_fault"] == 0, table
    assert (s["remedy_right"], s["remedy_wrong"]) == (len(FAULTS), 0), table
    print(table)
