"""One rank of the timed loop (``tests/loop_helpers.py``): a Slurm job step, gloo over loopback, CPU.

argv: RUN_DIR NODES_DIR [HANG_FLOOR]

The rank's identity comes from Slurm (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURMD_NODENAME``); it
registers with the node agent of its node (``NODES_DIR/<node>/reg``). It resumes from the newest
checkpoint that verifies against its manifest (``babysitter.checkpoints.resume_point``: what the
remediator's note names too), trains lockstep data parallel (one all_reduce a step), and rank 0 saves
every ``SAVE_EVERY`` steps with the tracker's manifest. It writes ``RUN_DIR/pids/rank<R>`` (its pid) so
that the harness can stop or kill it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

import babysitter
from babysitter.checkpoints import checkpoint_statuses, resume_point

SAVE_EVERY = 100

run_dir, nodes = Path(sys.argv[1]), Path(sys.argv[2])
hang_floor = float(sys.argv[3]) if len(sys.argv) > 3 else 300.0
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
node = os.environ["SLURMD_NODENAME"]
os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
resume = (
    resume_point(checkpoint_statuses(run_dir)) if (run_dir / "babysitter-ledger.jsonl").exists() else None
)
tracker = babysitter.watch(
    run="loop",
    port=0,
    registry_dir=nodes / node / "reg",
    run_dir=run_dir,
    labels={"cluster": "c1"},
    flops_per_token=6 * 64 * 64,
    peak_flops=1e12,
    tokens_per_step=1024,
    hang_floor=hang_floor,
)
step = 0
if resume is not None and resume.path:
    with tracker.checkpoint_load(step=resume.step):
        model.load_state_dict(torch.load(resume.path, weights_only=True))
    step = resume.step

import torch.distributed as dist  # noqa: E402 - after watch(): the flight recorder is on before the group
from sgd_step import allreduce_sgd_step  # noqa: E402 - imports torch.distributed: after watch() too

dist.init_process_group("gloo")
(run_dir / "pids").mkdir(exist_ok=True)
(run_dir / "pids" / f"rank{rank}").write_text(f"{os.getpid()} {node}\n")
print(f"resume {step} on {node} rank {rank} at {time.time():.3f}", flush=True)
while True:
    model(torch.randn(32, 64)).pow(2).mean().backward()
    time.sleep(0.1)
    allreduce_sgd_step(model, world)
    step += 1
    tracker.step(step=step)
    if rank == 0 and step % SAVE_EVERY == 0:
        path = run_dir / f"ckpt-{step}.pt"
        with tracker.checkpoint_save(step=step, path=path) as handle:
            torch.save(model.state_dict(), path)
            handle.nbytes = path.stat().st_size
