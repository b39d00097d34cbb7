"""One stage of a 2-stage pipeline under torchrun (gloo, CPU): ``torch.distributed.pipelining`` with
the GPipe schedule over 4 micro-batches, so every step has a pipeline bubble.

argv: REGISTRY_DIR OUT_DIR MAX_SECONDS

Before training, each stage measures its own FLOPs for one step with ``babysitter.flops.measure``
(FlopCounterMode), so the test can check that the FLOPs credited to the stages add up to what they
really computed: nothing double counted, nothing discounted for the bubble.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from parallel_common import (
    PEAK_FLOPS,
    RUN_PP,
    Shape,
    TinyGPT,
    batch,
    cross_entropy,
    palm_flops_per_token,
    train_logged,
)
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import babysitter
from babysitter import flops

registry_dir, out_dir, max_seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])


class First(nn.Module):
    def __init__(self, gpt: TinyGPT) -> None:
        super().__init__()
        self.embed, self.pos, self.block = gpt.embed, gpt.pos, gpt.blocks[0]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.block(self.embed(idx) + self.pos(torch.arange(idx.shape[1])))
        return out


class Last(nn.Module):
    def __init__(self, gpt: TinyGPT) -> None:
        super().__init__()
        self.block, self.norm, self.head = gpt.blocks[1], gpt.norm, gpt.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.norm(self.block(x)))
        return out


dist.init_process_group("gloo")
rank = dist.get_rank()
shape = Shape(batch=8)
assert shape.layers == 2
torch.manual_seed(0)
gpt = TinyGPT(shape)
module = First(gpt) if rank == 0 else Last(gpt)
stage = PipelineStage(module, rank, 2, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=cross_entropy)
opt = torch.optim.SGD(module.parameters(), lr=0.01)
# both stages draw the same batch: inputs for one, targets for the other
gen = torch.Generator().manual_seed(7)
tokens = shape.batch * shape.seq


def forward_backward() -> torch.Tensor | None:
    x, y = batch(shape, gen)
    if rank == 0:
        schedule.step(x)
        return None
    losses: list[torch.Tensor] = []
    schedule.step(target=y, losses=losses)
    return torch.stack(losses).mean().detach()


forward_backward()  # the schedule sets its stages up on its first step (shape inference), not measured
measured = flops.measure(module, forward_backward, tokens=tokens)
opt.zero_grad()
tracker = babysitter.watch(
    run=RUN_PP,
    port=0,
    registry_dir=registry_dir,
    parallelism={"pp": 2},
    tokens_per_step=tokens,
    samples_per_step=shape.batch,
    flops_per_token=palm_flops_per_token(shape),
    peak_flops=PEAK_FLOPS,
    mfu_window=10.0,
    flush_interval=0.5,
    hang_timeout=None,
    labels={"cluster": "c1"},
)


def step() -> torch.Tensor | None:
    loss = forward_backward()
    opt.step()
    opt.zero_grad()
    return loss


train_logged(
    tracker,
    step,
    out_dir,
    rank=rank,
    max_seconds=max_seconds,
    pace=0.05,
    extra={
        "dp_rank": 0,
        "tokens_per_step": tokens,
        "measured_model_flops": measured.model,
        "shape": vars(shape),
    },
)
tracker.close()
dist.barrier()
dist.destroy_process_group()
