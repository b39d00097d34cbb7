"""The DCGM collector through a fake with DcgmReader's shape, and loading the bindings from disk."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from babysitter.catalog import node as N
from babysitter.node.gpu.dcgm import FIELDS, DcgmCollector, DcgmUnavailable
from node_helpers import scrape

# Field ids as dcgm_fields defines them (DCGM 3/4); the collector only ever uses them by name.
FIELD_IDS = {
    "DCGM_FI_DRIVER_VERSION": 1,
    "DCGM_FI_DEV_NAME": 50,
    "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_MEM_CLOCK": 101,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 112,
    "DCGM_FI_DEV_MEMORY_TEMP": 140,
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156,
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 164,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 202,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_FB_TOTAL": 250,
    "DCGM_FI_DEV_FB_USED": 252,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 310,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 311,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 312,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 313,
    "DCGM_FI_DEV_RETIRED_SBE": 390,
    "DCGM_FI_DEV_RETIRED_DBE": 391,
    "DCGM_FI_DEV_RETIRED_PENDING": 392,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 393,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 394,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 396,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 409,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 419,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 429,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 439,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
}
F = SimpleNamespace(**FIELD_IDS)


class FakeDcgmReader:
    """DcgmReader's shape: GetLatestGpuValuesAsFieldIdDict(), m_gpuIdToUUId, m_gpuIdToBusId, Shutdown()."""

    def __init__(self, values: dict[int, dict[int, Any]]) -> None:
        self.values = values
        self.m_gpuIdToUUId = {g: f"GPU-dcgm-{g}" for g in values}
        self.m_gpuIdToBusId = {g: f"00000000:{0x18 + g:02X}:00.0" for g in values}
        self.shut = False

    def GetLatestGpuValuesAsFieldIdDict(self) -> dict[int, dict[int, Any]]:
        return {g: dict(v) for g, v in self.values.items() if v}

    def Shutdown(self) -> None:
        self.shut = True


def healthy(gpu: int) -> dict[int, Any]:
    return {
        F.DCGM_FI_DEV_NAME: "NVIDIA H100 80GB HBM3",
        F.DCGM_FI_DEV_GPU_UTIL: 93,
        F.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: 0.41,
        F.DCGM_FI_DEV_FB_USED: 70_000,
        F.DCGM_FI_DEV_FB_TOTAL: 81_559,
        F.DCGM_FI_DEV_POWER_USAGE: 612.5,
        F.DCGM_FI_DEV_ENFORCED_POWER_LIMIT: 700.0,
        F.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: 123_456_789,
        F.DCGM_FI_DEV_GPU_TEMP: 64,
        F.DCGM_FI_DEV_MEMORY_TEMP: 71,
        F.DCGM_FI_DEV_SM_CLOCK: 1980,
        F.DCGM_FI_DEV_MEM_CLOCK: 2619,
        F.DCGM_FI_DEV_CLOCKS_EVENT_REASONS: 0x4 | 0x40,
        F.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: 2,
        F.DCGM_FI_DEV_ROW_REMAP_PENDING: 1,
        F.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 9,
        F.DCGM_FI_DEV_PCIE_REPLAY_COUNTER: 3,
        F.DCGM_FI_DEV_RETIRED_PENDING: 0,
    }


def test_fields_map_to_catalog_with_base_units() -> None:
    """DCGM values land on the same catalog metrics as NVML's, in base units."""
    reader = FakeDcgmReader({0: healthy(0), 1: healthy(1)})
    s = scrape(DcgmCollector(reader, F))
    one = {"gpu": "1", "uuid": "GPU-dcgm-1", "pci_bus_id": "0000:19:00", "model": "NVIDIA H100 80GB HBM3"}
    assert s.value(N.GPU_UP.name, **one) == 1
    assert s.value(N.GPU_UTILIZATION.name, **one) == pytest.approx(0.93)
    assert s.value(N.GPU_TENSOR_ACTIVE.name, **one) == pytest.approx(0.41)
    assert s.value(N.GPU_MEMORY_USED.name, **one) == 70_000 * 2**20
    assert s.value(N.GPU_ENERGY.name, **one) == pytest.approx(123_456.789)
    assert s.value(N.GPU_SM_CLOCK.name, **one) == 1980e6
    assert s.value(N.GPU_TEMPERATURE.name, sensor="memory", **one) == 71
    assert s.value(N.GPU_ECC_ERRORS.name, type="uncorrected", scope="volatile", **one) == 2
    assert s.value(N.GPU_REMAPPED_ROWS.name, state="pending", **one) == 1
    assert s.value(N.GPU_NVLINK_ERRORS.name, link="all", type="crc_flit", **one) == 9
    assert s.value(N.GPU_PCIE_REPLAYS.name, **one) == 3
    assert s.value(N.GPU_RETIRED_PAGES_PENDING.name, **one) == 0
    active = {lbl["reason"] for name, lbl in s.series(gpu="1") if name == N.GPU_CLOCK_EVENT_ACTIVE.name
              and s.value(name, gpu="1", reason=lbl["reason"]) == 1}  # fmt: skip
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}


def test_blank_fields_are_omitted() -> None:
    """A field DCGM leaves blank (not supported) is simply absent."""
    values = healthy(0)
    del values[F.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE]
    s = scrape(DcgmCollector(FakeDcgmReader({0: values}), F))
    assert s.find(N.GPU_TENSOR_ACTIVE.name) == []
    assert s.value(N.GPU_UP.name, gpu="0") == 1


def test_gpu_missing_from_answer_is_down() -> None:
    """A GPU DCGM knows but returns no values for reports gpu_up=0 with its identity."""
    reader = FakeDcgmReader({0: healthy(0), 1: healthy(1)})
    collector = DcgmCollector(reader, F)
    scrape(collector)
    reader.values[1] = {}
    s = scrape(collector)
    assert s.value(N.GPU_UP.name, gpu="1", uuid="GPU-dcgm-1") == 0
    assert s.series(gpu="1") == [(N.GPU_UP.name, s.series(gpu="1")[0][1])]
    assert s.value(N.GPU_UP.name, gpu="0") == 1


def test_no_values_at_all_fails_the_collector() -> None:
    """An empty answer (hostengine down) raises, so the agent marks the collector failed."""
    reader = FakeDcgmReader({0: healthy(0)})
    reader.values = {}
    with pytest.raises(DcgmUnavailable):
        list(DcgmCollector(reader, F).collect())


def test_every_mapped_field_is_a_known_dcgm_name() -> None:
    """Every field the collector maps is among the dcgm_fields names above (from DCGM 4)."""
    assert set(FIELDS) <= set(FIELD_IDS)


def test_bindings_missing_is_unavailable(tmp_path: Path) -> None:
    """No DcgmReader.py at the install paths: DcgmUnavailable naming where it looked."""
    with pytest.raises(DcgmUnavailable, match=str(tmp_path)):
        DcgmCollector.from_bindings(paths=[str(tmp_path)])


def test_bindings_loaded_from_install_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bindings found at an install path are imported and connected with the known field ids."""
    (tmp_path / "dcgm_fields.py").write_text(
        "\n".join(f"{name} = {value}" for name, value in FIELD_IDS.items()) + "\n"
    )
    (tmp_path / "DcgmReader.py").write_text(
        textwrap.dedent(
            """
            class DcgmReader:
                def __init__(self, hostname="localhost", fieldIds=None, updateFrequency=10000000, **kw):
                    self.fieldIds = fieldIds
                    self.m_gpuIdToUUId = {0: "GPU-a"}
                    self.m_gpuIdToBusId = {0: "00000000:18:00.0"}
                def Init(self):
                    self.inited = True
                def GetLatestGpuValuesAsFieldIdDict(self):
                    return {0: {50: "NVIDIA B200", 203: 50}}
                def Shutdown(self):
                    pass
            """
        )
    )
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    for mod in ("DcgmReader", "dcgm_fields"):
        monkeypatch.delitem(__import__("sys").modules, mod, raising=False)
    collector = DcgmCollector.from_bindings(paths=[str(tmp_path)])
    s = scrape(collector)
    assert s.value(N.GPU_UTILIZATION.name, model="NVIDIA B200") == 0.5
    assert 1004 in collector._reader.fieldIds  # tensor activity is watched
    collector.close()
