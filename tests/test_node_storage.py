"""The storage probe: latencies and free bytes, failures per directory, no files left behind."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.catalog import storage as S
from babysitter.node.storage import probe as storage
from babysitter.node.storage.probe import StorageProbeCollector, probe_file_name, probe_once
from node_helpers import scrape, wait_for

PROBE_NAME = probe_file_name()


@pytest.fixture(name="make")
def _make() -> Iterator[object]:
    made: list[StorageProbeCollector] = []

    def make(paths: list[Path], **kwargs: object) -> StorageProbeCollector:
        collector = StorageProbeCollector(paths, **kwargs)  # type: ignore[arg-type]
        made.append(collector)
        collector.start()
        return collector

    yield make
    for collector in made:
        collector.close()


def probed(collector: StorageProbeCollector, path: Path) -> bool:
    return collector.last_results()[path] is not None


class TestProbeOnce:
    def test_measures_and_leaves_nothing(self, tmp_path: Path) -> None:
        result = probe_once(tmp_path, 256 * 1024)
        assert result.ok, result.detail
        for seconds in (result.write_seconds, result.fsync_seconds, result.read_seconds):
            assert seconds is not None
            assert 0 < seconds < 60
        st = os.statvfs(tmp_path)
        assert result.size_bytes == st.f_blocks * st.f_frsize
        assert result.free_bytes is not None
        assert 0 < result.free_bytes <= result.size_bytes
        assert os.listdir(tmp_path) == []

    def test_stale_file_from_a_killed_agent_is_replaced_and_removed(self, tmp_path: Path) -> None:
        (tmp_path / PROBE_NAME).write_bytes(b"left by an agent killed between create and unlink")
        assert probe_once(tmp_path, 4096).ok
        assert os.listdir(tmp_path) == []

    def test_symlink_at_the_probe_name_is_not_followed(self, tmp_path: Path) -> None:
        victim = tmp_path / "victim"
        victim.write_text("precious")
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        (ckpt / PROBE_NAME).symlink_to(victim)
        assert probe_once(ckpt, 4096).ok
        assert victim.read_text() == "precious"
        assert os.listdir(ckpt) == []

    def test_missing_and_not_a_directory(self, tmp_path: Path) -> None:
        result = probe_once(tmp_path / "gone", 4096)
        assert (result.ok, result.reason) == (False, "missing")
        assert result.free_bytes is None
        a_file = tmp_path / "file"
        a_file.write_text("x")
        assert probe_once(a_file, 4096).reason == "missing"


class TestCollector:
    def test_metrics_for_a_good_directory(self, tmp_path: Path, make) -> None:
        c = make([tmp_path], size_bytes=8192, interval_seconds=0.05)
        wait_for(lambda: probed(c, tmp_path))
        s = scrape(c)
        path = str(tmp_path)
        assert s.value(S.STORAGE_PROBE_UP.name, path=path) == 1
        for spec in (S.STORAGE_PROBE_WRITE, S.STORAGE_PROBE_FSYNC, S.STORAGE_PROBE_READ):
            assert s.value(spec.name, path=path) > 0
        assert s.value(S.STORAGE_FREE.name, path=path) > 0
        assert s.value(S.STORAGE_SIZE.name, path=path) >= s.value(S.STORAGE_FREE.name, path=path)
        errors = {x.labels["reason"]: x.value for x in s.samples if x.name == S.STORAGE_PROBE_ERRORS.name}
        assert errors == {}  # a reason's series appears with its first failure (the series budget)
        assert s.value(S.STORAGE_PROBE_RUNNING.name, path=path) >= 0

    def test_missing_directory_one_line_others_still_probed(self, tmp_path: Path, make, caplog) -> None:
        good, gone = tmp_path / "good", tmp_path / "gone"
        good.mkdir()
        with caplog.at_level(logging.INFO, logger="babysitter.node.storage.probe"):
            c = make([gone, good], size_bytes=4096, interval_seconds=0.05)
            wait_for(
                lambda: scrape(c).find(S.STORAGE_PROBE_ERRORS.name, path=str(gone), reason="missing") >= [3.0]
            )
            s = scrape(c)
        assert s.value(S.STORAGE_PROBE_UP.name, path=str(gone)) == 0
        assert s.value(S.STORAGE_PROBE_ERRORS.name, path=str(gone), reason="missing") >= 3
        assert s.value(S.STORAGE_PROBE_UP.name, path=str(good)) == 1
        assert [x for x in s.samples if x.name == S.STORAGE_PROBE_ERRORS.name] == [
            x for x in s.samples if x.name == S.STORAGE_PROBE_ERRORS.name and x.labels["reason"] == "missing"
        ]
        assert s.find(S.STORAGE_FREE.name, path=str(gone)) == []
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines  # three failures, one line
        assert str(gone) in lines[0]
        assert "missing" in lines[0]
        # the directory appears (mounted late): it recovers, with one more line
        with caplog.at_level(logging.INFO, logger="babysitter.node.storage.probe"):
            gone.mkdir()
            # The probe thread sets the gauge, then logs: wait for both (CI r14 read the gauge between).
            wait_for(
                lambda: (
                    scrape(c).value(S.STORAGE_PROBE_UP.name, path=str(gone)) == 1
                    and any("works again" in r.getMessage() for r in caplog.records)
                )
            )
        assert sum("works again" in r.getMessage() for r in caplog.records) == 1
        c.close()  # the probes run every 50 ms: one may be between its write and its unlink
        assert os.listdir(good) == []
        assert os.listdir(gone) == []

    @pytest.mark.skipif(
        os.geteuid() == 0, reason="root writes through mode bits; see the read-only mount test"
    )
    def test_unwritable_directory_as_unprivileged_user(self, tmp_path: Path, make) -> None:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        c = make([locked], size_bytes=4096, interval_seconds=0.05)
        wait_for(lambda: probed(c, locked))
        assert scrape(c).value(S.STORAGE_PROBE_ERRORS.name, path=str(locked), reason="permission") >= 1

    def test_hung_file_system_shows_as_running_and_does_not_block_others(
        self, tmp_path: Path, make, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A hung NFS mount cannot be made here; a probe that blocks stands in for one."""
        hung, good = tmp_path / "hung", tmp_path / "good"
        good.mkdir()
        release = threading.Event()
        real = storage.probe_once

        def probe(path: Path, *args: object, **kwargs: object) -> storage.ProbeResult:
            if path == hung:
                release.wait(30)
            return real(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(storage, "probe_once", probe)
        c = make([hung, good], size_bytes=4096, interval_seconds=0.05)
        wait_for(lambda: probed(c, good))
        time.sleep(0.3)
        s = scrape(c)  # returns at once: collect() does no file system calls
        assert s.value(S.STORAGE_PROBE_RUNNING.name, path=str(hung)) >= 0.3
        assert s.find(S.STORAGE_PROBE_UP.name, path=str(hung)) == []
        assert s.value(S.STORAGE_PROBE_UP.name, path=str(good)) == 1
        release.set()
        wait_for(lambda: probed(c, hung))

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"size_bytes": 0}, "size"),
            ({"size_bytes": storage.MAX_SIZE_BYTES + 1}, "size"),
            ({"interval_seconds": 0.0}, "interval"),
            ({"interval_seconds": float("nan")}, "interval"),
        ],
    )
    def test_bad_configuration_fails_at_setup(self, tmp_path: Path, kwargs: dict, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            StorageProbeCollector([tmp_path], **kwargs)
        with pytest.raises(ValueError, match="at least one"):
            StorageProbeCollector([])


_RO_SCRIPT = textwrap.dedent(
    """
    import json, logging, os, subprocess, sys
    from pathlib import Path
    ro, good = Path(sys.argv[1]), Path(sys.argv[2])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    from babysitter.node.storage.probe import StorageProbeCollector
    from node_helpers import scrape, wait_for
    lines = []
    logging.getLogger("babysitter").addHandler(logging.Handler())
    logging.getLogger("babysitter").handlers[0].emit = lambda r: lines.append(r.getMessage())
    c = StorageProbeCollector([ro, good], size_bytes=4096, interval_seconds=0.05)
    c.start()
    wait_for(lambda: all(r is not None for r in c.last_results().values()))
    import time; time.sleep(0.3)
    samples = [(s.name, s.labels, s.value) for s in scrape(c).samples]
    c.close()
    print(json.dumps({"samples": samples, "lines": lines}))
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_read_only_mount(tmp_path: Path) -> None:
    """A real read-only file system (a tmpfs mounted ro in a private mount namespace)."""
    ro, good = tmp_path / "ro", tmp_path / "good"
    ro.mkdir()
    good.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            _RO_SCRIPT,
            str(ro),
            str(good),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    if proc.returncode != 0 and "mount" in proc.stderr and "Operation not permitted" in proc.stderr:
        pytest.skip(f"cannot mount here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    values = {(n, tuple(sorted(lab.items()))): v for n, lab, v in out["samples"]}
    up = S.STORAGE_PROBE_UP.name
    assert values[(up, (("path", str(ro)),))] == 0
    assert values[(up, (("path", str(good)),))] == 1
    assert values[(S.STORAGE_PROBE_ERRORS.name, (("path", str(ro)), ("reason", "read_only")))] >= 3
    assert len(out["lines"]) == 1
    assert "read_only" in out["lines"][0]
    assert os.listdir(good) == []


_LOOP_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from babysitter.node.storage.probe import StorageProbeCollector
    c = StorageProbeCollector([Path(sys.argv[1])], size_bytes=4 * 1024 * 1024, interval_seconds=0.05)
    c.start()
    print("started", flush=True)
    time.sleep(60)
    """
)


def test_killed_agent_leaves_at_most_its_own_file_and_the_next_start_removes_it(tmp_path: Path) -> None:
    for attempt in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", _LOOP_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "started"
            time.sleep(0.05 + 0.037 * attempt)  # somewhere inside or between probes
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        left = os.listdir(tmp_path)
        assert left in ([], [PROBE_NAME])  # never anything else, never more than one
        assert probe_once(tmp_path, 4096).ok  # what the next start does first
        assert os.listdir(tmp_path) == []
