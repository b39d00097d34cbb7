"""``babysitter explain`` against a real Prometheus: each cause injected alone must be ranked first.

One TSDB holds every scenario of :mod:`explain_scenarios` as its own cluster and run (2.5 hours of
series at 30 s, backfilled with promtool, then the recording rules explain reads, backfilled the same
way in the order they read each other). The confusion matrix (injected cause x cause ranked first) is
printed and must be diagonal; combinations must rank both causes first and second, the healthy run
must come back with nothing found and the list of what was checked.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from babysitter import catalog
from babysitter.cli import main
from babysitter.explain import CAUSES, TEAMS, Cause, ExplainQueries, Explanation, explain
from babysitter.generate import GenerateConfig
from babysitter.generate.distributed import central_metrics
from babysitter.generate.rules import Records, recording_groups
from babysitter.prom import PromClient
from babysitter.views.top import Frame, RunRow, render
from babysitter.views.top.hints import RunHints, hint_line
from explain_scenarios import BASELINE, HISTORY, WINDOW, Scenario, write_openmetrics
from test_scorecard_helpers import backfilled_prometheus, rule_stages

#: Each scenario injects one cause; the cause explain must rank first ("none": nothing found).
SINGLE: dict[str, tuple[Scenario, str]] = {
    "throttle": (Scenario("throttle", slow={3: 1.8}, throttle=True), "gpu_throttling"),
    "straggler": (Scenario("straggler", slow={2: 1.6}), "straggler"),
    "xid": (Scenario("xid", xid_rank=1, alerts=(("TrainingProcessExited", 1, 300.0),)), "gpu_fault"),
    "restart": (Scenario("restart", xid_rank=1, gpu_fault=False), "restart"),
    "datawait": (Scenario("datawait", data_wait=0.5), "data_wait"),
    "checkpoint": (Scenario("checkpoint", save_seconds=40.0, saves_in_window=6), "checkpoint"),
    "storage": (Scenario("storage", save_seconds=150.0, storage_seconds=6.0), "storage"),
    "eval": (Scenario("eval", eval_seconds=300.0), "phase"),
    "shrink": (Scenario("shrink", leave=(2, 3)), "job_size"),
    "loss": (Scenario("loss", bad_loss=True), "loss"),
    "fabric": (Scenario("fabric", slow={2: 1.5}, fabric_rank=2), "fabric"),
    "healthy": (Scenario("healthy", fabric=True), "none"),
}
#: Two causes at once: the bigger one first, the other second.
COMBINED: dict[str, tuple[Scenario, tuple[str, str]]] = {
    "throttle+datawait": (
        Scenario("throttle-datawait", slow={3: 2.0}, throttle=True, data_wait=0.2),
        ("gpu_throttling", "data_wait"),
    ),
    "storage+eval": (
        Scenario("storage-eval", save_seconds=400.0, storage_seconds=6.0, eval_seconds=150.0),
        ("storage", "phase"),
    ),
    "xid+straggler": (Scenario("xid-straggler", xid_rank=1, slow={0: 1.3}), ("gpu_fault", "straggler")),
}
#: Every GPU throttles, so no rank is slower than its peers: the cost is measured against the
#: baseline's step time, and the baseline holds a 15-minute hang (step-time rules NaN for 10 of it).
UNIFORM = Scenario("uniform-throttle", slow=dict.fromkeys(range(4), 1.8), throttle=True, baseline_hang=900.0)
#: A replica diverges, a checkpoint fails its digest and one rank's loss goes non-finite first.
CORRUPTION = Scenario("corruption", bad_loss=True, corruption=True)
#: Issue 22's contradictions, one each: a throttle that begins 5 minutes before the window ends (under
#: the 50%-of-the-window bar) while its alert fires; an alert that fired with no throttle in the series
#: (what the check sees cannot time it); saves that got faster; a run younger than window + baseline.
LATE = Scenario(
    "late-throttle", slow={3: 1.8}, throttle=True, slow_from=1500.0, alerts=(("GpuThrottled", 3, 1545.0),)
)
ALERT_ONLY = Scenario("alert-only", alerts=(("GpuThrottled", 1, 1200.0),))
FASTER_SAVES = Scenario("faster-saves", baseline_save_seconds=90.0, save_seconds=20.0, saves_in_window=3)
YOUNG = Scenario("young", age=WINDOW + 600.0)
#: 20 minutes old, its GPU throttling for the last 5: no hour of MFU history for top's usual test.
YOUNG_THROTTLE = Scenario("young-throttle", age=1200.0, slow={3: 1.8}, throttle=True, slow_from=1500.0)
#: Killed right as the window begins: no series for its first 7 minutes, yet not a young run.
DOWN_AT_START = Scenario("down-at-start", xid_rank=1, gpu_fault=False, down_from=0.0)
EXTRA = (LATE, ALERT_ONLY, FASTER_SAVES, YOUNG, YOUNG_THROTTLE, DOWN_AT_START)
#: The recording rules explain reads (backfilled with whatever they read in turn).
_CFG = GenerateConfig()


def _read_rules() -> list[str]:
    r = Records(_CFG)
    return [
        r.rank_gpu,
        r.rank_step_mean,
        r.rank_step_ratio,
        r.rank_gpu_throttle,
        r.rank_gpu_sm_clock,
        r.rank_gpu_temperature,
        r.storage_probe_total,
        r.rank_nic,
    ]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    """A Prometheus holding every scenario (module-scoped: one backfill for the whole file)."""
    workdir = tmp_path_factory.mktemp("explain")
    end = math.floor(time.time() / 7200) * 7200 - 7200
    scenarios = (
        [sc for sc, _ in SINGLE.values()]
        + [sc for sc, _ in COMBINED.values()]
        + [UNIFORM, CORRUPTION, *EXTRA]
    )
    data = write_openmetrics(scenarios, end, workdir / "series.om")
    stages = []
    for index, chunk in enumerate(rule_stages(recording_groups(_CFG), _read_rules())):
        path = workdir / f"rules-{index}.yaml"
        path.write_text(yaml.safe_dump({"groups": [{"name": f"stage-{index}", "rules": chunk}]}))
        stages.append(path)
    # Lookback = the rules' evaluation interval: backfilled rules have no staleness markers.
    with backfilled_prometheus(
        workdir, [data], stages, start=end - HISTORY, end=end, eval_interval="1m", lookback="1m"
    ) as url:
        yield url, end


def _explain(prom: tuple[str, float], sc: Scenario) -> Explanation:
    url, end = prom
    return explain(PromClient(url), sc.name, end=end, window=WINDOW, baseline=BASELINE, cluster=sc.cluster)


def test_each_cause_alone_is_ranked_first(prom: tuple[str, float]) -> None:
    """The confusion matrix of the single-cause scenarios is diagonal (printed for the docs)."""
    got: dict[str, str] = {}
    text: dict[str, list[str]] = {}
    for name, (sc, _) in SINGLE.items():
        answer = _explain(prom, sc)
        got[name] = answer.top.key if answer.top else "none"
        text[name] = answer.lines()
    labels = [want for _, want in SINGLE.values()]
    labels += sorted(set(got.values()) - set(labels))
    print("\n| injected \\ ranked first | " + " | ".join(f"`{c}`" for c in labels) + " |")
    print("|---|" + "---|" * len(labels))
    for name, (_, want) in SINGLE.items():
        print(f"| `{want}` ({name}) | " + " | ".join("1" if got[name] == c else "" for c in labels) + " |")
    for name in SINGLE:
        print("\n".join(text[name]))
    assert got == {name: want for name, (_, want) in SINGLE.items()}


@pytest.mark.parametrize("name", list(COMBINED))
def test_combined_causes_ranked_by_time(prom: tuple[str, float], name: str) -> None:
    """Two causes at once: both found, the one that cost more time first."""
    sc, want = COMBINED[name]
    answer = _explain(prom, sc)
    print("\n".join(answer.lines()))
    assert [c.key for c in answer.causes[:2]] == list(want)
    assert answer.causes[0].seconds > answer.causes[1].seconds > 0


def test_throttle_evidence_names_rank_host_gpu_and_clocks(prom: tuple[str, float]) -> None:
    """The throttled rank's line says where it runs, how slow it is and what its GPU reports."""
    answer = _explain(prom, SINGLE["throttle"][0])
    cause = answer.causes[0]
    assert cause.ranks == ["3"] and cause.hosts == ["sc-throttle-h1:9946"] and cause.team == "infra"
    assert "rank 3 (host sc-throttle-h1:9946, GPU 1)" in cause.text
    assert "hw_slowdown + hw_thermal_slowdown" in cause.text
    # The GPU throttles from a minute before the window: 60 s of 1.1 GHz in the baseline hour.
    assert f"SM clock 1.10 GHz vs {(1.98 * 3540 + 1.1 * 60) / 3600:.2f} GHz" in cause.text
    # Rank 3 at 1.8x: 1 - 1/1.8 of the window is lost, and so are the tokens/s. The step-time rule's
    # 5-minute rate window ramps up over the window's first 5 minutes, so up to 5/30 of it may be missed.
    full = WINDOW * (1 - 1 / 1.8)
    ramp = 1 - 300 / WINDOW
    assert full * ramp <= cause.seconds <= full * 1.02
    assert answer.lost_seconds * ramp <= cause.seconds <= answer.lost_seconds * 1.02
    assert cause.share is not None and cause.share > 0.8


def test_a_straggler_on_a_sick_link_is_the_fabric(prom: tuple[str, float]) -> None:
    """Rank 2 is slow and its GPU's nearest port went down twice with symbol errors growing: the
    straggler's seconds are charged to the fabric, which names the port, the host and the rank."""
    answer = _explain(prom, SINGLE["fabric"][0])
    print("\n".join(answer.lines()))
    cause = answer.causes[0]
    assert cause.key == "fabric" and cause.team == "infra" and cause.ranks == ["2"]
    assert cause.hosts == ["sc-fabric-h1:9946"]
    assert re.search(
        r"for rank 2 \(host sc-fabric-h1:9946, GPU 0\) step time 1\.\dx the median rank", cause.text
    )
    assert "mlx5_0 port 1 on sc-fabric-h1:9946 (rank 2's NIC): down, link_downed +2" in cause.text
    assert "straggler" not in {c.key for c in answer.causes}
    full = WINDOW * (1 - 1 / 1.5)  # as the straggler would have been charged
    assert full * (1 - 300 / WINDOW) <= cause.seconds <= full * 1.02


def test_uniform_throttle_is_timed_against_a_baseline_that_held_a_hang(prom: tuple[str, float]) -> None:
    """A hang in the baseline leaves the step-time rules NaN for a while; the baseline's step time
    is the mean of its finite values, so the throttling still costs its time (it read "no time
    measured, step time unknown" when one NaN made the baseline mean NaN)."""
    answer = _explain(prom, UNIFORM)
    print("\n".join(answer.lines()))
    cause = answer.top
    assert cause is not None and cause.key == "gpu_throttling"
    assert "x the run's baseline" in cause.text
    # Every rank steps at 1.82 s in the window against 1.02 s before it.
    full = WINDOW * (1 - 1.02 / 1.82)
    assert full * (1 - 300 / WINDOW) <= cause.seconds <= full * 1.02


def _consistent(answer: Explanation) -> None:
    """The headline's lost time agrees with what the causes account for, or says why it does not."""
    head = answer.headline()
    accounted, lost = answer.accounted_seconds, answer.lost_seconds
    slack = max(1.0, 0.02 * WINDOW)
    if not answer.baseline_tokens_per_second:
        assert head.startswith("no baseline"), head
    elif accounted > lost * 1.1 + slack:
        assert f"the causes below cost ~{accounted:.0f} s" in head and "because" in head, head
    elif answer.causes:
        assert f"account for ~{accounted:.0f} s" in head, head
    assert answer.lines()[0].endswith(head)


def test_every_headline_agrees_with_its_causes(prom: tuple[str, float]) -> None:
    """Issue 22: "~0 s of 600 s lost" above 44 s of causes. Every scenario's headline equals what its
    causes account for, or says why not."""
    for sc in [
        *(x for x, _ in SINGLE.values()),
        *(x for x, _ in COMBINED.values()),
        UNIFORM,
        CORRUPTION,
        *EXTRA,
    ]:
        _consistent(_explain(prom, sc))
    answer = _explain(prom, UNIFORM)
    assert "because the baseline" in answer.headline(), answer.headline()


def test_a_late_throttle_whose_alert_fires_is_found_and_timed_over_its_stretch(
    prom: tuple[str, float],
) -> None:
    """Throttled for the last 5 minutes of 30 (17%, under the 50% bar), GpuThrottled firing: found,
    ranked first, timed over the stretch since the throttle began, with the alert as evidence."""
    answer = _explain(prom, LATE)
    print("\n".join(answer.lines()))
    cause = answer.top
    assert cause is not None and cause.key == "gpu_throttling", answer.lines()
    assert "in the last" in cause.text and "since its GPU began throttling" in cause.text
    assert any(e.what.startswith("GpuThrottled firing") for e in cause.evidence)
    # 300 s at 1.8x cost 133 s; the 5-minute rate window ramps over exactly that stretch, so the median
    # step time of the stretch reads about half of the slowdown: at least a third, never more.
    full = 300 * (1 - 1 / 1.8)
    assert full / 3 <= cause.seconds <= full * 1.02, cause.seconds
    assert "gpu_throttling" not in answer.checked
    assert any(a.startswith("GpuThrottled: ") for a in answer.alerts)


def test_a_cause_whose_alert_fired_is_never_nothing_found(prom: tuple[str, float]) -> None:
    """An alert fired about rank 1's GPU; the series show no throttling explain can time: the cause is
    listed untimed, with the alert and what its check saw, and not under "nothing found"."""
    answer = _explain(prom, ALERT_ONLY)
    print("\n".join(answer.lines()))
    keys = [c.key for c in answer.causes]
    assert keys == ["gpu_throttling"], keys
    cause = answer.causes[0]
    assert cause.seconds == 0 and cause.text.startswith("GpuThrottled fired in the window (")
    assert "gpu=1" in cause.text and "no time measured: no rank's GPU throttled" in cause.text
    assert "gpu_throttling" not in answer.checked
    assert "1. [no time measured; infra] GpuThrottled fired" in "\n".join(answer.lines())


def test_the_restart_after_an_xid_is_the_gpu_faults_not_a_cause_of_its_own(prom: tuple[str, float]) -> None:
    """TrainingProcessExited fired for the restart the Xid 79 caused: its evidence joins the GPU fault,
    which counts the restart; no second, untimed "restart" cause (the live bench listed one)."""
    answer = _explain(prom, SINGLE["xid"][0])
    keys = [c.key for c in answer.causes]
    assert keys == ["gpu_fault"], keys
    assert any(e.what.startswith("TrainingProcessExited firing") for e in answer.causes[0].evidence)


def test_saves_that_got_faster_are_not_a_cause(prom: tuple[str, float]) -> None:
    """Three 20 s saves in the window against two 90 s saves in the baseline hour: more saves, less
    blocking time. Before, "more saves x the baseline's mean" charged them 270 s."""
    answer = _explain(prom, FASTER_SAVES)
    print("\n".join(answer.lines()))
    assert "checkpoint" not in [c.key for c in answer.causes], answer.lines()
    assert "no more than the baseline's" in answer.checked["checkpoint"]


def test_a_run_younger_than_its_baseline_is_measured_over_its_own_time(prom: tuple[str, float]) -> None:
    """The run began 10 minutes into the baseline hour: tokens/s over the 600 s it ran, not over the
    hour (before: +500%, and any loss hidden)."""
    answer = _explain(prom, YOUNG)
    print("\n".join(answer.lines()))
    assert answer.baseline_covered is not None and 540 <= answer.baseline_covered <= 660
    assert answer.tokens_per_second and answer.baseline_tokens_per_second
    assert answer.tokens_per_second / answer.baseline_tokens_per_second == pytest.approx(1.0, abs=0.05)
    assert answer.causes == []


def test_a_run_down_at_the_windows_start_is_not_taken_for_a_young_one(prom: tuple[str, float]) -> None:
    """The live bench's kill read "series only in the last 5 s of the 20 s" and "~0 s lost": the run had
    no series at the window's start because it had just been killed. Its first sample is looked for
    before the window too, so the downtime is lost time."""
    answer = _explain(prom, DOWN_AT_START)
    assert answer.window_covered == WINDOW
    assert answer.lost_seconds > 300, answer.lines()
    assert answer.top is not None and answer.top.key == "restart"


def test_healthy_run_says_nothing_found_and_what_was_checked(prom: tuple[str, float]) -> None:
    """The control: no cause, and every cause listed as checked."""
    answer = _explain(prom, SINGLE["healthy"][0])
    assert answer.causes == []
    assert answer.lost_seconds < 0.02 * WINDOW
    assert set(answer.checked) == set(CAUSES)
    assert answer.lines()[-1].startswith("nothing found. Checked: ")


def test_cli_text_and_json(
    prom: tuple[str, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``babysitter explain`` prints the ranked causes and writes the same answer as JSON."""
    url, end = prom
    out = tmp_path / "explain.json"
    argv = ["explain", "--prometheus", url, "--run", "xid", "--cluster", "sc-xid", "--at", str(end)]
    assert main([*argv, "--window", "30m", "--baseline", "1h", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1. [" in printed and "Xid 79 (reset_gpu)" in printed and "restart(s) followed" in printed
    data = json.loads(out.read_text())
    assert data["causes"][0]["key"] == "gpu_fault" and data["causes"][0]["team"] == "infra"
    assert data["causes"][0]["ranks"] == ["1"]
    assert data["queries"]["xid_new"] == ExplainQueries("xid", "sc-xid").xid_new(WINDOW, BASELINE)


def test_cli_unknown_run_exits_1(prom: tuple[str, float], capsys: pytest.CaptureFixture[str]) -> None:
    """A run Prometheus has no series of is an error that names it, not an empty answer."""
    url, end = prom
    assert main(["explain", "--prometheus", url, "--run", "nope", "--at", str(end)]) == 1
    assert "no series of run 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        ["--since", "1x"],
        ["--at", "yesterday"],
        ["--since", "30m", "--at", "1700000000"],
        ["--baseline", "0s"],
        ["--rate-window", "5 minutes"],
        ["--cluster-label", "not a label"],
    ],
)
def test_cli_bad_arguments_exit_2(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Bad times and durations fail before any query, with a message."""
    argv = ["explain", "--prometheus", "http://127.0.0.1:9", "--run", "r1", *extra]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own checks
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert "babysitter explain" in err and "Connection refused" not in err


def test_cli_unreachable_prometheus_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Prometheus down: exit 2 and the client's message."""
    assert main(["explain", "--prometheus", "http://127.0.0.1:9", "--run", "r1", "--timeout", "2"]) == 2
    assert "babysitter explain: http://127.0.0.1:9" in capsys.readouterr().err


def test_explain_reads_only_what_the_central_tier_keeps(prom: tuple[str, float]) -> None:
    """Every metric explain queries survives the per-rack agents' drop list, so it works centrally."""
    answer = _explain(prom, SINGLE["throttle"][0])
    text = "\n".join(answer.queries.values())
    read = {
        spec.name for spec in catalog.ALL if re.search(rf"(?<![\w:]){re.escape(spec.name)}(?![\w:])", text)
    }
    assert read, "the queries name catalog metrics"
    assert read <= central_metrics(_CFG), read - central_metrics(_CFG)


def _wait_for(hints: RunHints, runs: list[str], run: str) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = hints.hints(runs)
        if run in found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no hint for {run} within 60 s")


def test_top_hint_for_a_run_whose_mfu_dropped(prom: tuple[str, float]) -> None:
    """``babysitter top`` explains only the runs whose MFU dropped, in one line naming the cause."""
    url, end = prom
    hints = RunHints(PromClient(url), now=lambda: end, window=WINDOW, baseline=BASELINE)
    found = _wait_for(hints, ["throttle", "healthy", "loss"], "throttle")
    assert found["throttle"].startswith("likely gpu throttling (")
    assert "rank 3 (host sc-throttle-h1:9946, GPU 1)" in found["throttle"]
    assert set(found) == {"throttle"}, "runs at their usual MFU get no hint"


def test_top_hint_for_a_young_run_whose_gpu_throttles(prom: tuple[str, float]) -> None:
    """Issue 22: the demo's throttled run (minutes old) got no hint: the MFU test needs an hour of
    history before the last 15 minutes. A run without it whose GPU throttles now is compared with its
    best MFU over the window instead, and explained (the rules' names read from the Prometheus)."""
    url, end = prom
    hints = RunHints(PromClient(url), now=lambda: end, window=WINDOW, baseline=BASELINE)
    found = _wait_for(hints, ["young-throttle", "young"], "young-throttle")
    assert found["young-throttle"].startswith("likely gpu throttling ("), found
    assert set(found) == {"young-throttle"}, "a young run at its usual MFU gets no hint"


def test_top_hint_never_waits_for_explain(prom: tuple[str, float]) -> None:
    """While an explanation runs, the view gets what is ready (nothing yet) instead of waiting."""
    url, end = prom
    started, release = threading.Event(), threading.Event()

    def slow(*args: object, **kwargs: object) -> Explanation:
        started.set()
        release.wait(60)
        return explain(*args, **kwargs)  # type: ignore[arg-type]

    hints = RunHints(PromClient(url), now=lambda: end, window=WINDOW, baseline=BASELINE, explainer=slow)
    assert hints.hints(["datawait"]) == {}
    assert started.wait(30), "the explanation was asked for"
    assert hints.hints(["datawait"]) == {}, "a pending explanation does not block the refresh"
    release.set()
    assert _wait_for(hints, ["datawait"], "datawait")["datawait"].startswith("likely data wait")


def test_hint_line_is_short_and_says_when_nothing_was_found() -> None:
    """The top hint is the first cause in one bounded line; nothing found says so."""
    empty = Explanation("r1", "", 0.0, 900.0, 3600.0, 1.0, 2.0, None, None, 450.0, [], {"loss": "no"})
    assert hint_line(empty).startswith("MFU dropped; explain found no cause")
    cause = Cause("data_wait", "x" * 500, 400.0, "training", share=0.89)
    line = hint_line(Explanation("r1", "", 0.0, 900.0, 3600.0, 1.0, 2.0, None, None, 450.0, [cause], {}))
    assert line.startswith("likely data wait (89% of the lost time): xxx") and len(line) == 160


def test_top_shows_the_hint_under_the_runs() -> None:
    """A run's hint is printed under the runs table; a run without one gets no line."""
    frame = Frame(
        time.time(),
        "test",
        runs=(
            RunRow("r1", 4, mfu=0.2, hint="likely data wait (89% of the lost time): every rank"),
            RunRow("r2", 4),
        ),
    )
    console = Console(record=True, width=200, color_system=None)
    console.print(render(frame))
    text = console.export_text()
    assert "  r1: likely data wait (89% of the lost time): every rank" in text
    assert "r2:" not in text


def test_silent_corruption_is_named_with_its_rank_host_gpu_and_checkpoint(prom: tuple[str, float]) -> None:
    """A diverged replica and a corrupt checkpoint in the window are listed (untimed: the run kept its
    pace), naming the rank with its host and GPU and the checkpoint's step, file and reason; the loss
    cause names the rank whose loss went non-finite first. The healthy run lists both as checked."""
    answer = _explain(prom, CORRUPTION)
    by_key = {c.key: c for c in answer.causes}
    replica = by_key["replica_divergence"]
    assert replica.ranks == ["2"] and replica.team == "infra" and replica.seconds == 0
    assert replica.text.startswith(
        "rank 2 (host sc-corruption-h1:9946, GPU 0) holds parameters that differ from its data-parallel "
        "replicas' since step 4321"
    ), replica.text
    corrupt = by_key["checkpoint_corrupt"]
    assert "the checkpoint of step 4000 fails verification: __2_0.distcp (digest)" in corrupt.text
    loss = by_key["loss"]
    assert loss.text.endswith(
        "the loss went non-finite first on rank 1 (host sc-corruption-h0:9946, GPU 1) at step 5000"
    ), loss.text
    assert loss.ranks == ["1"]
    healthy = _explain(prom, SINGLE["healthy"][0])
    assert {"replica_divergence", "checkpoint_corrupt"} <= set(healthy.checked)
    assert not {c.key for c in healthy.causes} & {"replica_divergence", "checkpoint_corrupt"}


def test_every_cause_has_a_team() -> None:
    """Each cause explain checks routes to infra or training (the alerts' rule shares its teams)."""
    assert set(TEAMS) == set(CAUSES)
    assert set(TEAMS.values()) == {"infra", "training"}


def test_demo_shows_the_throttle_fault_explained(prom: tuple[str, float]) -> None:
    """``babysitter demo``'s explainer (a background thread, in-process explain) names throttling first
    for a throttle fault, in the line the demo prints; here over the throttle scenario's backfilled
    series, with the rules' config they were recorded with (the demo passes its fast profile)."""
    from babysitter.demo.explainer import FaultExplainer
    from babysitter.demo.scenario import DemoEvent

    url, end = prom
    sc = SINGLE["throttle"][0]
    lines: list[str] = []
    explainer = FaultExplainer(
        url, run=sc.name, cluster=sc.cluster, cfg=_CFG, on_line=lines.append, delay=WINDOW, baseline=BASELINE
    )
    fault = DemoEvent(end - WINDOW, "throttle", 1, {"reasons": ["hw_slowdown", "hw_thermal_slowdown"]})
    explainer.schedule(fault, end - WINDOW)  # due at ``end``, long past: explained at once
    explainer.close(wait=30)
    assert [r.top_key for r in explainer.results] == ["gpu_throttling"]
    assert len(lines) == 1 and lines[0] == explainer.results[0].line()
    assert lines[0].startswith(
        "explained GPU 1 throttles (hw_slowdown + hw_thermal_slowdown): gpu throttling (infra, "
    )
    assert "of the lost time): rank 3 (host sc-throttle-h1:9946, GPU 1) step time 1.7x" in lines[0]
