"""One rank of the silent-corruption torchrun test (4 ranks, gloo, CPU, DDP).

Every rank trains the same small model under DistributedDataParallel with ``watch(...,
replica_check_every=EVERY)``. At step FLIP rank 2 flips one bit of one parameter (bit 22 of a float32:
the value changes by up to half, stays finite, and the difference survives every later update). At
step SAVE every rank saves a ``torch.distributed.checkpoint`` of the model inside
``tracker.checkpoint_save`` (each hashes its own shards, rank 0 merges the manifest; rank 0 keeps the
ledger). At step NAN rank 1's batch is NaN: its loss is NaN, the all-reduce makes every rank's
gradient norm NaN, and every rank skips that update (as a grad scaler would), so no parameter becomes
NaN and rank 2 keeps disagreeing.

argv: OUT_DIR RUN_DIR. Writes OUT_DIR/rank{r}.json with what this rank's own /metrics exposition says.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import babysitter
from babysitter.catalog import integrity as I

STEPS, EVERY, FLIP, SAVE, NAN = 24, 5, 6, 12, 20

out_dir, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
tracker = babysitter.watch(
    model,
    run="integrity",
    port=-1,
    hang_timeout=None,
    flush_interval=0.2,
    run_dir=run_dir,
    flops_per_token=1e6,
    replica_check_every=EVERY,
)
gen = torch.Generator().manual_seed(100 + rank)
for step in range(1, STEPS + 1):
    x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
    if step == NAN and rank == 1:
        x = x * float("nan")
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    if math.isfinite(float(norm)):  # a test's sync, not the tracker's: skip a non-finite update
        opt.step()
    if step == FLIP and rank == 2:
        with torch.no_grad():
            words = net[0].weight.data.view(-1).view(torch.int32)
            words[7] ^= 1 << 22
    tracker.step(loss=loss.detach(), grad_norm=norm, step=step)
    if step == SAVE:
        path = run_dir / f"dcp-{step}"
        with tracker.checkpoint_save(step=step, path=str(path)):
            dcp.save({"model": net.state_dict()}, checkpoint_id=str(path))
tracker.checkpoint_observer.wait_idle(60)  # type: ignore[union-attr]
tracker.housekeep()
dist.barrier()  # every rank's last exchange is in before anyone reads its metrics
for _ in range(50):  # this rank's own exposition, once its last exchange was compared
    tracker.housekeep()
    text = generate_latest(tracker.registry).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    checks = [s.value for s in samples if s.name == I.REPLICA_CHECKS.name]
    if checks and checks[0] >= (STEPS // EVERY) - 1:
        break
    time.sleep(0.1)
found = {
    "mismatch_step": next((s.value for s in samples if s.name == I.REPLICA_MISMATCH_STEP.name), None),
    "checks": checks[0] if checks else 0,
    "first": {s.labels["signal"]: s.value for s in samples if s.name == I.NONFINITE_FIRST_STEP.name},
    "manifests": {s.labels["result"]: s.value for s in samples if s.name == I.CKPT_MANIFESTS.name},
}
(out_dir / f"rank{rank}.json").write_text(json.dumps(found))
dist.barrier()
tracker.close()
dist.destroy_process_group()
