"""On a machine with an NVIDIA GPU: every reading of the NVML collector against ``nvidia-smi -q -x``.

Skipped elsewhere, saying why. Readings that move (power, clocks, utilization, temperature) are
bracketed: the collector is read before and after ``nvidia-smi``, and nvidia-smi's value must lie
between the two collector readings, widened by a tolerance. Where nvidia-smi says N/A the collector
must export nothing or the comparison is recorded as not made; a test that compared nothing fails.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import pytest

from babysitter.catalog import node as N
from babysitter.node.collector import normalize_pci_bus_id
from babysitter.node.gpu.collector import EXPORTED_CLOCK_EVENT_REASONS, GpuCollector
from babysitter.node.gpu.nvml import NvmlUnavailable, load_pynvml
from gpu_helpers import SmiGpu, parse_smi_xml, record, requires_gpu
from node_helpers import Scrape, scrape

pytestmark = requires_gpu

MIB = 2.0**20


def _smi() -> tuple[dict[str, str], list[SmiGpu], str]:
    out = subprocess.run(
        ["nvidia-smi", "-q", "-x"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    info, gpus = parse_smi_xml(out)
    return info, gpus, out


@pytest.fixture(scope="module")
def collector() -> Any:
    try:
        c = GpuCollector(load_pynvml())
        c.start()
    except NvmlUnavailable as exc:
        pytest.fail(f"nvidia-smi works but NVML does not: {exc}")
    yield c
    c.close()


class Bracket:
    """Compares nvidia-smi's reading with two collector readings taken around it."""

    def __init__(self, before: Scrape, after: Scrape, labels: dict[str, str]) -> None:
        self.before, self.after, self.labels = before, after, labels
        self.compared: dict[str, str] = {}
        self.failures: list[str] = []

    def values(self, name: str, **extra: str) -> list[float]:
        return [
            *self.before.find(name, **self.labels, **extra),
            *self.after.find(name, **self.labels, **extra),
        ]

    def check(
        self, what: str, name: str, smi: float | None, tol: float, *, scale: float = 1.0, **extra: str
    ) -> None:
        ours = self.values(name, **extra)
        if smi is None:
            self.compared[what] = "n/a in nvidia-smi" + (
                f"; collector {ours[0]:g}" if ours else "; absent in both"
            )
            return
        if not ours:
            self.failures.append(
                f"{what}: nvidia-smi says {smi:g} but the collector exports no {name}{extra}"
            )
            return
        want = smi * scale
        lo, hi = min(ours) - tol, max(ours) + tol
        if not lo <= want <= hi:
            self.failures.append(f"{what}: nvidia-smi {want:g} outside collector readings {ours} ± {tol:g}")
        self.compared[what] = (
            f"nvidia-smi {want:g}, collector {'/'.join(f'{v:g}' for v in ours)} (tol {tol:g})"
        )


def test_every_collector_reading_agrees_with_nvidia_smi_xml(collector: Any) -> None:
    before = scrape(collector)
    info, gpus, _ = _smi()
    after = scrape(collector)
    assert len(before.find(N.GPU_UP.name)) == len(gpus), (
        "the collector and nvidia-smi see different GPU counts"
    )
    assert not before.find(N.GPU_QUERY_ERRORS.name), "NVML queries failed on a healthy GPU"
    smi_by_bus = {normalize_pci_bus_id(g.bus_id): g for g in gpus}
    for identity in collector.identities():
        smi = smi_by_bus.get(normalize_pci_bus_id(identity.pci_bus_id))
        assert smi is not None, f"GPU {identity.index} ({identity.pci_bus_id}) is not in nvidia-smi -q -x"
        labels = dict(zip(("gpu", "uuid", "pci_bus_id", "model"), identity.label_values(), strict=True))
        assert identity.uuid == smi.text("uuid")
        assert identity.model == smi.text("product_name")
        b = Bracket(before, after, labels)
        r = smi.readings()
        b.check("up", N.GPU_UP.name, 1.0, 0.0)
        # NVML's v1 memory info counts the driver's reserved memory as used and in the total;
        # nvidia-smi lists it apart. Either accounting is accepted.
        reserved = r["memory_reserved_mib"] or 0.0
        for what, spec, key, tol in (
            ("memory total", N.GPU_MEMORY_TOTAL, "memory_total_mib", 2 * MIB),
            ("memory used", N.GPU_MEMORY_USED, "memory_used_mib", 64 * MIB),
        ):
            ours, smi_mib = b.values(spec.name), r[key]
            assert smi_mib is not None and ours, (what, smi_mib, ours)
            assert any(
                abs(v - smi_mib * MIB) <= tol or abs(v - (smi_mib + reserved) * MIB) <= tol for v in ours
            ), (what, ours, smi_mib, reserved)
            b.compared[what] = (
                f"nvidia-smi {smi_mib:g} MiB (+{reserved:g} reserved), collector {ours[0] / MIB:g} MiB"
            )
        power = r["power_w"]
        b.check("power draw", N.GPU_POWER.name, power, max(25.0, 0.2 * (power or 0)))
        b.check("power limit", N.GPU_POWER_LIMIT.name, r["power_limit_w"], 1.0)
        b.check("temperature", N.GPU_TEMPERATURE.name, r["temp_gpu_c"], 3.0, sensor="gpu")
        b.check("memory temperature", N.GPU_TEMPERATURE.name, r["temp_memory_c"], 3.0, sensor="memory")
        sm = r["sm_clock_mhz"]
        b.check("SM clock", N.GPU_SM_CLOCK.name, sm, max(150e6, 0.25 * (sm or 0) * 1e6), scale=1e6)
        mclk = r["mem_clock_mhz"]
        b.check("memory clock", N.GPU_MEMORY_CLOCK.name, mclk, 0.05 * (mclk or 0) * 1e6, scale=1e6)
        b.check("utilization", N.GPU_UTILIZATION.name, r["util_ratio"], 0.15)
        for label, _ in EXPORTED_CLOCK_EVENT_REASONS:
            b.check(
                f"clock event {label}",
                N.GPU_CLOCK_EVENT_ACTIVE.name,
                r[f"clock_event:{label}"],
                0.0,
                reason=label,
            )
        for scope in ("volatile", "aggregate"):
            for kind in ("corrected", "uncorrected"):
                b.check(
                    f"ECC {kind} {scope}",
                    N.GPU_ECC_ERRORS.name,
                    r[f"ecc:{kind}:{scope}"],
                    0.0,
                    type=kind,
                    scope=scope,
                )
        for state in ("correctable", "uncorrectable", "pending", "failure"):
            b.check(
                f"remapped rows {state}", N.GPU_REMAPPED_ROWS.name, r[f"remapped:{state}"], 0.0, state=state
            )
        for cause in ("multiple_single_bit_ecc", "double_bit_ecc"):
            b.check(
                f"retired pages {cause}", N.GPU_RETIRED_PAGES.name, r[f"retired:{cause}"], 0.0, cause=cause
            )
        b.check("retired pages pending", N.GPU_RETIRED_PAGES_PENDING.name, r["retired_pending"], 0.0)
        b.check("PCIe replays", N.GPU_PCIE_REPLAYS.name, r["pcie_replays"], 0.0)
        record(
            "nvml_vs_smi",
            gpu=identity.index,
            model=identity.model,
            driver=info.get("driver_version"),
            compared=b.compared,
            failures=b.failures,
        )
        assert not b.failures, "\n".join(b.failures)
        made = [k for k, v in b.compared.items() if not v.startswith("n/a")]
        assert len(made) >= 10, f"only {made} could be compared"


def test_energy_counter_follows_power_under_load(collector: Any) -> None:
    """No nvidia-smi field shows total energy: its increase over a loaded interval must match power x time."""
    import torch

    def energy_and_power() -> tuple[float | None, float | None]:
        s = scrape(collector)
        e, p = s.find(N.GPU_ENERGY.name, gpu="0"), s.find(N.GPU_POWER.name, gpu="0")
        return (e[0] if e else None), (p[0] if p else None)

    stop = threading.Event()
    a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)

    def load() -> None:
        while not stop.is_set():
            for _ in range(20):
                a @ a
            torch.cuda.synchronize(0)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        time.sleep(1.0)
        e0, _ = energy_and_power()
        t0 = time.monotonic()
        powers = []
        for _ in range(10):
            time.sleep(0.3)
            powers.append(energy_and_power()[1])
        e1, _ = energy_and_power()
        dt = time.monotonic() - t0
    finally:
        stop.set()
        worker.join(timeout=30)
    if e0 is None:
        pytest.skip("NVML reports no total energy on this GPU")
    watts = [p for p in powers if p is not None]
    assert e1 is not None and e1 > e0 and watts
    mean_power = sum(watts) / len(watts)
    ratio = (e1 - e0) / dt / mean_power
    record("energy_vs_power", joules=e1 - e0, seconds=dt, mean_watts=mean_power, ratio=ratio)
    assert 0.7 < ratio < 1.3, (e1 - e0, dt, mean_power)


def test_tensor_activity_rises_under_matmul(collector: Any) -> None:
    """GPM's tensor-core activity (Hopper and later): low while idle, high while bf16 matmuls run."""
    import torch

    torch.cuda.synchronize(0)
    idle = []
    for _ in range(4):  # the first reading may still cover earlier tests' work
        time.sleep(0.5)
        idle += scrape(collector).find(N.GPU_TENSOR_ACTIVE.name, gpu="0")
    if not idle:
        record("tensor_active", supported=False)
        pytest.skip("GPM tensor activity is not available on this GPU or driver")
    a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    torch.cuda.synchronize(0)
    scrape(collector)
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize(0)
    busy = scrape(collector).find(N.GPU_TENSOR_ACTIVE.name, gpu="0")
    record("tensor_active", supported=True, idle=idle, busy=busy[0] if busy else None)
    assert busy and busy[0] > 0.5 and busy[0] - idle[-1] > 0.3, (idle, busy)


def test_nvml_xid_events_register(collector: Any) -> None:
    """The Xid collector's NVML event source registers every GPU for critical Xid events."""
    from babysitter.node.xid.collector import XidCollector

    xid = XidCollector(gpus=collector.identities, kmsg_path=None, nvml=load_pynvml())
    xid.start()
    try:
        deadline = time.monotonic() + 10
        while "nvml" not in xid.source_status() and time.monotonic() < deadline:
            time.sleep(0.05)
        status = xid.source_status().get("nvml")
    finally:
        xid.close()
    record("xid_nvml_events", status=status)
    assert status == (True, ""), status


def test_xid_collector_reads_the_real_kernel_log_and_restarts_to_the_same_counts(
    collector: Any, tmp_path: Any
) -> None:
    """Xids since boot on the real ``/dev/kmsg`` with real NVML events: the ring buffer's history is
    read, both sources report healthy, and a restarted collector (state file kept) counts the same."""
    import os

    from babysitter.node.xid.collector import XidCollector

    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable by this user (the agent needs root or CAP_SYSLOG)")

    def run_once() -> tuple[dict[str, Any], list[tuple[dict[str, str], float]], float]:
        xid = XidCollector(
            gpus=collector.identities,
            kmsg_path="/dev/kmsg",
            nvml=load_pynvml(),
            state_path=str(tmp_path / "xid-state.json"),
        )
        t0 = time.monotonic()
        xid.start()
        try:
            deadline = t0 + 30
            while time.monotonic() < deadline:
                status = xid.source_status()
                follower = xid.follower
                if "nvml" in status and "kmsg" in status and follower is not None and follower.live:
                    break
                time.sleep(0.05)
            ready = time.monotonic() - t0
            status = xid.source_status()
            series = [
                (dict(s.labels), s.value) for s in scrape(xid).samples if s.name == N.GPU_XID_ERRORS.name
            ]
        finally:
            xid.close()
        return status, series, ready

    first_status, first, first_ready = run_once()
    second_status, second, second_ready = run_once()
    record(
        "xid_real_kmsg",
        status=first_status,
        seconds_to_live=first_ready,
        xid_series=first,
        restart_status=second_status,
        restart_seconds_to_live=second_ready,
        restart_xid_series=second,
    )
    assert first_status.get("kmsg") == (True, "") and first_status.get("nvml") == (True, ""), first_status
    assert sorted(map(str, first)) == sorted(map(str, second)), (first, second)


def test_nvlink_totals_equal_the_per_link_sums(collector: Any) -> None:
    """The summed NVLink counters come from the driver's _TOTAL fields in one call (issue 24): on real
    hardware they must equal the sums of the per-link counters (read a moment later, so a counter that
    moved in between may be higher there, never lower). A GPU without NVLink exports neither."""
    per_link = GpuCollector(load_pynvml(), nvlink_per_link=True)
    per_link.start()
    try:
        totals = scrape(collector)
        links = scrape(per_link)
    finally:
        per_link.close()
    compared = 0
    for sample in totals.matching(N.GPU_NVLINK_ERRORS.name, link="all"):
        gpu, kind = sample.labels["gpu"], sample.labels["type"]
        summed = sum(
            s.value
            for s in links.matching(N.GPU_NVLINK_ERRORS.name, gpu=gpu, type=kind)
            if s.labels["link"] != "all"
        )
        assert summed >= sample.value, (gpu, kind, sample.value, summed)
        compared += 1
    record("nvlink_totals", compared=compared)
