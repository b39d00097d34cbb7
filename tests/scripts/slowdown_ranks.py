"""One rank of the fail-slow test (torchrun, gloo, CPU): lockstep data parallelism, one rank slower
for a stretch.

argv: RUN_DIR OUT_DIR SLOW_RANK STEPS SLOW_FROM SLOW_TO

Every step sleeps BASE seconds of "compute" (SLOW_RANK 40% longer in steps SLOW_FROM..SLOW_TO-1),
all-reduces the gradients (the collective that makes every rank's step as long as the slowest's)
and marks the step. ``watch()`` runs before ``init_process_group`` so that torch's flight recorder is
on, and the straggler exchange runs every 5 steps: rank 0's ledger gets the straggler verdicts. Rank
0 writes OUT_DIR/rank0.json: the duration of each of its steps by its own clock (between its
``tracker.step()`` calls, the boundaries the tracker keeps) and its host name.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch

import babysitter

run_dir, out_dir = sys.argv[1], Path(sys.argv[2])
slow_rank, steps, slow_from, slow_to = (int(x) for x in sys.argv[3:7])
rank = int(os.environ["RANK"])
BASE = 0.1

torch.set_num_threads(1)
tracker = babysitter.watch(
    run="slowdown",
    port=-1,
    run_dir=run_dir if rank == 0 else None,
    tokens_per_step=512,
    flush_interval=0.2,
    straggler_every=5,
    straggler_timeout=120,
    hang_timeout=None,
)
import torch.distributed as dist  # noqa: E402 - after watch(), as a script that wants the recorder on does
from sgd_step import allreduce_sgd_step  # noqa: E402 - imports torch.distributed: after watch() too

dist.init_process_group("gloo")
world = dist.get_world_size()
model = torch.nn.Linear(32, 32)
ends: list[float] = []
for k in range(1, steps + 1):
    model(torch.randn(8, 32)).pow(2).mean().backward()
    time.sleep(BASE * (1.4 if rank == slow_rank and slow_from <= k < slow_to else 1.0))
    allreduce_sgd_step(model, world)
    tracker.step()
    ends.append(time.perf_counter())
tracker.close()
if rank == 0:
    durations = {k + 1: ends[k] - ends[k - 1] for k in range(1, len(ends))}
    (out_dir / "rank0.json").write_text(json.dumps({"durations": durations, "host": socket.gethostname()}))
dist.barrier()
os._exit(0)
