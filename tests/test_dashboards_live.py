"""Every query of every generated dashboard returns data from a real Prometheus that scraped a real CPU
training run (two ranks, the tracker) and a node agent with simulated GPUs, with the recording rules loaded.

Faults are injected so that panels which only show trouble have trouble to show: Xid errors, an
uncorrectable ECC error, throttling, a pending row remap, NVLink and PCIe errors, a missing storage
path, a checkpoint deleted behind the ledger's back, a registered trainer endpoint that never answers
and a malformed registration file.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from babysitter.catalog import train as T
from babysitter.generate import GenerateConfig
from babysitter.generate.writer import render, write
from babysitter.node.fabric.fake import FakeSysfs
from babysitter.registration import Endpoint, process_start_time, register, user_dir
from gen_helpers import REPO, LiveStack, dashboard_exprs, has_data, substitute_grafana

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
#: Panels that need ranks in one process group (collective arrival, a hang's culprit): this stack's
#: trainers run none, so tests/test_collectives_e2e.py runs these queries on its torchrun ranks.
TORCHRUN_PANELS = frozenset(
    (
        "Collective lag by rank",
        "Straggler score by rank",
        "Culprit of the last hang",
        "Ranks waiting in the last hang",
    )
)


def _queries() -> list[tuple[str, str, str, bool]]:
    found = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        model = json.loads(path.read_text())
        for panel in model["panels"]:
            if panel["title"] in TORCHRUN_PANELS:
                continue
            for target in panel.get("targets", []):
                found.append((path.stem, panel["title"], target["expr"], bool(target.get("instant"))))
        for title, expr in dashboard_exprs(model):
            if title.startswith("variable "):
                found.append((path.stem, title, expr, True))
            # Annotations of events this stack has (saves, Xids); restarts and hangs it does not.
            if title in ("annotation Checkpoint saves", "annotation Xid errors"):
                found.append((path.stem, title, expr, False))
    return found


class _SickFabric:
    """The simulated node's fabric (a fake sysfs tree): its two GPUs' NICs and the host get worse at
    every tick, so that panels which only show growth have growth to show."""

    def __init__(self, root: Path) -> None:
        self.fs = FakeSysfs(root / "sys", root / "proc")
        self.host = self.fs.dgx(2, memory_controllers=1, packages=1, cores=1)
        self.fs.link(self.host.nics[1], width=8)
        self.ticks = 0

    def tick(self, kernel_log: Path) -> None:
        self.ticks += 1
        n, fs, host = self.ticks, self.fs, self.host
        for counter in ("link_downed", "symbol_error", "port_rcv_errors", "port_xmit_data", "port_rcv_data"):
            fs.counter(host.rdma[0], counter, 3 * n)
        fs.counter(host.rdma[0], "out_of_sequence", 5 * n, hw=True)
        fs.counter(host.rdma[1], "port_xmit_wait", 100 * n)
        fs.carrier(host.netdevs[1], 2 + 2 * n)
        fs.aer(host.gpus[0], "correctable", n)
        fs.aer(host.nics[1], "nonfatal", n)
        fs.edac(0, ce=4 * n, ue=n)
        fs.cpu(0, package=0, core=0, core_throttles=n, package_throttles=2 * n)
        with kernel_log.open("a") as log:
            log.write(f"[{100 + n}.0] nfs: server fs1 not responding, still trying\n")


def test_every_dashboard_query_returns_data(tmp_path: Path) -> None:
    """All panel and variable queries of the committed dashboards parse and return finite data."""
    write(tmp_path / "gen", render(GenerateConfig()))
    rules = [tmp_path / "gen/alerts/babysitter-rules.yaml"]
    queries = _queries()
    assert len(queries) > 60
    fabric = _SickFabric(tmp_path / "host")
    with LiveStack(
        tmp_path,
        rule_files=rules,
        scenario=SCENARIO,
        ranks=2,
        extra_storage=[tmp_path / "not-mounted"],
        # The replica check runs (the two trainers are not replicas: both are named) and rank 1's loss
        # is NaN once, so the silent-corruption panels have something to show.
        # Rank 0 slows down from step 60 to 100 (after its ideal step time is learned): the slowdown
        # panels have slow steps to show.
        trainer_env={"LIVE_REPLICA_EVERY": "10", "LIVE_NAN_AT": "30", "LIVE_SLOW": "60:100"},
        sysfs=fabric.fs.root,
        procfs=fabric.fs.proc,
    ) as stack:
        prom = stack.prom
        start = time.time()
        prom.wait_for(f'{T.STEPS.name}{{rank="1"}} > 20', timeout=60)
        # A checkpoint the ledger lists disappears: the sentinel must report it missing; an older one
        # gets one byte flipped: the sentinel must find it corrupt (its manifest's digest).
        prom.wait_for(f'{T.STEPS.name}{{rank="0"}} > 55', timeout=60)  # two saves, at steps 25 and 50
        newest = stack.newest_checkpoint()
        older = stack.newest_checkpoint(before=newest)
        newest.unlink()
        data = bytearray(older.read_bytes())
        data[len(data) // 2] ^= 0x01
        older.write_bytes(bytes(data))
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
            fabric.tick(tmp_path / "kern.log")
            missing = []
            still = []
            for board, title, expr, instant in pending:
                if not has_data(prom, substitute_grafana(expr), instant, start):
                    still.append((board, title, expr, instant))
                    missing.append((board, title, expr))
            pending = still
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(5)
        titles = [f"{board}: {title}" for board, title, _ in missing]
        assert missing == [], (titles, missing, stack.log_tail("agent.log"), prom.log_tail())
