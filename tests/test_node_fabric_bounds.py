"""Attacks on the sysfs collectors through the tree they read: too much hardware, SR-IOV virtual functions,
a FIFO where an attribute should be, and files that are not what the kernel writes served as labels.

Each is written as the attack: a fake tree with the kernel's layout (``node/fabric/fake.py``), the
collectors run over it as the agent runs them (as root here), and what comes out is checked: a bounded
number of series, the virtual functions' ports not served, a collector that answers with everything but
the bad file, and no file content in a label unless it parses as what it should be.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from babysitter.catalog import fabric as F
from babysitter.catalog.budget import BUDGET, CAPS
from babysitter.node.collector import GpuIdentity
from babysitter.node.fabric.fake import FakeSysfs
from babysitter.node.fabric.infiniband import InfinibandCollector, parse_firmware, parse_state
from babysitter.node.fabric.pcie import PcieCollector
from babysitter.node.fabric.topology import TopologyCollector
from babysitter.node.host.edac import EdacCollector
from babysitter.node.host.thermal import CpuThermalCollector
from node_helpers import Scrape, scrape

_IB = 0x020700


def _all(fs: FakeSysfs, gpus: list[GpuIdentity] | None = None) -> list[object]:
    """Every sysfs collector of the agent over ``fs``, scanning at every scrape."""
    return [
        InfinibandCollector(fs.root, rescan_seconds=0),
        PcieCollector(fs.root, rescan_seconds=0),
        TopologyCollector(fs.root, procfs=fs.proc, gpus=lambda: gpus or [], rescan_seconds=0),
        EdacCollector(fs.root, rescan_seconds=0),
        CpuThermalCollector(fs.root, rescan_seconds=0),
    ]


def _dropped(s: Scrape) -> dict[tuple[str, str], float]:
    return {
        (x.labels["collector"], x.labels["kind"]): x.value for x in s.matching(F.SYSFS_ITEMS_DROPPED.name)
    }


def _problems(s: Scrape, collector: str = "infiniband") -> dict[str, float]:
    return {x.labels["reason"]: x.value for x in s.matching(F.SYSFS_PROBLEMS.name, collector=collector)}


def _hardware_series(s: Scrape) -> int:
    """Series of the hardware itself (not the collectors' own problem and cap counts)."""
    own = {F.SYSFS_PROBLEMS.name, F.SYSFS_ITEMS_DROPPED.name}
    return sum(1 for x in s.samples if x.name not in own)


@pytest.mark.slow
def test_a_huge_tree_serves_a_bounded_number_of_series_and_says_what_it_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """256 RDMA devices x 8 ports, 2,048 CPUs each its own package and 2,048 memory controllers gave
    43,024 series before. Each collector keeps to its caps (catalog.budget.CAPS), shows how many it
    left out by kind, and logs that once however many scans."""
    fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
    for i in range(256):
        address = f"{i // 128:04x}:{0x10 + i % 128:02x}:00.0"
        fs.pci(address, class_code=_IB, vendor=0x15B3)
        fs.rdma(f"mlx5_{i}", address, ports=8, counters=False, hw_counters=False)
    for n in range(2048):
        fs.edac(n)
        fs.cpu(n, package=n, core=0)
    collectors = _all(fs)
    with caplog.at_level(logging.WARNING, logger="babysitter.node.sysfs"):
        for _ in range(2):
            s = Scrape(f for c in collectors for f in c.collect())  # type: ignore[attr-defined]
    bound = (
        CAPS.port * BUDGET.fabric_port
        + CAPS.pcie_device * BUDGET.pcie_device
        + CAPS.memory_controller * 2
        + CAPS.package * 2
    )
    assert _hardware_series(s) <= bound, _hardware_series(s)
    assert len(s.matching(F.IB_PORT_STATE.name)) == CAPS.port
    assert len(s.matching(F.PCIE_DEVICE_INFO.name)) == CAPS.pcie_device
    assert len(s.matching(F.EDAC_CORRECTABLE.name)) == CAPS.memory_controller
    assert {x.labels["controller"] for x in s.matching(F.EDAC_CORRECTABLE.name)} == {
        str(n) for n in range(CAPS.memory_controller)
    }, "the lowest numbers, not the first names in text order (mc0, mc1, mc10, ...)"
    assert len(s.matching(F.CPU_PACKAGE_THROTTLES.name)) == CAPS.package
    assert _dropped(s) == {
        ("infiniband", "rdma_device"): 256 - CAPS.rdma_device,
        ("infiniband", "port"): CAPS.rdma_device * 8 - CAPS.port,
        ("pcie", "pcie_device"): 256 - CAPS.pcie_device,
        ("topology", "pcie_device"): 256 - CAPS.pcie_device,
        ("topology", "port"): 256 * 8 - CAPS.port,
        ("edac", "memory_controller"): 2048 - CAPS.memory_controller,
        ("thermal", "cpu"): 2048 - CAPS.cpu,
        ("thermal", "package"): CAPS.cpu - CAPS.package,
    }
    told = [r.getMessage() for r in caplog.records if "babysitter_sysfs_items_dropped" in r.getMessage()]
    assert len(told) == len(_dropped(s)), told  # once per collector and kind, not once per scan
    for c in collectors:
        c.close()  # type: ignore[attr-defined]


def test_a_host_under_its_caps_exports_no_cap_series(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
    fs.dgx(8)
    s = Scrape(f for c in _all(fs) for f in c.collect())  # type: ignore[attr-defined]
    assert s.find(F.SYSFS_ITEMS_DROPPED.name) == [] and s.find(F.SYSFS_PROBLEMS.name) == []
    assert len(s.matching(F.IB_PORT_STATE.name)) == 8


def test_sr_iov_virtual_functions_ports_are_not_served(tmp_path: Path) -> None:
    """2 physical functions with 62 virtual functions (each an RDMA device of its own, as mlx5 makes
    them) served all 64 ports (1,106 series) before, and a GPU's nearest ports were the virtual
    functions' too. Only the physical functions' ports are the host's."""
    fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
    fs.pci("0000:10:01.0")
    fs.pci("0000:11:00.0", parent="0000:10:01.0")
    fs.pci("0000:12:00.0", parent="0000:11:00.0", class_code=0x030200, vendor=0x10DE)
    for pf in range(2):
        fs.pci(f"0000:13:00.{pf}", parent="0000:11:00.0", class_code=_IB, vendor=0x15B3)
        fs.rdma(f"mlx5_{pf}", f"0000:13:00.{pf}")
    for vf in range(62):
        address = f"0000:13:{1 + vf // 8:02x}.{vf % 8}"
        here = fs.pci(address, parent="0000:11:00.0", class_code=_IB, vendor=0x15B3)
        (here / "physfn").symlink_to(fs.device_dir(f"0000:13:00.{vf % 2}"))
        fs.rdma(f"mlx5_{2 + vf}", address, hw_counters=False)
    gpus = [GpuIdentity(0, "GPU-x", "0000:12:00.0", "H100")]
    s = Scrape(f for c in _all(fs, gpus) for f in c.collect())  # type: ignore[attr-defined]
    assert {x.labels["device"] for x in s.matching(F.IB_PORT_STATE.name)} == {"mlx5_0", "mlx5_1"}
    assert {x.labels["device"] for x in s.samples if "device" in x.labels} == {"mlx5_0", "mlx5_1"}
    assert {(x.labels["device"], x.labels["nic_index"]) for x in s.matching(F.GPU_NIC.name)} == {
        ("mlx5_0", "0"),
        ("mlx5_1", "1"),
    }
    assert s.find(F.SYSFS_ITEMS_DROPPED.name) == []  # skipped by design, not over a cap


def _collect_within(collector: object, fifos: Iterable[Path], seconds: float = 20.0) -> list[Metric]:
    """collect() in a thread, given ``seconds``; a collector blocked in open() on a FIFO is let go
    (a writer opens it) so that the test never leaves a thread behind."""
    got: list[list[Metric]] = []
    worker = threading.Thread(target=lambda: got.append(list(collector.collect())), daemon=True)  # type: ignore[attr-defined]
    worker.start()
    worker.join(seconds)
    blocked = worker.is_alive()
    for fifo in fifos:
        with contextlib.suppress(OSError):  # no reader waiting: nothing to release
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # releases a reader blocked in open()
    worker.join(seconds)
    assert not blocked, "collect() blocked on a FIFO"
    return got[0]


def test_a_fifo_attribute_costs_that_attribute_not_the_collector(tmp_path: Path) -> None:
    """A FIFO where a counter, a port's state and the firmware version should be: root's open() of a
    FIFO blocks until a writer comes, which held the InfiniBand collector (and its lock) for good.
    Now each costs its own value, counted once as not_regular; the rest of the port is served."""
    fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
    host = fs.dgx(2, memory_controllers=1, packages=1, cores=1)
    fifos = [
        fs.port_dir("mlx5_0") / "counters/symbol_error",
        fs.port_dir("mlx5_0") / "state",
        fs.port_dir("mlx5_1").parent.parent / "fw_ver",
        tmp_path / "sys/devices/system/edac/mc/mc0/ce_count",
        fs.device_dir(host.gpus[0]) / "current_link_width",
    ]
    for fifo in fifos:
        fifo.unlink()
        os.mkfifo(fifo)
    collectors = {c.name: c for c in _all(fs)}  # type: ignore[attr-defined]
    for _ in range(3):
        s = {name: Scrape(_collect_within(c, fifos)) for name, c in collectors.items()}
    ib = s["infiniband"]
    port = {"device": "mlx5_0", "port": "1"}
    assert ib.find(F.IB_PORT_ERRORS.name, **port, counter="symbol_error") == []
    assert ib.find(F.IB_PORT_STATE.name, **port) == []
    assert ib.value(F.IB_PORT_PHYS_STATE.name, **port) == 5
    assert ib.value(F.IB_PORT_ERRORS.name, **port, counter="link_downed") == 0
    (info,) = ib.matching(F.IB_PORT_INFO.name, device="mlx5_1")
    assert info.labels["fw_version"] == ""
    assert ib.value(F.IB_PORT_STATE.name, device="mlx5_1", port="1") == 4
    assert _problems(ib) == {"not_regular": 3}
    assert s["edac"].find(F.EDAC_CORRECTABLE.name) == [] and s["edac"].find(F.EDAC_UNCORRECTABLE.name) == [0]
    assert _problems(s["edac"], "edac") == {"not_regular": 1}
    assert s["pcie"].find(F.PCIE_LINK_WIDTH.name, pci_address=host.gpus[0]) == []
    assert s["pcie"].value(F.PCIE_LINK_WIDTH.name, pci_address=host.nics[0]) == 16
    for fifo in fifos:  # files again: read again, and nothing more counted
        fifo.unlink()
        fs.write(fifo, "4: ACTIVE" if fifo.name == "state" else "28.39.1002" if fifo.name == "fw_ver" else 7)
    ib = scrape(collectors["infiniband"])
    assert ib.value(F.IB_PORT_ERRORS.name, **port, counter="symbol_error") == 7
    assert ib.value(F.IB_PORT_STATE.name, **port) == 4
    assert _problems(ib) == {"not_regular": 3}
    for c in collectors.values():
        c.close()  # type: ignore[attr-defined]


def _labels(s: Scrape) -> set[str]:
    return {value for x in s.samples for value in x.labels.values()}


@pytest.fixture(name="secret")
def _secret(tmp_path: Path) -> tuple[Path, str]:
    """A root-only file (0600 in a 0700 directory) whose first line looks like a firmware version and
    like a label value; the agent runs as root and can read it."""
    if os.geteuid() != 0:
        pytest.skip("the attack is on a collector running as root")
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    line = "12.34.5678"
    secret = private / "secret"
    secret.write_text(f"{line}\nmore\n")
    secret.chmod(0o600)
    for name in ("state", "phys_state", "rate", "link_layer"):
        (private / name).write_text(f"{line}\n")
        (private / name).chmod(0o600)
    for name in ("symbol_error", "link_downed", "port_rcv_errors"):
        (private / name).write_text("1234\n")
        (private / name).chmod(0o600)
    return private, line


def test_a_symlinked_fw_ver_never_serves_a_root_only_file(tmp_path: Path, secret: tuple[Path, str]) -> None:
    """``fw_ver`` a symbolic link to a root-only file served its first line as the info series' label.
    Attributes are never read through a link, and a port directory, counters/ or a netdev directory
    that is a link is not read either (each counted not_regular)."""
    private, line = secret
    fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
    fs.dgx(2, memory_controllers=1, packages=1, cores=1)
    top = fs.port_dir("mlx5_0").parent.parent
    (top / "fw_ver").unlink()
    (top / "fw_ver").symlink_to(private / "secret")
    counters = fs.port_dir("mlx5_1") / "counters"
    for f in counters.iterdir():
        f.unlink()
    counters.rmdir()
    counters.symlink_to(private)  # counters/symbol_error would read the secret
    fs.rdma("mlx5_9", "0000:29:00.0")  # a second device on NIC 1, its port 1 a link to the secret's directory
    port = fs.port_dir("mlx5_9")
    for child in sorted(port.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    port.rmdir()
    port.symlink_to(private)
    s = Scrape(f for c in _all(fs) for f in c.collect())  # type: ignore[attr-defined]
    assert line not in _labels(s) and not any(line in v for v in _labels(s))
    assert 1234 not in s.find(F.IB_PORT_ERRORS.name)  # the root-only counters/ files were not read
    assert s.find(F.IB_PORT_STATE.name, device="mlx5_9") == []
    (info,) = s.matching(F.IB_PORT_INFO.name, device="mlx5_0")
    assert info.labels["fw_version"] == ""
    assert s.value(F.IB_PORT_STATE.name, device="mlx5_0", port="1") == 4
    assert _problems(s) == {"not_regular": 3}


@pytest.mark.parametrize(
    ("attribute", "content"),
    [
        ("fw_ver", "hunter2 is the root password"),
        ("fw_ver", "28.39.1002" + ".1" * 40),  # a version, too long
        ("fw_ver", "२८.३९.१००२"),  # Devanagari digits: digits to str.isdigit, not to the kernel
        ("link_layer", "InfiniBand\x1b]0;owned\x07"),
        ("link_layer", "x" * 200),
    ],
)
def test_label_values_from_files_are_served_only_when_they_parse(
    tmp_path: Path, attribute: str, content: str
) -> None:
    """What the info series carries from a file (fw_ver, link_layer) is served only when it is what the
    kernel writes there; anything else is "" and counted garbage."""
    fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
    fs.dgx(1, memory_controllers=0, packages=0)
    path = (
        fs.port_dir("mlx5_0") / "link_layer"
        if attribute == "link_layer"
        else fs.port_dir("mlx5_0").parent.parent / "fw_ver"
    )
    fs.write(path, content)
    s = scrape(_all(fs)[0])
    (info,) = s.matching(F.IB_PORT_INFO.name)
    assert info.labels["link_layer" if attribute == "link_layer" else "fw_version"] == ""
    assert not any(content[:8] in v for v in _labels(s))
    assert _problems(s) == {"garbage": 1}


def test_unicode_digits_cost_their_value_not_the_collector(tmp_path: Path) -> None:
    """``²`` is a digit to str.isdigit and not to int(): in a port's state or a netdev's dev_port it
    raised out of the InfiniBand collector (every scrape failed); a package id of Arabic-Indic digits
    was served as the package label."""
    fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
    host = fs.dgx(2, memory_controllers=0, packages=1, cores=1)
    fs.write(fs.port_dir("mlx5_0") / "state", "²: ACTIVE")
    nic = fs.device_dir(host.nics[1])
    fs.write(nic / "net" / host.netdevs[1] / "dev_port", "²")
    fs.cpu(2, package=0, core=1)
    fs.write(
        tmp_path / "sys/devices/system/cpu/cpu2/topology/physical_package_id", "\u0661"
    )  # ARABIC-INDIC DIGIT ONE
    ib = scrape(_all(fs)[0])
    assert ib.find(F.IB_PORT_STATE.name, device="mlx5_0") == []
    assert ib.value(F.IB_PORT_STATE.name, device="mlx5_1", port="1") == 4
    assert ib.find(F.IB_PORT_CARRIER_CHANGES.name, device="mlx5_1") == []
    assert _problems(ib) == {"garbage": 2}
    thermal = scrape(_all(fs)[4])
    assert {x.labels["package"] for x in thermal.matching(F.CPU_PACKAGE_THROTTLES.name)} == {"0"}
    assert _problems(thermal, "thermal") == {"garbage": 1}


def test_parsers_are_strict() -> None:
    assert parse_state("4: ACTIVE") == 4 and parse_state("²: ACTIVE") is None
    assert parse_firmware("28.39.1002") == "28.39.1002" and parse_firmware("218.0.169.0") == "218.0.169.0"
    assert parse_firmware("1.57") == "1.57"
    for bad in ("", "v1.2", "1..2", "1.2.", "1 2", "1.2\n3", "\u0661.\u0662"):
        assert parse_firmware(bad) is None, bad
