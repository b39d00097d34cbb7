"""The demo's explainer without a working Prometheus, and the GPU the demo's CPU training claims.

The explanation itself, against a real Prometheus, is tested in
``tests/test_explain.py::test_demo_shows_the_throttle_fault_explained`` (it shares that file's TSDB).
"""

from __future__ import annotations

import time

from babysitter.demo.explainer import FaultExplainer
from babysitter.demo.scenario import DemoEvent, default_scenario
from babysitter.demo.stack import free_port
from babysitter.demo.trainer import simulated_gpu_labels
from babysitter.generate import fast
from babysitter.node.collector import GpuIdentity
from babysitter.node.gpu.simulate import Simulator


def test_a_failing_prometheus_becomes_a_line_not_an_exception() -> None:
    """Nothing listens on the port: the fault gets an 'explain failed' line, the thread ends."""
    lines: list[str] = []
    explainer = FaultExplainer(
        f"http://127.0.0.1:{free_port()}",
        run="demo",
        cluster="demo",
        cfg=fast(),
        on_line=lines.append,
        delay=1.0,
    )
    fault = DemoEvent(0.0, "throttle", 2, {"reasons": ["hw_slowdown"]})
    explainer.schedule(fault, time.time() - 1.0)
    explainer.close(wait=20)
    assert explainer.pending == 0
    assert len(lines) == 1
    assert lines[0].startswith("explained GPU 2 throttles (hw_slowdown): explain failed: PromError"), lines
    assert explainer.results[0].top_key is None


def test_a_fault_not_due_yet_is_dropped_at_close() -> None:
    """Closing does not wait for an explanation due after the grace; no line appears later."""
    lines: list[str] = []
    explainer = FaultExplainer(
        f"http://127.0.0.1:{free_port()}", run="demo", cluster="demo", cfg=fast(), on_line=lines.append
    )
    explainer.schedule(DemoEvent(0.0, "throttle", 0, {"reasons": ["hw_slowdown"]}), time.time() + 3600)
    explainer.close(wait=0.2)
    assert lines == [] and explainer.results == []


def test_the_demo_training_claims_the_simulated_gpu_as_the_agent_exports_it() -> None:
    """train_info's uuid and bus id equal the node agent's labels of the same simulated GPU."""
    sim = Simulator(8)
    sim.nvml.nvmlInit()
    for index in (0, 6):
        handle = sim.nvml.nvmlDeviceGetHandleByIndex(index)
        agent = GpuIdentity(
            index=index,
            uuid=sim.nvml.nvmlDeviceGetUUID(handle),
            pci_bus_id=sim.nvml.nvmlDeviceGetPciInfo(handle).busId.decode(),  # as the collector reads it
            model="",
        ).label_values()
        assert simulated_gpu_labels(index) == {"uuid": agent[1], "pci_bus_id": agent[2]}


def test_the_default_scenario_explains_its_throttle_on_a_clean_stretch() -> None:
    """The 20 s explained and the 30 s baseline before them hold no other fault, and no fault's
    stuck step sits in the fast rules' 20 s rate window (issue 22: explained 3 s after the hang, the
    line read "0.4x" in one run and "1.8x" in the next)."""
    s = default_scenario()
    throttle = next(e for e in s.events if e.event == "throttle")
    others = [e for e in s.events if e is not throttle]
    from babysitter.demo.explainer import EXPLAIN_WINDOW

    end = throttle.at + EXPLAIN_WINDOW
    assert all(e.at > end for e in others), "nothing else before the throttle's explanation ends"
    assert throttle.at >= 20.0, "a rate window's worth of steps before it"
    assert end <= s.duration - 5
