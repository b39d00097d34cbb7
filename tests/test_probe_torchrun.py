"""``babysitter probe`` under torchrun on CPU with gloo: a slowed rank is flagged as a lemon.

Three ranks on one host run the whole probe with small sizes (the CI machine has two shared cores);
rank 1 sleeps after every matmul (``--test-slow-rank``), so its throughput falls far below the
median. The threshold is loose (50%) because three ranks share two cores: the fast ranks' best
batches stay well within it, the slowed rank lands far outside.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from babysitter.catalog import probe as P
from babysitter.node.workloads.probe_results import ProbeResultsCollector
from babysitter.probe.collective import bus_bandwidth
from node_helpers import scrape

pytestmark = pytest.mark.slow

pytest.importorskip("torch")


def test_slowed_rank_is_a_lemon(tmp_path: Path) -> None:
    """Rank 1, slowed, is the one matmul lemon; all-reduce busbw is measured over gloo; the host file
    reaches the node agent's collector with the lemon flag."""
    ckpt, results, out = tmp_path / "ckpt", tmp_path / "results", tmp_path / "report.json"
    ckpt.mkdir()
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    argv += ["-m", "babysitter", "probe", "--device", "cpu", "--lemon-fraction", "0.5"]
    argv += ["--matmul-n", "128", "--matmul-iterations", "4", "--repeats", "5"]
    argv += ["--memory-bytes", "1048576", "--collective-bytes", "262144", "--collective-iterations", "5"]
    argv += ["--storage-path", str(ckpt), "--storage-bytes", "1048576", "--results-dir", str(results)]
    argv += ["--test-slow-rank", "1", "--test-slow-delay", "0.05", "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())

    assert [d["rank"] for d in report["devices"]] == [0, 1, 2]
    assert [d["gpu"] for d in report["devices"]] == ["cpu0", "cpu1", "cpu2"]
    matmul_lemons = [x for x in report["lemons"] if x["check"] == "matmul" and x["scope"] == "device"]
    assert [x["gpu"] for x in matmul_lemons] == ["cpu1"], report["lemons"]
    assert matmul_lemons[0]["below_median"] > 0.5

    coll = report["collective"]
    assert coll["backend"] == "gloo" and coll["world_size"] == 3 and coll["skipped"] == ""
    assert coll["busbw_bytes_per_second"] == pytest.approx(bus_bandwidth(coll["algbw_bytes_per_second"], 3))
    assert coll["busbw_bytes_per_second"] > 0

    nodes = report["node_collectives"]  # one host: its 3 ranks all-reduce among themselves
    assert [(n["world_size"], n["skipped"]) for n in nodes] == [(3, "")]
    assert nodes[0]["busbw_bytes_per_second"] > 0

    assert len(report["storage"]) == 1  # local rank 0 only: one writer per host
    assert report["storage"][0]["error"] == ""
    assert list(ckpt.iterdir()) == []

    files = list(results.iterdir())
    assert len(files) == 1
    s = scrape(ProbeResultsCollector(results))
    assert s.value(P.PROBE_DEVICE_LEMON.name, gpu="cpu1", check="matmul") == 1
    assert s.value(P.PROBE_DEVICE_LEMON.name, gpu="cpu0", check="matmul") == 0
    assert s.value(P.PROBE_DEVICE_LEMON.name, gpu="cpu2", check="matmul") == 0
    assert s.value(P.PROBE_ALLREDUCE_BUS_BANDWIDTH.name, backend="gloo", world_size="3") > 0
    assert s.value(P.PROBE_NODE_ALLREDUCE_BUS_BANDWIDTH.name, backend="gloo", world_size="3") > 0


def test_two_nodes_slow_node_is_a_lemon(tmp_path: Path) -> None:
    """Two simulated nodes (two torchrun agents on this machine, static rendezvous, ``--host``), two
    ranks each; node 1's ranks are slowed: node 1 is the matmul node lemon, each node all-reduces
    within itself, each node's local rank 0 measures storage and writes its own host file."""
    from promkit import free_port

    ckpt, results, out = tmp_path / "ckpt", tmp_path / "results", tmp_path / "report.json"
    ckpt.mkdir()
    port = free_port()
    procs = []
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2"]
        argv += ["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        argv += ["-m", "babysitter", "probe", "--device", "cpu", "--host", f"sim-node{node}"]
        argv += ["--lemon-fraction", "0.5", "--matmul-n", "96", "--matmul-iterations", "4", "--repeats", "2"]
        argv += ["--memory-bytes", "262144", "--collective-bytes", "65536", "--collective-iterations", "3"]
        argv += ["--storage-path", str(ckpt), "--storage-bytes", "262144", "--results-dir", str(results)]
        argv += ["--test-slow-rank", "2", "--test-slow-rank", "3", "--test-slow-delay", "0.05"]
        argv += ["--json", str(out), "--timeout", "120"]
        procs.append(
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
        )
    try:
        outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    report = json.loads(out.read_text())

    assert [(d["host"], d["rank"]) for d in report["devices"]] == [
        ("sim-node0", 0),
        ("sim-node0", 1),
        ("sim-node1", 2),
        ("sim-node1", 3),
    ]
    node_lemons = [(x["host"], x["check"]) for x in report["lemons"] if x["scope"] == "node"]
    assert ("sim-node1", "matmul") in node_lemons
    assert all(host == "sim-node1" for host, _ in node_lemons if _ == "matmul")
    device_matmul = sorted(
        x["gpu"] + "@" + x["host"]
        for x in report["lemons"]
        if x["check"] == "matmul" and x["scope"] == "device"
    )
    assert device_matmul == ["cpu0@sim-node1", "cpu1@sim-node1"]
    assert report["collective"]["world_size"] == 4
    assert sorted((n["host"], n["world_size"]) for n in report["node_collectives"]) == [
        ("sim-node0", 2),
        ("sim-node1", 2),
    ]
    assert sorted(s["host"] for s in report["storage"]) == ["sim-node0", "sim-node1"]

    assert sorted(p.name for p in results.iterdir()) == ["probe-sim-node0.json", "probe-sim-node1.json"]
    node1 = json.loads((results / "probe-sim-node1.json").read_text())
    assert {d["host"] for d in node1["devices"]} == {"sim-node1"}
    assert list(ckpt.iterdir()) == []
