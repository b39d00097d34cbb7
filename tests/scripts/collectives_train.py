"""One rank of the collectives end-to-end test (torchrun, gloo, CPU): lockstep data parallelism.

argv: REGISTRY_DIR RUN_DIR OUT_DIR SLOW_RANK SKEW_RANK SKEW_MS

Every step computes, sleeps its rank's share (SLOW_RANK 40% longer), all-reduces the flattened
gradients (one collective per step, as DDP's last bucket) and steps the optimizer, so every rank's step
time is the slowest rank's. ``watch()`` runs before ``init_process_group``: it turns the flight
recorder on and the straggler exchange starts at its first round after the group exists.

SKEW_RANK runs with a host clock SKEW_MS ahead. What a skewed host changes is its wall clock: the flight
recorder stamps enqueue times with it, and so does babysitter's own stamp of each round's completion
(``training/flight.wall_ns``); monotonic timers (step times) are unaffected. Patching ``wall_ns``
shifts exactly those, both of them (the recorder's times move with it: ``flight.Recorder``), so this
rank reports what a rank on a host with a skewed clock reports.

The rank's CPU stands in for the simulated node's GPU ``rank`` (train_info names its uuid, as
``watch()`` does on a CUDA rank), so the pages can name a GPU. Every rank steps until OUT_DIR/stop
(or until the test stops torchrun).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import babysitter
from babysitter.labels import normalize_pci_bus_id
from babysitter.node.gpu.fake import fake_gpus
from babysitter.training import flight

registry_dir, run_dir, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
slow_rank, skew_rank, skew_ms = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
rank = int(os.environ["RANK"])
if rank == skew_rank:
    _real = time.time_ns
    flight.wall_ns = lambda: _real() + int(skew_ms * 1e6)

torch.set_num_threads(1)
tracker = babysitter.watch(
    run="lockstep",
    port=0,
    registry_dir=registry_dir,
    run_dir=run_dir if rank == 0 else None,
    labels={"cluster": "c1"},
    flops_per_token=6 * 64 * 64,
    peak_flops=1e12,
    tokens_per_step=512,
    flush_interval=0.2,
    straggler_every=5,
    straggler_timeout=120,
    hang_floor=3,
)
gpu = fake_gpus(4)[rank]
tracker.gpu = {"uuid": gpu.uuid, "pci_bus_id": normalize_pci_bus_id(gpu.pci_bus_id)}

import torch.distributed as dist  # noqa: E402 - after watch(), as a script that wants the recorder on does
from sgd_step import allreduce_sgd_step  # noqa: E402 - imports torch.distributed: after watch() too

dist.init_process_group("gloo")
world = dist.get_world_size()
(out_dir / f"rank{rank}.json").write_text(json.dumps({"pid": os.getpid(), "url": tracker.metrics_url}))
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
stop = out_dir / "stop"
base = 0.06
while not stop.exists():
    model(torch.randn(16, 64)).pow(2).mean().backward()
    time.sleep(base * (1.4 if rank == slow_rank else 1.0))
    allreduce_sgd_step(model, world)
    tracker.step()
tracker.close()
os._exit(0)  # the others may be inside a collective: no destroy_process_group barrier
