"""The NVML GPU collector, driven through the fake pynvml: values, units, and per-GPU failure isolation."""

from __future__ import annotations

import logging

import pytest

from babysitter.catalog import node as N
from babysitter.node.gpu import fake as F
from babysitter.node.gpu.collector import GpuCollector
from babysitter.node.gpu.fake import FakeNvml, fake_gpus
from babysitter.node.gpu.nvml import NvmlUnavailable
from node_helpers import scrape


@pytest.fixture(name="lib")
def _lib() -> FakeNvml:
    return FakeNvml(fake_gpus(2))


@pytest.fixture(name="gpus")
def _gpus(lib: FakeNvml) -> GpuCollector:
    collector = GpuCollector(lib)
    collector.start()
    yield collector
    collector.close()


class TestValues:
    def test_units_are_converted_to_base_units(self, lib: FakeNvml, gpus: GpuCollector) -> None:
        """NVML's mW, mJ, MHz and percent become watts, joules, hertz and ratios."""
        g = lib.gpu(1)
        g.power_mw, g.power_limit_mw, g.energy_mj = 412_345, 650_000, 9_876_543
        g.sm_clock_mhz, g.mem_clock_mhz, g.utilization_gpu = 1755, 2619, 87
        g.memory_used, g.temperature_c, g.memory_temperature_c = 3 * 1024**3, 71, 83
        s = scrape(gpus)
        one = {"gpu": "1"}
        assert s.value(N.GPU_POWER.name, **one) == pytest.approx(412.345)
        assert s.value(N.GPU_POWER_LIMIT.name, **one) == pytest.approx(650.0)
        assert s.value(N.GPU_ENERGY.name, **one) == pytest.approx(9876.543)
        assert s.value(N.GPU_SM_CLOCK.name, **one) == 1755e6
        assert s.value(N.GPU_MEMORY_CLOCK.name, **one) == 2619e6
        assert s.value(N.GPU_UTILIZATION.name, **one) == pytest.approx(0.87)
        assert s.value(N.GPU_MEMORY_USED.name, **one) == 3 * 1024**3
        assert s.value(N.GPU_TEMPERATURE.name, sensor="gpu", **one) == 71
        assert s.value(N.GPU_TEMPERATURE.name, sensor="memory", **one) == 83
        assert s.value(N.GPU_POWER.name, gpu="0") == pytest.approx(70.0)

    def test_every_series_carries_the_gpu_identity(self, lib: FakeNvml, gpus: GpuCollector) -> None:
        """Per-GPU series carry gpu, uuid, normalized pci_bus_id and model, as GpuIdentity gives them."""
        lib.gpu(1).pci_bus_id = "00000000:9B:00.0"
        collector = GpuCollector(lib)
        collector.start()
        s = scrape(collector)
        ident = {i.index: i.label_values() for i in collector.identities()}
        assert ident[1] == ("1", lib.gpu(1).uuid, "0000:9b:00", "NVIDIA H100 80GB HBM3")
        for sample in s.samples:
            index = int(sample.labels["gpu"])
            got = tuple(sample.labels[k] for k in N.GPU_LABELS)
            assert got == ident[index], sample
        collector.close()

    def test_clock_event_reasons_are_labelled_zero_one_series(
        self, lib: FakeNvml, gpus: GpuCollector
    ) -> None:
        """Each throttling reason bit becomes its own 0/1 series; idle, app clocks, sync boost and
        display clock are not exported (the series budget)."""
        lib.gpu(0).clock_event_reasons = (
            F.nvmlClocksEventReasonSwPowerCap
            | F.nvmlClocksEventReasonHwThermalSlowdown
            | F.nvmlClocksEventReasonGpuIdle
        )
        s = scrape(gpus)
        active = {
            lbl["reason"]
            for name, lbl in s.series(gpu="0")
            if name == N.GPU_CLOCK_EVENT_ACTIVE.name and s.value(name, gpu="0", reason=lbl["reason"]) == 1.0
        }
        assert active == {"sw_power_cap", "hw_thermal_slowdown"}
        exported = {lbl["reason"] for name, lbl in s.series(gpu="0") if name == N.GPU_CLOCK_EVENT_ACTIVE.name}
        assert exported == {
            "sw_power_cap",
            "hw_slowdown",
            "sw_thermal_slowdown",
            "hw_thermal_slowdown",
            "hw_power_brake_slowdown",
        }

    def test_ecc_remap_retired_pcie_counters(self, lib: FakeNvml, gpus: GpuCollector) -> None:
        """ECC by type and scope, remapped rows by state, retired pages by cause, PCIe replays."""
        g = lib.gpu(0)
        g.ecc = {
            (F.NVML_MEMORY_ERROR_TYPE_CORRECTED, F.NVML_VOLATILE_ECC): 5,
            (F.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, F.NVML_AGGREGATE_ECC): 2,
        }
        g.remapped_rows = (3, 1, 1, 0)
        g.retired_pages = {F.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x1000, 0x2000]}
        g.retired_pages_pending = 1
        g.pcie_replays = 42
        s = scrape(gpus)
        assert s.value(N.GPU_ECC_ERRORS.name, gpu="0", type="corrected", scope="volatile") == 5
        assert s.value(N.GPU_ECC_ERRORS.name, gpu="0", type="uncorrected", scope="aggregate") == 2
        assert s.value(N.GPU_ECC_ERRORS.name, gpu="0", type="uncorrected", scope="volatile") == 0
        assert s.value(N.GPU_REMAPPED_ROWS.name, gpu="0", state="correctable") == 3
        assert s.value(N.GPU_REMAPPED_ROWS.name, gpu="0", state="pending") == 1
        assert s.value(N.GPU_RETIRED_PAGES.name, gpu="0", cause="double_bit_ecc") == 2
        assert s.value(N.GPU_RETIRED_PAGES_PENDING.name, gpu="0") == 1
        assert s.value(N.GPU_PCIE_REPLAYS.name, gpu="0") == 42

    def test_nvlink_errors_summed_by_default_and_per_link_on_request(self, lib: FakeNvml) -> None:
        """NVLink counters sum over active links (link="all"); per-link series when asked."""
        lib.gpu(0).nvlink_active = 4
        lib.gpu(0).nvlink_errors = {
            (1, F.NVML_NVLINK_ERROR_DL_REPLAY): 7,
            (3, F.NVML_NVLINK_ERROR_DL_REPLAY): 2,
        }
        summed = GpuCollector(lib)
        summed.start()
        s = scrape(summed)
        assert s.value(N.GPU_NVLINK_ERRORS.name, gpu="0", link="all", type="replay") == 9
        assert len(s.find(N.GPU_NVLINK_ERRORS.name, gpu="0")) == 4
        summed.close()
        per_link = GpuCollector(lib, nvlink_per_link=True)
        per_link.start()
        s = scrape(per_link)
        assert s.value(N.GPU_NVLINK_ERRORS.name, gpu="0", link="1", type="replay") == 7
        assert len(s.find(N.GPU_NVLINK_ERRORS.name, gpu="0")) == 4 * 4
        per_link.close()

    def test_nvlink_sums_come_from_the_driver_totals_in_one_call(self, lib: FakeNvml) -> None:
        """The summed counters are the driver's totals (one field-values call per GPU, not one call per
        link and counter); a driver without them gives the same sums link by link."""
        for index in (0, 1):
            lib.gpu(index).nvlink_active = 18
            lib.gpu(index).nvlink_errors = {
                (5, F.NVML_NVLINK_ERROR_DL_CRC_FLIT): 4,
                (17, F.NVML_NVLINK_ERROR_DL_CRC_FLIT): 1,
            }
        lib.gpu(1).unsupported.add("nvlink_totals")
        c = GpuCollector(lib)
        c.start()
        before = lib.calls.get("nvmlDeviceGetNvLinkErrorCounter", 0)
        s = scrape(c)
        for gpu in ("0", "1"):
            assert s.value(N.GPU_NVLINK_ERRORS.name, gpu=gpu, link="all", type="crc_flit") == 5
            assert s.value(N.GPU_NVLINK_ERRORS.name, gpu=gpu, link="all", type="replay") == 0
        # GPU 0 answered from its totals; GPU 1 was asked link by link: 18 links x 4 counters.
        assert lib.calls.get("nvmlDeviceGetNvLinkErrorCounter", 0) - before == 18 * 4
        c.close()

    def test_no_nvlink_series_without_nvlink(self, lib: FakeNvml) -> None:
        """A GPU without NVLink (state NotSupported) has no NVLink series."""
        lib.gpu(1).nvlink_active = 0
        c = GpuCollector(lib)
        c.start()
        assert scrape(c).find(N.GPU_NVLINK_ERRORS.name, gpu="1") == []
        c.close()

    def test_tensor_activity_from_gpm_needs_two_scrapes(self, lib: FakeNvml, gpus: GpuCollector) -> None:
        """GPM tensor activity is an average between two samples: absent on the first scrape."""
        lib.gpu(0).tensor_active_pct = 30.0
        assert scrape(gpus).find(N.GPU_TENSOR_ACTIVE.name, gpu="0") == []
        lib.gpu(0).tensor_active_pct = 50.0
        assert scrape(gpus).value(N.GPU_TENSOR_ACTIVE.name, gpu="0") == pytest.approx(0.40)

    def test_series_per_gpu_within_budget(self, gpus: GpuCollector) -> None:
        """DESIGN.md's budget: about 40 series per GPU."""
        scrape(gpus)
        s = scrape(gpus)
        assert 30 <= len(s.series(gpu="0")) <= 40


class TestFailures:
    def test_not_supported_omits_only_that_metric(self, lib: FakeNvml) -> None:
        """NotSupported on one query of one GPU drops that series only, and the query is not retried."""
        lib.gpu(1).unsupported.add("nvmlDeviceGetPowerUsage")
        c = GpuCollector(lib)
        c.start()
        s = scrape(c)
        assert s.find(N.GPU_POWER.name, gpu="1") == []
        assert s.value(N.GPU_POWER.name, gpu="0") == pytest.approx(70.0)
        assert s.value(N.GPU_POWER_LIMIT.name, gpu="1") == pytest.approx(700.0)
        assert s.value(N.GPU_UP.name, gpu="1") == 1
        calls = lib.calls["nvmlDeviceGetPowerUsage"]
        scrape(c)
        assert lib.calls["nvmlDeviceGetPowerUsage"] == calls + 1  # GPU 0 only
        assert s.find(N.GPU_QUERY_ERRORS.name) == []
        c.close()

    def test_gpu_lost_mid_run(
        self, lib: FakeNvml, gpus: GpuCollector, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A GPU that falls off the bus reports gpu_up=0 with its identity, logs once; the other is intact."""
        scrape(gpus)  # prime GPM so both scrapes below have the same series
        before = scrape(gpus)
        lib.gpu(0).lost = True
        with caplog.at_level(logging.ERROR, logger="babysitter.node.gpu.collector"):
            s = scrape(gpus)
            scrape(gpus)
        assert s.value(N.GPU_UP.name, gpu="0", uuid=lib.gpu(0).uuid, pci_bus_id="0000:18:00") == 0
        assert s.series(gpu="0") == [(N.GPU_UP.name, before.series(gpu="0")[0][1])]
        assert s.value(N.GPU_UP.name, gpu="1") == 1
        assert len(s.series(gpu="1")) == len(before.series(gpu="1"))
        lost_lines = [r for r in caplog.records if "is lost" in r.getMessage()]
        assert len(lost_lines) == 1
        assert "GpuIsLost" in lost_lines[0].getMessage()
        lib.gpu(0).lost = False
        assert scrape(gpus).value(N.GPU_UP.name, gpu="0") == 1

    def test_gpu_lost_before_start(self, lib: FakeNvml) -> None:
        """A GPU already lost at start still shows up, as gpu_up=0 with its index."""
        lib.gpu(1).lost = True
        c = GpuCollector(lib)
        c.start()
        s = scrape(c)
        assert s.value(N.GPU_UP.name, gpu="1") == 0
        assert [i.index for i in c.identities()] == [0]
        lib.gpu(1).lost = False
        s = scrape(c)
        assert s.value(N.GPU_UP.name, gpu="1", uuid=lib.gpu(1).uuid) == 1
        c.close()

    def test_other_error_is_counted_and_logged_once(
        self, lib: FakeNvml, gpus: GpuCollector, caplog: pytest.LogCaptureFixture
    ) -> None:
        """An unexpected NVML error omits the reading and counts it; the GPU stays up."""
        lib.gpu(1).errors["nvmlDeviceGetTemperature"] = F.NVML_ERROR_UNKNOWN
        with caplog.at_level(logging.WARNING, logger="babysitter.node.gpu.collector"):
            scrape(gpus)
            s = scrape(gpus)
        assert s.value(N.GPU_QUERY_ERRORS.name, gpu="1", query="temperature", error="Unknown") == 2
        assert s.find(N.GPU_TEMPERATURE.name, gpu="1", sensor="gpu") == []
        assert s.value(N.GPU_UP.name, gpu="1") == 1
        assert len([r for r in caplog.records if "temperature failed" in r.getMessage()]) == 1

    def test_throttle_reasons_fallback(self, lib: FakeNvml) -> None:
        """Without nvmlDeviceGetCurrentClocksEventReasons, the older throttle-reasons call is used."""
        lib.gpu(0).errors["nvmlDeviceGetCurrentClocksEventReasons"] = F.NVML_ERROR_FUNCTION_NOT_FOUND
        lib.gpu(0).clock_event_reasons = F.nvmlClocksEventReasonSwThermalSlowdown
        c = GpuCollector(lib)
        c.start()
        s = scrape(c)
        assert s.value(N.GPU_CLOCK_EVENT_ACTIVE.name, gpu="0", reason="sw_thermal_slowdown") == 1
        assert lib.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] >= 1
        c.close()

    def test_init_failure_is_a_clear_error_and_retried(self, lib: FakeNvml) -> None:
        """nvmlInit failing raises NvmlUnavailable at start; collect raises until the retry interval."""
        now = [0.0]

        def fail() -> None:
            raise F.NVMLError(F.NVML_ERROR_DRIVER_NOT_LOADED)

        lib.nvmlInit = fail  # type: ignore[method-assign]
        c = GpuCollector(lib, clock=lambda: now[0])
        with pytest.raises(NvmlUnavailable, match="DriverNotLoaded"):
            c.start()
        with pytest.raises(NvmlUnavailable, match="retrying"):
            list(c.collect())
        del lib.nvmlInit
        now[0] = 31.0
        assert scrape(c).value(N.GPU_UP.name, gpu="0") == 1
        c.close()

    def test_close_shuts_nvml_down(self, lib: FakeNvml) -> None:
        """close() frees GPM samples and balances nvmlInit with nvmlShutdown."""
        c = GpuCollector(lib)
        c.start()
        scrape(c)
        c.close()
        with pytest.raises(F.NVMLError_Uninitialized):
            lib.nvmlDeviceGetCount()
        assert lib.calls["nvmlGpmSampleFree"] == 4


def test_name_query_failing_keeps_the_gpu(lib: FakeNvml) -> None:
    """A GPU whose name query fails is still collected, with an empty model label."""
    lib.gpu(0).errors["nvmlDeviceGetName"] = F.NVML_ERROR_UNKNOWN
    c = GpuCollector(lib)
    c.start()
    s = scrape(c)
    assert s.value(N.GPU_UP.name, gpu="0", model="") == 1
    assert s.value(N.GPU_POWER.name, gpu="0") == pytest.approx(70.0)
    c.close()


def test_lost_gpu_gets_a_fresh_handle_now_and_then(lib: FakeNvml) -> None:
    """While a GPU is lost the collector asks NVML for a fresh handle once a minute, not every scrape."""
    now = [0.0]
    c = GpuCollector(lib, clock=lambda: now[0])
    c.start()
    lib.gpu(1).lost = True
    scrape(c)  # GPU 1 goes down at t=0
    before = lib.calls["nvmlDeviceGetHandleByIndex"]
    now[0] = 30.0
    scrape(c)
    assert lib.calls["nvmlDeviceGetHandleByIndex"] == before
    now[0] = 61.0
    scrape(c)
    assert lib.calls["nvmlDeviceGetHandleByIndex"] == before + 1
    now[0] = 90.0
    scrape(c)
    assert lib.calls["nvmlDeviceGetHandleByIndex"] == before + 1
    lib.gpu(1).lost = False
    now[0] = 125.0
    s = scrape(c)
    assert lib.calls["nvmlDeviceGetHandleByIndex"] == before + 2
    assert s.value(N.GPU_UP.name, gpu="1") == 1
    c.close()
