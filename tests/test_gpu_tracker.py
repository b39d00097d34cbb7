"""On a machine with an NVIDIA GPU: the tracker's CUDA paths on a real training loop.

* Step times from CUDA events (no sync) against ``torch.cuda.synchronize()`` timing, within 2 %.
* ``torch.cuda.set_sync_debug_mode``: a tracked loop raises nothing in mode ``error``, and no
  synchronizing call made anywhere in the process (any thread) has a babysitter frame on its stack;
  the same for the Lightning and the Hugging Face callbacks, whose hooks run in mode ``error``
  (the frameworks' own syncs are counted and reported, not blamed on babysitter).
* The loss copied off the device through pinned memory equals the loss the loop computed.
* ``train_info`` names the rank's GPU (uuid, pci_bus_id) as the node agent's NVML collector does.

Skipped elsewhere, saying why.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import pytest

import babysitter
from babysitter.catalog import node as N
from babysitter.catalog import selfmon as S
from babysitter.catalog import train as T
from gpu_helpers import (
    CudaGptConfig,
    hook_names,
    record,
    requires_gpu,
    strict_methods,
    sync_log,
    tiny_cuda_gpt,
)
from integ_helpers import sample_value

pytestmark = requires_gpu

BATCH, SEQ = 16, 512


def _batches(n: int, cfg: CudaGptConfig) -> list[Any]:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    return [
        torch.randint(0, cfg.vocab_size, (BATCH, SEQ + 1), device="cuda", generator=gen) for _ in range(n)
    ]


def _train_step(model: Any, opt: Any, batch: Any) -> Any:
    import torch

    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _setup(tmp_path: Path) -> tuple[Any, Any, Any, CudaGptConfig]:
    import torch

    cfg = CudaGptConfig()
    model = tiny_cuda_gpt(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tracker = babysitter.watch(
        model, seq_len=SEQ, tokens_per_step=BATCH * SEQ, dtype="bf16", port=-1, run_dir=tmp_path / "run"
    )
    assert tracker.config.timing == "cuda"
    return model, opt, tracker, cfg


def _internal_errors(tracker: Any) -> dict[str, int]:
    return dict(tracker.errors.counts())


def _hist(tracker: Any) -> tuple[float, float]:
    tracker.snapshot()  # folds the ring and drains completed events
    s = sample_value(tracker.registry, T.STEP_DURATION.name + "_sum")
    c = sample_value(tracker.registry, T.STEP_DURATION.name + "_count")
    return s or 0.0, c or 0.0


def test_cuda_event_step_times_match_synchronized_timing(tmp_path: Path) -> None:
    import torch

    model, opt, tracker, cfg = _setup(tmp_path)
    batches = _batches(8, cfg)
    try:
        for i in range(10):  # warm-up: cuBLAS heuristics, allocator, clocks
            tracker.step(loss=_train_step(model, opt, batches[i % len(batches)]))
        # A: the real case, no sync per step; the events' sum against wall time between two syncs.
        # Both clocks start at the same sync: the first event interval spans the idle gap after it.
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        s0, c0 = _hist(tracker)
        n = 60
        for i in range(n):
            tracker.step(loss=_train_step(model, opt, batches[i % len(batches)]))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        s1, c1 = _hist(tracker)
        assert c1 - c0 == n, (c0, c1)
        sum_error = (s1 - s0) / wall - 1
        # B: per step, synchronized: each event duration against the host's synchronized step time.
        timer = tracker._timer
        per_step: list[float] = []
        drain = timer.drain

        def spy() -> list[float]:
            out: list[float] = drain()
            per_step.extend(out)
            return out

        timer.drain = spy
        tracker.snapshot()
        per_step.clear()
        host: list[float] = []
        torch.cuda.synchronize()
        t_prev = time.perf_counter()
        for i in range(41):
            loss = _train_step(model, opt, batches[i % len(batches)])
            tracker.step(loss=loss)
            torch.cuda.synchronize()
            t = time.perf_counter()
            host.append(t - t_prev)
            t_prev = t
        tracker.snapshot()
        timer.drain = drain
        assert len(per_step) == len(host)
        # The first interval starts at phase A's last event, before the snapshot above: left out.
        ratios = [d / h for d, h in zip(per_step[1:], host[1:], strict=True)]
        median_error = statistics.median(ratios) - 1
        # The loss read through pinned memory off the training thread equals the loop's own loss.
        expected = float(loss.item())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            got = sample_value(tracker.registry, T.LOSS.name)
            if got is not None and abs(got - expected) <= 1e-6 * max(1.0, abs(expected)):
                break
            time.sleep(0.05)
        peak = sample_value(tracker.registry, T.PEAK_FLOPS.name)
        mfu = sample_value(tracker.registry, T.MFU.name)
        record(
            "step_timing",
            steps=n,
            wall_seconds=wall,
            event_sum_seconds=s1 - s0,
            sum_error=sum_error,
            per_step_median_error=median_error,
            per_step_max_abs_error=max(abs(r - 1) for r in ratios),
            mean_step_ms=1000 * wall / n,
            loss_loop=expected,
            loss_exported=got,
            device=tracker.config.peak.device,
            peak_flops=peak,
            mfu=mfu,
            internal_errors=_internal_errors(tracker),
        )
        assert abs(sum_error) < 0.02, (s1 - s0, wall)
        assert abs(median_error) < 0.02, ratios
        assert got == pytest.approx(expected, rel=1e-6)
        assert peak is not None and peak > 0, f"no peak FLOP/s row for {torch.cuda.get_device_name()}"
        assert not _internal_errors(tracker)
    finally:
        tracker.close()


def test_tracked_loop_never_synchronizes(tmp_path: Path) -> None:
    import torch

    model, opt, tracker, cfg = _setup(tmp_path)
    batches = _batches(4, cfg)
    try:
        tracker.step(loss=_train_step(model, opt, batches[0]))
        torch.cuda.synchronize()
        with sync_log() as syncs:
            torch.cuda.set_sync_debug_mode("error")  # the training thread: any sync raises here
            for i in range(50):
                loss = _train_step(model, opt, batches[i % len(batches)])
                tracker.step(loss=loss)
                if i % 10 == 0:
                    with tracker.phase("eval"):
                        pass
                tracker.snapshot()  # what the housekeeping thread and a scrape do, here on this thread
            torch.cuda.set_sync_debug_mode("warn")
            time.sleep(1.5)  # the housekeeping thread folds (in mode warn: its syncs are recorded)
            tracker.snapshot()
        ours = [s for s in syncs if s.ours]
        record(
            "sync_free_loop",
            steps=50,
            syncs_total=len(syncs),
            syncs_babysitter=len(ours),
            where=sorted({s.where() for s in syncs}),
            internal_errors=_internal_errors(tracker),
        )
        assert not ours, [s.where() for s in ours]
        assert not _internal_errors(tracker)
        assert tracker.steps == 51
    finally:
        torch.cuda.set_sync_debug_mode("default")
        tracker.close()


# ------------------------------------------------------------------------------------------ frameworks


def _check_callback(check: str, tracker: Any, wrapped: list[str], syncs: list[Any], steps: int) -> None:
    """Record what a callback run did, then assert babysitter neither synchronized nor failed."""
    assert tracker is not None
    ours = [s for s in syncs if s.ours]
    record(
        check,
        hooks_in_error_mode=wrapped,
        steps=tracker.steps,
        syncs_total=len(syncs),
        syncs_babysitter=len(ours),
        framework_sync_sites=sorted({s.where() for s in syncs if not s.ours}),
        internal_errors=_internal_errors(tracker),
    )
    assert wrapped, "no hook was wrapped: the check would prove nothing"
    assert not ours, [s.where() for s in ours]
    assert not _internal_errors(tracker)
    assert tracker.steps == steps
    assert sample_value(tracker.registry, S.INTERNAL_ERRORS.name) in (None, 0.0)


def test_lightning_callback_never_synchronizes(tmp_path: Path) -> None:
    import torch

    lightning = pytest.importorskip("lightning.pytorch")
    from babysitter.integrations.lightning import Babysitter

    cfg = CudaGptConfig()
    data = _batches(32, cfg)

    class Module(lightning.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_cuda_gpt(cfg)
            self.config = cfg

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            logits = self.model(batch[:, :-1])
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    loader = torch.utils.data.DataLoader(data, batch_size=None)  # batches already on the GPU
    callback = Babysitter(seq_len=SEQ, port=-1, run_dir=str(tmp_path / "run"), straggler_every=None)
    wrapped = strict_methods(callback, hook_names(type(callback), lightning.Callback))
    trainer = lightning.Trainer(
        accelerator="gpu",
        devices=1,
        max_steps=30,
        precision="bf16-mixed",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback],
    )
    module = Module()  # built (and moved to the GPU) before the log: its copies are not the loop's
    with sync_log() as syncs:
        trainer.fit(module, loader)
    _check_callback("sync_free_lightning", callback.core.tracker, wrapped, syncs, steps=30)


def test_hf_callback_never_synchronizes(tmp_path: Path) -> None:
    import torch

    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from babysitter.integrations.hf import Babysitter

    config = GPT2Config(vocab_size=8192, n_positions=SEQ, n_embd=512, n_layer=4, n_head=8)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    gen = torch.Generator().manual_seed(0)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 8192, (8 * 30, SEQ), generator=gen)]

    callback = Babysitter(port=-1, run_dir=str(tmp_path / "run"), straggler_every=None)
    wrapped = strict_methods(callback, [*hook_names(type(callback), TrainerCallback), "_pre_forward"])
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        max_steps=25,
        learning_rate=1e-4,
        logging_steps=5,
        report_to=[],
        bf16=True,
        save_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[callback])  # type: ignore[arg-type]
    with sync_log() as syncs:
        trainer.train()
    assert "_pre_forward" in wrapped and "on_step_end" in wrapped
    _check_callback("sync_free_hf", callback.tracker, wrapped, syncs, steps=25)


# ------------------------------------------------------------------------------------------ rank's GPU


def test_train_info_names_the_ranks_gpu_as_the_node_agent_does(tmp_path: Path) -> None:
    """train_info{uuid, pci_bus_id} of a CUDA rank: the labels the node agent's NVML collector exports for
    the GPU torch trains on, and the UUID torch itself reports for it (two independent sources)."""
    import torch

    from babysitter.node.gpu.collector import GpuCollector
    from babysitter.node.gpu.nvml import load_pynvml

    _model, _opt, tracker, _cfg = _setup(tmp_path)
    try:
        info = dict(tracker.snapshot().info)
    finally:
        tracker.close()
    agent = GpuCollector(load_pynvml(), gpm=False)
    agent.start()
    try:
        exported = {
            s.labels["uuid"]: s.labels["pci_bus_id"]
            for family in agent.collect()
            if family.name == N.GPU_UP.name
            for s in family.samples
        }
    finally:
        agent.close()
    torch_uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    record("rank_gpu_identity", info_uuid=info["uuid"], info_pci=info["pci_bus_id"], torch_uuid=torch_uuid)
    assert _internal_errors(tracker) == {}
    assert exported.get(info["uuid"]) == info["pci_bus_id"], (info, exported)
    assert info["uuid"].removeprefix("GPU-") == torch_uuid.removeprefix("GPU-")
    # Without nvidia-ml-py the rank spells torch's UUID itself: it must be NVML's spelling exactly.
    from babysitter.training.gpu import torch_uuid as spelled

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert spelled(props) == info["uuid"], (str(props.uuid), info["uuid"])
