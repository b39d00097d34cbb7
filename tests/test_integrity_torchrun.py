"""Silent corruption under a real 4-rank torchrun (gloo, CPU, DistributedDataParallel), one run for all:

- one bit of one parameter flipped on rank 2 at step 6: the replica check (every 5 steps) names rank 2
  within 5 steps, and no other rank;
- rank 1's batch NaN at step 20: rank 1's loss is the first non-finite one; every rank's gradient
  norm (taken after the all-reduce) ties at step 20;
- a torch.distributed.checkpoint save by all four ranks at step 12: each hashed its own shard, rank 0
  merged the parts into one manifest; one flipped byte in rank 2's shard is named by the sentinel.

See tests/scripts/integrity_ddp.py for the training loop.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from babysitter.catalog import storage as S
from babysitter.checkpoints import read_manifest
from babysitter.checkpoints.manifest import PART_PREFIX, manifest_path
from babysitter.node.storage.sentinel import CheckpointSentinelCollector
from node_helpers import scrape

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "integrity_ddp.py"
EVERY, FLIP = 5, 6  # as in the script


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, object]], Path]:
    tmp = tmp_path_factory.mktemp("integrity")
    out, run = tmp / "out", tmp / "run"
    out.mkdir()
    run.mkdir()
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    done = subprocess.run(
        [*argv, str(SCRIPT), str(out), str(run)], capture_output=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)], run


def test_the_rank_with_a_flipped_bit_is_named_within_n_steps_and_no_other(job) -> None:
    ranks, _run = job
    assert all(r["checks"] >= 3 for r in ranks), ranks  # every rank compared, round after round
    named = {k: r["mismatch_step"] for k, r in enumerate(ranks) if r["mismatch_step"] is not None}
    assert list(named) == [2], ranks
    assert FLIP < named[2] <= FLIP + EVERY


def test_the_rank_whose_loss_went_non_finite_first_is_the_one_with_the_nan(job) -> None:
    ranks, _run = job
    loss = {k: r["first"].get("loss") for k, r in enumerate(ranks)}  # type: ignore[union-attr]
    assert loss == {0: None, 1: 20.0, 2: None, 3: None}
    assert [r["first"].get("grad_norm") for r in ranks] == [20.0] * 4  # type: ignore[union-attr]


def test_a_dcp_save_of_four_ranks_has_one_merged_manifest_and_a_flipped_shard_is_named(job) -> None:
    ranks, run = job
    assert [r["manifests"] for r in ranks] == [{"manifest": 1.0}, {"part": 1.0}, {"part": 1.0}, {"part": 1.0}]
    ckpt = run / "dcp-12"
    manifest, _ = read_manifest(manifest_path(ckpt))
    assert manifest.layout == "dcp" and manifest.ranks == (0, 1, 2, 3)
    assert sorted(f.path for f in manifest.files) == [".metadata", *(f"__{r}_0.distcp" for r in range(4))]
    assert not [p for p in ckpt.iterdir() if p.name.startswith(PART_PREFIX)]  # parts merged, removed
    sentinel = CheckpointSentinelCollector(
        [run], refresh_seconds=0.0, wait_seconds=20.0, reverify_seconds=0.0
    )
    try:
        assert scrape(sentinel).value(S.CHECKPOINT_CORRUPT.name, run="integrity") == 0
        shard = ckpt / "__2_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
        s = scrape(sentinel)
    finally:
        sentinel.close()
    [bad] = [x for x in s.samples if x.name == S.CHECKPOINT_CORRUPT_STEP.name]
    assert (bad.value, bad.labels["file"], bad.labels["reason"]) == (12, "__2_0.distcp", "digest")
