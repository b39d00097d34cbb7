"""The demo's scenario format (validation, the split between trainer, process and node faults) and the
matching of pages to faults."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from babysitter.demo.pager import Page
from babysitter.demo.runner import match_pages, unscripted
from babysitter.demo.scenario import (
    DEFAULT_SCENARIO,
    default_scenario,
    load_scenario,
    parse_scenario_data,
)
from babysitter.node.gpu.simulate import THROTTLED_CLOCK, parse_scenario

ROOT = Path(__file__).resolve().parents[1]


def test_default_scenario_tells_the_whole_story() -> None:
    """Healthy stretch, the training's GPU throttles (explained on screen, and paged as GpuThrottled),
    slow checkpoint, Xid 79, kill + restart, hang, each with its page; then time to recover."""
    s = default_scenario()
    kinds = [e.event for e in s.events]
    assert kinds == ["throttle", "slow_checkpoint", "xid79", "kill", "recover", "hang"]
    assert s.events[0].at >= 20, "a healthy stretch first"
    assert s.duration - s.events[-1].at - s.events[-1].seconds >= 20, "time to recover after the last fault"
    assert {e.event: e.expect for e in s.events if e.expect} == {
        "throttle": ("GpuThrottled",),
        "slow_checkpoint": ("CheckpointSaveSlow",),
        "xid79": ("GpuXidCritical",),  # its GpuDown is inhibited: one page per GPU fault
        "kill": ("TrainingProcessExited",),
        "hang": ("TrainingStalled",),
    }


def test_example_file_is_the_default_scenario() -> None:
    """examples/demo-scenario.json is what the demo plays without --scenario."""
    example = ROOT / "examples" / "demo-scenario.json"
    assert json.loads(example.read_text()) == DEFAULT_SCENARIO
    assert load_scenario(example) == default_scenario()


def test_faults_go_to_who_plays_them() -> None:
    """Node faults become a simulator scenario, trainer faults go to the training process."""
    s = parse_scenario_data(
        {
            "duration": 60,
            "gpus": 2,
            "events": [
                {"at": 5, "event": "hang_gpu", "gpu": 1, "seconds": 3},
                {"at": 6, "event": "throttle", "gpu": 0, "reasons": ["hw_slowdown"]},
                {"at": 7, "event": "slow_checkpoint", "seconds": 2},
                {"at": 8, "event": "freeze", "seconds": 4},
                {"at": 9, "event": "kill", "restart_after": None},
                {"at": 1, "event": "hang", "seconds": 10},
            ],
        }
    )
    node = s.node_events()
    assert node == [
        {"at": 5.0, "gpu": 1, "event": "hang", "seconds": 3},
        {"at": 6.0, "gpu": 0, "event": "throttle", "reasons": ["hw_slowdown"]},
    ]
    simulated = parse_scenario(node, 2)  # the simulator itself accepts them
    assert [e.event for e in simulated] == ["hang", "throttle"]
    assert s.trainer_events() == [
        {"at": 1.0, "event": "hang", "seconds": 10.0},
        {"at": 7.0, "event": "slow_checkpoint", "seconds": 2.0},
    ]
    kill = next(e for e in s.events if e.event == "kill")
    assert "not restarted" in kill.describe()
    assert next(e for e in s.events if e.event == "freeze").expect == ("TrainingStalled",)


def test_input_stall_eval_and_bad_loss_go_to_the_trainer() -> None:
    """``slow_data`` (with its per-batch ``wait``), ``eval``, ``loss_spike`` and ``nan_loss`` are trainer
    faults; only a NaN loss must page (TrainingNonFiniteLoss: no alert watches the other three)."""
    s = parse_scenario_data(
        {
            "duration": 60,
            "events": [
                {"at": 9, "event": "eval", "seconds": 4},
                {"at": 3, "event": "slow_data", "seconds": 20, "wait": 0.1},
                {"at": 12, "event": "nan_loss", "seconds": 2},
                {"at": 11, "event": "loss_spike", "seconds": 5},
            ],
        }
    )
    assert s.node_events() == []
    assert s.trainer_events() == [
        {"at": 3.0, "event": "slow_data", "seconds": 20.0, "wait": 0.1},
        {"at": 9.0, "event": "eval", "seconds": 4.0},
        {"at": 11.0, "event": "loss_spike", "seconds": 5.0},
        {"at": 12.0, "event": "nan_loss", "seconds": 2.0},
    ]
    assert [e.expect for e in s.events] == [(), (), (), ("TrainingNonFiniteLoss",)]
    assert [e.describe() for e in s.events] == [
        "input pipeline slow: each batch waits 0.1 s, for 20 s",
        "eval phase (4 s)",
        "loss spikes for 5 s (logits 30x)",
        "loss is NaN for 2 s",
    ]


def test_a_throttle_on_the_trainings_gpu_slows_its_steps() -> None:
    """The simulated GPU the training claims throttles: the trainer gets that GPU's clock, the
    simulator's throttled ratio, until the throttle clears; another GPU's throttle is not its own."""
    s = parse_scenario_data(
        {
            "duration": 60,
            "events": [
                {"at": 5, "gpu": 2, "event": "throttle", "reasons": ["hw_slowdown"]},
                {"at": 7, "gpu": 1, "event": "throttle", "reasons": ["hw_slowdown"]},
                {"at": 8, "event": "hang", "seconds": 3},
                {"at": 20, "gpu": 2, "event": "clear_throttle"},
            ],
        }
    )
    assert s.trainer_events() == [{"at": 8.0, "event": "hang", "seconds": 3.0}]
    assert s.trainer_events(gpu=2) == [
        {"at": 5.0, "event": "gpu_clock", "factor": THROTTLED_CLOCK},
        {"at": 8.0, "event": "hang", "seconds": 3.0},
        {"at": 20.0, "event": "gpu_clock", "factor": 1.0},
    ]
    assert 0 < THROTTLED_CLOCK < 1
    assert [e["event"] for e in s.trainer_events(gpu=0)] == ["hang"]


def test_truncation_drops_later_faults() -> None:
    s, dropped = default_scenario().truncated(62)
    assert s.duration == 62
    assert [e.event for e in s.events] == ["throttle", "slow_checkpoint", "xid79"]
    assert [e.event for e in dropped] == ["kill", "recover", "hang"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "is an object"),
        ({"duration": 5}, "between 10 s"),
        ({"surprise": 1}, "unknown scenario keys: surprise"),
        ({"gpus": 0}, "gpus must be"),
        ({"gpu_model": "Z9000"}, "gpu_model must be one of"),
        ({"events": [{"at": 1, "event": "meteor"}]}, "unknown event 'meteor'"),
        ({"events": [{"event": "kill"}]}, "'at' must be a finite number"),
        ({"events": [{"at": -1, "event": "kill"}]}, "must be >= 0"),
        ({"events": [{"at": 1, "event": "hang"}]}, "'seconds' must be a finite number"),
        ({"events": [{"at": 1, "event": "freeze", "seconds": 0}]}, "freeze needs 'seconds' > 0"),
        ({"events": [{"at": 1, "event": "xid79"}]}, "needs 'gpu' from 0 to 7"),
        ({"events": [{"at": 1, "event": "xid79", "gpu": 8}]}, "needs 'gpu' from 0 to 7"),
        ({"events": [{"at": 1, "event": "kill", "gpu": 0}]}, "not a GPU event"),
        ({"events": [{"at": 1, "event": "kill", "expect": "TrainingStalled"}]}, "'expect' must be a list"),
        ({"events": [{"at": 1, "event": "kill", "restart_after": "soon"}]}, "restart_after"),
        ({"events": [{"at": 1, "event": "xid", "gpu": 0}]}, "xid needs an integer 'xid'"),
        ({"events": [{"at": 1, "event": "eval"}]}, "'seconds' must be a finite number"),
        (
            {"events": [{"at": 1, "event": "slow_data", "seconds": 0, "wait": 1}]},
            "slow_data needs 'seconds' > 0",
        ),
        ({"events": [{"at": 1, "event": "slow_data", "seconds": 5}]}, "'wait' must be a finite number"),
        ({"events": [{"at": 1, "event": "slow_data", "seconds": 5, "wait": 0}]}, "needs 'wait' > 0"),
        ({"events": [{"at": 1, "event": "slow_data", "seconds": 5, "wait": 11}]}, "and <= 10 s"),
        ({"events": [{"at": 1, "event": "eval", "seconds": 5, "gpu": 0}]}, "not a GPU event"),
        ({"events": [{"at": 1, "event": "loss_spike"}]}, "'seconds' must be a finite number"),
        ({"events": [{"at": 1, "event": "nan_loss", "seconds": 0}]}, "nan_loss needs 'seconds' > 0"),
    ],
)
def test_bad_scenarios_say_what_is_wrong(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_scenario_data(data)


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=str(path)):
        load_scenario(path)


def _page(name: str, at: float, *, status: str = "firing", gpu: str | None = None) -> Page:
    labels = {"alertname": name, "severity": "critical"}
    if gpu is not None:
        labels["gpu"] = gpu
    return Page(received=at, status=status, name=name, severity="critical", labels=labels)


def test_pages_match_faults_after_them_on_the_same_gpu() -> None:
    s = parse_scenario_data(
        {
            "duration": 100,
            "events": [
                {"at": 10, "event": "xid79", "gpu": 3, "expect": ["GpuXidCritical", "GpuDown"]},
                {"at": 50, "event": "kill"},
            ],
        }
    )
    t0 = 1000.0
    pages = [
        _page("GpuXidCritical", t0 + 5, gpu="3"),  # before the fault: an older incident
        _page("GpuXidCritical", t0 + 12, gpu="2"),  # another GPU
        _page("GpuXidCritical", t0 + 13.5, gpu="3"),
        _page("GpuDown", t0 + 20, status="resolved", gpu="3"),  # a resolution is not a page
        _page("TrainingProcessExited", t0 + 52),
    ]
    results = match_pages(s.events, pages, t0)
    assert results[0].pages == {"GpuXidCritical": pytest.approx(3.5), "GpuDown": None}
    assert results[1].pages == {"TrainingProcessExited": pytest.approx(2.0)}


def test_faults_name_the_receivers_and_unscripted_alerts_are_listed() -> None:
    """Under the shipped routing a critical reaches pager and chat, a warning chat only; an alert no
    fault expects is listed with where it went (a warning in chat is not a page)."""
    s = parse_scenario_data({"duration": 100, "events": [{"at": 10, "event": "hang", "seconds": 20}]})
    t0 = 1000.0
    stalled = _page("TrainingStalled", t0 + 27)
    pages = [
        replace(stalled, receiver="pager"),
        replace(stalled, receiver="chat", received=t0 + 27.1),
        replace(stalled, receiver="pager", received=t0 + 80),  # a later episode: not this delivery
        replace(_page("TrainingGoodputLow", t0 + 40), severity="warning", receiver="chat"),
    ]
    results = match_pages(s.events, pages, t0)
    assert results[0].pages == {"TrainingStalled": pytest.approx(17.0)}
    assert results[0].receivers == {"TrainingStalled": ("chat", "pager")}
    assert unscripted(s.events, pages) == {"TrainingGoodputLow": ("warning", ("chat",))}
