"""``babysitter probe`` pieces on CPU: lemons, results files, storage, matmul/memory, the collector."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from babysitter.catalog import probe as P
from babysitter.cli import build_parser
from babysitter.node.workloads.probe_results import ProbeResultsCollector
from babysitter.probe import (
    Bandwidth,
    CollectiveResult,
    DeviceResult,
    MatmulResult,
    ProbeConfig,
    ProbeReport,
    StorageResult,
    find_lemons,
    host_file_name,
    read_report,
    write_report,
)
from babysitter.probe.collective import SINGLE_PROCESS, bus_bandwidth, measure_allreduce
from babysitter.probe.lemons import flag_below_median
from babysitter.probe.storage import MAX_SIZE_BYTES, measure_storage
from babysitter.views.probe import render_table
from node_helpers import scrape


def _device(
    host: str, gpu: str, flops: float, name: str = "NVIDIA H100 80GB HBM3", mem: float = 3e12
) -> DeviceResult:
    d = DeviceResult(host=host, rank=0, local_rank=int(gpu), gpu=gpu, name=name)
    d.matmul = MatmulResult(
        dtype="bf16", n=8192, iterations=1, flops_per_second=flops, peak_flops_per_second=989.5e12
    )
    d.memory = Bandwidth(bytes=1, iterations=1, bytes_per_second=mem)
    d.host_to_device = Bandwidth(skipped="x")
    return d


class TestLemons:
    def test_flag_below_median(self) -> None:
        """Only values more than the fraction below the median are flagged."""
        median, flagged = flag_below_median([100.0, 95.0, 89.0, 80.0, 101.0], 0.1)
        assert median == 95.0
        assert flagged == [3]  # 80 < 85.5; 89 is within 10%

    def test_small_groups_flag_nothing(self) -> None:
        """One device has no fleet to be compared with."""
        assert flag_below_median([1.0], 0.1)[1] == []
        assert flag_below_median([], 0.1)[1] == []

    @pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 2.0])
    def test_bad_fraction(self, fraction: float) -> None:
        """The fraction must be strictly between 0 and 1."""
        with pytest.raises(ValueError, match="fraction"):
            flag_below_median([1.0, 2.0], fraction)

    def test_slow_device_and_its_node(self) -> None:
        """A slow GPU is a device lemon; its node, slower than the other nodes' median, a node lemon."""
        devices = [_device(f"n{h}", str(g), 700e12) for h in range(3) for g in range(2)]
        devices[3].matmul.flops_per_second = 300e12  # n1 gpu 1
        lemons = find_lemons(devices, [], 0.1)
        device = [x for x in lemons if x.scope == "device"]
        assert [(x.host, x.gpu, x.check) for x in device] == [("n1", "1", "matmul")]
        assert device[0].below_median == pytest.approx(1 - 300 / 700)
        node = [x for x in lemons if x.scope == "node"]
        assert [(x.host, x.check) for x in node] == [("n1", "matmul")]

    def test_models_compared_only_with_their_own(self) -> None:
        """In a mixed fleet an A100 is not a lemon next to H100s; a slow A100 next to A100s is."""
        devices = [_device("n0", str(g), 700e12) for g in range(3)]
        devices += [_device("n1", str(g), 250e12, name="NVIDIA A100-SXM4-80GB") for g in range(3)]
        assert find_lemons(devices, [], 0.1) == []
        devices[-1].matmul.flops_per_second = 100e12
        assert [(x.host, x.gpu) for x in find_lemons(devices, [], 0.1) if x.scope == "device"] == [
            ("n1", "2")
        ]

    def test_slow_storage_node(self) -> None:
        """A host whose checkpoint directory writes far slower than the others' is a node lemon."""
        storage = [
            StorageResult(
                host=f"n{i}",
                path="/ckpt",
                size_bytes=10**9,
                write_seconds=1.0,
                fsync_seconds=0.0,
                read_seconds=1.0,
            )
            for i in range(4)
        ]
        storage[2].write_seconds = 5.0
        lemons = find_lemons([], storage, 0.2)
        assert [(x.host, x.check) for x in lemons] == [("n2", "storage_write")]

    def test_node_allreduce(self) -> None:
        """A node whose intra-node all-reduce is slow is a node lemon; nodes of other sizes are not peers."""
        nodes = [_node_coll(f"n{i}", 300e9) for i in range(4)] + [_node_coll("n9", 100e9, ranks=4)]
        nodes[1].busbw_bytes_per_second = 150e9
        nodes.append(CollectiveResult(host="n5", skipped="one rank on this host"))
        assert [(x.host, x.check) for x in find_lemons([], [], 0.1, nodes)] == [("n1", "allreduce")]

    def test_memory_checked_too(self) -> None:
        """Memory bandwidth is its own check: a GPU with slow HBM is flagged for memory only."""
        devices = [_device("n0", str(g), 700e12) for g in range(4)]
        devices[0].memory.bytes_per_second = 1e12
        assert [(x.gpu, x.check) for x in find_lemons(devices, [], 0.1)] == [("0", "memory")]


def _node_coll(host: str, busbw: float, ranks: int = 2) -> CollectiveResult:
    return CollectiveResult(
        host=host, backend="nccl", world_size=ranks, bytes=4, iterations=1, busbw_bytes_per_second=busbw
    )


def _report() -> ProbeReport:
    nodes = [_node_coll("n0", 300e9), _node_coll("n1", 310e9)]
    devices = [_device("n0", "0", 700e12), _device("n0", "1", 300e12), _device("n1", "0", 710e12)]
    devices[1].errors.append("memory: boom")
    storage = [
        StorageResult(
            host="n0", path="/ckpt", size_bytes=100, write_seconds=0.5, fsync_seconds=0.5, read_seconds=0.25
        )
    ]
    return ProbeReport(
        started=1.0,
        finished=2.0,
        world_size=3,
        lemon_fraction=0.1,
        devices=devices,
        collective=CollectiveResult(
            backend="nccl",
            world_size=3,
            bytes=4,
            iterations=1,
            seconds_per_op=1.0,
            algbw_bytes_per_second=4.0,
            busbw_bytes_per_second=bus_bandwidth(4.0, 3),
        ),
        node_collectives=nodes,
        storage=storage,
        lemons=find_lemons(devices, storage, 0.1, nodes),
    )


class TestResults:
    def test_json_round_trip(self, tmp_path: Path) -> None:
        """What is written is what is read back, derived numbers included in the JSON."""
        report = _report()
        path = tmp_path / host_file_name("n0")
        write_report(report, path)
        assert oct(path.stat().st_mode & 0o777) == "0o644"
        back = read_report(path)
        assert back == report
        data = json.loads(path.read_text())
        assert data["storage"][0]["write_bytes_per_second"] == 100.0
        assert data["devices"][0]["matmul"]["peak_ratio"] == pytest.approx(700e12 / 989.5e12)

    def test_for_host(self) -> None:
        """A host's part holds only its devices, storage and lemons."""
        part = _report().for_host("n1")
        assert [d.host for d in part.devices] == ["n1"]
        assert part.storage == [] and part.lemons == []

    @pytest.mark.parametrize(
        "text",
        [
            "not json",
            "[]",
            '{"schema": "other/1"}',
            '{"schema": "babysitter.probe/1", "started": "x", "finished": 1, "world_size": 1, "lemon_fraction": 0.1}',
            '{"schema": "babysitter.probe/1", "started": 1, "finished": 1, "world_size": 1, "lemon_fraction": 0.1,'
            ' "devices": [{"host": "h", "rank": "0", "local_rank": 0, "gpu": "0", "name": "x"}]}',
        ],
    )
    def test_rejects_what_is_not_a_report(self, tmp_path: Path, text: str) -> None:
        """Anything but a well-formed report is rejected as a whole (ValueError)."""
        path = tmp_path / "probe-x.json"
        path.write_text(text)
        with pytest.raises(ValueError):
            read_report(path)

    def test_table(self) -> None:
        """The table names the lemon device and the node lemon."""
        from io import StringIO

        out = StringIO()
        render_table(_report(), out)
        text = out.getvalue()
        assert "matmul" in text and "LEMONS" in text and "n0: matmul" in text


class TestStorage:
    def test_measures_and_removes_its_file(self, tmp_path: Path) -> None:
        """Write, fsync and read of the whole file are timed; nothing is left behind."""
        result = measure_storage(tmp_path, size_bytes=3 * 2**20 + 5, host="h")
        assert result.error == ""
        assert result.write_bytes_per_second and result.read_bytes_per_second
        assert result.fsync_seconds is not None
        assert list(tmp_path.iterdir()) == []

    def test_missing_directory_is_a_result(self, tmp_path: Path) -> None:
        """A missing checkpoint directory is reported, not raised."""
        result = measure_storage(tmp_path / "nope", size_bytes=1024, host="h")
        assert "ENOENT" in result.error
        assert result.write_bytes_per_second is None

    def test_bounded_by_free_space(self, tmp_path: Path) -> None:
        """A size above half the free space, or above the cap, is refused with the reason; nothing written."""
        st = os.statvfs(tmp_path)
        half = st.f_bavail * st.f_frsize // 2
        if half + 1 <= MAX_SIZE_BYTES:
            assert measure_storage(tmp_path, size_bytes=half + 1, host="h").error.startswith("skipped")
        assert measure_storage(tmp_path, size_bytes=MAX_SIZE_BYTES + 1, host="h").error.startswith(
            "size must"
        )
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
    def test_unwritable(self, tmp_path: Path) -> None:
        """A read-only directory gives a permission error in the result."""
        tmp_path.chmod(0o500)
        try:
            assert "EACCES" in measure_storage(tmp_path, size_bytes=1024, host="h").error
        finally:
            tmp_path.chmod(0o700)


class TestDeviceMeasurements:
    def test_cpu_matmul_fp32_no_peak(self) -> None:
        """On a CPU the probe runs fp32, reports FLOP/s, and no peak (the table has no CPU rows)."""
        from babysitter.probe.compute import measure_matmul

        torch = pytest.importorskip("torch")
        result = measure_matmul(torch.device("cpu"), name="cpu", n=64, iterations=2, repeats=2)
        assert result.dtype == "fp32"
        assert result.flops_per_second is not None and result.flops_per_second > 0
        assert result.peak_flops_per_second is None and result.peak_ratio is None

    def test_delay_slows_the_matmul(self) -> None:
        """The slow-rank test knob makes the measured throughput drop (it is what makes a lemon)."""
        from babysitter.probe.compute import measure_matmul

        torch = pytest.importorskip("torch")
        cpu = torch.device("cpu")
        # The best of 20 batches: on a loaded CI machine the best of 2 once ran at 2 MFLOP/s.
        fast = measure_matmul(cpu, name="cpu", n=32, iterations=3, repeats=20).flops_per_second
        slow = measure_matmul(
            cpu, name="cpu", n=32, iterations=3, repeats=2, delay_seconds=0.05
        ).flops_per_second
        assert fast is not None and slow is not None
        assert slow <= 2 * 32**3 / 0.05  # each iteration waits the delay: whatever the load
        assert slow < fast / 2

    def test_memory_and_host_device(self) -> None:
        """Memory bandwidth is measured on a CPU; host-device copies are skipped with the reason."""
        from babysitter.probe.memory import NO_DEVICE, measure_host_device, measure_memory

        torch = pytest.importorskip("torch")
        cpu = torch.device("cpu")
        mem = measure_memory(cpu, size_bytes=1 << 20, iterations=2, repeats=2)
        assert mem.bytes == 1 << 20 and mem.bytes_per_second
        h2d, d2h = measure_host_device(cpu, size_bytes=1 << 20, iterations=2, repeats=2)
        assert h2d.skipped == d2h.skipped == NO_DEVICE

    def test_allreduce_single_process_skipped(self) -> None:
        """Without torchrun there is no collective to measure: skipped with the reason."""
        torch = pytest.importorskip("torch")
        assert measure_allreduce(torch.device("cpu"), size_bytes=1024, iterations=1).skipped == SINGLE_PROCESS

    def test_bus_bandwidth(self) -> None:
        """NCCL-tests' all-reduce factor 2(n-1)/n: 1x for 2 ranks, 1.75x for 8."""
        assert bus_bandwidth(10.0, 2) == 10.0
        assert bus_bandwidth(10.0, 8) == 17.5
        assert bus_bandwidth(10.0, 1) == 0.0


class TestGpuLabel:
    @pytest.mark.parametrize(
        ("visible", "index", "label"),
        [("", 1, "1"), ("4,5", 1, "5"), ("4, 5", 0, "4"), ("GPU-abc,GPU-def", 1, "1"), ("3", 2, "2")],
    )
    def test_physical_index(self, visible: str, index: int, label: str) -> None:
        """The gpu label is the index the node agent uses, through CUDA_VISIBLE_DEVICES when numeric."""
        from babysitter.probe.runner import physical_gpu_label

        assert physical_gpu_label(index, {"CUDA_VISIBLE_DEVICES": visible}) == label


class TestConfig:
    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"device": "tpu"}, "device"),
            ({"skip": frozenset({"gpu"})}, "skip"),
            ({"sizes": {"matmul_n": 0}}, "positive"),
            ({"sizes": {"bogus": 1}}, "unknown size"),
            ({"lemon_fraction": 1.5}, "fraction"),
        ],
    )
    def test_setup_errors(self, kwargs: dict[str, object], match: str) -> None:
        """Mistakes fail at setup with the reason."""
        with pytest.raises(ValueError, match=match):
            ProbeConfig(**kwargs)  # type: ignore[arg-type]


class TestCli:
    def test_single_process_cpu(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """One CPU process: JSON on stdout, the host file for the agent, storage measured, no collective."""
        ckpt, results = tmp_path / "ckpt", tmp_path / "results"
        ckpt.mkdir()
        argv = ["probe", "--device", "cpu", "--matmul-n", "64", "--matmul-iterations", "2", "--repeats", "1"]
        argv += ["--memory-bytes", "65536", "--storage-path", str(ckpt), "--storage-bytes", "65536"]
        argv += ["--results-dir", str(results), "--json", "-"]
        args = build_parser().parse_args(argv)
        assert args.func(args) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["collective"]["skipped"] == SINGLE_PROCESS
        assert data["devices"][0]["gpu"] == "cpu0"
        assert data["storage"][0]["error"] == ""
        files = list(results.iterdir())
        assert len(files) == 1 and files[0].name.startswith("probe-")
        assert list(ckpt.iterdir()) == []

    def test_bad_storage_path_exit_2(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A storage path that is not a directory is a setup error (exit 2, one line)."""
        args = build_parser().parse_args(["probe", "--device", "cpu", "--storage-path", str(tmp_path / "x")])
        assert args.func(args) == 2
        assert "not a directory" in capsys.readouterr().err


class TestCollector:
    def test_serves_the_catalog_families(self, tmp_path: Path) -> None:
        """A results file becomes probe_* series: throughput, peak ratio, lemons, storage, busbw."""
        report = _report().for_host("n0")
        write_report(report, tmp_path / host_file_name("n0"))
        s = scrape(ProbeResultsCollector(tmp_path))
        assert s.value(P.PROBE_MATMUL_FLOPS.name, gpu="0", dtype="bf16") == 700e12
        assert s.value(P.PROBE_MATMUL_PEAK.name, gpu="1") == pytest.approx(300e12 / 989.5e12)
        assert s.value(P.PROBE_DEVICE_LEMON.name, gpu="1", check="matmul") == 1
        assert s.value(P.PROBE_DEVICE_LEMON.name, gpu="0", check="matmul") == 0
        assert s.find(P.PROBE_DEVICE_LEMON.name, check="host_to_device") == []  # skipped: no series
        assert s.value(P.PROBE_NODE_LEMON.name, check="matmul") == 1
        assert s.value(P.PROBE_STORAGE_WRITE_BANDWIDTH.name, path="/ckpt") == 100.0
        assert s.value(P.PROBE_ALLREDUCE_BUS_BANDWIDTH.name, backend="nccl", world_size="3") == pytest.approx(
            bus_bandwidth(4.0, 3)
        )
        assert s.value(P.PROBE_NODE_ALLREDUCE_BUS_BANDWIDTH.name, world_size="2") == 300e9
        assert s.value(P.PROBE_NODE_LEMON.name, check="allreduce") == 0
        assert s.value(P.PROBE_TIMESTAMP.name) == 2.0
        assert s.value(P.PROBE_RESULTS_INVALID.name) == 0
        names = {spec.name for spec in P.METRICS} - {P.PROBE_HOST_DEVICE_BANDWIDTH.name}
        assert names <= s.names()

    def test_series_bounded_per_file(self, tmp_path: Path) -> None:
        """A file with far more devices than a host has cannot blow up the series count."""
        from babysitter.node.workloads.probe_results import MAX_DEVICES

        report = _report()
        report.devices = [_device("n0", str(i), 700e12) for i in range(500)]
        report.lemons = []
        write_report(report, tmp_path / host_file_name("n0"))
        assert len(scrape(ProbeResultsCollector(tmp_path)).find(P.PROBE_MATMUL_FLOPS.name)) == MAX_DEVICES

    def test_invalid_file_counted_not_fatal(self, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
        """A broken file is skipped and counted (logged once), the good one is still served."""
        write_report(_report().for_host("n0"), tmp_path / host_file_name("n0"))
        (tmp_path / "probe-broken.json").write_text("{")
        collector = ProbeResultsCollector(tmp_path)
        s = scrape(collector)
        assert s.value(P.PROBE_RESULTS_INVALID.name) == 1
        assert s.find(P.PROBE_MATMUL_FLOPS.name, gpu="0")
        scrape(collector)
        assert sum("probe-broken.json" in r.message for r in caplog.records) == 1

    def test_missing_directory(self, tmp_path: Path) -> None:
        """No probe has run yet: nothing but the invalid-file count."""
        s = scrape(ProbeResultsCollector(tmp_path / "none"))
        assert s.names() == {P.PROBE_RESULTS_INVALID.name}

    def test_new_file_replaces_cached(self, tmp_path: Path) -> None:
        """A newer probe's file is read again (the cache is keyed by mtime and size)."""
        path = tmp_path / host_file_name("n0")
        report = _report().for_host("n0")
        write_report(report, path)
        collector = ProbeResultsCollector(tmp_path)
        assert scrape(collector).value(P.PROBE_TIMESTAMP.name) == 2.0
        report.finished = 1234.0
        report.devices = report.devices[:1]
        write_report(report, path)
        os.utime(path, ns=(path.stat().st_mtime_ns + 10**9,) * 2)
        assert scrape(collector).value(P.PROBE_TIMESTAMP.name) == 1234.0


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs an NVIDIA GPU (runs on a lent GPU machine)")
class TestOnGpu:
    """The acceptance checks for real hardware: bf16 matmul and memory bandwidth against the table."""

    def test_bf16_matmul_against_peak(self) -> None:
        """bf16 matmul reaches a plausible share of the table's dense peak (not above it, not a tenth)."""
        import torch

        from babysitter.probe.compute import measure_matmul

        name = torch.cuda.get_device_name(0)
        result = measure_matmul(torch.device("cuda", 0), name=name, n=8192, iterations=20, repeats=3)
        assert result.dtype == "bf16"
        if result.peak_flops_per_second is None:
            pytest.skip(f"{name} is not in the peak table")
        assert result.peak_ratio is not None
        assert 0.2 < result.peak_ratio <= 1.0, (name, result)

    def test_memory_and_host_device_bandwidth(self) -> None:
        """Device memory copies beat 100 GB/s (any datacenter GPU) and pinned PCIe/C2C copies 1 GB/s."""
        import torch

        from babysitter.probe.memory import measure_host_device, measure_memory

        gpu = torch.device("cuda", 0)
        mem = measure_memory(gpu, size_bytes=1 << 30, iterations=10, repeats=3)
        assert mem.bytes_per_second is not None and mem.bytes_per_second > 100e9
        h2d, d2h = measure_host_device(gpu, size_bytes=256 << 20, iterations=5, repeats=3)
        assert h2d.bytes_per_second is not None and h2d.bytes_per_second > 1e9
        assert d2h.bytes_per_second is not None and d2h.bytes_per_second > 1e9

    def test_cli_every_local_gpu(self, tmp_path: Path) -> None:
        """A single process probes every local GPU in turn and reports each against the table."""
        import torch

        out = tmp_path / "r.json"
        argv = [
            "probe",
            "--device",
            "cuda",
            "--skip",
            "storage",
            "--matmul-iterations",
            "10",
            "--json",
            str(out),
        ]
        args = build_parser().parse_args(argv)
        assert args.func(args) == 0
        data = json.loads(out.read_text())
        assert len(data["devices"]) == torch.cuda.device_count()
        assert all(d["matmul"]["dtype"] == "bf16" and not d["errors"] for d in data["devices"])
