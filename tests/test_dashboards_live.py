"""Every query of every generated dashboard returns data from a real Prometheus that scraped a real CPU
training run (two ranks, the tracker) and a node agent with simulated GPUs, with the recording rules loaded.

Faults are injected so that panels which only show trouble have trouble to show: Xid errors, an
uncorrectable ECC error, throttling, a pending row remap, NVLink and PCIe errors, a missing storage
path, a checkpoint deleted behind the ledger's back, a registered trainer endpoint that never answers
and a malformed registration file.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from babysitter.catalog import train as T
from babysitter.generate import GenerateConfig
from babysitter.generate.writer import render, write
from babysitter.registration import Endpoint, process_start_time, register, user_dir
from gen_helpers import REPO, LiveStack, dashboard_exprs, substitute_grafana

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

SCENARIO = [
    {"at": 2, "gpu": 0, "event": "xid", "xid": 13},
    {"at": 3, "gpu": 0, "event": "xid", "xid": 79},
    {"at": 3, "gpu": 1, "event": "throttle", "reasons": ["hw_thermal_slowdown", "sw_power_cap"]},
    {"at": 4, "gpu": 0, "event": "ecc", "type": "uncorrected", "count": 1},
    {"at": 4, "gpu": 1, "event": "remap", "state": "pending", "count": 1},
    {"at": 5, "gpu": 1, "event": "nvlink", "link": 0, "type": "crc_flit", "count": 3},
    {"at": 5, "gpu": 0, "event": "pcie_replay", "count": 2},
]
DEADLINE_S = 150


def _has_data(prom: Any, expr: str, instant: bool, start: float) -> bool:
    """Whether the query returns at least one finite sample (range queries over the test's lifetime)."""
    if instant:
        result = prom.query(expr)
        values = [sample["value"][1] for sample in result]
    else:
        params = {"query": expr, "start": repr(start), "end": repr(time.time()), "step": "2"}
        from promkit import _get_json

        body = _get_json(f"{prom.url}/api/v1/query_range?{urllib.parse.urlencode(params)}")
        assert body.get("status") == "success", (expr, body)
        values = [value for series in body["data"]["result"] for _, value in series["values"]]
    return any(math.isfinite(float(value)) for value in values)


def _queries() -> list[tuple[str, str, str, bool]]:
    found = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        model = json.loads(path.read_text())
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                found.append((path.stem, panel["title"], target["expr"], bool(target.get("instant"))))
        for title, expr in dashboard_exprs(model):
            if title.startswith("variable "):
                found.append((path.stem, title, expr, True))
            # Annotations of events this stack has (saves, Xids); restarts and hangs it does not.
            if title in ("annotation Checkpoint saves", "annotation Xid errors"):
                found.append((path.stem, title, expr, False))
    return found


def test_every_dashboard_query_returns_data(tmp_path: Path) -> None:
    """All panel and variable queries of the committed dashboards parse and return finite data."""
    write(tmp_path / "gen", render(GenerateConfig()))
    rules = [tmp_path / "gen/alerts/babysitter-rules.yaml"]
    queries = _queries()
    assert len(queries) > 60
    with LiveStack(
        tmp_path, rule_files=rules, scenario=SCENARIO, ranks=2, extra_storage=[tmp_path / "not-mounted"]
    ) as stack:
        prom = stack.prom
        start = time.time()
        prom.wait_for(f'{T.STEPS.name}{{rank="1"}} > 20', timeout=60)
        # A checkpoint the ledger lists disappears: the sentinel must report it missing.
        stack.newest_checkpoint().unlink()
        # A live process registers an endpoint where nothing listens (every fetch fails: connect), and
        # a file that is not a registration lands next to the trainers' (skipped: malformed).
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            closed = sock.getsockname()[1]
        pid = os.getpid()
        ghost = Endpoint(pid, process_start_time(pid), f"http://127.0.0.1:{closed}/metrics", "ghost", 0, 0)
        register(stack.reg, ghost)
        (user_dir(stack.reg) / "not-a-registration.json").write_text("[]")
        missing: list[tuple[str, str, str]] = []
        deadline = time.monotonic() + DEADLINE_S
        pending = queries
        while True:
            missing = []
            still = []
            for board, title, expr, instant in pending:
                if not _has_data(prom, substitute_grafana(expr), instant, start):
                    still.append((board, title, expr, instant))
                    missing.append((board, title, expr))
            pending = still
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(5)
        titles = [f"{board}: {title}" for board, title, _ in missing]
        assert missing == [], (titles, missing, stack.log_tail("agent.log"), prom.log_tail())
