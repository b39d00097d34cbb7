"""One rank of a TP=2 x DP=2 job under torchrun (gloo, CPU): a tiny GPT really sharded by
``torch.distributed.tensor.parallel`` over the ``tp`` dimension of a 2-D DeviceMesh, FSDP2 over ``dp``.

argv: REGISTRY_DIR OUT_DIR MAX_SECONDS

``babysitter.watch(model, ...)`` gets no layout argument: it reads the mesh from the model's DTensor
parameters, as it would in a torchtitan or Lightning run. The two ranks of a tensor-parallel group
read the same batch (seeded by their data-parallel rank), as they must.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from parallel_common import (
    PEAK_FLOPS,
    RUN_TP,
    Shape,
    TinyGPT,
    batch,
    cross_entropy,
    palm_flops_per_token,
    train_logged,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import babysitter

registry_dir, out_dir, max_seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
shape = Shape()
torch.manual_seed(0)
model = TinyGPT(shape)
plan: dict[str, object] = {"head": ColwiseParallel(output_layouts=Replicate())}
for i in range(shape.layers):
    plan |= {f"blocks.{i}.{name}": ColwiseParallel() for name in ("q", "k", "v", "up")}
    plan |= {f"blocks.{i}.{name}": RowwiseParallel() for name in ("o", "down")}
parallelize_module(model, mesh["tp"], plan)
for block in model.blocks:
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
tokens = shape.batch * shape.seq  # of this rank's data-parallel replica, the same on both TP ranks
tracker = babysitter.watch(
    model,
    run=RUN_TP,
    port=0,
    registry_dir=registry_dir,
    tokens_per_step=tokens,
    samples_per_step=shape.batch,
    flops_per_token=palm_flops_per_token(shape),
    peak_flops=PEAK_FLOPS,
    mfu_window=10.0,
    flush_interval=0.5,
    hang_timeout=None,
    labels={"cluster": "c1"},
)
dp_rank = mesh["dp"].get_local_rank()
gen = torch.Generator().manual_seed(1000 + dp_rank)


def step() -> torch.Tensor:
    x, y = batch(shape, gen)
    loss = cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


local_q = model.blocks[0].q.weight.to_local().shape  # the shard this rank holds
train_logged(
    tracker,
    step,
    out_dir,
    rank=rank,
    max_seconds=max_seconds,
    pace=0.05,
    extra={"dp_rank": dp_rank, "tokens_per_step": tokens, "local_q_weight": list(local_q)},
)
tracker.close()
dist.barrier()
dist.destroy_process_group()
