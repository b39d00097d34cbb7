"""End to end: the fast-profile rules in a real Prometheus, a real Alertmanager with the example config,
and a webhook receiver in the test. A stopped training process pages "stalled", Xid 79 on a simulated
GPU pages, and a checkpoint deleted from disk pages "missing"; warnings never reach the pager.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from babysitter.catalog import train as T
from babysitter.generate import fast
from babysitter.generate.writer import render, write
from gen_helpers import AlertmanagerServer, LiveStack, WebhookReceiver, alertmanager_config

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

XID79_AT = 20  # seconds after the agent starts


def _wait_for_page(hook: WebhookReceiver, alertname: str, timeout: float, **labels: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for alert in hook.pages():
            found = alert["labels"]
            if found.get("alertname") == alertname and all(found.get(k) == v for k, v in labels.items()):
                return alert
        time.sleep(0.5)
    pages = sorted({a["labels"]["alertname"] for a in hook.pages()})
    raise AssertionError(f"no {alertname} page {labels} within {timeout} s; pages so far: {pages}")


def test_stalled_xid79_and_missing_checkpoint_page(tmp_path: Path) -> None:
    """Three faults, three pages, each with its runbook link; the pager gets only critical alerts."""
    cfg = fast()
    write(tmp_path / "gen", render(cfg))
    rules = [tmp_path / "gen/alerts/babysitter-rules.yaml", tmp_path / "gen/alerts/babysitter-alerts.yaml"]
    scenario = [{"at": XID79_AT, "gpu": 1, "event": "xid79"}]
    with (
        WebhookReceiver() as hook,
        AlertmanagerServer(tmp_path, alertmanager_config(hook.url)) as am,
        LiveStack(tmp_path, rule_files=rules, scenario=scenario, ranks=1, alertmanager=am.address) as stack,
    ):
        prom = stack.prom
        prom.wait_for(f"{T.STEPS.name} > 50", timeout=60)

        # 1. A checkpoint the ledger lists disappears from disk.
        newest = stack.newest_checkpoint()
        step = newest.name.split("-")[1]
        newest.unlink()
        missing = _wait_for_page(hook, "CheckpointMissing", 45, run="live")
        assert missing["annotations"]["runbook_url"] == cfg.runbook_url("CheckpointMissing")
        assert f"step {step} " in missing["annotations"]["summary"], missing["annotations"]

        # 2. Xid 79 on GPU 1 (the simulator then loses the GPU).
        xid = _wait_for_page(hook, "GpuXidCritical", XID79_AT + 45, xid="79", gpu="1", action="reboot")
        assert "reboot" in xid["annotations"]["description"]
        assert xid["labels"]["cluster"] == "c1"

        # Nothing has stalled so far: the run is stepping.
        assert not [a for a in hook.pages() if a["labels"]["alertname"] == "TrainingStalled"]

        # 3. The training process is stopped.
        stack.trainers[0].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        stalled = _wait_for_page(hook, "TrainingStalled", 75, run="live", cluster="c1")
        assert time.monotonic() - stopped >= cfg.stall_min_seconds - 2
        assert stalled["labels"]["severity"] == "critical"
        assert stalled["annotations"]["runbook_url"].endswith("/TrainingStalled.md")
        # It went to the pager of the team its likely cause names (infra's when it names none).
        team = stalled["labels"].get("team", "")
        to = "/pager-training" if team == "training" else "/pager"
        assert any(a["labels"]["alertname"] == "TrainingStalled" for a in hook.alerts(to)), (team, to)
        print(f"TrainingStalled team={team!r}, paged at {to}")

        pager = {a["labels"]["alertname"] for a in hook.pages()}
        assert all(a["labels"]["severity"] == "critical" for a in hook.pages()), pager
        chat = {a["labels"]["alertname"] for a in hook.alerts("/chat")}
        assert {"CheckpointMissing", "GpuXidCritical", "TrainingStalled"} <= chat  # critical goes to chat too
