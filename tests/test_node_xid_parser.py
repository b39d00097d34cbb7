"""The kernel-log Xid parser: real NVRM line formats of several driver generations, garbage, 100k lines."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from babysitter.catalog import fabric
from babysitter.node.collector import normalize_pci_bus_id
from babysitter.node.xid import codes as xid_catalog
from babysitter.node.xid.kmsg import KernelLogParser, XidEvent, parse_log

DATA = Path(__file__).parent / "data" / "kmsg"


def _parse_file(name: str) -> tuple[list[XidEvent], KernelLogParser]:
    parser = KernelLogParser()
    return parse_log((DATA / name).read_bytes().split(b"\n"), parser), parser


def _summary(events: list[XidEvent]) -> list[tuple[int, str, str, int | None, str]]:
    return [(e.xid, e.pci_bus_id, e.uuid, e.pid, e.process) for e in events]


class TestDriverFormats:
    def test_gsp_era_dmesg_with_bus_to_uuid_lines(self) -> None:
        events, _ = _parse_file("dmesg_r550_gsp.log")
        gpu4 = "GPU-3f1c2a9e-7b4d-4e2f-9a61-0c5d8e7f1a23"
        gpu1 = "GPU-a0b1c2d3-e4f5-4a6b-8c7d-9e0f1a2b3c4d"
        assert _summary(events) == [
            (119, "0000:9b:00", gpu4, 2024380, "nvidia-smi"),
            (119, "0000:9b:00", gpu4, 2024380, "nvidia-smi"),
            (48, "0000:1b:00", gpu1, None, ""),  # pid='<unknown>', name=<unknown>
            (63, "0000:1b:00", gpu1, None, ""),
            (94, "0000:1b:00", gpu1, 771234, "python3"),
        ]
        assert events[0].message.startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")
        # "Rate limiting GSP RPC error prints for GPU at PCI:..." is not an Xid nor a bus->UUID line
        assert len(events) == 5

    def test_journal_pid_only_function_suffix_quoted_and_sxid(self) -> None:
        events, _ = _parse_file("journal_r535.log")
        assert _summary(events) == [
            (79, "0000:2b:00", "GPU-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9", 0, ""),  # pid=0, no name
            (74, "0000:3c:00", "", None, ""),  # bus id with ".0", no GPU-at line for this bus
            (31, "0000:3c:00", "", 1234, "python3"),  # pid='1234', name='python3'
        ]
        assert events[0].message == "GPU has fallen off the bus."
        assert events[1].message.startswith("NVLink: fatal error detected on link 6")

    def test_old_drivers_without_pci_prefix_or_pid(self) -> None:
        events, _ = _parse_file("dmesg_r340_old.log")
        assert _summary(events) == [
            (13, "0000:03:00", "", None, ""),
            (8, "0000:03:00", "", None, ""),
            (13, "0000:02:00", "", None, ""),
            (43, "0000:02:00", "", None, ""),
        ]
        assert events[0].message == "0003 00000000 0000a097 00001b0c 00000004 00000000"

    def test_kmsg_records_continuations_forgery_and_lost_records(self) -> None:
        events, parser = _parse_file("kmsg_records.txt")
        assert [(e.xid, e.seq, e.usec) for e in events] == [(119, 1203, 86311104527), (45, 1207, 86400000000)]
        assert events[0].uuid == "GPU-3f1c2a9e-7b4d-4e2f-9a61-0c5d8e7f1a23"
        assert parser.forged == 1  # prio 12 = facility 1 (LOG_USER): a userspace write, not the driver
        assert parser.lost_records == 2  # seq 1204 -> 1207

    def test_mig_gpu_and_compute_instance_in_the_bus_field(self) -> None:
        """MIG lines carry ``GPU-I:%02u`` (and ``GPU-CI:%02u``) after the bus id (kernel_rc.c)."""
        events, _ = _parse_file("dmesg_mig_a100.log")
        uuid = "GPU-5c9d7c7e-3f7a-4f1b-9a2b-6b3e1d2c4a5f"
        found = [
            (e.xid, e.pci_bus_id, e.uuid, e.pid, e.process, e.gpu_instance, e.compute_instance)
            for e in events
        ]
        assert found == [
            (94, "0000:01:00", uuid, 7194, "", 5, None),  # GPU instance only
            (94, "0000:01:00", uuid, 7062, "", None, None),  # the same GPU, not attributed
            (13, "0000:01:00", uuid, 8123, "python3", 1, 0),  # GPU and compute instance
            (31, "0000:01:00", uuid, 8200, "pt_main_thread", 2, 1),
            (43, "0000:01:00", uuid, 8123, "python3", 1, 0),
            (45, "0000:01:00", uuid, 8123, "python3", 13, None),
            (95, "0000:01:00", uuid, 7062, "", None, None),
        ]
        assert events[0].message == "Contained: CE User Channel (0x9). RST: No, D-RST: No"
        assert events[5].message == "Ch 00000008 caused by previous Xid 13"

    def test_mig_kmsg_record(self) -> None:
        event = KernelLogParser().feed(
            "4,2201,7290551100,-;NVRM: Xid (PCI:0000:01:00 GPU-I:03 GPU-CI:02): 13, pid=1, name=a, text"
        )
        assert event is not None
        assert (event.xid, event.pci_bus_id, event.gpu_instance, event.compute_instance, event.seq) == (
            13,
            "0000:01:00",
            3,
            2,
            2201,
        )

    def test_five_digit_pci_domain_behind_vmd(self) -> None:
        event = KernelLogParser().feed("NVRM: Xid (PCI:10000:01:00): 79, GPU has fallen off the bus.")
        assert event is not None
        assert event.pci_bus_id == normalize_pci_bus_id("00010000:01:00.0")  # NVML's spelling

    def test_uuid_learned_from_an_earlier_line_applies_later(self) -> None:
        parser = KernelLogParser()
        assert parser.feed("NVRM: Xid (PCI:0000:41:00): 13, before") == XidEvent(
            13, "0000:41:00", "", None, "", "before"
        )
        parser.feed("[1.0] NVRM: GPU at PCI:0000:41:00: GPU-AB12CD34-0000-4000-8000-00000000FFFF")
        event = parser.feed(b"[2.0] NVRM: Xid (PCI:0000:41:00): 13, after\n")
        assert event is not None
        assert event.uuid == "GPU-ab12cd34-0000-4000-8000-00000000ffff"


class TestGarbage:
    def test_garbage_file_yields_only_the_valid_line(self) -> None:
        events, _ = _parse_file("garbage.log")
        assert _summary(events) == [(13, "0000:9b:00", "", None, "")]

    @pytest.mark.parametrize(
        "line",
        [
            "NVRM: Xid (PCI:0000:9b:00): 79",  # cut before the comma: the code may be cut too ("7" of "79")
            "NVRM: Xid (PCI:0000:9b",
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal",
            "NVRM: Xid (PCI:0000:9b:00): 0, zero",
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05",  # cut inside the instance
            "NVRM: Xid (PCI:0000:01:00 GPU-I:xx): 94, not a number",
            "NVRM: Xid (PCI:0000:01:00 GPU-CI:01): 94, compute instance without its GPU instance",
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05 ): 94, stray space",
            "",
            "\x00" * 100_000,
            "NVRM: " + "Xid " * 10_000,
        ],
    )
    def test_rejected_lines(self, line: str) -> None:
        assert KernelLogParser().feed(line) is None

    def test_random_bytes_never_raise(self) -> None:
        rng = random.Random(4)
        parser = KernelLogParser()
        for _ in range(2000):
            blob = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
            prefix = rng.choice([b"", b"NVRM: Xid (PCI:", b"6,1,2,-;NVRM: ", b"NVRM: GPU at PCI:"])
            parser.feed(prefix + blob)
        assert parser.lines == 2000


def test_100k_line_log_counts_every_xid() -> None:
    """A long, mixed log (noise, several formats, garbage) parses completely with exact counts."""
    rng = random.Random(100_000)
    lines: list[str] = []
    expected: Counter[int] = Counter()
    buses = [f"0000:{b:02x}:00" for b in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)]
    for i in range(100_000):
        kind = rng.random()
        bus = rng.choice(buses)
        if kind < 0.02:
            xid = rng.choice([13, 31, 43, 45, 48, 63, 74, 79, 94, 95, 119, 154])
            expected[xid] += 1
            fmt = rng.randrange(5)
            if fmt == 0:
                lines.append(f"[{i / 10:12.6f}] NVRM: Xid (PCI:{bus}): {xid}, pid={i}, name=python3, text")
            elif fmt == 1:
                lines.append(
                    f"6,{i},{i * 1000},-;NVRM: Xid (PCI:{bus}): {xid}, pid='<unknown>', name=<unknown>, t"
                )
            elif fmt == 2:
                lines.append(f"Nov 30 02:13:01 node kernel: NVRM: Xid (PCI:{bus}.0): {xid}, GPU text.")
            elif fmt == 3:
                mig = f"GPU-I:{rng.randrange(1, 15):02d}" + rng.choice(
                    ["", f" GPU-CI:{rng.randrange(8):02d}"]
                )
                lines.append(f"[{i}.0] NVRM: Xid (PCI:{bus} {mig}): {xid}, pid={i}, name=python3, MIG")
            else:
                lines.append(f"[{i}.0] NVRM: Xid ({bus}): {xid}, 0003 00000000")
        elif kind < 0.03:
            lines.append(f"[{i}.0] NVRM: GPU at PCI:{bus}: GPU-{i:08x}-0000-4000-8000-000000000000")
        elif kind < 0.04:
            lines.append(f"NVRM: Xid (PCI:{bus}): {rng.randrange(10, 99)}")  # cut short: not counted
        else:
            lines.append(f"[{i}.0] usb 1-1: new high-speed USB device number {i} using xhci_hcd")
    events = parse_log(lines)
    assert Counter(e.xid for e in events) == expected
    assert sum(expected.values()) > 1500


class TestCatalog:
    @pytest.mark.parametrize(
        ("xid", "action"),
        [
            (13, "restart_app"),
            (31, "restart_app"),
            (43, "ignore"),
            (45, "workflow"),
            (48, "workflow"),
            (61, "drain"),
            (63, "ignore"),
            (64, "reset_gpu"),
            (74, "workflow"),
            (79, "reboot"),
            (94, "restart_app"),
            (95, "reset_gpu"),
            (119, "reset_gpu"),
            (145, "workflow"),
            (154, "workflow"),
            (108, "ignore"),  # the catalog page: IGNORE (NVSentinel's CSV: report issue)
            (160, "ignore"),  # the catalog page: IGNORE (NVSentinel's CSV: RESTART_BM)
        ],
    )
    def test_actions_follow_nvidia_buckets(self, xid: int, action: str) -> None:
        assert xid_catalog.action_for(xid) == action

    @pytest.mark.parametrize(
        ("xid", "action"),
        [
            (162, "ignore"),
            (163, "workflow"),
            (164, "workflow"),
            (165, "workflow"),
            (166, "drain"),
            (167, "reset_gpu"),
            (168, "drain"),
            (169, "reset_gpu"),
            (170, "drain"),
            (171, "workflow"),
            (172, "workflow"),
        ],
    )
    def test_codes_nvidia_lists_without_a_bucket_get_our_action(self, xid: int, action: str) -> None:
        info = xid_catalog.lookup(xid)
        assert info is not None
        assert (info.nvidia_bucket, info.action) == ("", action)

    def test_every_row_has_a_known_action_and_a_meaning(self) -> None:
        assert set(xid_catalog.CATALOG) == set(range(1, 173))
        for info in xid_catalog.CATALOG.values():
            assert info.action in xid_catalog.ACTIONS
            assert info.meaning
        assert sum(not info.nvidia_bucket for info in xid_catalog.CATALOG.values()) == 11  # 162-172

    @pytest.mark.parametrize("xid", [173, 176, 177, 999])
    def test_codes_newer_than_the_catalog_are_unknown(self, xid: int) -> None:
        """173-176 are in the driver's nverror.h but not in NVIDIA's catalog: counted as unknown."""
        assert xid_catalog.lookup(xid) is None
        assert xid_catalog.action_for(xid) == xid_catalog.UNKNOWN_ACTION

    def test_unknown_code_is_unknown_not_dropped(self) -> None:
        assert xid_catalog.lookup(999) is None
        assert xid_catalog.action_for(999) == xid_catalog.UNKNOWN_ACTION


class TestTroublePatterns:
    """Kernel lines that come before trouble, counted by pattern (kernel records only)."""

    LINES = (
        ("[ 812.1] watchdog: BUG: soft lockup - CPU#12 stuck for 23s! [python:4242]", "soft_lockup"),
        ("[ 900.0] INFO: task python3:4242 blocked for more than 120 seconds.", "hung_task"),
        (
            "[ 901.0] pcieport 0000:16:00.0: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
            "(Receiver ID)",
            "pcie_bus_error_corrected",
        ),
        (
            "[ 902.0] nvidia 0000:18:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction "
            "Layer, (Requester ID)",
            "pcie_bus_error_uncorrected",
        ),
        (
            "[ 903.0] mlx5_core 0000:19:00.0: wait_func:1110:(pid 37): ENABLE_HCA(0x104) timeout. Will cause a "
            "leak of a command resource",
            "mlx5_cmd_timeout",
        ),
        (
            "[ 904.0] mlx5_core 0000:19:00.0: poll_health:800:(pid 0): device's health compromised",
            "mlx5_health",
        ),
        ("[ 905.0] nfs: server 10.0.0.5 not responding, still trying", "nfs_not_responding"),
        ("[ 906.0] nfs: server 10.0.0.5 OK", None),
        ("[ 907.0] mlx5_core 0000:19:00.0: Port module event: module 0, Cable plugged", None),
        ("[ 908.0] e1000e: eth0 NIC Link is Up 1000 Mbps", None),
    )

    @pytest.mark.parametrize(("line", "pattern"), LINES)
    def test_each_pattern(self, line: str, pattern: str | None) -> None:
        parser = KernelLogParser()
        parser.feed(line)
        assert parser.pattern == pattern
        if pattern is not None:
            assert pattern in fabric.KERNEL_LOG_PATTERNS

    def test_kmsg_records_of_userspace_never_match(self) -> None:
        """Only the kernel facility counts: a process writing a fake soft lockup to /dev/kmsg is ignored."""
        parser = KernelLogParser()
        parser.feed("4,812,123456789,-;watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [x:1]")
        assert parser.pattern == "soft_lockup"
        parser.feed("12,813,123456790,-;watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [x:1]")  # LOG_USER
        assert parser.pattern is None
