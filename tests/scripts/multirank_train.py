"""One rank of the multi-rank test, started by torchrun: gloo, CPU, one rank slowed on purpose.

argv: REGISTRY_DIR RUN_DIR OUT_DIR MAX_SECONDS SLOW_RANK

Ranks train independent tiny models (no per-step collective), so that a slow rank's step time is
its own - as with any non-lockstep work; in lockstep data parallelism step boundaries align and
the PromQL mean would hide the straggler. Every rank steps until OUT_DIR/stop appears (written by
the test once it has checked Prometheus), so all ranks step while it looks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import babysitter

registry_dir, run_dir, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
max_seconds, slow_rank = float(sys.argv[4]), int(sys.argv[5])

dist.init_process_group("gloo")
rank = dist.get_rank()
tracker = babysitter.watch(
    run="multirank",
    port=0,
    registry_dir=registry_dir,
    run_dir=run_dir,
    flops_per_token=6 * 64 * 64,
    peak_flops=1e12,
    flush_interval=0.2,
    straggler_every=10,
    straggler_timeout=10,
    hang_timeout=None,
)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
base, slow = 0.04, 0.09
stop = out_dir / "stop"
(out_dir / f"rank{rank}.json").write_text(json.dumps({"pid": os.getpid(), "url": tracker.metrics_url}))
deadline = time.monotonic() + max_seconds
while not stop.exists() and time.monotonic() < deadline:
    x = torch.randn(8, 64)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    time.sleep(slow if rank == slow_rank else base)
    tracker.step(tokens=8 * 64, samples=8, loss=loss.detach())
tracker.close()
dist.barrier()
dist.destroy_process_group()
