"""On a machine with an NVIDIA GPU: the NVML collector's output against ``nvidia-smi`` (skipped elsewhere)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from babysitter.catalog import node as N
from babysitter.node.collector import normalize_pci_bus_id
from babysitter.node.gpu import GpuCollector
from babysitter.node.nvml import NvmlUnavailable, load_pynvml
from node_helpers import scrape

pytestmark = pytest.mark.skipif(
    shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU and nvidia-smi"
)

FIELDS = "index,uuid,pci.bus_id,name,memory.total,enforced.power.limit,temperature.gpu,clocks.max.sm"


def test_nvml_collector_agrees_with_nvidia_smi() -> None:
    """Identity, memory, power limit, temperature and clocks match nvidia-smi's view of each GPU."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    try:
        collector = GpuCollector(load_pynvml())
        collector.start()
    except NvmlUnavailable as exc:
        pytest.fail(f"nvidia-smi works but NVML does not: {exc}")
    try:
        s = scrape(collector)
    finally:
        collector.close()
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    assert len(s.find(N.GPU_UP.name)) == len(rows)
    for index, uuid, bus, name, mem_mib, limit_w, temp_c, max_sm_mhz in rows:
        labels = {"gpu": index, "uuid": uuid, "pci_bus_id": normalize_pci_bus_id(bus), "model": name}
        assert s.value(N.GPU_UP.name, **labels) == 1
        assert abs(s.value(N.GPU_MEMORY_TOTAL.name, **labels) - float(mem_mib) * 2**20) <= 2**20
        if limit_w not in ("[N/A]", "[Not Supported]"):
            assert s.value(N.GPU_POWER_LIMIT.name, **labels) == pytest.approx(float(limit_w), abs=1.0)
        assert abs(s.value(N.GPU_TEMPERATURE.name, sensor="gpu", **labels) - float(temp_c)) <= 5
        assert 0 < s.value(N.GPU_SM_CLOCK.name, **labels) <= float(max_sm_mhz) * 1e6
        assert 0 <= s.value(N.GPU_UTILIZATION.name, **labels) <= 1
        assert len(s.find(N.GPU_CLOCK_EVENT_ACTIVE.name, gpu=index)) == 9
        assert len(s.series(gpu=index)) <= 40 + 4 * 18  # budget, plus per-link NVLink if enabled
