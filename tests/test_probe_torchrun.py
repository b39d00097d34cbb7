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
from babysitter.node.probe_results import ProbeResultsCollector
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
    argv += ["--matmul-n", "128", "--matmul-iterations", "4", "--repeats", "3"]
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
