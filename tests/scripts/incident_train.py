"""One rank of the incident tests (torchrun, gloo, CPU): lockstep data parallelism with a run directory.

argv: RUN_DIR OUT_DIR [REGISTRY_DIR]

Every rank gives ``watch()`` the run directory, so every rank answers incident requests there; rank 0
also writes the ledger. Each step computes, sleeps a little and all-reduces the gradients (the step's
one collective). A rank stops at OUT_DIR/stop; rank N raises ``RuntimeError("injected fault on rank
N")`` at its next step once OUT_DIR/crashN exists (an uncaught exception, which its crash record keeps).
With REGISTRY_DIR the ranks serve their metrics (port 0) and register for the node agent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import babysitter

run_dir, out_dir = sys.argv[1], Path(sys.argv[2])
registry = sys.argv[3] if len(sys.argv) > 3 else None
rank = int(os.environ["RANK"])
torch.set_num_threads(1)
tracker = babysitter.watch(
    run="incident",
    port=0 if registry else -1,
    registry_dir=registry,
    run_dir=run_dir,
    labels={"cluster": "c1"},
    flops_per_token=6 * 64 * 64,
    peak_flops=1e12,
    tokens_per_step=512,
    flush_interval=0.2,
    hang_floor=3,
)

import torch.distributed as dist  # noqa: E402 - after watch(): the flight recorder is on before the group
from sgd_step import allreduce_sgd_step  # noqa: E402 - imports torch.distributed: after watch() too

dist.init_process_group("gloo")
world = dist.get_world_size()
(out_dir / f"rank{rank}.json").write_text(json.dumps({"pid": os.getpid()}))
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
stop, crash = out_dir / "stop", out_dir / f"crash{rank}"
while not stop.exists():
    if crash.exists():
        raise RuntimeError(f"injected fault on rank {rank}")
    model(torch.randn(16, 64)).pow(2).mean().backward()
    time.sleep(0.05)
    allreduce_sgd_step(model, world)
    tracker.step()
tracker.close()
os._exit(0)  # the others may be inside a collective: no destroy_process_group barrier
