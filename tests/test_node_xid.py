"""The Xid collector: NVML events (fake pynvml), the kernel log (files, real /dev/kmsg), counted once."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.catalog import fabric
from babysitter.catalog import node as N
from babysitter.node.collector import GpuIdentity
from babysitter.node.gpu.fake import FakeNvml, fake_gpus
from babysitter.node.xid.collector import XidCollector, XidDeduper
from node_helpers import scrape, wait_for

XID = N.GPU_XID_ERRORS.name
EVENTS = fabric.KERNEL_LOG_EVENTS.name
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError


def identities(lib: FakeNvml) -> list[GpuIdentity]:
    return [GpuIdentity(g.index, g.uuid, g.pci_bus_id, g.name) for g in lib.gpus]


def kernel_bus(lib: FakeNvml, index: int) -> str:
    """The GPU's bus id as the kernel log spells it (``0000:28:00``)."""
    domain, bus, rest = lib.gpus[index].pci_bus_id.lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest.split('.')[0]}"


def xid_line(bus: str, xid: int, text: str = "pid=1234, name=python3, details") -> str:
    return f"[ 100.000000] NVRM: Xid (PCI:{bus}): {xid}, {text}\n"


def append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def wait_live(collector: XidCollector) -> None:
    """Wait until the kernel log reader has read the history present at start (later lines are new)."""
    wait_for(lambda: collector.follower is not None and collector.follower.live)


def total(collector: XidCollector, **labels: str) -> float:
    return sum(scrape(collector).find(XID, **labels))


@pytest.fixture(name="lib")
def _lib() -> FakeNvml:
    return FakeNvml(fake_gpus(2))


@pytest.fixture(name="kernel_log")
def _kernel_log(tmp_path: Path) -> Path:
    path = tmp_path / "kern.log"
    path.write_text("[    1.000000] Linux version 6.8.0\n")
    return path


@pytest.fixture(name="make")
def _make() -> Iterator[object]:
    made: list[XidCollector] = []

    def make(**kwargs: object) -> XidCollector:
        collector = XidCollector(**kwargs)  # type: ignore[arg-type]
        made.append(collector)
        collector.start()
        return collector

    yield make
    for collector in made:
        collector.close()


class TestNvml:
    def test_xid_event_counted_with_gpu_labels_and_action(self, lib: FakeNvml, make) -> None:
        c = make(gpus=lambda: identities(lib), kmsg_path=None, nvml=lib)
        wait_for(lambda: c.source_status().get("nvml") == (True, ""))
        assert lib.inject_event(1, XID_EVENT, 79) == 1
        wait_for(lambda: total(c) == 1)
        gpu = lib.gpus[1]
        labels = {"gpu": "1", "uuid": gpu.uuid, "pci_bus_id": kernel_bus(lib, 1), "model": gpu.name}
        assert scrape(c).value(XID, xid="79", action="reboot", **labels) == 1
        lib.inject_event(1, XID_EVENT, 79)
        lib.inject_event(1, XID_EVENT, 79)
        wait_for(lambda: total(c, xid="79") == 3)  # repeats are visible

    def test_not_supported_gpu_skipped_others_watched(self, lib: FakeNvml, make, caplog) -> None:
        lib.gpus[0].unsupported.add("nvmlDeviceRegisterEvents")
        with caplog.at_level(logging.INFO, logger="babysitter.node.xid.collector"):
            c = make(gpus=lambda: identities(lib), kmsg_path=None, nvml=lib)
            wait_for(lambda: c.source_status().get("nvml") == (True, ""))
        assert any("GPU 0 does not support NVML Xid events" in r.message for r in caplog.records)
        assert lib.inject_event(0, XID_EVENT, 13) == 0  # nothing registered for GPU 0
        assert lib.inject_event(1, XID_EVENT, 13) == 1
        wait_for(lambda: total(c) == 1)
        assert scrape(c).value(XID, gpu="1", xid="13") == 1

    def test_no_gpu_supports_events_marks_source_down(self, lib: FakeNvml, make, caplog) -> None:
        for gpu in lib.gpus:
            gpu.unsupported.add("nvmlDeviceRegisterEvents")
        with caplog.at_level(logging.INFO, logger="babysitter.node.xid.collector"):
            c = make(gpus=lambda: identities(lib), kmsg_path=None, nvml=lib, nvml_retry_seconds=0.02)
            wait_for(lambda: lib.calls.get("nvmlEventSetCreate", 0) >= 4)  # retried
        assert c.source_status()["nvml"] == (False, "no GPU supports Xid events")
        assert len(caplog.records) == 3, [r.getMessage() for r in caplog.records]  # 2 GPUs + status, once

    def test_driver_not_loaded_yet_is_retried(self, make) -> None:
        class BootingNvml(FakeNvml):
            loaded = False

            def nvmlInitWithFlags(self, flags: int) -> None:
                if not self.loaded:
                    raise self.NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED
                super().nvmlInitWithFlags(flags)

        lib = BootingNvml(fake_gpus(2))
        c = make(gpus=lambda: identities(lib), kmsg_path=None, nvml=lib, nvml_retry_seconds=0.02)
        wait_for(lambda: "nvml" in c.source_status())
        ok, reason = c.source_status()["nvml"]
        assert not ok
        assert "nvmlInit failed" in reason
        lib.loaded = True
        wait_for(lambda: c.source_status()["nvml"] == (True, ""))
        lib.inject_event(0, XID_EVENT, 119)
        wait_for(lambda: total(c, xid="119", action="reset_gpu") == 1)

    def test_xid_storm_logs_one_line_per_gpu_and_code_per_minute(self, lib: FakeNvml, make, caplog) -> None:
        now = [1000.0]
        with caplog.at_level(logging.INFO, logger="babysitter.node.xid.collector"):
            c = make(gpus=lambda: identities(lib), kmsg_path=None, nvml=lib, clock=lambda: now[0])
            wait_for(lambda: c.source_status().get("nvml") == (True, ""))
            for _ in range(50):
                lib.inject_event(0, XID_EVENT, 13)
            lib.inject_event(1, XID_EVENT, 13)
            wait_for(lambda: total(c) == 51)
            now[0] += 61
            lib.inject_event(0, XID_EVENT, 13)
            wait_for(lambda: total(c) == 52)
        lines = [r.getMessage() for r in caplog.records if "Xid 13" in r.getMessage()]
        assert len(lines) == 3, lines
        assert "(+49 more since the last line)" in lines[2]

    def test_nvml_reference_released_on_close(self, lib: FakeNvml) -> None:
        c = XidCollector(gpus=lambda: identities(lib), kmsg_path=None, nvml=lib)
        c.start()
        wait_for(lambda: c.source_status().get("nvml") == (True, ""))
        c.close()
        assert lib.calls.get("nvmlEventSetFree") == 1
        with pytest.raises(lib.NVMLError_Uninitialized):  # our nvmlInit was the only reference
            lib.nvmlDeviceGetCount()


class TestKernelLog:
    def test_history_and_new_lines_are_counted(self, kernel_log: Path, make) -> None:
        append(kernel_log, "[ 5.0] NVRM: GPU at PCI:0000:77:00: GPU-77777777-0000-4000-8000-000000000077\n")
        append(kernel_log, xid_line("0000:77:00", 48))  # before the agent started: counted (since boot)
        c = make(gpus=list, kmsg_path=str(kernel_log))
        wait_live(c)
        assert c.follower.records == 3
        assert total(c) == 1
        append(kernel_log, xid_line("0000:77:00", 48))
        wait_for(lambda: total(c) == 2)
        # an unknown bus is still counted, with the UUID the driver printed for it
        s = scrape(c)
        assert s.value(XID, gpu="", model="", pci_bus_id="0000:77:00", xid="48", action="workflow") == 2
        assert s.value(XID, xid="48", uuid="GPU-77777777-0000-4000-8000-000000000077") == 2

    def test_trouble_lines_are_counted_by_pattern_history_included(self, kernel_log: Path, make) -> None:
        """Every pattern is exported (0 until seen); history and new lines count, each line once."""
        append(kernel_log, "[ 7.0] INFO: task python3:42 blocked for more than 120 seconds.\n")
        c = make(gpus=list, kmsg_path=str(kernel_log))
        wait_live(c)
        s = scrape(c)
        assert {x.labels["pattern"] for x in s.matching(EVENTS)} == set(fabric.KERNEL_LOG_PATTERNS)
        assert s.value(EVENTS, pattern="hung_task") == 1
        append(kernel_log, "[ 8.0] nfs: server fs1 not responding, still trying\n" * 2)
        wait_for(lambda: scrape(c).value(EVENTS, pattern="nfs_not_responding") == 2)
        assert scrape(c).value(EVENTS, pattern="hung_task") == 1
        assert scrape(make(gpus=list, kmsg_path=None)).find(EVENTS) == []  # no kernel log, no series

    def test_known_bus_gets_the_gpus_labels(self, lib: FakeNvml, kernel_log: Path, make) -> None:
        c = make(gpus=lambda: identities(lib), kmsg_path=str(kernel_log))
        wait_live(c)
        append(kernel_log, xid_line(kernel_bus(lib, 0), 31))
        wait_for(lambda: total(c) == 1)
        assert scrape(c).value(XID, gpu="0", uuid=lib.gpus[0].uuid, model=lib.gpus[0].name, xid="31") == 1

    def test_partial_line_waits_for_its_end(self, kernel_log: Path, make) -> None:
        c = make(gpus=list, kmsg_path=str(kernel_log))
        wait_live(c)
        initial = c.follower.records
        append(kernel_log, "[ 9.0] NVRM: Xid (PCI:0000:9b:00): 7")
        wait_for(lambda: c.follower.offset == kernel_log.stat().st_size)  # read: a line without its end
        assert c.follower.records == initial
        append(kernel_log, "9, GPU has fallen off the bus.\n")
        wait_for(lambda: total(c) == 1)
        assert scrape(c).value(XID, xid="79") == 1  # not "7": the line was joined before parsing
        assert c.follower.records == initial + 1

    def test_rotation_reopens_and_counts_the_new_file(self, kernel_log: Path, make) -> None:
        c = make(gpus=list, kmsg_path=str(kernel_log))
        wait_live(c)
        rotated = kernel_log.with_suffix(".1")
        kernel_log.rename(rotated)
        kernel_log.write_text(xid_line("0000:9b:00", 13))
        wait_for(lambda: total(c, xid="13") == 1)
        kernel_log.write_text("")  # truncated in place (copytruncate), then a line of the same length
        append(kernel_log, xid_line("0000:9b:00", 13, text="pid=4321, name=python3, details"))
        wait_for(lambda: total(c, xid="13") == 2)

    def test_unreadable_kernel_log_one_line_nvml_still_counts(
        self, lib: FakeNvml, tmp_path: Path, make, caplog
    ) -> None:
        missing = tmp_path / "no-such-kmsg"
        with caplog.at_level(logging.WARNING, logger="babysitter.node.xid.collector"):
            c = make(gpus=lambda: identities(lib), kmsg_path=str(missing), nvml=lib, kmsg_retry_seconds=0.05)
            wait_for(lambda: c.source_status().get("kmsg", (True,))[0] is False)
            wait_for(lambda: c.source_status().get("nvml") == (True, ""))
            lib.inject_event(0, XID_EVENT, 48)
            wait_for(lambda: total(c, xid="48") == 1)
        lines = [r.message for r in caplog.records if "kmsg" in r.message]
        assert len(lines) == 1, lines  # retried many times, logged once
        assert "no such file" in lines[0]
        missing.write_text("")  # it appears: the source recovers
        wait_for(lambda: c.source_status()["kmsg"] == (True, ""))

    @pytest.mark.skipif(
        getattr(N, "XID_SOURCE_UP", None) is None, reason="catalog/node.py does not define XID_SOURCE_UP yet"
    )
    def test_source_health_metric(self, lib: FakeNvml, tmp_path: Path, make) -> None:
        c = make(gpus=lambda: identities(lib), kmsg_path=str(tmp_path / "none"), nvml=lib)
        wait_for(lambda: len(c.source_status()) == 2)
        s = scrape(c)
        name = N.XID_SOURCE_UP.name  # type: ignore[attr-defined]
        assert s.value(name, source="kmsg") == 0
        assert s.value(name, source="nvml") == 1

    def test_directory_is_not_a_kernel_log(self, tmp_path: Path, make) -> None:
        c = make(gpus=list, kmsg_path=str(tmp_path))
        wait_for(lambda: "kmsg" in c.source_status())
        ok, reason = c.source_status()["kmsg"]
        assert not ok
        assert "not a character device or regular file" in reason


class TestCountedOnce:
    def test_same_event_through_both_sources_counts_once(self, lib: FakeNvml, kernel_log: Path, make) -> None:
        c = make(gpus=lambda: identities(lib), kmsg_path=str(kernel_log), nvml=lib)
        wait_for(lambda: c.source_status() == {"kmsg": (True, ""), "nvml": (True, "")})
        wait_live(c)
        bus = kernel_bus(lib, 0)
        lib.inject_event(0, XID_EVENT, 48)
        append(kernel_log, xid_line(bus, 48))
        wait_for(lambda: c.sightings() == {"kmsg": 1, "nvml": 1})
        assert total(c) == 1
        # a burst of three seen by both sources: three events
        for _ in range(3):
            lib.inject_event(0, XID_EVENT, 48)
            append(kernel_log, xid_line(bus, 48))
        wait_for(lambda: c.sightings() == {"kmsg": 4, "nvml": 4})
        assert total(c) == 4
        # the driver rate-limited its print: NVML alone still counts
        lib.inject_event(0, XID_EVENT, 48)
        wait_for(lambda: c.sightings()["nvml"] == 5)
        assert total(c) == 5
        # another GPU, or another code on the same GPU, never pairs with these
        append(kernel_log, xid_line(kernel_bus(lib, 1), 48) + xid_line(bus, 13))
        wait_for(lambda: c.sightings()["kmsg"] == 6)
        assert total(c) == 7
        assert scrape(c).value(XID, gpu="0", xid="48") == 5


class TestDeduper:
    def test_pairs_across_sources_only_within_window(self) -> None:
        d = XidDeduper(10.0)
        key = ("0000:18:00", 79)
        assert d.admit(key, "nvml", 0.0)
        assert not d.admit(key, "kmsg", 9.0)  # the same event, seen late by the other source
        assert d.admit(key, "kmsg", 9.5)  # nothing left to pair with: a new event
        assert d.admit(key, "nvml", 20.0)  # the kmsg sighting at 9.5 expired at 19.5

    def test_one_source_repeats_never_merge(self) -> None:
        d = XidDeduper(10.0)
        assert all(d.admit(("b", 13), "kmsg", t / 10) for t in range(50))
        assert sum(not d.admit(("b", 13), "nvml", 5.0 + t / 100) for t in range(60)) == 50

    def test_memory_is_bounded(self) -> None:
        d = XidDeduper(1e9, max_pending=8)
        for t in range(100):
            d.admit(("b", 13), "kmsg", float(t))
        assert sum(not d.admit(("b", 13), "nvml", 100.0) for _ in range(20)) == 8


_NOBODY_SCRIPT = textwrap.dedent(
    """
    import json, logging, sys
    from babysitter.node.collector import GpuIdentity
    from babysitter.node.gpu.fake import FakeNvml, fake_gpus
    from babysitter.node.xid.collector import XidCollector
    from node_helpers import wait_for
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("babysitter").addHandler(handler)
    logging.getLogger("babysitter").setLevel(logging.INFO)
    lib = FakeNvml(fake_gpus(2))
    ids = [GpuIdentity(g.index, g.uuid, g.pci_bus_id, g.name) for g in lib.gpus]
    c = XidCollector(gpus=lambda: ids, kmsg_path="/dev/kmsg", nvml=lib, kmsg_retry_seconds=0.05)
    c.start()
    wait_for(lambda: len(c.source_status()) == 2)
    lib.inject_event(1, 0x8, 95)
    wait_for(lambda: c.sightings()["nvml"] == 1)
    import time; time.sleep(0.3)  # several kmsg retries
    samples = [(s.name, s.labels, s.value) for f in c.collect() for s in f.samples]
    c.close()
    print(json.dumps({"status": c.source_status(), "samples": samples,
                      "logs": [r.getMessage() for r in records if "kmsg" in r.getMessage()]}))
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_real_dev_kmsg_without_privilege() -> None:
    """As an unprivileged user (dmesg_restrict=1), /dev/kmsg fails with EPERM: one clear line, NVML works."""
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("dmesg_restrict is off: unprivileged users can read /dev/kmsg here")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
    probe = subprocess.run(
        [*as_nobody, "import babysitter, node_helpers"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/",
    )
    if probe.returncode != 0:
        # A checkout under a 0700 directory (mktemp -d) cannot be read by the unprivileged user.
        pytest.skip(f"this checkout is not readable by an unprivileged user: {probe.stderr.strip()[-200:]}")
    proc = subprocess.run(
        [*as_nobody, _NOBODY_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"]["kmsg"][0] is False
    assert "permission denied" in out["status"]["kmsg"][1]
    assert out["status"]["nvml"] == [True, ""]
    assert len(out["logs"]) == 1
    assert "/dev/kmsg" in out["logs"][0]
    xids = [
        (labels["gpu"], labels["xid"], labels["action"], v) for n, labels, v in out["samples"] if n == XID
    ]
    assert xids == [("1", "95", "reset_gpu", 1.0)]


def test_real_dev_kmsg_forged_userspace_record_not_counted(make) -> None:
    """Against the real device: records are read live, and an NVRM line written from userspace is ignored."""
    try:
        os.close(os.open("/dev/kmsg", os.O_RDWR))
    except OSError as exc:
        pytest.skip(f"/dev/kmsg not readable and writable here: {exc}")
    c = make(gpus=list, kmsg_path="/dev/kmsg")
    wait_live(c)  # the boot backlog is read
    assert c.follower.records > 0
    before_forged = c.follower.parser.forged
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write("babysitter test: NVRM: Xid (PCI:0000:99:00): 79, forged by tests/test_node_xid.py\n")
    wait_for(lambda: c.follower.parser.forged == before_forged + 1)
    assert total(c) == 0
