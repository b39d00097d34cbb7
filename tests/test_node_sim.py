"""The simulated GPU backend: scenarios drive the fake NVML, and the real collectors see the faults."""

from __future__ import annotations

import ctypes
import json
import time
from pathlib import Path

import pytest

from babysitter.catalog import node as N
from babysitter.node.gpu import fake as F
from babysitter.node.gpu.collector import GpuCollector
from babysitter.node.gpu.simulate import (
    GPU_MODELS,
    Simulator,
    load_scenario,
    parse_scenario,
    resolve_model,
    scenario_epoch,
)
from node_helpers import scrape


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sim(count: int = 2, model: str = "H100", events: list[dict[str, object]] | None = None, **kw: object):  # type: ignore[no-untyped-def]
    clock = Clock()
    scenario = parse_scenario(events or [], count)
    s = Simulator(count, model, scenario=scenario, clock=clock, **kw)  # type: ignore[arg-type]
    gpu = GpuCollector(s.nvml)
    gpu.start()
    return s, clock, gpu


class TestScenario:
    @pytest.mark.parametrize(
        ("events", "message"),
        [
            ({"events": "no"}, "list of events"),
            ([{"event": "explode"}], "unknown event 'explode'"),
            ([{"event": "lost", "gpu": 9}], "out of range"),
            ([{"event": "lost", "at": -1}], ">= 0"),
            ([{"event": "xid"}], "integer 'xid'"),
            ([{"event": "throttle", "reasons": ["too_hot"]}], "reasons"),
            ([{"event": "ecc", "type": "soft"}], "corrected or uncorrected"),
            ([{"event": "error", "query": "nvmlDeviceGetPowerUsage"}], "code"),
            ([{"event": "pcie_replay", "count": "many"}], "number"),
        ],
    )
    def test_bad_scenarios_are_rejected(self, events: object, message: str) -> None:
        """A scenario mistake is a ValueError naming the event and the problem."""
        with pytest.raises(ValueError, match=message):
            parse_scenario(events, 2)

    def test_scenario_file(self, tmp_path: Path) -> None:
        """A JSON file of events loads sorted by time; an unreadable file names its path."""
        path = tmp_path / "s.json"
        path.write_text(
            json.dumps({"events": [{"at": 5, "event": "lost"}, {"at": 1, "event": "xid", "xid": 13}]})
        )
        assert [e.event for e in load_scenario(path, 1)] == ["xid", "lost"]
        with pytest.raises(ValueError, match=r"missing\.json"):
            load_scenario(tmp_path / "missing.json", 1)

    def test_models(self) -> None:
        """Short and full model names resolve; an unknown one lists the choices."""
        assert resolve_model("h100") is GPU_MODELS["H100"]
        assert resolve_model("NVIDIA A100-SXM4-80GB") is GPU_MODELS["A100"]
        with pytest.raises(ValueError, match="H100"):
            resolve_model("TPUv5")


class TestFaults:
    def test_events_fire_on_time(self) -> None:
        """An event applies once its time has come, not before."""
        s, clock, gpu = sim(events=[{"at": 10, "gpu": 1, "event": "lost"}])
        clock.now += 9
        s.step()
        assert scrape(gpu).value(N.GPU_UP.name, gpu="1") == 1
        clock.now += 2
        s.step()
        assert scrape(gpu).value(N.GPU_UP.name, gpu="1") == 0
        assert scrape(gpu).value(N.GPU_UP.name, gpu="0") == 1

    def test_xid79_delivers_the_event_then_the_gpu_is_lost(self, tmp_path: Path) -> None:
        """Xid 79 reaches a registered NVML event set and the kernel log, then the GPU stops answering."""
        log = tmp_path / "kern.log"
        s, clock, gpu = sim(events=[{"at": 1, "gpu": 1, "event": "xid79"}], kernel_log=log)
        lib = s.nvml
        es = lib.nvmlEventSetCreate()
        lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(1), lib.nvmlEventTypeXidCriticalError, es)
        clock.now += 1
        s.step()
        event = lib.nvmlEventSetWait(es, 1000)
        assert event.eventData == 79
        handle = lib.nvmlDeviceGetHandleByIndex(0)  # GPU 1 is lost now: compare handle addresses
        addresses = {ctypes.cast(h, ctypes.c_void_p).value for h in (event.device, handle)}
        assert len(addresses) == 2
        with pytest.raises(lib.NVMLError_GpuIsLost):
            lib.nvmlDeviceGetUUID(event.device)
        line = log.read_text()
        assert line == "NVRM: Xid (PCI:0000:28:00): 79, pid=4242, name=python3, GPU has fallen off the bus.\n"
        assert scrape(gpu).value(N.GPU_UP.name, gpu="1") == 0

    def test_kernel_log_line_parses_with_the_xid_parser(self, tmp_path: Path) -> None:
        """The simulated NVRM line is one the kernel-log parser understands, mapped to the GPU's bus."""
        kmsg = pytest.importorskip("babysitter.node.xid.kmsg")
        log = tmp_path / "kern.log"
        sim(events=[{"at": 0, "gpu": 0, "event": "xid", "xid": 31}], kernel_log=log)
        events = kmsg.parse_log(log.read_text().splitlines())
        assert len(events) == 1
        assert events[0].xid == 31

    def test_xid48_ecc_and_remap(self) -> None:
        """Xid 48 comes with an uncorrected ECC error and a pending row remap."""
        _, _, gpu = sim(events=[{"at": 0, "gpu": 0, "event": "xid48"}])
        out = scrape(gpu)
        assert out.value(N.GPU_ECC_ERRORS.name, gpu="0", type="uncorrected", scope="volatile") == 1
        assert out.value(N.GPU_REMAPPED_ROWS.name, gpu="0", state="pending") == 1
        assert out.value(N.GPU_REMAPPED_ROWS.name, gpu="0", state="uncorrectable") == 1

    def test_throttling_shows_as_reasons_lower_clock_and_power(self) -> None:
        """Thermal throttling sets the reason series and lowers SM clock and power."""
        s, clock, gpu = sim(
            events=[{"at": 5, "gpu": 0, "event": "throttle", "reasons": ["hw_thermal_slowdown"]}]
        )
        before = scrape(gpu)
        clock.now += 5
        s.step()
        after = scrape(gpu)
        assert after.value(N.GPU_CLOCK_EVENT_ACTIVE.name, gpu="0", reason="hw_thermal_slowdown") == 1
        assert after.value(N.GPU_SM_CLOCK.name, gpu="0") < before.value(N.GPU_SM_CLOCK.name, gpu="0")
        assert after.value(N.GPU_POWER.name, gpu="0") < before.value(N.GPU_POWER.name, gpu="0")
        assert after.value(N.GPU_CLOCK_EVENT_ACTIVE.name, gpu="1", reason="hw_thermal_slowdown") == 0

    def test_counters_and_errors(self) -> None:
        """ECC, NVLink, PCIe counters accumulate; an injected NVML error is counted, not fatal."""
        _, _, gpu = sim(
            events=[
                {"at": 0, "gpu": 1, "event": "ecc", "type": "corrected", "count": 3},
                {"at": 0, "gpu": 1, "event": "ecc", "type": "corrected", "count": 2},
                {"at": 0, "gpu": 1, "event": "nvlink", "link": 2, "type": "crc_flit", "count": 4},
                {"at": 0, "gpu": 1, "event": "pcie_replay", "count": 6},
                {
                    "at": 0,
                    "gpu": 0,
                    "event": "error",
                    "query": "nvmlDeviceGetPowerUsage",
                    "code": F.NVML_ERROR_UNKNOWN,
                },
            ]
        )
        out = scrape(gpu)
        assert out.value(N.GPU_ECC_ERRORS.name, gpu="1", type="corrected", scope="aggregate") == 5
        assert out.value(N.GPU_NVLINK_ERRORS.name, gpu="1", link="all", type="crc_flit") == 4
        assert out.value(N.GPU_PCIE_REPLAYS.name, gpu="1") == 6
        assert out.value(N.GPU_QUERY_ERRORS.name, gpu="0", query="power", error="Unknown") == 1

    def test_energy_integrates_power(self) -> None:
        """Energy grows by power x time between ticks."""
        s, clock, gpu = sim(count=1)
        e0 = scrape(gpu).value(N.GPU_ENERGY.name)
        watts = scrape(gpu).value(N.GPU_POWER.name)
        clock.now += 10
        s.step()
        assert scrape(gpu).value(N.GPU_ENERGY.name) - e0 == pytest.approx(watts * 10, rel=0.1)

    def test_model_decides_remap_or_retired_pages(self) -> None:
        """Ampere and later remap rows (no retired pages); a V100 retires pages (no remapped rows)."""
        _, _, h100 = sim(count=1, model="H100")
        out = scrape(h100)
        assert out.find(N.GPU_RETIRED_PAGES.name) == []
        assert len(out.find(N.GPU_REMAPPED_ROWS.name)) == 4
        _, _, v100 = sim(count=1, model="V100")
        out = scrape(v100)
        assert out.find(N.GPU_REMAPPED_ROWS.name) == []
        assert len(out.find(N.GPU_RETIRED_PAGES.name)) == 2
        assert out.find(N.GPU_TENSOR_ACTIVE.name) == []

    def test_hang_and_recover(self) -> None:
        """A hanging GPU makes NVML calls block; recover ends it."""
        s, _, _ = sim(count=1, events=[{"at": 0, "event": "hang", "seconds": 0.05}])
        assert s.nvml.gpu(0).delay_seconds == 0.05
        s._apply(parse_scenario([{"event": "recover"}], 1)[0])
        assert s.nvml.gpu(0).delay_seconds == 0


def test_builtin_demo_scenario_fits_any_gpu_count() -> None:
    """`--scenario demo` needs no file and maps its GPUs onto however many are simulated."""
    for count in (1, 2, 8):
        events = load_scenario(Path("demo"), count)
        assert {e.event for e in events} >= {"throttle", "xid48", "xid79"}
        assert all(0 <= e.gpu < count for e in events)


class TestSimulatedCluster:
    def test_each_simulated_host_has_its_own_gpu_uuids(self) -> None:
        """UUIDs are globally unique (the rank-to-GPU joins key on them): host N's differ from every other
        host's, stay the same from one start to the next, and host 0's are the ones tests always saw."""
        uuids = {host: [g.uuid for g in Simulator(2, host=host).nvml.gpus] for host in (0, 1, 2)}
        assert (
            uuids[0]
            == [g.uuid for g in F.fake_gpus(2)]
            == [
                "GPU-00000000-fa4e-4bab-8e5d-000000000000",
                "GPU-00000001-fa4e-4bab-8e5d-000000000001",
            ]
        )
        assert len({u for found in uuids.values() for u in found}) == 6
        assert uuids[2] == [g.uuid for g in Simulator(2, host=2).nvml.gpus]
        with pytest.raises(ValueError, match=r"0\.\.65535"):
            F.fake_gpus(1, host=1 << 16)

    def test_an_anchored_scenario_restarts_where_the_gpus_are(self, tmp_path: Path) -> None:
        """With an epoch, ``at`` counts from that Unix time: an agent started 10 s into the scenario has
        the GPU that fell off the bus at 5 s lost already, without a second Xid line in the kernel log
        (an agent restarted mid-scenario must not page the old Xid again), and plays later events on time."""
        log = tmp_path / "kern.log"
        log.write_text(
            "NVRM: Xid (PCI:0000:28:00): 79, pid=4242, name=python3, GPU has fallen off the bus.\n"
        )
        events = [
            {"at": 5, "gpu": 1, "event": "xid79"},
            {"at": 20, "gpu": 0, "event": "throttle", "reasons": ["hw_slowdown"]},
        ]
        s, clock, gpu = sim(events=events, kernel_log=log, epoch=time.time() - 10)
        assert [e.event for e in s.applied] == ["xid79"]
        assert scrape(gpu).value(N.GPU_UP.name, gpu="1") == 0
        assert log.read_text().count("Xid") == 1
        clock.now += 9
        s.step()
        assert [e.event for e in s.applied] == ["xid79"]  # 19 s: not yet
        clock.now += 2
        s.step()
        assert [e.event for e in s.applied] == ["xid79", "throttle"]

    def test_an_anchored_scenario_waits_for_its_epoch(self, tmp_path: Path) -> None:
        """An agent started 4 s before the epoch plays an event ``at`` 5 s at 9 s of its own clock, not
        at 5 s (the campaign's Xid 79 was paged before the time it was scheduled for)."""
        events = [{"at": 5, "gpu": 1, "event": "xid79"}]
        s, clock, gpu = sim(events=events, epoch=time.time() + 4)
        clock.now += 8
        s.step()
        assert s.applied == []  # 8 s after the start is 4 s after the epoch: not yet
        assert scrape(gpu).value(N.GPU_UP.name, gpu="1") == 1
        clock.now += 1.5
        s.step()
        assert [(e.event, e.gpu) for e in s.applied] == [("xid79", 1)]

    def test_scenario_epoch(self, tmp_path: Path) -> None:
        path = tmp_path / "s.json"
        path.write_text(json.dumps({"epoch": 1700000000.5, "events": []}))
        assert scenario_epoch(path) == 1700000000.5
        path.write_text(json.dumps([{"at": 1, "event": "lost"}]))
        assert scenario_epoch(path) is None
        path.write_text(json.dumps({"epoch": "yesterday", "events": []}))
        with pytest.raises(ValueError, match="Unix time"):
            scenario_epoch(path)
