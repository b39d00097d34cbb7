"""One rank of the lockstep straggler test (torchrun, gloo, CPU): data-parallel steps with a gradient
all-reduce every step, so step boundaries align; rank SLOW_RANK is slowed before the all-reduce.

argv: OUT_DIR STEPS SLOW_RANK. Writes OUT_DIR/rank{r}.json with the straggler score from work time
(what the callbacks measure), where it came from, what the flight recorder reader said, and this
rank's median step time. The test runs it with the recorder off (TORCH_FR_BUFFER_SIZE=0) and
``watch()`` after the process group exists: the documented fallback.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import babysitter
from babysitter.training.collectives import CollectiveMonitor
from babysitter.training.straggler import StragglerMonitor

out_dir, steps, slow_rank = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
tracker = babysitter.watch(run="lockstep", port=-1, hang_timeout=None, flush_interval=0.2)
collectives = CollectiveMonitor(tracker, enabled="off").start()
monitor = StragglerMonitor(tracker, every=10, collectives=collectives)
assert monitor.start()
model = torch.nn.Linear(32, 32)
for _ in range(steps):
    t0 = time.perf_counter()
    model(torch.randn(4, 32)).pow(2).mean().backward()
    time.sleep(0.06 if rank == slow_rank else 0.02)  # this rank's own work
    monitor.add_work(time.perf_counter() - t0)
    for p in model.parameters():  # the collective that aligns every rank's step boundary
        dist.all_reduce(p.grad)
        p.grad /= world
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.01 * p.grad)
            p.grad = None
    tracker.step(tokens=128)
    monitor.after_step()
recorder = collectives.info()
info = tracker.info()["flight_recorder"]
tracker.close()
median_step = statistics.median(tracker.recent_step_seconds(steps))
(out_dir / f"rank{rank}.json").write_text(
    json.dumps(
        {
            "score": monitor.score,
            "source": monitor.source,
            "rounds": monitor.rounds,
            "median_step": median_step,
            "recorder": recorder,
            "train_info": info,
        }
    )
)
dist.barrier()
dist.destroy_process_group()
