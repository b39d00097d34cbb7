"""The fabric collectors on fake sysfs trees with the kernel's layout: values, drivers that differ, garbage,
unreadable and vanishing files, and counters reset by a driver reload. Every problem is counted once and
the collectors keep answering."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from babysitter.catalog import fabric as F
from babysitter.catalog import node as N
from babysitter.node.collector import GpuIdentity
from babysitter.node.config import AgentConfig
from babysitter.node.daemon import build
from babysitter.node.fabric.fake import FakeSysfs, Host
from babysitter.node.fabric.infiniband import InfinibandCollector, parse_rate, parse_state
from babysitter.node.fabric.pci import Inventory, nearest
from babysitter.node.fabric.pcie import PcieCollector, parse_aer, parse_speed
from babysitter.node.fabric.topology import TopologyCollector
from babysitter.node.host.edac import EdacCollector
from babysitter.node.host.thermal import CpuThermalCollector
from babysitter.node.sysfs import SysfsReader
from node_helpers import parse_exposition, scrape


@pytest.fixture(name="tree")
def _tree(tmp_path: Path) -> tuple[FakeSysfs, Host]:
    fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
    return fs, fs.dgx(4, memory_controllers=1, packages=1, cores=1)


def _problems(collector: object) -> dict[str, float]:
    s = scrape(collector)  # type: ignore[arg-type]
    return {x.labels["reason"]: x.value for x in s.matching(F.SYSFS_PROBLEMS.name)}


def _ib(fs: FakeSysfs, **kwargs: object) -> InfinibandCollector:
    return InfinibandCollector(fs.root, rescan_seconds=0, **kwargs)  # type: ignore[arg-type]


class TestParsers:
    def test_kernel_spellings(self) -> None:
        assert parse_state("4: ACTIVE") == 4 and parse_state("5: LinkUp") == 5
        assert parse_state("ACTIVE") is None and parse_state("x: y") is None
        assert parse_rate("400 Gb/sec (4X NDR)") == 5e10
        assert parse_rate("2.5 Gb/sec (1X SDR)") == pytest.approx(2.5e9 / 8)
        assert parse_rate("fast") is None and parse_rate("400 Mb/sec") is None
        assert parse_speed("32.0 GT/s PCIe") == 32e9 and parse_speed("8 GT/s") == 8e9
        assert parse_speed("2.5 GT/s PCIe") == 2.5e9 and parse_speed("Unknown") is None

    def test_aer_both_spellings_and_totals(self) -> None:
        old = "Receiver Error 2\nBad TLP 0\nBad DLLP 1\nTOTAL_ERR_COR 3\n"
        new = "RxErr 2\nBadTLP 0\nBadDLLP 1\nTOTAL_ERR_COR 3\n"
        assert parse_aer(old, "correctable") == parse_aer(new, "correctable") == 3
        assert parse_aer("RxErr 2\nBadDLLP 1\n", "correctable") == 3  # no total line: the sum
        assert parse_aer("Undefined 0\nDLP 1\nTOTAL_ERR_FATAL 1\n", "fatal") == 1
        assert parse_aer("garbage\n", "fatal") is None


class TestInfiniband:
    def test_values_of_a_healthy_port(self, tree: tuple[FakeSysfs, Host]) -> None:
        fs, host = tree
        fs.counter("mlx5_0", "port_rcv_data", 1000)
        fs.counter("mlx5_0", "port_xmit_packets", 7)
        fs.counter("mlx5_0", "symbol_error", 3)
        fs.counter("mlx5_0", "out_of_sequence", 5, hw=True)
        s = scrape(_ib(fs))
        port = {"device": "mlx5_0", "port": "1"}
        assert s.value(F.IB_PORT_STATE.name, **port) == 4
        assert s.value(F.IB_PORT_PHYS_STATE.name, **port) == 5
        assert s.value(F.IB_PORT_RATE.name, **port) == 5e10
        assert s.value(F.IB_PORT_DATA.name, **port, direction="receive") == 4000  # 4-byte words
        assert s.value(F.IB_PORT_PACKETS.name, **port, direction="transmit") == 7
        assert s.value(F.IB_PORT_ERRORS.name, **port, counter="symbol_error") == 3
        assert s.value(F.IB_PORT_HW_COUNTER.name, **port, counter="out_of_sequence") == 5
        assert s.value(F.IB_PORT_CARRIER_CHANGES.name, **port, interface=host.netdevs[0]) == 2
        (info,) = s.matching(F.IB_PORT_INFO.name, **port)
        assert info.labels["link_layer"] == "InfiniBand" and info.labels["pci_address"] == host.nics[0]
        assert info.labels["interface"] == host.netdevs[0] and info.labels["fw_version"] == "28.39.1002"
        errors = {x.labels["counter"] for x in s.matching(F.IB_PORT_ERRORS.name, **port)}
        assert errors == set(F.DEFAULT_PORT_ERRORS)
        hw = {x.labels["counter"] for x in s.matching(F.IB_PORT_HW_COUNTER.name, **port)}
        assert hw == set(F.DEFAULT_HW_COUNTERS)
        assert s.find(F.IB_PORT_COUNTER.name) == []  # the rest only with all_counters
        assert len({(x.labels["device"]) for x in s.matching(F.IB_PORT_STATE.name)}) == 4
        assert _problems(_ib(fs)) == {}

    def test_all_counters_on_request(self, tree: tuple[FakeSysfs, Host]) -> None:
        fs, _ = tree
        s = scrape(_ib(fs, all_counters=True))
        port = {"device": "mlx5_0", "port": "1"}
        others = {x.labels["counter"] for x in s.matching(F.IB_PORT_COUNTER.name, **port)}
        assert {"VL15_dropped", "unicast_rcv_packets", "port_rcv_constraint_errors"} <= others
        assert "port_rcv_data" not in others and "symbol_error" not in others  # exported as themselves
        hw = {x.labels["counter"] for x in s.matching(F.IB_PORT_HW_COUNTER.name, **port)}
        assert {"roce_slow_restart", "out_of_buffer"} <= hw and "lifespan" not in hw

    def test_drivers_without_counters(self, tmp_path: Path) -> None:
        """Broadcom's bnxt_re has no counters/, irdma no hw_counters/ split the same: each exports what it has."""
        fs = FakeSysfs(tmp_path / "sys")
        fs.pci("0000:3b:00.0", class_code=0x020000, vendor=0x14E4)
        fs.rdma("bnxt_re0", "0000:3b:00.0", counters=False, link_layer="Ethernet", rate="200 Gb/sec (4X HDR)")
        fs.netdev("ens3f0np0", "0000:3b:00.0")
        s = scrape(_ib(fs))
        port = {"device": "bnxt_re0", "port": "1"}
        assert s.value(F.IB_PORT_RATE.name, **port) == 2.5e10
        assert s.find(F.IB_PORT_ERRORS.name) == [] and s.find(F.IB_PORT_DATA.name) == []
        assert len(s.find(F.IB_PORT_HW_COUNTER.name, **port)) == len(F.DEFAULT_HW_COUNTERS)
        assert s.value(F.IB_PORT_CARRIER_CHANGES.name, **port, interface="ens3f0np0") == 2
        assert _problems(_ib(fs)) == {}

    def test_no_infiniband_class_at_all(self, tmp_path: Path) -> None:
        s = scrape(InfinibandCollector(tmp_path))
        assert s.find(F.IB_PORT_STATE.name) == [] and s.find(F.SYSFS_PROBLEMS.name) == []

    def test_no_pma_garbage_and_unreadable_counted_once(self, tree: tuple[FakeSysfs, Host]) -> None:
        """N/A (no PMA) is unavailable, a bad rate is garbage, a file that is a directory is unreadable:
        each counted once however many scrapes, the values absent, the rest of the port still there."""
        fs, _ = tree
        fs.counter("mlx5_1", "symbol_error", "N/A (no PMA)")
        fs.write(fs.port_dir("mlx5_1") / "rate", "fast")
        link_downed = fs.port_dir("mlx5_1") / "counters/link_downed"
        link_downed.unlink()
        link_downed.mkdir()
        c = _ib(fs)
        for _ in range(3):
            s = scrape(c)
        port = {"device": "mlx5_1", "port": "1"}
        assert s.find(F.IB_PORT_ERRORS.name, **port, counter="symbol_error") == []
        assert s.find(F.IB_PORT_RATE.name, **port) == []
        assert s.find(F.IB_PORT_ERRORS.name, **port, counter="link_downed") == []
        assert s.value(F.IB_PORT_STATE.name, **port) == 4
        assert _problems(c) == {"unavailable": 1, "garbage": 1, "unreadable": 1}
        fs.counter("mlx5_1", "symbol_error", 9)  # the counter comes back, then fails again: counted anew
        assert scrape(c).value(F.IB_PORT_ERRORS.name, **port, counter="symbol_error") == 9
        fs.counter("mlx5_1", "symbol_error", "N/A (no PMA)")
        assert _problems(c)["unavailable"] == 2

    def test_a_vanishing_device_is_counted_once_and_forgotten(self, tree: tuple[FakeSysfs, Host]) -> None:
        fs, _ = tree
        c = InfinibandCollector(fs.root, rescan_seconds=3600)
        assert len(scrape(c).find(F.IB_PORT_STATE.name)) == 4
        shutil.rmtree(fs.port_dir("mlx5_2").parent.parent)  # the driver unbinds the device
        s = scrape(c)
        assert {x.labels["device"] for x in s.matching(F.IB_PORT_STATE.name)} == {
            "mlx5_0",
            "mlx5_1",
            "mlx5_3",
        }
        assert _problems(c)["vanished"] >= 1
        vanished = _problems(c)["vanished"]
        for _ in range(3):  # scanned again after the loss: the device is gone, nothing more is counted
            assert _problems(c)["vanished"] == vanished
        assert c.scans >= 2

    def test_counters_survive_a_reset_and_a_driver_reload(self, tree: tuple[FakeSysfs, Host]) -> None:
        """A counter that goes back (a reset) or a device made anew (a driver reload, even one whose counter
        is already above the old value) continues from the last value: monotonic for Prometheus."""
        fs, _ = tree
        c = _ib(fs)
        port = {"device": "mlx5_3", "port": "1", "counter": "link_downed"}
        fs.counter("mlx5_3", "link_downed", 3)
        assert scrape(c).value(F.IB_PORT_ERRORS.name, **port) == 3
        fs.counter("mlx5_3", "link_downed", 1)  # reset to 0 since, then one more
        assert scrape(c).value(F.IB_PORT_ERRORS.name, **port) == 4
        fs.recreate("mlx5_3")
        fs.counter("mlx5_3", "link_downed", 5)  # above the old raw value: only the new inode tells
        assert scrape(c).value(F.IB_PORT_ERRORS.name, **port) == 9
        fs.counter("mlx5_3", "link_downed", 6)
        assert scrape(c).value(F.IB_PORT_ERRORS.name, **port) == 10
        assert c._counters.resets == 2

    def test_roce_port_netdev_by_dev_port(self, tmp_path: Path) -> None:
        """A two-port function (mlx4) has one netdev per port, told apart by dev_port."""
        fs = FakeSysfs(tmp_path / "sys")
        fs.pci("0000:5e:00.0", class_code=0x020000, vendor=0x15B3)
        fs.rdma("mlx4_0", "0000:5e:00.0", ports=2, link_layer="Ethernet")
        fs.netdev("ens5", "0000:5e:00.0", dev_port=0, carrier_changes=4)
        fs.netdev("ens5d1", "0000:5e:00.0", dev_port=1, carrier_changes=6)
        s = scrape(_ib(fs))
        assert s.value(F.IB_PORT_CARRIER_CHANGES.name, device="mlx4_0", port="1", interface="ens5") == 4
        assert s.value(F.IB_PORT_CARRIER_CHANGES.name, device="mlx4_0", port="2", interface="ens5d1") == 6


class TestPcie:
    def test_links_and_the_lower_maximum(self, tree: tuple[FakeSysfs, Host]) -> None:
        """The most a link can do is the lower of both ends' maximums: a x16 card in a x8 slot is at its best."""
        fs, host = tree
        fs.link(host.nics[1], width=8)  # downtrained
        fs.write(fs.device_dir(host.gpus[2]).parent / "max_link_width", 8)  # the slot above GPU 2 is x8
        fs.link(host.gpus[2], width=8)
        fs.link(host.gpus[0], speed="2.5 GT/s PCIe")  # idle
        s = scrape(PcieCollector(fs.root))
        nic1, gpu2 = {"pci_address": host.nics[1]}, {"pci_address": host.gpus[2]}
        assert (
            s.value(F.PCIE_LINK_WIDTH.name, **nic1) == 8 and s.value(F.PCIE_LINK_MAX_WIDTH.name, **nic1) == 16
        )
        assert (
            s.value(F.PCIE_LINK_WIDTH.name, **gpu2) == 8 and s.value(F.PCIE_LINK_MAX_WIDTH.name, **gpu2) == 8
        )
        assert s.value(F.PCIE_LINK_SPEED.name, pci_address=host.gpus[0]) == 2.5e9
        assert s.value(F.PCIE_LINK_MAX_SPEED.name, pci_address=host.gpus[0]) == 32e9
        kinds = {x.labels["pci_address"]: x.labels["kind"] for x in s.matching(F.PCIE_DEVICE_INFO.name)}
        assert kinds == {**dict.fromkeys(host.gpus, "gpu"), **dict.fromkeys(host.nics, "nic")}
        (info,) = s.matching(F.PCIE_DEVICE_INFO.name, pci_address=host.gpus[0])
        assert info.labels["driver"] == "nvidia" and info.labels["vendor_id"] == "0x10de"
        assert info.labels["upstream"] == "0000:17:00.0"

    def test_only_gpus_and_physical_nics(self, tmp_path: Path) -> None:
        """A BMC's VGA, bridges, NVMe and SR-IOV virtual functions are not watched."""
        fs = FakeSysfs(tmp_path / "sys")
        fs.pci("0000:02:00.0", class_code=0x030000, vendor=0x1A03)  # ASPEED BMC display
        fs.pci("0000:03:00.0", class_code=0x010802)  # NVMe
        fs.pci("0000:04:00.0", class_code=0x020000, vendor=0x15B3)
        vf = fs.pci("0000:04:00.2", class_code=0x020000, vendor=0x15B3)
        (vf / "physfn").symlink_to(fs.device_dir("0000:04:00.0"))
        fs.pci("0000:05:00.0", class_code=0x030000, vendor=0x10DE)  # an NVIDIA GPU of the VGA class
        s = scrape(PcieCollector(fs.root))
        assert {x.labels["pci_address"] for x in s.matching(F.PCIE_DEVICE_INFO.name)} == {
            "0000:04:00.0",
            "0000:05:00.0",
        }

    def test_aer_adds_the_link_partner_in_both_spellings(self, tree: tuple[FakeSysfs, Host]) -> None:
        fs, host = tree
        fs.aer(host.gpus[0], "correctable", 2, old_names=True)
        fs.aer("0000:17:00.0", "correctable", 5)  # the port above GPU 0 counted errors of its link
        fs.aer(host.gpus[1], "fatal", 1)
        s = scrape(PcieCollector(fs.root))
        assert s.value(F.PCIE_AER_ERRORS.name, pci_address=host.gpus[0], severity="correctable") == 7
        assert s.value(F.PCIE_AER_ERRORS.name, pci_address=host.gpus[1], severity="fatal") == 1
        assert s.value(F.PCIE_AER_ERRORS.name, pci_address=host.gpus[1], severity="nonfatal") == 0

    def test_garbage_unknown_speed_and_a_removed_gpu(self, tree: tuple[FakeSysfs, Host]) -> None:
        fs, host = tree
        fs.write(fs.device_dir(host.gpus[3]) / "aer_dev_fatal", "TOTAL_ERR_FATAL lots\n")
        fs.link(host.nics[2], speed="Unknown")  # a link that is down has no speed: not garbage
        c = PcieCollector(fs.root, rescan_seconds=3600)
        for _ in range(2):
            s = scrape(c)
        assert s.find(F.PCIE_AER_ERRORS.name, pci_address=host.gpus[3], severity="fatal") == []
        assert s.find(F.PCIE_LINK_SPEED.name, pci_address=host.nics[2]) == []
        assert _problems(c) == {"garbage": 1}
        shutil.rmtree(fs.device_dir(host.gpus[0]))  # fell off the bus and was removed
        (fs.root / "bus/pci/devices" / host.gpus[0]).unlink()
        s = scrape(c)
        assert s.find(F.PCIE_DEVICE_INFO.name, pci_address=host.gpus[0]) == []
        vanished = _problems(c)["vanished"]
        assert vanished >= 1 and _problems(c)["vanished"] == vanished

    def test_aer_counts_survive_a_device_re_added(self, tree: tuple[FakeSysfs, Host]) -> None:
        fs, host = tree
        fs.aer(host.nics[0], "nonfatal", 2)
        c = PcieCollector(fs.root, rescan_seconds=0)
        assert scrape(c).value(F.PCIE_AER_ERRORS.name, pci_address=host.nics[0], severity="nonfatal") == 2
        fs.aer(host.nics[0], "nonfatal", 1)  # a hot-plug made the device anew, one error since
        assert scrape(c).value(F.PCIE_AER_ERRORS.name, pci_address=host.nics[0], severity="nonfatal") == 3


class TestTopology:
    def test_each_gpu_gets_the_nic_under_its_switch(self, tree: tuple[FakeSysfs, Host]) -> None:
        fs, host = tree
        gpus = [GpuIdentity(i, f"GPU-{i}", host.gpus[i].upper(), "H100") for i in range(4)]
        s = scrape(TopologyCollector(fs.root, procfs=fs.proc, gpus=lambda: gpus))
        pairs = {
            x.labels["uuid"]: (x.labels["device"], x.labels["link"], x.labels["nic_index"])
            for x in s.matching(F.GPU_NIC.name)
        }
        assert pairs == {f"GPU-{i}": (f"mlx5_{i}", "PIX", "0") for i in range(4)}
        (one,) = s.matching(F.GPU_NIC.name, uuid="GPU-1")
        assert one.labels["pci_bus_id"] == host.gpus[1][:-2] and one.labels["nic_pci_address"] == host.nics[1]

    def test_uuid_from_the_driver_without_a_gpu_collector(self, tmp_path: Path) -> None:
        fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
        host = fs.dgx(
            2, uuids=("GPU-AAAA0000-0000-0000-0000-000000000000",), memory_controllers=0, packages=0
        )
        s = scrape(TopologyCollector(fs.root, procfs=fs.proc))
        (only,) = s.matching(F.GPU_NIC.name)  # GPU 1 has no UUID anywhere: no series
        assert only.labels["uuid"] == "GPU-aaaa0000-0000-0000-0000-000000000000"
        assert only.labels["gpu_pci_address"] == host.gpus[0]

    def test_links_by_closeness_and_ties(self, tmp_path: Path) -> None:
        """Two functions of a dual-port NIC under the GPU's switch tie (both exported); otherwise the host
        bridge (PHB), another host bridge of the NUMA node (NODE) or the other node (SYS)."""
        fs = FakeSysfs(tmp_path / "sys")
        fs.pci("0000:10:01.0", numa_node=0)
        fs.pci("0000:11:00.0", parent="0000:10:01.0")
        for n in range(3):
            fs.pci(f"0000:12:{n:02x}.0", parent="0000:11:00.0")
        fs.pci("0000:13:00.0", parent="0000:12:00.0", class_code=0x030200, vendor=0x10DE)
        for fn in (0, 1):
            fs.pci(f"0000:14:00.{fn}", parent="0000:12:01.0", class_code=0x020700, vendor=0x15B3)
            fs.rdma(f"mlx5_{fn}", f"0000:14:00.{fn}")
        fs.pci("0000:10:02.0", numa_node=0)  # the same host bridge, another root port
        fs.pci("0000:20:00.0", parent="0000:10:02.0", class_code=0x020700, vendor=0x15B3)
        fs.rdma("mlx5_2", "0000:20:00.0")
        fs.pci("0000:30:01.0", numa_node=0)  # another host bridge on node 0
        fs.pci("0000:31:00.0", parent="0000:30:01.0", class_code=0x020700, vendor=0x15B3, numa_node=0)
        fs.rdma("mlx5_3", "0000:31:00.0")
        fs.pci("0000:80:01.0", numa_node=1)
        fs.pci("0000:81:00.0", parent="0000:80:01.0", class_code=0x020700, vendor=0x15B3, numa_node=1)
        fs.rdma("mlx5_4", "0000:81:00.0")
        inventory = Inventory(SysfsReader(fs.root, "test"))
        inventory.refresh()
        gpu = next(d for d in inventory.devices if d.kind == "gpu")
        assert [(p.device, link) for p, link in nearest(gpu, inventory.ports)] == [
            ("mlx5_0", "PIX"),
            ("mlx5_1", "PIX"),
        ]

        def alone(name: str) -> str:
            return nearest(gpu, [p for p in inventory.ports if p.device == name])[0][1]

        assert [alone(f"mlx5_{n}") for n in (2, 3, 4)] == ["PHB", "NODE", "SYS"]
        gpus = [GpuIdentity(0, "GPU-x", "0000:13:00.0", "H100")]
        s = scrape(TopologyCollector(fs.root, gpus=lambda: gpus))
        assert {(x.labels["device"], x.labels["nic_index"]) for x in s.matching(F.GPU_NIC.name)} == {
            ("mlx5_0", "0"),
            ("mlx5_1", "1"),
        }


class TestHost:
    def test_edac_counts_and_a_reset(self, tmp_path: Path) -> None:
        fs = FakeSysfs(tmp_path / "sys")
        fs.edac(0, ce=12, ue=0)
        fs.edac(1, ce=0, ue=1)
        c = EdacCollector(fs.root, rescan_seconds=0)
        s = scrape(c)
        assert s.value(F.EDAC_CORRECTABLE.name, controller="0") == 12
        assert s.value(F.EDAC_UNCORRECTABLE.name, controller="1") == 1
        fs.edac(0, ce=2)  # the counters were reset (edac sysfs reset_counters): continues from 12
        assert scrape(c).value(F.EDAC_CORRECTABLE.name, controller="0") == 14
        fs.write(fs.root / "devices/system/edac/mc/mc1/ue_count", "x")
        s = scrape(c)
        assert s.find(F.EDAC_UNCORRECTABLE.name, controller="1") == [] and _problems(c) == {"garbage": 1}
        assert scrape(EdacCollector(tmp_path / "none")).find(F.EDAC_CORRECTABLE.name) == []  # no EDAC driver

    def test_thermal_throttles_per_package_each_core_once(self, tmp_path: Path) -> None:
        """Both hyperthreads of a core show its count: summed once per core, per package."""
        fs = FakeSysfs(tmp_path / "sys")
        for cpu, (package, core, count) in enumerate(
            [(0, 0, 5), (0, 0, 5), (0, 1, 2), (0, 1, 2), (1, 0, 7), (1, 0, 7)]
        ):
            fs.cpu(
                cpu, package=package, core=core, core_throttles=count, package_throttles=10 * (package + 1)
            )
        s = scrape(CpuThermalCollector(fs.root))
        assert s.value(F.CPU_CORE_THROTTLES.name, package="0") == 7
        assert s.value(F.CPU_CORE_THROTTLES.name, package="1") == 7
        assert s.value(F.CPU_PACKAGE_THROTTLES.name, package="1") == 20


class TestAgent:
    def test_the_agent_keeps_serving_through_bad_files_and_counts_each_once(self, tmp_path: Path) -> None:
        """The built agent (simulated GPUs, a fake tree) over five scrapes of a tree that goes bad: every
        sysfs collector succeeds at every scrape, and each problem is counted once."""
        fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
        host = fs.dgx(2, memory_controllers=1, packages=1, cores=1)
        config = AgentConfig(
            simulate=2,
            registry_dir=tmp_path / "reg",
            kmsg_path="",
            path_sysfs=fs.root,
            path_procfs=fs.proc,
            fabric_rescan_interval=0,
        )
        running = build(config)
        try:
            names = ("infiniband", "pcie", "topology", "edac", "thermal")
            assert set(names) <= set(running.agent.collector_names)
            fs.counter("mlx5_0", "symbol_error", "N/A (no PMA)")
            fs.write(fs.device_dir(host.gpus[1]) / "current_link_speed", "\x00\xff")
            fs.write(tmp_path / "sys/devices/system/edac/mc/mc0/ce_count", "-3")
            for step in range(5):
                if step == 2:
                    shutil.rmtree(fs.port_dir("mlx5_1").parent.parent)  # a device leaves mid-run
                s = parse_exposition(running.agent.render().decode())
                for name in names:
                    assert s.value(N.COLLECTOR_SUCCESS.name, collector=name) == 1, (step, name)
            problems = {
                (x.labels["collector"], x.labels["reason"]): x.value
                for x in s.matching(F.SYSFS_PROBLEMS.name)
            }
            assert problems[("infiniband", "unavailable")] == 1
            assert problems[("pcie", "garbage")] == 1
            assert problems[("edac", "garbage")] == 1
            assert {x.labels["device"] for x in s.matching(F.IB_PORT_STATE.name)} == {"mlx5_0"}
            assert len(s.matching(F.GPU_NIC.name)) == 2  # the simulated GPUs sit where the tree has them
        finally:
            running.close()


def test_every_fabric_family_is_reserved_for_the_agent() -> None:
    """A trainer cannot serve a series that looks like the host's fabric (the registration directory is
    shared by every user of the host)."""
    from babysitter.node.workloads.trainers import RESERVED_PREFIXES

    assert all(spec.name.startswith(RESERVED_PREFIXES) for spec in F.METRICS)
