"""The committed Xid alerts over agent restarts and node reboots, with real promtool.

The Xid counter means "Xids since boot" and an agent reads the kernel log's history at start, so a
restarted agent shows the same values after a gap in the scrapes. The alerts must not page again for
Xids already paged (a failed scrape or a restart marks the series stale), and must page for Xids that
happened while the agent was down or after a reboot.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from babysitter.catalog import node as N
from gen_helpers import REPO, promtool, require_promtool

XID = N.GPU_XID_ERRORS.name
LABELS = (
    'cluster="c1", gpu="3", instance="n1:9400", job="babysitter-node", model="NVIDIA H100 80GB HBM3", '
    'pci_bus_id="0000:9b:00", uuid="GPU-8c5d3f3a", xid="79", action="reboot"'
)
FIRING = 'ALERTS{alertname="GpuXidCritical", alertstate="firing", xid="79"}'


def run_case(tmp_path: Path, values: str, quiet: list[str], firing: list[str]) -> str:
    """promtool's output for one Xid 79 series (1 sample a minute) and the expected alert states."""
    require_promtool()
    alerts_dir = REPO / "alerts"
    expr_tests = [{"expr": f"count({FIRING})", "eval_time": t, "exp_samples": []} for t in quiet]
    expr_tests += [
        {"expr": f"count({FIRING})", "eval_time": t, "exp_samples": [{"labels": "{}", "value": 1}]}
        for t in firing
    ]
    test = {
        "rule_files": [str(alerts_dir / "babysitter-rules.yaml"), str(alerts_dir / "babysitter-alerts.yaml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": f"{XID}{{{LABELS}}}", "values": values}],
                "promql_expr_test": expr_tests,
            }
        ],
    }
    path = tmp_path / "xid-restart-test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(["test", "rules", path.name], tmp_path, timeout=120)
    return result.stdout + result.stderr if result.returncode else ""


@pytest.mark.parametrize(
    ("values", "quiet", "firing"),
    [
        pytest.param(
            "1+0x30 stale 1+0x40",
            ["20m", "40m", "46m", "50m", "60m"],
            ["5m"],
            id="one-failed-scrape-or-a-quick-restart-same-value",
        ),
        pytest.param(
            "1+0x10 stale _x19 1+0x40",
            ["31m", "40m", "46m", "55m"],
            ["5m"],
            id="agent-down-20m-nothing-new",
        ),
        pytest.param(
            "1+0x10 stale _x19 2+0x40",
            ["28m", "50m"],
            ["31m", "40m"],
            id="agent-down-20m-an-xid-while-down",
        ),
        pytest.param(
            "3+0x10 stale _x29 1+0x40",
            ["38m", "60m"],
            ["41m", "50m"],
            id="node-rebooted-for-30m-a-new-xid-after-boot",
        ),
    ],
)
def test_xid_alert_over_gaps(tmp_path: Path, values: str, quiet: list[str], firing: list[str]) -> None:
    """Quiet where nothing new happened across the gap, firing (for one window) where something did."""
    assert run_case(tmp_path, values, quiet, firing) == ""
