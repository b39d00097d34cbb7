"""One rank of Lightning's ModelParallelStrategy (tensor parallel over 2 ranks, gloo, CPU) under
torchrun, tracked by babysitter's Lightning callback, which reads the layout from the strategy's
DeviceMesh (nothing about parallelism is passed to it).

argv: OUT_DIR STEPS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from parallel_common import PEAK_FLOPS, Shape, TinyGPT, cross_entropy, palm_flops_per_token
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, Dataset

from babysitter.integrations.lightning import Babysitter

out_dir, steps = Path(sys.argv[1]), int(sys.argv[2])
shape = Shape()


class Tokens(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randint(0, shape.vocab, (shape.seq + 1,), generator=torch.Generator().manual_seed(i))


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gpt = TinyGPT(shape)

    def configure_model(self) -> None:
        plan: dict[str, object] = {"head": ColwiseParallel(output_layouts=Replicate())}
        for i in range(shape.layers):
            plan |= {f"blocks.{i}.{name}": ColwiseParallel() for name in ("q", "k", "v", "up")}
            plan |= {f"blocks.{i}.{name}": RowwiseParallel() for name in ("o", "down")}
        parallelize_module(self.gpt, self.device_mesh["tensor_parallel"], plan)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return cross_entropy(self.gpt(batch[:, :-1]), batch[:, 1:])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


callback = Babysitter(
    straggler_every=None,
    run="parallel-lightning",
    port=-1,
    flops_per_token=palm_flops_per_token(shape),
    tokens_per_step=0,
    peak_flops=PEAK_FLOPS,
    hang_timeout=None,
)
trainer = L.Trainer(
    accelerator="cpu",
    devices=2,
    strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2),
    max_steps=steps,
    callbacks=[callback],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Module(), DataLoader(Tokens(), batch_size=shape.batch))
tracker = callback.tracker
assert tracker is not None
snap = tracker.snapshot()
record = {
    "rank": trainer.global_rank,
    "steps": snap.steps,
    "tokens": snap.tokens,
    "model_flops": snap.model_flops,
    "mfu": snap.mfu,
    "layout": str(getattr(tracker.config, "parallel", None)),
    "source": getattr(getattr(tracker.config, "parallel", None), "source", None),
    "batch_tokens": shape.batch * (shape.seq + 1),
    "flops_per_token": palm_flops_per_token(shape),
}
(out_dir / f"rank{record['rank']}.json").write_text(json.dumps(record))
