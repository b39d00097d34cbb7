"""The demo's training run: a tiny GPT on CPU, tracked by ``babysitter.watch``, with real checkpoints.

Run as a child process by the demo (``python -m babysitter.demo.trainer ...``); it is an ordinary
training script: resume from the newest checkpoint in the run directory, train, save a checkpoint every
``--checkpoint-interval`` seconds of demo time (atomic rename, the newest three kept), stop cleanly on
SIGTERM. Saving on the demo's clock rather than every N steps keeps the progress a kill loses the same
from one machine to the next, whatever the startup took. The
tracker writes the goodput ledger into the same run directory and registers its endpoint for the node
agent.

Six faults of the scenario play in here, at their time since ``--t0`` (the demo's start), so that a
restarted process does not replay the ones before it started: a slow checkpoint save (the save blocks
for the given seconds, as on a slow file system), a hang (the loop stops stepping while the process
still answers scrapes, as in a stuck collective), a slow input pipeline (for the given seconds each
batch waits ``wait`` seconds in the loader, which the loop reads through ``tracker.data()``, outside
the step's pace), an eval phase (forward passes without gradients for the given seconds, inside
``tracker.phase("eval")``) and a bad loss (for the given seconds the logits are scaled up
:data:`SPIKE_SCALE` times, ``loss_spike``, or made NaN, ``nan_loss``; the loop skips those updates,
as a spike guard or AMP's grad scaler would, so the model is the same after it). A ``throttle`` on the
simulated GPU the training claims (``gpu_clock`` events from the demo) stretches each step's pace to the
simulator's throttled SM clock, as a throttled GPU slows the training on it. The product's hang watchdog
(:mod:`babysitter.training.watchdog`, started by ``watch()``) books that time as ``hang`` in the
ledger, exactly as in production; the demo only lowers its floor (``watch(hang_floor=...)``,
``--hang-floor``, 5 s here against production's 300 s) so that a hang of seconds counts. A hang due
before this process has finished :data:`_ARMED_STEPS` steps waits for them: until it has two step
times the watchdog holds its start-up threshold (imports and compilation are not a hang), and its
threshold is 10 x the median step time, which the first slow steps (the first backward pass, a
loaded machine) would hold above a few seconds' hang; a restart slower than planned would play the
hang unbooked.

Steps are paced (``--pace`` seconds each at least; the pause sits inside the step, as a slower model
would) so the demo leaves CPU for everything else on a small machine. MFU is measured against the
single-thread float32 matmul throughput of this CPU, calibrated once per run and kept in the run
directory, so restarts compare against the same peak.

A CPU has no GPU, so ``train_info`` would carry no ``uuid`` and the rank-to-GPU join (docs/rank-gpu.md)
would see nothing of the simulated node. With ``--simulated-gpu N`` (the demo passes it; nothing else
does) this process claims the simulated node's GPU ``N``: its uuid and bus id exactly as the node
agent's simulator exports them (:func:`simulated_gpu_labels`), set where ``watch()`` puts what it reads
from torch and NVML on a CUDA rank. Without the option, as in any real CPU run, there is no GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "HANG_FLOOR",
    "SPIKE_SCALE",
    "Loader",
    "TinyConfig",
    "gpu_clock_at",
    "main",
    "simulated_gpu_labels",
    "train_step",
]

log = logging.getLogger("babysitter.demo.trainer")

_CKPT = re.compile(r"^step-(\d{8})\.pt$")
_KEEP = 3
#: The hang watchdog's floor in the demo (``watch(hang_floor=...)``; production's default is 300 s).
HANG_FLOOR = 5.0
#: Steps of this process before a scripted hang can play: the watchdog leaves its start-up threshold
#: after three, and with ten the median it scales is the paced steps', not the first slow ones.
_ARMED_STEPS = 10
#: How much ``loss_spike`` scales the logits: the loss jumps far above its median (random tokens: ~5.5).
SPIKE_SCALE = 30.0
#: The eval batch's seed: one held-out batch, none of the training's (seeded by their step).
_EVAL_SEED = 2**40


@dataclass(frozen=True)
class TinyConfig:
    """GPT-2-style hyperparameters (attribute names as in Hugging Face's GPT2Config)."""

    vocab_size: int = 256
    n_positions: int = 64
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4


def build_model(cfg: TinyConfig) -> Any:
    """A tiny GPT-style decoder in plain torch (pre-LN blocks, causal attention, untied LM head)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(cfg.n_embd)
            self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, batch_first=True)
            self.ln2 = nn.LayerNorm(cfg.n_embd)
            self.mlp = nn.Sequential(
                nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
            )

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            out: torch.Tensor = x + self.mlp(self.ln2(x))
            return out

    class TinyGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = cfg
            self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.n_embd)
            self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            t = idx.shape[1]
            mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
            x = self.wte(idx) + self.wpe(torch.arange(t))
            for block in self.blocks:
                x = block(x, mask)
            logits: torch.Tensor = self.head(self.ln_f(x))
            return logits

    return TinyGPT()


def flops_per_token(model: Any, seq_len: int) -> float:
    """PaLM's 6N + 12·L·H·Q·T (N: parameters without the token and position embeddings)."""
    cfg: TinyConfig = model.config
    n = sum(p.numel() for name, p in model.named_parameters() if not name.startswith(("wte", "wpe")))
    return float(6 * n + 12 * cfg.n_layer * cfg.n_embd * seq_len)


def calibrate_peak(seconds: float = 0.3) -> float:
    """Single-thread float32 matmul FLOP/s of this CPU: the demo's stand-in for a GPU's dense peak."""
    import torch

    a = torch.randn(256, 256)
    b = torch.randn(256, 256)
    torch.mm(a, b)
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        torch.mm(a, b)
        n += 1
    return 2 * 256**3 * n / elapsed


def _peak(run_dir: Path) -> float:
    path = run_dir / "demo-peak.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        value = float(json.loads(path.read_text())["peak_flops"])
        if value > 0:
            return value
    value = calibrate_peak()
    with contextlib.suppress(OSError):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"peak_flops": value, "what": "1-thread fp32 matmul FLOP/s"}))
        tmp.replace(path)
    return value


class Loader:
    """The training's input pipeline: step ``n``'s batch is the same after a restart (seeded by ``n``);
    while a scripted stall lasts (:meth:`stall`), each batch first waits, as a starved loader does."""

    def __init__(self, vocab_size: int, batch: int, seq_len: int, *, step: int = 0) -> None:
        self.vocab_size, self.batch, self.seq_len = vocab_size, batch, seq_len
        self.step = step
        self.stall_until = 0.0
        self.wait = 0.0

    def stall(self, until: float, wait: float) -> None:
        """Each batch waits ``wait`` seconds until Unix time ``until``."""
        self.stall_until, self.wait = until, wait

    def batch_for(self, seed: int) -> Any:
        """The batch (tokens and, shifted by one, targets) that ``seed`` draws."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.vocab_size, (self.batch, self.seq_len + 1), generator=gen)

    def __iter__(self) -> Iterator[Any]:
        while True:
            if self.wait and time.time() < self.stall_until:
                time.sleep(self.wait)
            yield self.batch_for(self.step)


def simulated_gpu_labels(index: int) -> dict[str, str]:
    """``train_info``'s GPU labels for the node agent's simulated GPU ``index`` (demo and tests only)."""
    from babysitter.labels import normalize_pci_bus_id
    from babysitter.node.gpu.fake import fake_gpus

    gpu = fake_gpus(index + 1)[index]
    return {"uuid": gpu.uuid, "pci_bus_id": normalize_pci_bus_id(gpu.pci_bus_id)}


def _checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    found = []
    with contextlib.suppress(OSError):
        for entry in ckpt_dir.iterdir():
            match = _CKPT.match(entry.name)
            if match:
                found.append((int(match.group(1)), entry))
    return sorted(found)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m babysitter.demo.trainer", description=__doc__)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--registry-dir", type=Path, required=True)
    p.add_argument("--run", default="demo")
    p.add_argument(
        "--t0", type=float, default=None, help="Unix time the demo started (event times count from it)"
    )
    p.add_argument("--events", default="[]", help="JSON list of trainer faults: {at, event, seconds}")
    p.add_argument(
        "--checkpoint-interval", type=float, default=10.0, help="seconds of demo time between saves"
    )
    p.add_argument("--pace", type=float, default=0.1, help="minimum seconds per step")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument(
        "--hang-floor",
        type=float,
        default=HANG_FLOOR,
        help="the watchdog's floor: watch(hang_floor=...), seconds without a step it may call a hang",
    )
    p.add_argument("--max-steps", type=int, default=0, help="stop after this global step (0: until SIGTERM)")
    p.add_argument("--cluster", default="demo")
    p.add_argument(
        "--simulated-gpu",
        type=int,
        default=None,
        help="demo only: claim the simulated node's GPU N in train_info (a CPU run has no GPU of its own)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train until SIGTERM/SIGINT (or ``--max-steps``); 0 after a clean stop."""
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    started = _started()
    t0 = args.t0 if args.t0 is not None else started
    scripted = sorted(json.loads(args.events), key=lambda e: float(e["at"]))
    events = [e for e in scripted if float(e["at"]) >= started - t0]
    # A restarted process starts on the GPU as it is: throttled still, if it throttled before.
    initial_clock = gpu_clock_at(scripted, started - t0)

    import torch

    import babysitter

    torch.set_num_threads(1)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = args.run_dir / "checkpoints"
    ckpt_dir.mkdir(exist_ok=True)
    cfg = TinyConfig(n_positions=max(64, args.seq_len))
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = args.batch * args.seq_len
    tracker = babysitter.watch(
        model,
        run=args.run,
        tokens_per_step=tokens,
        samples_per_step=args.batch,
        flops_per_token=flops_per_token(model, args.seq_len),
        peak_flops=_peak(args.run_dir),
        dtype="fp32",
        port=0,
        run_dir=args.run_dir,
        registry_dir=args.registry_dir,
        labels={"cluster": args.cluster},
        flush_interval=0.5,
        mfu_window=20.0,
        timing="cpu",
        hang_floor=args.hang_floor,
    )
    if args.simulated_gpu is not None:
        tracker.gpu = simulated_gpu_labels(args.simulated_gpu)
    step = 0
    existing = _checkpoints(ckpt_dir)
    if existing:
        step, path = existing[-1]
        with tracker.checkpoint_load(step=step, path=str(path)):
            state = torch.load(path, weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
        log.info("demo trainer: resumed from step %d (%s)", step, path.name)
    slow_save = 0.0
    bad_loss_until, bad_scale = 0.0, 1.0
    clock = initial_clock  # the claimed simulated GPU's SM clock over its unthrottled one
    first_step = step
    loader = Loader(cfg.vocab_size, args.batch, args.seq_len, step=step)
    batches = iter(tracker.data(loader))
    saved_slot = int((time.time() - t0) // args.checkpoint_interval)
    try:
        while not stop.is_set() and not (args.max_steps and step >= args.max_steps):
            now = time.time() - t0
            while events and float(events[0]["at"]) <= now:
                if events[0]["event"] == "hang" and step - first_step < _ARMED_STEPS:
                    break  # the watchdog is still on its start-up threshold
                event = events.pop(0)
                if event["event"] == "slow_checkpoint":
                    slow_save = float(event["seconds"])
                elif event["event"] == "hang":
                    log.warning("demo trainer: hanging for %.0f s (scenario)", float(event["seconds"]))
                    stop.wait(float(event["seconds"]))
                elif event["event"] == "slow_data":
                    log.warning(
                        "demo trainer: input pipeline slow for %.0f s (scenario)", float(event["seconds"])
                    )
                    loader.stall(t0 + float(event["at"]) + float(event["seconds"]), float(event["wait"]))
                elif event["event"] in ("loss_spike", "nan_loss"):
                    log.warning(
                        "demo trainer: %s for %.0f s (scenario)", event["event"], float(event["seconds"])
                    )
                    bad_loss_until = t0 + float(event["at"]) + float(event["seconds"])
                    bad_scale = SPIKE_SCALE if event["event"] == "loss_spike" else math.nan
                elif event["event"] == "gpu_clock":
                    # The claimed simulated GPU's SM clock changed (a throttle, or its end): compute
                    # takes 1/factor as long, as on a GPU that slows down.
                    clock = float(event["factor"])
                    log.warning("demo trainer: the GPU's clock at %.0f%%, steps slow with it", clock * 100)
                elif event["event"] == "eval":
                    _evaluate(
                        tracker, model, loader, seconds=float(event["seconds"]), pace=args.pace, stop=stop
                    )
            loader.step = step
            data = next(batches)  # outside the step's pace: a data wait lengthens the step
            t_step = time.perf_counter()
            loss = train_step(model, opt, data, scale=bad_scale if time.time() < bad_loss_until else None)
            rest = args.pace / clock - (time.perf_counter() - t_step)
            if rest > 0:
                time.sleep(rest)
            step += 1
            tracker.step(loss=loss.detach())
            slot = int((time.time() - t0) // args.checkpoint_interval)
            if slot > saved_slot or slow_save:
                _save(tracker, model, opt, ckpt_dir=ckpt_dir, step=step, extra_seconds=slow_save)
                slow_save = 0.0
                saved_slot = slot
    finally:
        tracker.close(clean=True)
    log.info("demo trainer: stopped at step %d", step)
    return 0


def _started() -> float:
    """When this process was created: the events before it belong to an earlier incarnation. Not when
    ``main`` runs: on a loaded machine the interpreter's start-up took long enough that an event due
    in it was dropped as if it came before the process."""
    try:  # the kernel's clock ticks since boot at the process's start, against the uptime now
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - max(uptime - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):  # no /proc: the time main runs is the next best
        return time.time()


def gpu_clock_at(events: list[dict[str, Any]], at: float) -> float:
    """The claimed GPU's clock factor ``at`` seconds into the scenario: the last ``gpu_clock`` event's
    before then (1.0 before any). A training restarted after a throttle began runs throttled (issue
    22's demo restarted at full speed on a GPU the simulator still throttled)."""
    factor = 1.0
    for event in events:
        if float(event["at"]) < at and event.get("event") == "gpu_clock":
            factor = float(event["factor"])
    return factor


def train_step(model: Any, opt: Any, data: Any, *, scale: float | None = None) -> Any:
    """One optimizer step on ``data`` (tokens, targets shifted by one); the loss tensor. With ``scale``
    (a scripted bad stretch) the logits are scaled by it and the update is skipped."""
    import torch

    logits = model(data[:, :-1])
    if scale is not None:
        logits = logits * scale
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), data[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    if scale is None:
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    return loss


def _evaluate(tracker: Any, model: Any, loader: Loader, *, seconds: float, pace: float, stop: Any) -> None:
    """An eval phase: forward passes without gradients for ``seconds``, marked ``phase("eval")``."""
    import torch

    log.warning("demo trainer: eval phase for %.0f s (scenario)", seconds)
    end = time.monotonic() + seconds
    data = loader.batch_for(_EVAL_SEED)
    with tracker.phase("eval"), torch.no_grad():
        while time.monotonic() < end and not stop.is_set():
            model(data[:, :-1])
            stop.wait(min(pace, max(0.0, end - time.monotonic())))


def _save(tracker: Any, model: Any, opt: Any, *, ckpt_dir: Path, step: int, extra_seconds: float) -> None:
    import torch

    path = ckpt_dir / f"step-{step:08d}.pt"
    tmp = path.with_name(f".{path.name}.tmp")
    with tracker.checkpoint_save(step=step, path=str(path)) as ckpt:
        if extra_seconds:
            log.warning("demo trainer: slow storage, this save blocks %.0f s (scenario)", extra_seconds)
            time.sleep(extra_seconds)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        tmp.replace(path)
        ckpt.nbytes = path.stat().st_size
    for _, old in _checkpoints(ckpt_dir)[:-_KEEP]:
        with contextlib.suppress(OSError):
            old.unlink()


if __name__ == "__main__":
    sys.exit(main())
