"""Per-step overhead of the Lightning and Hugging Face callbacks, side by side with Lightning's
ThroughputMonitor, on the same tiny CPU training loop, in one run.

Two measurements:

1. **Hooks alone** (precise): the hooks each callback runs per optimizer step, called in a tight
   loop against the real Trainer objects of a finished fit, so framework time is not in the number.
2. **End to end** (what a user sees): the same tiny fit (a 32x32 linear layer, batch 8, CPU) with no
   callback, with ``Babysitter``, and with ``ThroughputMonitor``; contenders run interleaved in
   rounds so machine noise hits all alike; medians of per-round wall time per step.

    .venv/bin/python benchmarks/bench_callbacks.py [--steps 400] [--rounds 5] [--hook-calls 20000] \
        [--out benchmarks/results/callbacks.md]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from machine import cpu_model

logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")


def _lightning() -> Any:
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 32)

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.layer(batch["x"]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return L, Tiny


def _loader(steps: int) -> torch.utils.data.DataLoader[Any]:
    ids = torch.randint(0, 100, (steps * 8, 16))
    rows = [{"x": torch.randn(32), "input_ids": ids[i]} for i in range(steps * 8)]
    return torch.utils.data.DataLoader(rows, batch_size=8)  # type: ignore[arg-type]


def _callback(name: str) -> list[Any]:
    if name == "none":
        return []
    if name == "babysitter":
        from babysitter.integrations.lightning import Babysitter

        return [
            Babysitter(port=-1, ledger=False, hang_timeout=None, straggler_every=None, flops_per_token=1e3)
        ]
    from lightning.pytorch.callbacks import ThroughputMonitor

    return [
        ThroughputMonitor(batch_size_fn=lambda b: b["x"].shape[0], length_fn=lambda b: b["input_ids"].numel())
    ]


def fit(name: str, steps: int) -> tuple[float, Any]:
    """Seconds per optimizer step of one tiny fit, and the trainer."""
    L, Tiny = _lightning()
    callbacks = _callback(name)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        log_every_n_steps=10**9,
    )
    loader = _loader(steps)
    model = Tiny()
    t0 = time.perf_counter()
    trainer.fit(model, loader)
    return (time.perf_counter() - t0) / steps, (trainer, model, callbacks)


def hooks_per_step(name: str, calls: int) -> float:
    """Nanoseconds of the callback's own hooks per optimizer step (train batch start/end, before backward)."""
    from lightning.pytorch.trainer.states import RunningStage, TrainerFn

    _, (trainer, model, callbacks) = fit(name, 5)
    cb = callbacks[0]
    batch = next(iter(_loader(1)))
    loss = torch.tensor(1.0)
    outputs = {"loss": loss}
    trainer.state.fn, trainer.state.stage = TrainerFn.FITTING, RunningStage.TRAINING
    if name == "babysitter":
        cb.core.tracker = None  # closed at teardown: start a fresh tracker as a new fit would
        cb._start(trainer, model, None)
    else:
        cb.setup(trainer, model, "fit")
        cb.on_train_start(trainer, model)
    progress = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
    best = float("inf")
    step = trainer.global_step
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for i in range(calls):
            step += 1
            progress.completed = step  # what the optimizer step does to trainer.global_step
            cb.on_train_batch_start(trainer, model, batch, i)
            cb.on_before_backward(trainer, model, loss)
            cb.on_train_batch_end(trainer, model, outputs, batch, i)
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    if name == "babysitter":
        assert cb.core.tracker.steps == 3 * calls  # every emulated optimizer step counted once
        cb.core.close()
    return best


def hf_hooks_per_step(calls: int) -> float:
    """Nanoseconds of the Hugging Face callback's work per optimizer step (forward pre-hook + on_step_end)."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerControl, TrainerState, TrainingArguments

    from babysitter.integrations.hf import Babysitter

    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    model.train()
    args = TrainingArguments(output_dir="/tmp/bench-callbacks-hf", report_to=[], use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    cb = Babysitter(port=-1, ledger=False, hang_timeout=None, straggler_every=None, seq_len=16)
    cb.on_train_begin(args, state, control, model=model)
    inputs = {"input_ids": torch.randint(0, 100, (4, 16))}
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            cb._pre_forward(model, (), inputs)  # what the registered hook runs per micro-batch
            state.global_step += 1
            cb.on_step_end(args, state, control)
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    assert cb.tracker is not None
    assert cb.tracker.steps == 3 * calls
    cb.on_train_end(args, state, control)
    return best


def hf_end_to_end(steps: int, with_callback: bool) -> float:
    """Seconds per step of a tiny Hugging Face Trainer run (GPT-2 from a config), with/without callback."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from babysitter.integrations.hf import Babysitter

    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    ids = torch.randint(0, 100, (steps * 4, 16))
    rows = [{"input_ids": ids[i], "labels": ids[i]} for i in range(steps * 4)]
    args = TrainingArguments(
        output_dir="/tmp/bench-callbacks-hf",
        per_device_train_batch_size=4,
        max_steps=steps,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=10**9,
        disable_tqdm=True,
    )
    callbacks = (
        [Babysitter(port=-1, ledger=False, hang_timeout=None, straggler_every=None, seq_len=16)]
        if with_callback
        else []
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    trainer.train()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hook-calls", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    names = ["none", "babysitter", "throughput_monitor"]
    fit(names[0], 20)  # warm up imports and allocator
    per_round: dict[str, list[float]] = {n: [] for n in names}
    hf: dict[bool, list[float]] = {False: [], True: []}
    hf_end_to_end(5, False)  # warm up the Trainer path
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]  # alternate so warm-up/drift does not favour one
        for name in order:
            per_round[name].append(fit(name, args.steps)[0])
        for flag in (False, True) if r % 2 == 0 else (True, False):
            hf[flag].append(hf_end_to_end(args.steps // 4, flag))
    hooks = {f"Lightning {n}": hooks_per_step(n, args.hook_calls) for n in names[1:]}
    hooks["Hugging Face babysitter"] = hf_hooks_per_step(args.hook_calls)
    base = statistics.median(per_round["none"])
    lines = [
        "# Callback overhead benchmark",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {cpu_model()}, {os.cpu_count()} logical CPUs (shared with other work), "
        f"{torch.get_num_threads()} torch threads, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}",
        f"- Command: `.venv/bin/python benchmarks/bench_callbacks.py --steps {args.steps} "
        f"--rounds {args.rounds} --hook-calls {args.hook_calls}`",
        "",
        "## Hooks alone, per optimizer step (best of 3 loops)",
        "",
        "| callback | ns per step |",
        "|---|---:|",
        *(f"| {n} | {v:.0f} |" for n, v in hooks.items()),
        "",
        f"## Lightning end to end: tiny fit, {args.steps} steps, {args.rounds} interleaved rounds (median)",
        "",
        "Contender order alternates between rounds.",
        "",
        "| callback | µs per step | overhead vs none (µs) | per-round µs |",
        "|---|---:|---:|---|",
    ]
    for name in names:
        med = statistics.median(per_round[name])
        lines.append(
            f"| {name} | {med * 1e6:.0f} | {(med - base) * 1e6:+.0f} | "
            + ", ".join(f"{v * 1e6:.0f}" for v in per_round[name])
            + " |"
        )
    hf_base = statistics.median(hf[False])
    hf_cb = statistics.median(hf[True])
    hf_rounds = {flag: ", ".join(f"{v * 1e6:.0f}" for v in hf[flag]) for flag in hf}
    lines += [
        "",
        f"## Hugging Face end to end: tiny GPT-2 Trainer, {args.steps // 4} steps, {args.rounds} rounds "
        "(median, order alternating)",
        "",
        "| callback | µs per step | overhead vs none (µs) | per-round µs |",
        "|---|---:|---:|---|",
        f"| none | {hf_base * 1e6:.0f} | +0 | {hf_rounds[False]} |",
        f"| babysitter | {hf_cb * 1e6:.0f} | {(hf_cb - hf_base) * 1e6:+.0f} | {hf_rounds[True]} |",
        "",
    ]
    lines += [
        "End-to-end rounds on a shared machine vary far more than any callback costs; the hooks-alone "
        "table is the cost, end to end is a sanity check.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
