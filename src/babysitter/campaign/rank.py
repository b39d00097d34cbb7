"""One rank of the campaign's training job: lockstep data parallelism over gloo, run by ``torchrun``.

``python -m torch.distributed.run --nproc-per-node N -m babysitter.campaign.rank JOB.json``. Each rank
registers with the node agent of the simulated host the job file assigns it (its registration
directory) and claims that host's simulated GPU (``train_info``'s uuid and bus id, as ``watch()``
reads them from NVML on a CUDA rank), so every page can name a host, a GPU and a rank. Every step:
a forward and backward pass of a small MLP, a paced sleep (the step's compute: ``step_seconds`` with
seeded log-normal jitter), one ``all_reduce`` of the flattened gradients (DDP's last bucket), the
update. Lockstep makes every rank's step the slowest rank's. Rank 0 saves a checkpoint every
``checkpoint_every`` seconds through ``tracker.checkpoint_save`` (a manifest each, the newest
``keep`` kept) and writes the goodput ledger; a restarted job resumes from the newest checkpoint that
verifies (:func:`babysitter.checkpoints.resume.resume_point`), agreed on by all ranks.

The campaign plays the training-side faults through a control directory (:class:`Control`), read at
most every 0.2 s, never inside a collective:

* ``rank<r>.json`` (this rank alone, whenever it reads it): ``slow`` (compute time factor: a straggler,
  or a throttled GPU), ``data_wait`` (seconds each batch waits in the loader), ``nan`` (the loss it
  reports is NaN), ``diverge`` (a counter: each new value perturbs this rank's parameters once, as a
  flipped bit in its memory would), ``save_extra`` (rank 0: each save blocks that much longer, as on
  slow storage).
* ``job.json`` (every rank, at a given global step, so that they act together): ``evals`` (``[step,
  seconds]``: an eval phase of forward passes, ``tracker.phase("eval")``), ``slow_saves`` (``[step,
  seconds]``: rank 0's first save from that step blocks that much longer), ``stop_at`` (a planned stop:
  every rank leaves cleanly after that step, rank 0 saving first).

Rank 0 writes ``status.json`` (its global step and the time) about once a second, so the campaign can
pick a step a little ahead. SIGTERM (what ``torchrun`` sends when a peer died) ends the rank at its
next step or when its collective fails; either way its tracker closes, so only a rank that was killed
leaves a dead registration behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Control", "JobSettings", "checkpoint_name", "main"]

log = logging.getLogger("babysitter.campaign.rank")

#: Seconds between reads of the control files.
_POLL = 0.2


def checkpoint_name(step: int) -> str:
    """The file a checkpoint of ``step`` is saved as, under the run directory's ``checkpoints/``."""
    return f"step-{step:08d}.pt"


@dataclass
class RankSettings:
    """What ``rank<r>.json`` says (defaults: healthy)."""

    slow: float = 1.0
    data_wait: float = 0.0
    nan: bool = False
    diverge: int = 0
    save_extra: float = 0.0


@dataclass
class JobSettings:
    """What ``job.json`` says: actions every rank takes at the same global step."""

    evals: list[tuple[int, float]] = field(default_factory=list)
    slow_saves: list[tuple[int, float]] = field(default_factory=list)
    stop_at: int | None = None


def _number(value: object, default: float, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return default
    return min(max(float(value), low), high)


def _pairs(value: object) -> list[tuple[int, float]]:
    out = []
    if isinstance(value, list):
        for item in value[:100]:
            if isinstance(item, list) and len(item) == 2:
                out.append((int(_number(item[0], 0, 0, 1e12)), _number(item[1], 0.0, 0.0, 600.0)))
    return out


class Control:
    """The control directory, read when a file changed (its mtime), at most every :data:`_POLL` s."""

    def __init__(self, directory: Path, rank: int) -> None:
        self.directory = directory
        self.rank = rank
        self.mine = RankSettings()
        self.job = JobSettings()
        self._seen: dict[str, float] = {}
        self._next = 0.0

    def _read(self, name: str) -> dict[str, Any] | None:
        path = self.directory / name
        try:
            mtime = path.stat().st_mtime
            if self._seen.get(name) == mtime:
                return None
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        self._seen[name] = mtime
        return data if isinstance(data, dict) else None

    def poll(self, now: float) -> bool:
        """Re-read what changed; True when something did."""
        if now < self._next:
            return False
        self._next = now + _POLL
        changed = False
        mine = self._read(f"rank{self.rank}.json")
        if mine is not None:
            self.mine = RankSettings(
                slow=_number(mine.get("slow"), 1.0, 0.1, 50.0),
                data_wait=_number(mine.get("data_wait"), 0.0, 0.0, 60.0),
                nan=bool(mine.get("nan", False)),
                diverge=int(_number(mine.get("diverge"), 0, 0, 1e9)),
                save_extra=_number(mine.get("save_extra"), 0.0, 0.0, 600.0),
            )
            changed = True
        job = self._read("job.json")
        if job is not None:
            stop = job.get("stop_at")
            self.job = JobSettings(
                evals=_pairs(job.get("evals")),
                slow_saves=_pairs(job.get("slow_saves")),
                stop_at=int(_number(stop, 0, 0, 1e12)) if stop is not None else None,
            )
            changed = True
        return changed


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Train until SIGTERM or a planned stop; 0 after a clean stop."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m babysitter.campaign.rank JOB.json\n")
        return 2
    job = json.loads(Path(args[0]).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    import torch
    import torch.distributed as dist

    import babysitter
    from babysitter.labels import normalize_pci_bus_id
    from babysitter.node.gpu.fake import fake_gpus

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    host = int(job["hosts_of_rank"][rank])
    gpu = int(job["gpu_of_rank"][rank])
    run_dir = Path(job["run_dir"])
    ckpt_dir = run_dir / "checkpoints"
    ctl = Control(Path(job["ctl_dir"]), rank)
    torch.manual_seed(0)  # every rank starts from the same parameters: replicas
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
    tracker = babysitter.watch(
        model,
        run=job["run"],
        port=0,
        registry_dir=job["registries"][host],
        run_dir=run_dir if rank == 0 else None,
        labels={"cluster": job["cluster"]},
        flops_per_token=6 * 64 * 64 * 2,
        peak_flops=1e9,
        tokens_per_step=64,
        flush_interval=0.5,
        mfu_window=float(job.get("mfu_window", 20.0)),
        timing="cpu",
        straggler_every=int(job.get("straggler_every", 5)),
        straggler_timeout=120,
        replica_check_every=int(job.get("replica_check_every", 20)),
        hang_floor=float(job.get("hang_floor", 300.0)),
    )
    fake = fake_gpus(gpu + 1, host=int(job["host_ids"][host]))[gpu]
    tracker.gpu = {"uuid": fake.uuid, "pci_bus_id": normalize_pci_bus_id(fake.pci_bus_id)}
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    parts = _Parts(tracker, model, opt, torch, dist)
    step = _resume(parts, run_dir, rank)
    rng = random.Random(int(job.get("seed", 0)) * 1000 + rank + step)
    base, sigma = float(job["step_seconds"]), float(job.get("jitter", 0.1))
    every, keep = float(job["checkpoint_every"]), int(job.get("keep", 3))
    slot = int(time.time() // every)
    diverged, done_evals, done_saves = 0, set(), set()
    status_at = 0.0
    clean = False

    def batches() -> Any:
        while True:
            wait = ctl.mine.data_wait
            if wait:
                time.sleep(wait)
            yield torch.randn(16, 64, generator=torch.Generator().manual_seed(step * world + rank))

    data = iter(tracker.data(batches()))
    try:
        while not stop.is_set():
            now = time.time()
            ctl.poll(now)
            if ctl.job.stop_at is not None and step >= ctl.job.stop_at:
                clean = True
                break
            for at, seconds in ctl.job.evals:
                if at == step and at not in done_evals:
                    done_evals.add(at)
                    _evaluate(tracker, model, seconds, stop, torch)
            x = next(data)
            loss = model(x).pow(2).mean()
            loss.backward()
            time.sleep(base * ctl.mine.slow * math.exp(rng.gauss(0.0, sigma)))
            flat = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
            dist.all_reduce(flat)
            with torch.no_grad():
                offset = 0
                for p in model.parameters():
                    n = p.numel()
                    assert p.grad is not None
                    p.grad.copy_(flat[offset : offset + n].view_as(p) / world)
                    offset += n
            opt.step()
            opt.zero_grad(set_to_none=True)
            if ctl.mine.diverge != diverged:
                diverged = ctl.mine.diverge
                with torch.no_grad():  # a flipped bit: this replica's parameters differ from now on
                    next(iter(model.parameters())).view(-1)[rank] += 1e-3
                log.warning("campaign: rank %d parameters perturbed (diverged replica)", rank)
            step += 1
            tracker.step(loss=float("nan") if ctl.mine.nan else loss.detach())
            if rank == 0:
                extra = 0.0
                for at, seconds in ctl.job.slow_saves:
                    if at <= step and at not in done_saves:
                        done_saves.add(at)
                        extra = seconds
                now_slot = int(time.time() // every)
                if now_slot > slot or extra:
                    slot = now_slot
                    _save(parts, ckpt_dir, step, extra=extra + ctl.mine.save_extra, keep=keep)
                if time.time() >= status_at:
                    status_at = time.time() + 1.0
                    _write_json(ctl.directory / "status.json", {"step": step, "time": time.time()})
        if clean and rank == 0:
            _save(parts, ckpt_dir, step, extra=0.0, keep=keep)
    except Exception as exc:  # a peer died under a collective: the job is over for this rank
        log.warning("campaign: rank %d stops: %r", rank, exc)
    finally:
        tracker.close(clean=clean)
        log.info("campaign: rank %d stopped at step %d (clean=%s)", rank, step, clean)
    if clean:
        with contextlib.suppress(Exception):
            dist.barrier()
    os._exit(0 if clean else 1)  # no destroy_process_group: a peer may be gone


@dataclass(frozen=True)
class _Parts:
    """What the helpers below work on (torch and its modules imported in ``main``)."""

    tracker: Any
    model: Any
    opt: Any
    torch: Any
    dist: Any


def _resume(parts: _Parts, run_dir: Path, rank: int) -> int:
    """Every rank loads the checkpoint rank 0 chose: the newest that verifies (0: start afresh)."""
    tracker, model, opt, torch, dist = parts.tracker, parts.model, parts.opt, parts.torch, parts.dist
    ckpt_dir = run_dir / "checkpoints"
    choice = torch.tensor([-1], dtype=torch.int64)
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            from babysitter.checkpoints.resume import checkpoint_statuses, resume_point

            point = resume_point(checkpoint_statuses(run_dir))
            if point is not None:
                choice[0] = point.step
    dist.broadcast(choice, 0)
    step = int(choice[0])
    if step < 0:
        return 0
    path = ckpt_dir / checkpoint_name(step)
    with tracker.checkpoint_load(step=step, path=str(path)):
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    log.info("campaign: resumed from step %d", step)
    return step


def _evaluate(tracker: Any, model: Any, seconds: float, stop: threading.Event, torch: Any) -> None:
    end = time.monotonic() + seconds
    with tracker.phase("eval"), torch.no_grad():
        while time.monotonic() < end and not stop.is_set():
            model(torch.randn(16, 64))
            stop.wait(min(0.1, max(0.0, end - time.monotonic())))


def _save(parts: _Parts, ckpt_dir: Path, step: int, *, extra: float, keep: int) -> None:
    tracker, model, opt, torch = parts.tracker, parts.model, parts.opt, parts.torch
    path = ckpt_dir / checkpoint_name(step)
    tmp = path.with_name(f".{path.name}.tmp")
    with tracker.checkpoint_save(step=step, path=str(path)) as ckpt:
        if extra:
            time.sleep(extra)  # slow storage: the blocking part takes that much longer
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        tmp.replace(path)
        ckpt.nbytes = path.stat().st_size
    from babysitter.checkpoints.manifest import manifest_path

    saved = sorted(ckpt_dir.glob("step-*.pt"))
    for old in saved[:-keep]:
        for doomed in (old, manifest_path(old)):
            with contextlib.suppress(OSError):
                doomed.unlink()


if __name__ == "__main__":
    sys.exit(main())
