"""The Xid counter means "Xids since boot": history read at start, restarts exact, NVML still paired.

Kernel logs here are files: dmesg text, or records in the ``/dev/kmsg`` format (``prio,seq,usec,-;``)
whose sequence numbers let a restart know what it already counted, as on the real device.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from babysitter.catalog import node as N
from babysitter.node.collector import GpuIdentity
from babysitter.node.config import AgentConfig, ConfigError, add_arguments, load_config
from babysitter.node.daemon import build
from babysitter.node.gpu.fake import FakeNvml, fake_gpus
from babysitter.node.xid.collector import XidCollector
from babysitter.node.xid.state import StateError, load_state
from node_helpers import parse_exposition, scrape, wait_for

XID = N.GPU_XID_ERRORS.name
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
BOOT = "3d5c0a44-1f0e-4a51-9b7e-2c1d0e9f8a77"
OTHER_BOOT = "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"


def identities(lib: FakeNvml) -> list[GpuIdentity]:
    return [GpuIdentity(g.index, g.uuid, g.pci_bus_id, g.name) for g in lib.gpus]


def kernel_bus(lib: FakeNvml, index: int) -> str:
    domain, bus, rest = lib.gpus[index].pci_bus_id.lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest.split('.')[0]}"


def dmesg(bus: str, xid: int, text: str = "pid=1234, name=python3, details") -> str:
    return f"[ 100.000000] NVRM: Xid (PCI:{bus}): {xid}, {text}\n"


def record(seq: int, message: str, prio: int = 4) -> str:
    """One ``/dev/kmsg`` record (facility 0: the kernel)."""
    return f"{prio},{seq},{seq * 1000},-;{message}\n"


def xid_record(seq: int, bus: str, xid: int) -> str:
    return record(seq, f"NVRM: Xid (PCI:{bus}): {xid}, pid=77, name=python3, details")


def append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def counts(collector: XidCollector) -> dict[tuple[str, str], float]:
    """(pci_bus_id, xid) -> value, every Xid series."""
    return {
        (s.labels["pci_bus_id"], s.labels["xid"]): s.value for s in scrape(collector).samples if s.name == XID
    }


def caught_up(collector: XidCollector) -> None:
    wait_for(lambda: collector.follower is not None and collector.follower.live)


@pytest.fixture(name="lib")
def _lib() -> FakeNvml:
    return FakeNvml(fake_gpus(2))


@pytest.fixture(name="make")
def _make() -> Iterator[object]:
    made: list[XidCollector] = []

    def make(**kwargs: object) -> XidCollector:
        kwargs.setdefault("gpus", list)
        kwargs.setdefault("boot", BOOT)
        collector = XidCollector(**kwargs)  # type: ignore[arg-type]
        made.append(collector)
        collector.start()
        return collector

    yield make
    for collector in made:
        collector.close()


class TestHistory:
    def test_xids_already_in_the_log_at_start_are_counted_once(self, tmp_path: Path, make, caplog) -> None:
        """A kernel log that holds Xids when the agent starts: they count, with one summary line."""
        log_file = tmp_path / "kern.log"
        log_file.write_text(
            "[    1.000000] Linux version 6.8.0\n"
            "[ 50.0] NVRM: GPU at PCI:0000:2b:00: GPU-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9\n"
            + dmesg("0000:2b:00", 79, "pid=0, GPU has fallen off the bus.")
            + dmesg("0000:3c:00", 13)
            + dmesg("0000:3c:00", 13)
        )
        with caplog.at_level(logging.INFO, logger="babysitter.node.xid.collector"):
            c = make(kmsg_path=str(log_file))
            caught_up(c)
        assert counts(c) == {("0000:2b:00", "79"): 1, ("0000:3c:00", "13"): 2}
        assert scrape(c).value(XID, xid="79", uuid="GPU-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9") == 1
        lines = [r.getMessage() for r in caplog.records if "Xid" in r.getMessage()]
        assert len(lines) == 1, lines  # history is summed up, not logged Xid by Xid
        assert "3 Xids were already in the kernel log" in lines[0]
        assert "Xid 13 x2 on bus 0000:3c:00" in lines[0]
        append(log_file, dmesg("0000:3c:00", 13))
        wait_for(lambda: counts(c)[("0000:3c:00", "13")] == 3)

    def test_restart_mid_stream_neither_loses_nor_double_counts(self, tmp_path: Path, make) -> None:
        """Agent A counts history and new lines; B, started after more Xids, shows A's counts plus those."""
        log_file = tmp_path / "kern.log"
        log_file.write_text(dmesg("0000:18:00", 48) + dmesg("0000:18:00", 63))
        a = make(kmsg_path=str(log_file))
        caught_up(a)
        append(log_file, dmesg("0000:18:00", 48))
        wait_for(lambda: counts(a) == {("0000:18:00", "48"): 2, ("0000:18:00", "63"): 1})
        a.close()
        append(log_file, dmesg("0000:9a:00", 79))  # while no agent runs
        b = make(kmsg_path=str(log_file))
        caught_up(b)
        assert counts(b) == {("0000:18:00", "48"): 2, ("0000:18:00", "63"): 1, ("0000:9a:00", "79"): 1}
        append(log_file, dmesg("0000:18:00", 48))
        wait_for(lambda: counts(b)[("0000:18:00", "48")] == 3)

    def test_kmsg_records_read_again_are_not_counted_again(self, tmp_path: Path, make) -> None:
        """A dump of the ring buffer rewritten with its old records plus new ones counts the new ones only."""
        log_file = tmp_path / "kmsg.txt"
        dump = record(1, "Linux version 6.8.0", prio=5) + xid_record(2, "0000:18:00", 31)
        log_file.write_text(dump)
        c = make(kmsg_path=str(log_file))
        caught_up(c)
        assert counts(c) == {("0000:18:00", "31"): 1}
        replacement = tmp_path / "kmsg.new"  # a new file (new inode) over the old one, as `dmesg -r > f`
        replacement.write_text(dump + xid_record(3, "0000:18:00", 31))
        replacement.replace(log_file)
        wait_for(lambda: counts(c)[("0000:18:00", "31")] == 2)
        assert c.follower is not None and c.follower.resume_after_seq == 3

    def test_reopen_after_an_error_resumes_where_it_was(self, tmp_path: Path, make) -> None:
        """The log becomes unreadable and comes back unchanged: nothing is counted a second time."""
        log_file = tmp_path / "kern.log"
        log_file.write_text(dmesg("0000:18:00", 13) + dmesg("0000:18:00", 13))
        c = make(kmsg_path=str(log_file), kmsg_retry_seconds=0.05)
        caught_up(c)
        assert counts(c) == {("0000:18:00", "13"): 2}
        aside = tmp_path / "kern.log.aside"
        log_file.rename(aside)
        log_file.mkdir()  # the path is now a directory: the reader fails and retries
        wait_for(lambda: c.source_status().get("kmsg", (True,))[0] is False)
        log_file.rmdir()
        aside.rename(log_file)  # the same file (inode and bytes) is back
        wait_for(lambda: c.source_status()["kmsg"] == (True, ""))
        append(log_file, dmesg("0000:18:00", 13))
        wait_for(lambda: counts(c)[("0000:18:00", "13")] == 3)
        assert counts(c) == {("0000:18:00", "13"): 3}


class TestWithNvml:
    def test_nvml_waits_for_the_history_then_pairs_with_new_lines(
        self, lib: FakeNvml, tmp_path: Path, make
    ) -> None:
        """NVML registers only after the kernel log's history is read; then both sources pair as before."""
        bus = kernel_bus(lib, 0)
        log_file = tmp_path / "kern.log"
        log_file.write_text(dmesg(bus, 48))
        release = threading.Event()
        c = XidCollector(gpus=lambda: identities(lib), kmsg_path=str(log_file), nvml=lib, boot=BOOT)
        assert c.follower is not None
        real_run = c.follower.run

        def slow_history(stop: threading.Event) -> None:
            release.wait(10)  # the history read takes a while
            real_run(stop)

        c.follower.run = slow_history  # type: ignore[method-assign]
        c.start()
        try:
            assert not release.wait(0.5)
            assert lib.calls.get("nvmlDeviceRegisterEvents", 0) == 0  # NVML waits
            release.set()
            wait_for(lambda: c.source_status().get("nvml") == (True, ""))
            assert counts(c) == {(bus, "48"): 1}  # the history, from the kernel log alone
            lib.inject_event(0, XID_EVENT, 48)  # a new Xid, seen by both sources
            append(log_file, dmesg(bus, 48))
            wait_for(lambda: c.sightings() == {"kmsg": 2, "nvml": 1})
            assert counts(c) == {(bus, "48"): 2}
        finally:
            c.close()

    def test_nvml_starts_anyway_when_the_history_takes_too_long(
        self, lib: FakeNvml, tmp_path: Path, caplog
    ) -> None:
        log_file = tmp_path / "kern.log"
        log_file.write_text("")
        release = threading.Event()
        c = XidCollector(
            gpus=lambda: identities(lib), kmsg_path=str(log_file), nvml=lib, kmsg_wait_seconds=0.2, boot=BOOT
        )
        assert c.follower is not None
        c.follower.run = lambda stop: release.wait(10)  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="babysitter.node.xid.collector"):
            c.start()
            try:
                wait_for(lambda: c.source_status().get("nvml") == (True, ""))
            finally:
                release.set()
                c.close()
        assert any("history not read after 0.2 s; NVML starts" in r.getMessage() for r in caplog.records)

    def test_kernel_log_readable_only_later(self, lib: FakeNvml, tmp_path: Path, make, caplog) -> None:
        """What NVML reported while the log was unreadable is not counted again; older Xids are."""
        bus = kernel_bus(lib, 0)
        log_file = tmp_path / "kern.log"
        c = make(gpus=lambda: identities(lib), kmsg_path=str(log_file), nvml=lib, kmsg_retry_seconds=0.05)
        wait_for(lambda: c.source_status().get("nvml") == (True, ""))  # no kernel log: NVML goes ahead
        lib.inject_event(0, XID_EVENT, 48)
        wait_for(lambda: counts(c) == {(bus, "48"): 1})
        with caplog.at_level(logging.INFO, logger="babysitter.node.xid.collector"):
            # It appears whole (a rename), as a log that becomes readable does: written in place, the
            # reader could open it empty, take that as the history and read the lines only at its
            # next poll, after the assertion below.
            written = tmp_path / "kern.log.new"
            written.write_text(
                xid_record(7, bus, 13)  # logged seconds after boot, long before NVML started: counted
                + dmesg(bus, 48)  # no timestamp, while NVML ran: NVML's report stands
            )
            written.replace(log_file)
            wait_for(lambda: c.source_status().get("kmsg") == (True, ""))
            caught_up(c)
        assert counts(c) == {(bus, "48"): 1, (bus, "13"): 1}
        assert any(
            "1 Xids logged while the kernel log was unreadable" in r.getMessage() for r in caplog.records
        )

    def test_mig_instance_in_the_log_line_of_both_sources(
        self, lib: FakeNvml, tmp_path: Path, make, caplog
    ) -> None:
        """MIG instances go to the log line (the per-GPU series budget has no room for them as labels)."""

        class MigNvml(FakeNvml):
            def nvmlEventSetWait_v2(self, eventSet: object, timeoutms: int) -> object:
                event = super().nvmlEventSetWait_v2(eventSet, timeoutms)
                event.gpuInstanceId, event.computeInstanceId = 3, 0
                return event

        mig = MigNvml(fake_gpus(2))
        log_file = tmp_path / "kern.log"
        log_file.write_text("")
        bus = kernel_bus(mig, 1)
        with caplog.at_level(logging.INFO, logger="babysitter.node.xid.collector"):
            c = make(gpus=lambda: identities(mig), kmsg_path=str(log_file), nvml=mig)
            wait_for(lambda: c.source_status().get("nvml") == (True, ""))
            append(log_file, f"[ 7.0] NVRM: Xid (PCI:{bus} GPU-I:05): 94, pid=7194, Contained: CE (0x9).\n")
            wait_for(lambda: counts(c).get((bus, "94")) == 1)
            mig.inject_event(0, XID_EVENT, 13)
            wait_for(lambda: counts(c).get((kernel_bus(mig, 0), "13")) == 1)
        lines = [
            r.getMessage() for r in caplog.records if "Xid 9" in r.getMessage() or "Xid 1" in r.getMessage()
        ]
        assert any(f"Xid 94 (restart_app) on GPU '1' bus {bus} GPU-I 5 via kmsg" in line for line in lines), (
            lines
        )
        assert any(
            "Xid 13 (restart_app) on GPU '0'" in line and "GPU-I 3 GPU-CI 0 via nvml" in line
            for line in lines
        )
        series = scrape(c).series(xid="94")
        assert [sorted(labels) for _, labels in series] == [
            ["action", "gpu", "model", "pci_bus_id", "uuid", "xid"]
        ]  # no instance labels


class TestStateFile:
    def test_restart_keeps_nvml_only_xids_and_what_the_ring_buffer_dropped(
        self, lib: FakeNvml, tmp_path: Path, make
    ) -> None:
        """With a state file a restart is exact; without it, dropped records and NVML-only Xids are lost."""
        bus0, bus1 = kernel_bus(lib, 0), kernel_bus(lib, 1)
        kmsg = tmp_path / "kmsg.txt"
        state = tmp_path / "xid-state.json"
        kmsg.write_text(record(10, "Linux version 6.8.0", prio=5) + xid_record(11, bus0, 48))
        a = make(gpus=lambda: identities(lib), kmsg_path=str(kmsg), nvml=lib, state_path=str(state))
        wait_for(lambda: a.source_status().get("nvml") == (True, ""))
        lib.inject_event(1, XID_EVENT, 79)  # NVML alone (the driver's print was lost)
        append(kmsg, xid_record(12, bus0, 13))
        wait_for(lambda: counts(a) == {(bus0, "48"): 1, (bus1, "79"): 1, (bus0, "13"): 1})
        a.close()
        saved = json.loads(state.read_text())
        assert (saved["boot_id"], saved["kmsg_seq"], saved["resumable"]) == (BOOT, 12, True)
        assert oct(state.stat().st_mode & 0o777) == "0o600"
        # While down: the ring buffer drops records 10-11, and one more Xid is logged.
        kmsg.write_text(xid_record(12, bus0, 13) + xid_record(13, bus1, 31))
        b = make(gpus=lambda: identities(lib), kmsg_path=str(kmsg), nvml=lib, state_path=str(state))
        caught_up(b)
        expected = {(bus0, "48"): 1, (bus1, "79"): 1, (bus0, "13"): 1, (bus1, "31"): 1}
        assert counts(b) == expected
        without_state = make(gpus=lambda: identities(lib), kmsg_path=str(kmsg))
        caught_up(without_state)
        assert counts(without_state) == {(bus0, "13"): 1, (bus1, "31"): 1}  # what the state file prevents
        b.close()
        c = make(gpus=lambda: identities(lib), kmsg_path=str(kmsg), nvml=lib, state_path=str(state))
        caught_up(c)
        assert counts(c) == expected  # restored again, nothing counted twice

    @pytest.mark.parametrize(
        "case",
        [
            (OTHER_BOOT, "same", "it is from another boot"),
            (BOOT, "other", "it is for kernel log"),
        ],
    )
    def test_state_of_another_boot_or_log_is_not_restored(
        self, tmp_path: Path, make, caplog, case: tuple[str, str, str]
    ) -> None:
        boot, path_kind, why = case
        kmsg = tmp_path / "kmsg.txt"
        kmsg.write_text(xid_record(5, "0000:18:00", 13))
        state = tmp_path / "state.json"
        a = make(kmsg_path=str(kmsg), state_path=str(state), boot=BOOT)
        caught_up(a)
        a.close()
        second = kmsg if path_kind == "same" else tmp_path / "other.txt"
        if path_kind == "other":
            second.write_text(xid_record(5, "0000:18:00", 13))
        with caplog.at_level(logging.INFO, logger="babysitter.node.xid.collector"):
            b = make(kmsg_path=str(second), state_path=str(state), boot=boot)
            caught_up(b)
        assert counts(b) == {("0000:18:00", "13"): 1}  # from the log, not the log plus the state
        assert any(why in r.getMessage() for r in caplog.records)

    def test_text_log_state_is_not_restored(self, tmp_path: Path, make) -> None:
        """Dmesg text has no sequence numbers: the state says so and the log is counted afresh."""
        log_file = tmp_path / "kern.log"
        log_file.write_text(dmesg("0000:18:00", 13))
        state = tmp_path / "state.json"
        a = make(kmsg_path=str(log_file), state_path=str(state))
        caught_up(a)
        a.close()
        assert json.loads(state.read_text())["resumable"] is False
        b = make(kmsg_path=str(log_file), state_path=str(state))
        caught_up(b)
        assert counts(b) == {("0000:18:00", "13"): 1}

    @pytest.mark.parametrize(
        "content",
        [
            b"{not json",
            b'{"version": 2}',
            json.dumps({"version": 1, "boot_id": BOOT, "kmsg_path": "", "kmsg_seq": -1}).encode(),
            json.dumps(
                {
                    "version": 1,
                    "boot_id": BOOT,
                    "kmsg_path": "",
                    "kmsg_seq": None,
                    "resumable": True,
                    "counts": [{"gpu": "0", "uuid": "", "pci_bus_id": "", "model": "", "xid": 0, "value": 1}],
                }
            ).encode(),
            b"\x00" * (5 * 1024 * 1024),
        ],
    )
    def test_unusable_state_file_is_ignored_with_one_line(
        self, tmp_path: Path, make, caplog, content: bytes
    ) -> None:
        state = tmp_path / "state.json"
        state.write_bytes(content)
        with pytest.raises(StateError):
            load_state(state)
        kmsg = tmp_path / "kmsg.txt"
        kmsg.write_text(xid_record(5, "0000:18:00", 13))
        with caplog.at_level(logging.WARNING, logger="babysitter.node.xid.collector"):
            c = make(kmsg_path=str(kmsg), state_path=str(state))
            caught_up(c)
        assert counts(c) == {("0000:18:00", "13"): 1}
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines
        assert lines[0].startswith("babysitter: Xid state ignored, counting the kernel log from its start: ")

        def replaced() -> bool:
            try:
                return load_state(state) is not None
            except StateError:
                return False

        wait_for(replaced)  # the collector saved a good state over it

    def test_unwritable_state_one_line_counting_goes_on(self, tmp_path: Path, make, caplog) -> None:
        kmsg = tmp_path / "kmsg.txt"
        kmsg.write_text("")
        state = tmp_path / "missing-dir" / "state.json"
        with caplog.at_level(logging.WARNING, logger="babysitter.node.xid.collector"):
            c = make(kmsg_path=str(kmsg), state_path=str(state), state_save_seconds=0.01)
            caught_up(c)
            for seq in range(1, 4):
                append(kmsg, xid_record(seq, "0000:18:00", 13))
                wait_for(lambda seq=seq: counts(c).get(("0000:18:00", "13")) == seq)
            c.close()
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines
        assert "cannot save the Xid state" in lines[0]
        assert not os.path.exists(state.parent)


class TestAgent:
    def test_state_file_in_a_missing_directory_is_a_setup_error(self, tmp_path: Path) -> None:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--xid-state-file", str(tmp_path / "no-such-dir" / "xid.json")])
        with pytest.raises(ConfigError, match="no-such-dir"):
            load_config(args, {})
        args = parser.parse_args(["--xid-state-file", str(tmp_path / "xid.json")])
        assert load_config(args, {}).xid_state_file == tmp_path / "xid.json"

    def test_agent_restart_keeps_the_counts(self, tmp_path: Path) -> None:
        """``--xid-state-file``: an Xid NVML alone reported is still counted after the agent restarts."""
        config = AgentConfig(
            simulate=2, registry_dir=tmp_path / "reg", kmsg_path="", xid_state_file=tmp_path / "xid.json"
        )
        first = build(config)
        try:
            assert first.simulator is not None
            nvml = first.simulator.nvml
            wait_for(lambda: nvml.inject_event(1, XID_EVENT, 79) == 1)  # once the event set is registered
            wait_for(lambda: b'xid="79"' in first.agent.render())
        finally:
            first.close()
        second = build(config)
        try:
            body = parse_exposition(second.agent.render().decode())
            assert body.value(XID, gpu="1", xid="79", action="reboot") == 1
        finally:
            second.close()

    def test_deployments_keep_the_state_on_the_host(self) -> None:
        """The systemd unit and the DaemonSet set --xid-state-file in a directory that outlives the agent."""
        exporters = Path(__file__).resolve().parent.parent / "exporters"
        unit = (exporters / "babysitter-node-agent.service").read_text()
        env = dict(
            line.removeprefix("Environment=").split("=", 1)
            for line in unit.splitlines()
            if line.startswith("Environment=")
        )
        state = Path(env["BABYSITTER_NODE_XID_STATE_FILE"])
        assert f"StateDirectory={state.parent.name}" in unit.splitlines()
        assert state.parent == Path("/var/lib") / state.parent.name  # where systemd puts StateDirectory
        ds = yaml.safe_load((exporters / "node-agent-daemonset.yaml").read_text())
        spec = ds["spec"]["template"]["spec"]
        container = spec["containers"][0]
        value = {e["name"]: e.get("value") for e in container["env"]}["BABYSITTER_NODE_XID_STATE_FILE"]
        mount = next(m for m in container["volumeMounts"] if Path(value).parent == Path(m["mountPath"]))
        assert not mount.get("readOnly", False)
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert volume["hostPath"]["path"] == mount["mountPath"]  # on the host: survives the pod
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        config = load_config(parser.parse_args([]), {"BABYSITTER_NODE_XID_STATE_FILE": "/tmp/x.json"})
        assert config.xid_state_file == Path("/tmp/x.json")  # the variable the unit and the pod set
