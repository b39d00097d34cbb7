"""VictoriaMetrics and vmalert, tested like Prometheus: one run, both engines fed the same samples.

One simulated host (``node-agent --simulate 4``) serves two real CPU training runs (the demo trainer);
one Prometheus agent scrapes it through the generated per-rack job and remote-writes every sample to
a central Prometheus and to VictoriaMetrics. The Prometheus evaluates the fast-profile rules itself;
vmalert evaluates the same files against VictoriaMetrics. VictoriaMetrics and vmalert run with the
shipped flags (``exporters/central/victoriametrics/``; only addresses, paths and the fast profile's
1 s evaluation interval put in), and each engine pages through its own Alertmanager with
``exporters/alertmanager.yml`` (webhook URLs and grouping waits changed, as in the other end-to-end
tests) into its own pager, which records when each page arrived.

In steady state every recording rule's output is read from both engines at one instant: the same
series with the same labels, values within the tolerance each kind of rule is given (:data:`TOLERANCE`).
Then four faults land at once: an Xid 79 on GPU 2, GPU 3 falls off the bus, run ``stall`` hangs (its
process still answers scrapes) and run ``killed``'s process is SIGKILLed. Each must page on both
engines, with the same labels and text, within the Prometheus path's budget for the fast profile
(:func:`_budget`); VictoriaMetrics gets :data:`VM_NEW_SERIES` more where the fault's series is new.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.catalog import goodput as G
from babysitter.demo.pager import Page, PagerServer
from babysitter.generate import fast
from babysitter.generate.config import parse_duration
from babysitter.generate.rules import Records, recording_rules
from babysitter.generate.writer import render, write
from gen_helpers import REPO, AlertmanagerServer, agent_job, dashboard_exprs, substitute_grafana
from node_helpers import read_port_file
from promkit import PrometheusServer
from vmkit import VictoriaMetricsServer, VmalertServer, require_victoriametrics

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

#: The fast profile, with a goodput target the young runs stay far below: their goodput climbs through
#: the shipped 0.9 (0.90 at 52 s, 0.93 at 75 s in one run) and hovers within the engines' differences of
#: it, so TrainingGoodputLow fired on one engine only; below 0.99 it fires on both, 30 s after the
#: runs have 30 s of wall time.
CFG = replace(fast(), goodput_target=0.99)
R = Records(CFG)
CLUSTER = "c1"
ENGINES = ("prometheus", "victoriametrics")
#: Seconds after the test starts the node agent at which the faults land: the trainers step from about
#: 15 s (torch's import, the demo's peak calibration), and VictoriaMetrics shows a new series to
#: queries up to 10 s after its first sample, so a recording rule that reads another rule's result reads
#: nothing for up to 10 s per level: the deepest chains (3 levels) had results on it at 42 s on an idle
#: 2-core machine; with 58 s, one CI run (three test workers on two cores) ended the wait still short,
#: and with 72 s another (r8: the likely team of a run still missing on VictoriaMetrics at 69 s).
FAULT_AT = 90.0
#: Grouping waits of every route in the tests' Alertmanagers (the shipped 10-30 s would dominate).
GROUP_WAIT = 1.0
#: The agent's remote-write batches leave within this (its queue_config below).
SEND_DEADLINE = 1.0
#: What a loaded 2-core CI machine adds to a page on either engine (process scheduling, Python agents).
SLACK = 8.0
#: VictoriaMetrics refreshes its index of the current hour's series every 10 s (not configurable in
#: 1.79): a series born with the fault (a GPU's first Xid of a code) is invisible to queries that long.
VM_NEW_SERIES = 10.0
#: Seconds around a goodput rule's evaluation in which the tracker's own goodput is read (its 1 s
#: housekeeping and the 1 s scrapes).
TRACKER_SKEW = 2.0
_LOGTIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


@dataclass(frozen=True)
class Tolerance:
    """How far one engine's value may be from the other's: ``abs`` or ``rel`` of the larger, and why."""

    why: str
    rel: float = 0.0
    abs: float = 1e-9

    def allows(self, a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=self.rel, abs_tol=self.abs)


EXACT = Tolerance("the same samples, the same arithmetic")
#: Prometheus extrapolates a rate to the window's edges; VictoriaMetrics divides the growth since the
#: sample before the window by the time between: up to one scrape interval in the 20 s window.
RATE = Tolerance("rate(): extrapolated (Prometheus) or not (VictoriaMetrics), 1 s in 20 s", rel=0.10)
#: The demo's data wait is the real time its loader takes to make each batch (about a millisecond, a
#: few times more or less from step to step), so the counter does not grow evenly: the second or two
#: at the window's edges that the two engines see differently (evaluated up to 1 s apart, extrapolated
#: or not) can differ by a few times their share: 10.8% seen in a CI run.
MEASURED = Tolerance(
    "rate() of a measured millisecond wait per step: uneven growth, 1 s in 20 s", rel=0.25, abs=1e-4
)
#: Counters that jump at checkpoint saves (a few per window): one save more or less in the window
#: (saves every 3 s, 4 s on a loaded machine: 5 in the 20 s window, 20.1% seen in a run), and
#: Prometheus's rate() extrapolates to the window's edges where VictoriaMetrics's does not.
BURSTY = Tolerance("rate() of a counter that jumps at saves: one save of 5 in the window", rel=0.30)
#: Two rates over the same samples divided: the extrapolation cancels.
RATIO = Tolerance("a ratio of two rates over the same samples", rel=0.02)
#: Each engine's latest evaluation is up to 1 s old at the instant compared (different phases), and
#: the ledger's totals advance in steps (the demo books its time at each 3 s save).
MOVING = Tolerance("a gauge read up to 1 s apart", rel=0.02, abs=2.0)
LEDGER = Tolerance("the ledger's totals step by 3 s (each save): reads 1 s apart, a step apart", abs=3.5)
#: A simulated GPU's temperature is 35 + 40 x utilization (which jitters by +-0.02: +-0.8 C) plus
#: +-1 C, rounded, drawn anew at each tick: two reads a tick apart differ by up to 4 C (3 C seen in CI).
TEMPERATURE = Tolerance("the simulator's +-1.8 C jitter, rounded, between two reads", abs=4.0)
#: The storage probe's write + fsync times are milliseconds that change at every probe.
PROBE = Tolerance("a probe's millisecond timing, re-measured every second", abs=0.05)

#: Each recording rule's tolerance; a rule not named here gets :data:`DEFAULT` (new rules merged
#: after this test was written: tighten them here).
TOLERANCE: dict[str, Tolerance] = {
    # Each engine's last evaluation (1 s) of the newest sample it could search: remote-write batches
    # sent every second, and VictoriaMetrics's rows searchable about a second after they arrive
    # (2.03 s apart seen in a CI run on three test workers).
    R.last_step: Tolerance("a step's Unix time: remote-write batch, search delay, evaluation", abs=3.0),
    R.steps_rate: RATE,
    R.tokens_rate: RATE,
    R.mfu: RATE,
    R.hfu: RATE,
    R.data_wait_mean: MEASURED,
    R.data_wait_worst: MEASURED,
    R.checkpoint_bytes_rate: BURSTY,
    R.checkpoint_save_rate: Tolerance(BURSTY.why, rel=BURSTY.rel, abs=1e-4),
    R.rank_step_mean: RATIO,
    R.rank_step_ratio: RATIO,
    R.rank_gpu_step_ratio: RATIO,
    R.step_baseline: RATIO,
    R.step_quantile(0.5): MOVING,
    R.step_quantile(0.9): MOVING,
    R.productive_window: LEDGER,
    R.badput_window: LEDGER,
    R.productive_total: LEDGER,
    R.badput_total: LEDGER,
    # One ledger step (3 s) of a 45 s old run moves its goodput by up to 0.03, and vmalert reads the
    # windows a flush (1 s) plus ingestion later.
    R.goodput_window: Tolerance(
        "a ledger step, and rules' results read about 2 s later on vmalert", abs=0.05
    ),
    R.checkpoint_interval: Tolerance("span of the saves seen over their number", rel=0.05),
    R.slowdown.slowdown_total: LEDGER,
    R.slowdown.failure_total: LEDGER,
    # A ledger step (3 s) in the fast profile's 1 m window, and a flush later on vmalert.
    R.slowdown.ratio: Tolerance("a ledger step in a 1 m window", abs=0.06),
    R.slowdown.gpu_rate_by_cause: Tolerance("a ledger step in a 20 s window, times the ranks", abs=0.5),
    R.rank_gpu_temperature: TEMPERATURE,
    R.storage_probe_total: PROBE,
    R.storage_probe_p99: PROBE,
    **dict.fromkeys(
        (
            R.cluster_ranks,
            R.cluster_gpus,
            R.rank_gpu,
            R.rank_gpu_sm_clock,
            R.rank_gpu_throttle,
            R.rank_gpu_ecc_new,
            R.rank_gpu_xid_new,
            R.restarts_total,
            R.xid_new,
            R.probe_peak_median,
            R.probe_busbw_median,
            R.probe_storage_write_median,
            R.probe_lemons,
            R.likely_cause,
            R.likely_team,
            # Which ranks speak for a run (generate/ranks.py): rank 0's world size; none excluded here.
            R.ranks.world_size,
            R.ranks.undeclared,
            R.ranks.excluded,
            R.slowdown.ranks,
            R.slowdown.cause,
        ),
        EXACT,
    ),
}
DEFAULT = RATE
#: Records that must have series in this run (the rest may be empty on both: no probe ran here).
MUST_HAVE = (
    R.mfu,
    R.goodput_window,
    R.productive_window,
    R.badput_window,
    R.checkpoint_interval,
    R.step_baseline,
    R.rank_gpu,
    R.rank_gpu_step_ratio,
    R.rank_gpu_throttle,
    R.rank_gpu_xid_new,
    R.likely_cause,
    R.likely_team,
)


@dataclass(frozen=True)
class Fault:
    """One fault, the alert that must page for it, where, and the Prometheus path's budget."""

    name: str
    alert: str
    labels: dict[str, str]
    budget: float
    #: The fault's series is born with it (a new Xid code's counter): VictoriaMetrics needs up to
    #: :data:`VM_NEW_SERIES` more to see it.
    new_series: bool = False
    #: Receivers that may get it; the stall goes to the pager of the team its likely cause names.
    receivers: tuple[str, ...] = ("pager",)


def _budget(hold: str, detect: float = 0.0) -> float:
    """The Prometheus path's worst case in the fast profile, added up as tests/test_paging_config.py
    does for the default one: scrape (1 s), the agent's send deadline, the paging group's evaluation,
    what the fault needs before a scrape can see it, ``for:``, group_wait; plus the machine's slack."""
    interval = parse_duration(CFG.page_eval_interval)
    return 1 + SEND_DEADLINE + interval + detect + parse_duration(hold) + GROUP_WAIT + SLACK


FAULTS = (
    Fault("Xid 79 on GPU 2", "GpuXidCritical", {"gpu": "2", "xid": "79"}, _budget("0s"), new_series=True),
    Fault("GPU 3 lost", "GpuDown", {"gpu": "3"}, _budget(CFG.gpu_down_for)),
    Fault(
        "run stall hangs (its process answers)",
        "TrainingStalled",
        {"run": "stall"},
        _budget(CFG.stall_for, detect=CFG.stall_min_seconds),
        receivers=("pager", "pager-training"),
    ),
    # A warning: the agent finds the dead registration at its next scrape (1 s).
    Fault(
        "run killed's process SIGKILLed",
        "TrainingProcessExited",
        {},
        _budget("0s", detect=1),
        receivers=("chat",),
    ),
)


@dataclass
class Run:
    """What the shared run saw, for the tests below."""

    loaded: dict[str, int] = field(default_factory=dict)
    vmalert_unhealthy: list[str] = field(default_factory=list)
    #: engine -> record -> labels (JSON) -> value, read at one instant in steady state.
    records: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: engine -> how old the newest scraped sample it showed was, once (seconds).
    lag: dict[str, float] = field(default_factory=dict)
    #: engine -> run -> the least and greatest of the tracker's own train_goodput_ratio within
    #: TRACKER_SKEW s of the instant the goodput rule was evaluated.
    trackers: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    fault_at: dict[str, float] = field(default_factory=dict)
    pages: dict[str, list[Page]] = field(default_factory=dict)
    ended: float = 0.0
    #: engine -> the runs with a last-step record at the end (the killed one must be gone).
    last_step_runs: dict[str, set[str]] = field(default_factory=dict)
    #: dashboard/panel -> engine -> whether the query returned a finite value at the end.
    dashboards: dict[str, dict[str, bool]] = field(default_factory=dict)
    dashboard_errors: list[str] = field(default_factory=list)
    #: When the engines never agreed on the series before the faults: for each record that differed,
    #: each engine's samples of it over the minute before (series -> count, first and last age), and
    #: of the trackers' info series the host record reads.
    diagnosis: list[str] = field(default_factory=list)


def _logged_at(path: Path, needle: str) -> float | None:
    """Unix time of the first line of a child's log containing ``needle`` (logging's asctime)."""
    if not path.exists():
        return None
    for line in path.read_text(errors="replace").splitlines():
        match = _LOGTIME.match(line)
        if needle in line and match:
            stamp = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
            return stamp + int(match.group(2)) / 1000
    return None


def _alertmanager_config(pager: PagerServer) -> str:
    config = yaml.safe_load((REPO / "exporters/alertmanager.yml").read_text())
    routes = [config["route"]]
    while routes:  # every route: the pager route sets its own (production) timings
        route = routes.pop()
        route.update(group_wait=f"{GROUP_WAIT:g}s", group_interval="2s", repeat_interval="1h")
        routes += route.get("routes", [])
    for item in config["receivers"]:
        item["webhook_configs"] = [{"url": pager.url_for(item["name"]), "send_resolved": True}]
    return yaml.safe_dump(config)


def _trainer(workdir: Path, run: str, gpu: int, t0: float, events: list[dict[str, Any]]) -> list[str]:
    reg = workdir / "reg"
    return [
        sys.executable,
        "-m",
        "babysitter.demo.trainer",
        *("--run-dir", str(workdir / f"run-{run}"), "--registry-dir", str(reg), "--run", run),
        *("--cluster", CLUSTER, "--simulated-gpu", str(gpu), "--t0", repr(t0)),
        *("--events", json.dumps(events), "--pace", "0.2", "--checkpoint-interval", "3"),
    ]


def _key(metric: dict[str, str]) -> str:
    return json.dumps(dict(sorted(metric.items())))


def _read_records(
    query: Callable[[str, float], list[dict[str, Any]]], at: float
) -> dict[str, dict[str, float]]:
    return {
        record: {_key(s["metric"]): float(s["value"][1]) for s in query(record, at)}
        for record, _ in recording_rules(CFG)
    }


def _diagnose(
    records: dict[str, dict[str, dict[str, float]]],
    queries: dict[str, Callable[[str, float], list[dict[str, Any]]]],
    at: float,
) -> list[str]:
    """What each engine held over the minute before ``at`` of every record whose series differed."""
    lines = []
    differing = [
        r
        for r in records["prometheus"]
        if set(records["prometheus"][r]) != set(records["victoriametrics"][r])
    ]
    for record in differing + ["train_info"] * any(r.startswith("run_rank:train_info") for r in differing):
        for engine, query in queries.items():
            for s in query(f"{record}[60s]", at):
                stamps = [float(t) for t, _ in s["values"]]
                lines.append(
                    f"{engine} {_key(s['metric'])}: {len(stamps)} samples, "
                    f"{at - stamps[0]:.1f} to {at - stamps[-1]:.1f} s old"
                )
    return lines


def _wait(predicate: Callable[[], bool], until: float) -> bool:
    while time.time() < until:
        if predicate():
            return True
        time.sleep(0.5)
    return predicate()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_victoriametrics()
    workdir = tmp_path_factory.mktemp("vm")
    generated = workdir / "gen"
    write(generated, render(CFG))
    rules = [generated / "alerts/babysitter-rules.yaml", generated / "alerts/babysitter-alerts.yaml"]
    dirs = {name: workdir / name for name in ("central", "agent", "vm", "vmalert", *ENGINES)}
    for folder in (*dirs.values(), workdir / "reg"):
        folder.mkdir()
    reg = workdir / "reg"
    out = Run()
    with ExitStack() as stack:
        pagers = {engine: PagerServer(lambda page: None).start() for engine in ENGINES}
        for pager in pagers.values():
            stack.callback(pager.close)
        ams = {
            engine: stack.enter_context(
                AlertmanagerServer(dirs[engine], _alertmanager_config(pagers[engine]))
            )
            for engine in ENGINES
        }
        # The host: 4 simulated GPUs; the runs claim GPUs 0 and 1, the GPU faults hit 2 and 3.
        scenario = workdir / "scenario.json"
        events = [{"at": FAULT_AT, "gpu": 2, "event": "xid79"}, {"at": FAULT_AT, "gpu": 3, "event": "lost"}]
        scenario.write_text(json.dumps({"events": events}))
        agent = [
            sys.executable,
            "-m",
            "babysitter",
            "node-agent",
            "--simulate",
            "4",
            "--scenario",
            str(scenario),
        ]
        agent += ["--port", "0", "--port-file", str(workdir / "addr"), "--registry-dir", str(reg)]
        agent += ["--simulate-kernel-log", str(workdir / "kern.log"), "--storage-path", str(workdir)]
        agent += ["--collector-timeout", "5", "--trainer-timeout", "0.5"]
        procs: list[subprocess.Popen[bytes]] = []

        def spawn(argv: list[str], log: str) -> subprocess.Popen[bytes]:
            handle = (workdir / log).open("wb")
            stack.callback(handle.close)
            procs.append(subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT))
            return procs[-1]

        def stop_all() -> None:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)

        stack.callback(stop_all)
        # The agent's scenario and the trainer's hang count from here (the agent starts a little later:
        # each fault's time is the one its own process logs).
        t0 = time.time()
        spawn(agent, "agent.log")
        spawn(
            _trainer(workdir, "stall", 0, t0, [{"at": FAULT_AT, "event": "hang", "seconds": 600}]),
            "stall.log",
        )
        killed = spawn(_trainer(workdir, "killed", 1, t0, []), "killed.log")
        address = read_port_file(workdir / "addr", timeout=60)
        central = stack.enter_context(
            PrometheusServer(
                dirs["central"], rule_files=rules, alertmanager=ams["prometheus"].address, receiver=True
            )
        )
        vm = stack.enter_context(VictoriaMetricsServer(dirs["vm"]))
        vmalert = stack.enter_context(
            VmalertServer(
                dirs["vmalert"],
                vm,
                rules,
                ams["victoriametrics"].address,
                # The fast profile evaluates every second; the shipped 30 s is the default profile's.
                override={"-evaluationInterval": "1s"},
            )
        )
        queue = {"batch_send_deadline": f"{SEND_DEADLINE:g}s", "max_samples_per_send": 2000}
        stack.enter_context(
            PrometheusServer(
                dirs["agent"],
                agent=True,
                extra_scrape_configs=[agent_job(generated, address)],
                external_labels={"cluster": CLUSTER, "rack": "r1"},
                remote_write=[
                    {"url": f"{central.url}/api/v1/write", "queue_config": queue},
                    {"url": f"{vm.url}/api/v1/write", "queue_config": queue},
                ],
            )
        )
        out.loaded = {
            "prometheus": sum(
                len(g["rules"]) for f in rules for g in yaml.safe_load(f.read_text())["groups"]
            ),
            "victoriametrics": sum(len(g["rules"]) for g in vmalert.groups()),
        }

        # Steady state: every series of every record Prometheus has, VictoriaMetrics has too, at an
        # instant whose evaluations have arrived on both engines (vmalert flushes its results every
        # second, VictoriaMetrics makes rows searchable about a second after they arrive and a new
        # series after its index refresh; on a loaded machine, later).
        read_at = [0.0]

        def caught_up() -> bool:
            read_at[0] = time.time() - 4
            out.records = {
                "prometheus": _read_records(central.query, read_at[0]),
                "victoriametrics": _read_records(vm.query, read_at[0]),
            }
            seen = {
                engine: {(r, k) for r, series in got.items() for k in series}
                for engine, got in out.records.items()
            }
            have = {r for r, _ in seen["prometheus"]}
            return set(MUST_HAVE) <= have and seen["prometheus"] == seen["victoriametrics"]

        caught = _wait(caught_up, t0 + FAULT_AT - 3)
        print(f"\nVictoriaMetrics had every series at {time.time() - t0:.0f} s: {caught}")
        if not caught:
            out.diagnosis = _diagnose(
                out.records, {"prometheus": central.query, "victoriametrics": vm.query}, read_at[0]
            )
        # The records are those of the last check (the steady-state test says what differs, if any);
        # the trackers' goodput below is read around the same evaluations.
        at = read_at[0]
        # How old the newest scraped sample each engine shows now is (VictoriaMetrics makes rows
        # searchable in batches after they arrive; both receive the same remote-write batches).
        newest = 'time() - max(timestamp(up{job="babysitter-node"}))'
        out.lag = {
            "prometheus": central.query_value(newest) or math.nan,
            "victoriametrics": vm.query_value(newest) or math.nan,
        }
        print(f"age of the newest sample shown: {out.lag}")
        # A young run's goodput climbs by percents a second (its startup is a large share of its wall
        # time), and the rule was evaluated up to a second before or after the tracker's value was
        # scraped (which the tracker itself updates once a second), over the samples the engine could
        # search then (``lag`` old): the tracker's range around the rule's evaluation, back to that
        # lag, is what the rule must fall in.
        out.trackers = {}
        for engine, query in (("prometheus", central.query), ("victoriametrics", vm.query)):
            out.trackers[engine] = {}
            lag = out.lag[engine] if math.isfinite(out.lag[engine]) else 0.0
            for sample in query(f"timestamp({R.goodput_window})", at):
                name, evaluated = sample["metric"]["run"], float(sample["value"][1])
                span = 2 * TRACKER_SKEW + max(lag, 0.0)
                window = f'(max({G.GOODPUT.name}{{run="{name}"}}))[{round(span * 1000)}ms:250ms]'
                low, high = (
                    query(f"{fn}_over_time({window})", evaluated + TRACKER_SKEW) for fn in ("min", "max")
                )
                if low and high:
                    out.trackers[engine][name] = (float(low[0]["value"][1]), float(high[0]["value"][1]))

        time.sleep(max(t0 + FAULT_AT - time.time(), 0))
        killed.send_signal(signal.SIGKILL)
        out.fault_at["run killed's process SIGKILLed"] = time.time()
        killed.wait(timeout=10)  # reaped, as its parent (torchrun, the scheduler) would: no zombie

        def all_paged() -> bool:
            return all(
                any(p.name == f.alert for p in pagers[engine].snapshot())
                for engine in ENGINES
                for f in FAULTS
            )

        _wait(all_paged, time.time() + max(f.budget for f in FAULTS) + VM_NEW_SERIES)
        time.sleep(3)  # what else either engine pages has had time to arrive
        out.ended = time.time()
        out.pages = {engine: pagers[engine].snapshot() for engine in ENGINES}
        out.last_step_runs = {
            engine: {s["metric"]["run"] for s in server.query(R.last_step)}
            for engine, server in (("prometheus", central), ("victoriametrics", vm))
        }
        for name, (log, needle) in {
            "Xid 79 on GPU 2": ("agent.log", "simulator: GPU 2 xid79"),
            "GPU 3 lost": ("agent.log", "simulator: GPU 3 lost"),
            "run stall hangs (its process answers)": ("stall.log", "hanging for"),
        }.items():
            logged = _logged_at(workdir / log, needle)
            if logged is not None:
                out.fault_at[name] = logged
        # Every dashboard query (Grafana reads the central tier), on both engines, once.
        retry: dict[str, str] = {}
        for board in sorted((generated / "dashboards").glob("*.json")):
            for title, expr in dashboard_exprs(json.loads(board.read_text())):
                query = substitute_grafana(expr)
                results = {}
                for engine, server in (("prometheus", central), ("victoriametrics", vm)):
                    try:
                        values = [float(s["value"][1]) for s in server.query(query)]
                        results[engine] = any(math.isfinite(v) for v in values)
                    except (AssertionError, OSError) as exc:
                        out.dashboard_errors.append(f"{engine} {board.stem}/{title}: {exc}")
                out.dashboards[f"{board.stem}/{title}"] = results
                if results.get("prometheus") and not results.get("victoriametrics"):
                    retry[f"{board.stem}/{title}"] = query
        # In one CI run the run overview's "Slowest 5 ranks per run and their GPUs" (on a chain of three
        # rules: by_gpu <- gpu:info <- excluded) had data on Prometheus and none on VictoriaMetrics at
        # the instant asked. The likeliest reason (not confirmed): a rule's new series show on
        # VictoriaMetrics up to VM_NEW_SERIES later, per level of the chain. Such queries are asked
        # again for that long, and the wait is printed; one still without data fails the test.
        asked = time.time()
        while retry and time.time() < asked + 3 * VM_NEW_SERIES + SLACK:
            time.sleep(1.0)
            for name, query in list(retry.items()):
                try:
                    found = any(math.isfinite(float(s["value"][1])) for s in vm.query(query))
                except (AssertionError, OSError):
                    found = False  # the first ask's error, if any, is already in dashboard_errors
                if found:
                    out.dashboards[name]["victoriametrics"] = True
                    print(
                        f"dashboard query {name}: data on VictoriaMetrics {time.time() - asked:.1f} s later"
                    )
                    del retry[name]
        out.vmalert_unhealthy = [
            f"{group['name']}/{rule['name']}: {rule.get('health')} {rule.get('lastError', '')}"
            for group in vmalert.groups()
            for rule in group["rules"]
            if rule.get("health") != "ok" or rule.get("lastError")
        ]
        print(f"\nshared run: {time.time() - t0:.0f} s")
        yield out


def _firing(pages: list[Page]) -> list[Page]:
    return [p for p in pages if p.status == "firing"]


def _first(pages: list[Page], fault: Fault) -> Page | None:
    for page in sorted(_firing(pages), key=lambda p: p.received):
        if (
            page.name == fault.alert
            and page.receiver in fault.receivers
            and all(page.labels.get(k) == v for k, v in fault.labels.items())
        ):
            return page
    return None


def test_every_rule_loads_and_evaluates_in_vmalert(run: Run) -> None:
    """All the rule files' rules, loaded by vmalert 1.79.5 as they are, none failing to evaluate."""
    assert run.loaded["victoriametrics"] == run.loaded["prometheus"] > 50, run.loaded
    assert not run.vmalert_unhealthy, run.vmalert_unhealthy


def test_recording_rules_agree_in_steady_state(run: Run) -> None:
    """Same series, same labels, values within each rule's tolerance, at one instant."""
    rows, problems = [], []
    prometheus, victoriametrics = run.records["prometheus"], run.records["victoriametrics"]
    for record in prometheus:
        p, v = prometheus[record], victoriametrics[record]
        tolerance = TOLERANCE.get(record, DEFAULT)
        if set(p) != set(v):
            problems.append(
                f"{record}: series differ: only Prometheus {set(p) - set(v)}, only VM {set(v) - set(p)}"
            )
            continue
        worst = max((abs(p[k] - v[k]) / max(abs(p[k]), abs(v[k]), 1e-12) for k in p), default=0.0)
        rows.append(f"| `{record}` | {len(p)} | {worst:.2%} | {tolerance.rel:.0%} / {tolerance.abs:g} |")
        problems += [
            f"{record} {k}: {p[k]} vs {v[k]} ({tolerance.why})" for k in p if not tolerance.allows(p[k], v[k])
        ]
    print("\n| record | series | largest difference | tolerance (rel / abs) |\n|---|---|---|---|")
    print("\n".join(rows))
    assert not problems, "\n".join(problems + run.diagnosis)
    empty = [record for record in MUST_HAVE if not prometheus[record]]
    assert not empty, f"no series in this run: {empty}"


def test_goodput_rule_equals_the_trackers_own_goodput_on_both_engines(run: Run) -> None:
    """For runs younger than the window the rule's goodput is the ledger's since the first start,
    startup included, as the tracker computes it: on both engines (increase() gave 0.996 on
    Prometheus, which ignored the startup, and 0.86 on VictoriaMetrics)."""
    for engine in ENGINES:
        rule = {json.loads(k)["run"]: v for k, v in run.records[engine][R.goodput_window].items()}
        tracker = run.trackers[engine]
        assert set(rule) == set(tracker) == {"stall", "killed"}, (engine, rule, tracker)
        for name, value in rule.items():
            low, high = tracker[name]
            assert low - 0.02 <= value <= high + 0.02, (engine, name, value, low, high)
            # Torch's import and the calibration count: ignoring them gave 0.996. Not a tighter
            # bound: how much of a young run they are depends on the machine (0.903 in one CI run).
            assert value < 0.97, (engine, name, value)


def test_a_killed_runs_rules_end_at_once_on_both_engines(run: Run) -> None:
    """The killed run's last-step record ends with its series on both engines: the agent's staleness
    markers end the input, and vmalert writes its own when the result disappears. Kept for vmalert's
    5 min lookback instead, TrainingStalled would page the killed (or a finished) run 4 min after its
    last step, as a stopped one."""
    assert run.last_step_runs["prometheus"] == run.last_step_runs["victoriametrics"] == {"stall"}, (
        run.last_step_runs
    )


def test_every_fault_pages_on_both_engines_within_budget(run: Run) -> None:
    """Each fault's alert reaches its receiver from both engines within the Prometheus path's budget
    (VictoriaMetrics: plus its new-series delay where the fault's series is new)."""
    lines, late = [], []
    for fault in FAULTS:
        assert fault.name in run.fault_at, (fault.name, run.fault_at)
        delays = {}
        for engine in ENGINES:
            page = _first(run.pages[engine], fault)
            assert page is not None, f"{engine}: no {fault.alert} page for {fault.name}"
            delays[engine] = page.received - run.fault_at[fault.name]
            budget = fault.budget + (VM_NEW_SERIES if engine == "victoriametrics" and fault.new_series else 0)
            if not 0 < delays[engine] <= budget:
                late.append(f"{engine} {fault.alert}: {delays[engine]:.1f} s (budget {budget:.0f} s)")
        vm_budget = f" (VictoriaMetrics {fault.budget + VM_NEW_SERIES:.0f} s)" if fault.new_series else ""
        lines.append(
            f"| {fault.name} | {fault.alert} | {delays['prometheus']:.1f} s | {delays['victoriametrics']:.1f} s "
            f"| {fault.budget:.0f} s{vm_budget} |"
        )
    print("\n| fault | alert | Prometheus | VictoriaMetrics | budget |\n|---|---|---|---|---|")
    print("\n".join(lines))
    assert not late, late


def _masked(page: Page) -> tuple[str, str, tuple[tuple[str, str], ...], str]:
    # Values rendered into the text (a stall's age) differ by when each engine evaluated.
    summary = re.sub(r"\d+(\.\d+)?", "N", page.summary)
    return page.receiver, page.name, tuple(sorted(page.labels.items())), summary


def test_each_faults_page_has_the_same_receiver_labels_and_text_on_both_engines(run: Run) -> None:
    """The same alert from either engine: its receiver, every label (vmalert adds none: the shipped
    -disableAlertgroupLabel), the summary with the likely-cause template query, but for its numbers."""
    for fault in FAULTS:
        pages = [_first(run.pages[engine], fault) for engine in ENGINES]
        assert None not in pages, fault
        prometheus, victoriametrics = (_masked(page) for page in pages if page is not None)
        assert prometheus == victoriametrics, fault.name


def test_both_engines_page_the_same_alerts(run: Run) -> None:
    """Every alert one engine paged or sent to chat the other did too, by the end of the run. Pages
    from the last seconds are left out: an alert on rules' results fires on vmalert up to
    :data:`VM_NEW_SERIES` later while those results are new series, and the run ends then."""
    settled = run.ended - VM_NEW_SERIES - 5
    # The same holds at the kill for the killed run: an alert still pending when its series end never
    # fires, and an alert on a two-level rule chain (the goodput's) goes pending up to two
    # VM_NEW_SERIES later on vmalert. One CI run paged run killed's TrainingGoodputLow on Prometheus
    # about 10 s before the kill and, so, never on vmalert.
    # Pages the kill causes (TrainingProcessExited) come after it and are compared.
    kill = run.fault_at["run killed's process SIGKILLed"]
    racing = (kill - 2 * VM_NEW_SERIES - SLACK, kill)

    def compare(page: Page) -> bool:
        if page.labels.get("run") == "killed" and racing[0] < page.received <= racing[1]:
            return False
        return page.received <= settled

    seen = {engine: {_masked(p) for p in _firing(run.pages[engine])} for engine in ENGINES}
    for engine, other in (ENGINES, ENGINES[::-1]):
        early = {_masked(p) for p in _firing(run.pages[engine]) if compare(p)}
        assert early, f"{engine}: no page early enough to compare"
        assert early <= seen[other], f"only {engine}: {early - seen[other]}"


def test_every_dashboard_query_runs_on_victoriametrics_and_finds_what_prometheus_finds(run: Run) -> None:
    """Grafana reads the central tier: every panel, variable and annotation query of the dashboards
    runs on VictoriaMetrics, and returns data at the end of the run wherever Prometheus's does."""
    assert len(run.dashboards) > 60
    assert not run.dashboard_errors, run.dashboard_errors
    differ = {
        name: got for name, got in run.dashboards.items() if got["prometheus"] != got["victoriametrics"]
    }
    print(f"\ndashboard queries with data on one engine only: {differ}")
    assert not {name for name, got in differ.items() if got["prometheus"]}, differ
