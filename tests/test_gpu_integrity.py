"""On a machine with an NVIDIA GPU: the replica fingerprint and the first non-finite step on CUDA.

* The fingerprint of parameters on the GPU is computed without a host sync (sync debug mode ``error``
  around the check), is read only once its event completed, and equals the fingerprint of the same
  bits on the CPU (so a CPU replica and a CUDA one, or two GPUs, compare the same number).
* What a check costs on CUDA against a training step (recorded for benchmarks/results/gpu.md): the
  host time to queue it and the device time of its kernels.
* Every step's CUDA loss is looked at off the hot path: a NaN at one step is found at that step, and
  neither ``step()`` nor the housekeeping pass synchronizes.

Skipped elsewhere, saying why. Not yet run on hardware (no device lent to the session that wrote it).
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace
from typing import Any

import babysitter
from babysitter.catalog import integrity as I
from babysitter.training.replicas import ReplicaChecker
from gpu_helpers import CudaGptConfig, record, requires_gpu, strict_methods, tiny_cuda_gpt
from node_helpers import Scrape

pytestmark = requires_gpu


def _checker(params: list[Any]) -> ReplicaChecker:
    import torch

    checker = ReplicaChecker.__new__(ReplicaChecker)
    checker._torch, checker._fp, checker._params = torch, None, params
    checker.tracker = SimpleNamespace(global_step=3)  # type: ignore[assignment]
    return checker


def _wait_ready(checker: ReplicaChecker) -> tuple[int, int, int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = checker._ready()
        if found is not None:
            return found
        time.sleep(0.001)
    raise AssertionError("the fingerprint's event never completed")


def test_the_cuda_fingerprint_needs_no_sync_and_equals_the_cpus() -> None:
    import torch

    model = tiny_cuda_gpt(CudaGptConfig())
    params = [*list(model.parameters()), torch.randn(1001, device="cuda").to(torch.bfloat16)]
    checker = _checker(params)
    strict_methods(checker, ["_fingerprint"])
    checker._fingerprint()  # raises under sync debug mode "error" if it synchronized
    on_gpu = _wait_ready(checker)
    cpu = _checker([p.detach().cpu() for p in params])
    cpu._fingerprint()
    assert cpu._ready() == on_gpu


def test_what_a_check_costs_on_cuda_against_a_training_step() -> None:
    import torch

    cfg = CudaGptConfig()
    model = tiny_cuda_gpt(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch = torch.randint(0, cfg.vocab_size, (16, 513), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    checker = _checker(list(model.parameters()))
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    steps, queued, device = [], [], []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        c, d = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        c.record()
        t0 = time.perf_counter()
        checker._fingerprint()
        queued.append((time.perf_counter() - t0) * 1e3)
        d.record()
        torch.cuda.synchronize()
        _wait_ready(checker)
        steps.append(a.elapsed_time(b))
        device.append(c.elapsed_time(d))
    params = sum(p.numel() for p in model.parameters())
    step_ms, device_ms = statistics.median(steps), statistics.median(device)
    record(
        "replica_check_cuda",
        params_m=round(params / 1e6, 1),
        step_ms=round(step_ms, 3),
        check_device_ms=round(device_ms, 3),
        check_host_ms=round(statistics.median(queued), 3),
        check_over_step=round(device_ms / step_ms, 4),
    )
    assert device_ms < step_ms  # a check is cheaper than the step it checks


def test_every_cuda_loss_is_looked_at_without_a_sync() -> None:
    import torch

    tracker = babysitter.watch(run="gpu-nf", port=-1, hang_timeout=None, flush_interval=60.0, timing="cuda")
    try:
        strict_methods(tracker, ["step", "housekeep"])
        for step in range(1, 31):
            loss = torch.full((), float("nan") if step == 13 else 1.0, device="cuda")
            tracker.step(loss=loss, grad_norm=loss * 2, step=step)
        tracker.housekeep()  # queues the copy
        torch.cuda.synchronize()
        tracker.housekeep()  # reads it
        s = Scrape(tracker.event_metrics(["run", "rank"], ["gpu-nf", "0"]))
        first = {x.labels["signal"]: x.value for x in s.samples if x.name == I.NONFINITE_FIRST_STEP.name}
        assert first == {"loss": 13.0, "grad_norm": 13.0}
    finally:
        tracker.close()
