"""One rank of a 2-rank expert-parallel MoE job under torchrun (gloo, CPU).

argv: REGISTRY_DIR OUT_DIR STEPS

A tiny MoE (4 experts, top-2 routing by a learned router) whose experts live two per rank: each rank
routes its own tokens, sends each token to the ranks holding its experts with an all-to-all, and gets
the results back with another (autograd through both). Router, embedding and LM head are replicated:
expert parallelism is carved out of data parallelism, so each rank brings its own batch.

Each rank measures one step with ``babysitter.flops.measure`` (FlopCounterMode): the dense part on its
own tokens plus its experts on whatever tokens were routed to them. Then it trains ``STEPS`` steps
tracked with ``parallelism={"ep": 2}`` and writes its counters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from torch import nn

import babysitter
from babysitter import flops

registry_dir, out_dir, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
VOCAB, D, FFN, EXPERTS, TOP_K, BATCH, SEQ = 128, 32, 64, 4, 2, 4, 16


def active_flops_per_token() -> float:
    """6 x the parameters one token is multiplied by: router, its top-2 experts (up and down), LM head."""
    return 6.0 * (D * EXPERTS + TOP_K * 2 * D * FFN + D * VOCAB)


class ExpertParallelMoE(nn.Module):
    def __init__(self, ep: int, ep_rank: int) -> None:
        super().__init__()
        self.ep, self.local = ep, EXPERTS // ep
        self.router = nn.Linear(D, EXPERTS, bias=False)
        torch.manual_seed(100 + ep_rank)  # this rank's experts
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(D, FFN, bias=False), nn.GELU(), nn.Linear(FFN, D, bias=False))
            for _ in range(self.local)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        weights, chosen = self.router(x).softmax(-1).topk(TOP_K, dim=-1)
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        sent = x.repeat_interleave(TOP_K, dim=0)[order]  # grouped by expert, so by destination rank
        per_expert = torch.bincount(flat, minlength=EXPERTS)
        incoming = torch.empty_like(per_expert)  # [source rank][my local expert]
        dist.all_to_all_single(incoming, per_expert)
        send_sizes = per_expert.view(self.ep, self.local).sum(1).tolist()
        recv_sizes = incoming.view(self.ep, self.local).sum(1).tolist()
        received = dist_nn.all_to_all_single(x.new_empty(sum(recv_sizes), D), sent, recv_sizes, send_sizes)
        chunks = received.split(incoming.tolist())
        done = torch.cat([self.experts[j % self.local](chunk) for j, chunk in enumerate(chunks)])
        back = dist_nn.all_to_all_single(x.new_empty(len(sent), D), done, send_sizes, recv_sizes)
        out = back[order.argsort()].view(n, TOP_K, D)
        return (out * weights.unsqueeze(-1)).sum(1)


class Model(nn.Module):
    def __init__(self, ep: int, ep_rank: int) -> None:
        super().__init__()
        torch.manual_seed(0)  # replicated dense part
        self.embed = nn.Embedding(VOCAB, D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.moe = ExpertParallelMoE(ep, ep_rank)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx).reshape(-1, D)
        out: torch.Tensor = self.head(x + self.moe(x))
        return out


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = Model(world, rank)
dense = [p for name, p in model.named_parameters() if ".experts." not in name]
opt = torch.optim.SGD(model.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(500 + rank)  # each expert-parallel rank brings its own batch
tokens = BATCH * SEQ


def forward_backward() -> torch.Tensor:
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    loss = F.cross_entropy(model(data[:, :-1]), data[:, 1:].reshape(-1))
    loss.backward()
    return loss.detach()


measured = flops.measure(model, forward_backward, tokens=tokens)
opt.zero_grad()
tracker = babysitter.watch(
    run="parallel-ep",
    port=-1,
    registry_dir=registry_dir,
    parallelism={"ep": world},
    tokens_per_step=tokens,
    flops_per_token=active_flops_per_token(),
    peak_flops=1e10,
    hang_timeout=None,
)
for _ in range(steps):
    loss = forward_backward()
    for p in dense:  # data parallel for the dense part
        dist.all_reduce(p.grad)  # type: ignore[arg-type]
        p.grad /= world  # type: ignore[operator]
    opt.step()
    opt.zero_grad()
    tracker.step(loss=loss)
snap = tracker.snapshot()
record = {
    "rank": rank,
    "steps": snap.steps,
    "tokens": snap.tokens,
    "model_flops": snap.model_flops,
    "measured_model_flops": measured.model,
    "layout": str(tracker.config.parallel),
    "flops_per_token": active_flops_per_token(),
}
(out_dir / f"rank{rank}.json").write_text(json.dumps(record))
tracker.close()
dist.barrier()
dist.destroy_process_group()
