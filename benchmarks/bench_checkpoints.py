"""What verifying checkpoints and comparing replicas costs, on this machine, side by side in one run.

1. Digests against the disk: SHA-256, BLAKE2b and SHA-1 (``hashlib``, one core, through the same
   ``hash_range`` the manifest writer and the sentinel use) and ``zlib.crc32`` for reference, against
   this disk's write bandwidth (write + fsync of the same size) and its read bandwidth with cached
   pages dropped: the ratio says whether hashing keeps up with writing.
2. A manifest of a DCP-like checkpoint (8 shards) made in the background while a CPU training loop
   runs: the loop's mean step time with and without it (ratio), and the manifest's own time.
3. The sentinel's I/O per pass: a pass over a checkpoint larger than the budget reads the budget (and
   no more); a sizes-and-headers pass over 1,000 files, its time.
4. The replica check per check on CPU: the fingerprint of a model against one training step of that
   model (forward, backward, SGD), and what the other N-1 steps pay (the countdown).

    .venv/bin/python benchmarks/bench_checkpoints.py [--mib 512] [--out benchmarks/results/checkpoints.md]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import tempfile
import threading
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch

from babysitter.checkpoints import build_manifest
from babysitter.checkpoints.digest import BUFFER, hash_range
from babysitter.checkpoints.manifest import manifest_path
from babysitter.ledger import DEFAULT_FILE_NAME
from babysitter.ledger.records import CheckpointEnd, Start, encode, to_us
from babysitter.node.storage.sentinel import CheckpointSentinelCollector
from babysitter.training.replicas import ReplicaChecker
from machine import cpu_model

MIB = 1 << 20


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk(tmp: Path, mib: int) -> dict[str, float]:
    """Write + fsync, then a read with cached pages dropped, of ``mib`` MiB (MiB/s)."""
    block = os.urandom(4 * MIB)
    path = tmp / "disk.bin"
    t0 = time.perf_counter()
    with path.open("wb") as fh:
        for _ in range(mib // 4):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    write = mib / (time.perf_counter() - t0)
    _drop(path)
    t0 = time.perf_counter()
    with path.open("rb", buffering=0) as fh:
        while fh.read(4 * MIB):
            pass
    read = mib / (time.perf_counter() - t0)
    path.unlink()
    return {"write": write, "read": read}


def digests(tmp: Path, mib: int, rounds: int) -> dict[str, float]:
    """MiB/s of each digest over a cached file, through hash_range (best of ``rounds``, interleaved)."""
    path = tmp / "digest.bin"
    path.write_bytes(os.urandom(mib * MIB))
    buf = bytearray(BUFFER)
    best: dict[str, float] = {}
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(rounds):
            for alg in ("sha256", "blake2b", "sha1"):
                t0 = time.perf_counter()
                hash_range(fd, 0, mib * MIB, alg=alg, buf=buf)
                best[alg] = max(best.get(alg, 0.0), mib / (time.perf_counter() - t0))
            data = path.read_bytes()
            t0 = time.perf_counter()
            zlib.crc32(data)
            best["crc32 (zlib, reference)"] = max(
                best.get("crc32 (zlib, reference)", 0.0), mib / (time.perf_counter() - t0)
            )
        # Two threads at once: hashlib releases the GIL, so they scale where cores are free.
        t0 = time.perf_counter()
        threads = [
            threading.Thread(target=hash_range, args=(fd, 0, mib * MIB), kwargs={"buf": bytearray(BUFFER)})
            for _ in range(2)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        best["sha256, 2 threads (aggregate)"] = 2 * mib / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return best


def _mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), torch.randn(64, 512), torch.randn(64, 512)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def background_manifest(tmp: Path, mib: int, steps: int) -> dict[str, float]:
    """Mean step time alone and while a manifest of an 8-shard checkpoint is made on a nice-19 thread."""
    ckpt = tmp / "dcp"
    ckpt.mkdir()
    shard = os.urandom(mib // 8 * MIB)
    for i in range(8):
        (ckpt / f"__{i}_0.distcp").write_bytes(shard)
    (ckpt / ".metadata").write_bytes(b"x" * 4096)
    model, opt, x, y = _mlp()
    for _ in range(10):
        _step(model, opt, x, y)

    def steps_alone() -> list[float]:
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            _step(model, opt, x, y)
            out.append(time.perf_counter() - t0)
        return out

    alone = steps_alone()
    done: dict[str, float] = {}

    def make() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        result = build_manifest(ckpt, run="bench", step=1, rank=0, part_wait=0.0, dcp_metadata=False)
        done["seconds"] = result.seconds

    thread = threading.Thread(target=make)
    during: list[float] = []
    thread.start()
    while thread.is_alive():
        t0 = time.perf_counter()
        _step(model, opt, x, y)
        during.append(time.perf_counter() - t0)
    thread.join()
    after = steps_alone()
    base = statistics.mean(alone + after)
    return {
        "step_alone_ms": base * 1e3,
        "step_during_ms": statistics.mean(during) * 1e3,
        "ratio": statistics.mean(during) / base,
        "steps_during": len(during),
        "manifest_seconds": done["seconds"],
        "mib": mib,
    }


def sentinel_io(tmp: Path, mib: int, budget_mib: int) -> dict[str, float]:
    """Bytes one pass reads with a budget below the checkpoint's size, and a sizes-only pass's time
    over a 1,000-file checkpoint."""
    run = tmp / "run"
    run.mkdir()
    big = run / "big.bin"
    big.write_bytes(os.urandom(mib * MIB))
    many = run / "many"
    many.mkdir()
    for i in range(1000):
        (many / f"__{i}_0.distcp").write_bytes(b"\x00" * 512)
    for path in (big, many):
        build_manifest(path, run="bench", step=1 if path is big else 2, part_wait=0.0, dcp_metadata=False)
    now = time.time()
    lines = [encode(Start(t=to_us(now - 60), pst=to_us(now - 60), id="b1", host="h", pid=1, run="bench"))]
    for step, path in ((1, big), (2, many)):
        lines.append(
            encode(
                CheckpointEnd(
                    t=to_us(now - 30 + step),
                    op="save",
                    step=step,
                    ok=True,
                    nbytes=None,
                    path=str(path),
                    manifest=True,
                )
            )
        )
    (run / DEFAULT_FILE_NAME).write_bytes(b"".join(lines))
    out: dict[str, float] = {}
    c = CheckpointSentinelCollector(
        [run], refresh_seconds=0.0, wait_seconds=120.0, verify_bytes=budget_mib * MIB, walk_seconds=0.0
    )
    try:
        reads = []
        for _ in range(3):
            before = c.verifications.read_bytes
            t0 = time.perf_counter()
            c.check_now()
            reads.append((c.verifications.read_bytes - before, time.perf_counter() - t0))
        out["budget_mib"] = budget_mib
        out["read_mib_per_pass"] = statistics.mean(r for r, _ in reads) / MIB
        out["pass_seconds"] = statistics.mean(s for _, s in reads)
    finally:
        c.close()
    sizes = CheckpointSentinelCollector([run], refresh_seconds=0.0, verify_bytes=0, walk_seconds=0.0)
    try:
        t0 = time.perf_counter()
        for _ in range(5):
            sizes.check_now()
        out["sizes_pass_seconds"] = (time.perf_counter() - t0) / 5
    finally:
        sizes.close()
    manifest_bytes = manifest_path(many).stat().st_size
    out["manifest_kib_1000_files"] = manifest_bytes / 1024
    return out


def replica_cost(steps: int) -> list[dict[str, float]]:
    """Per check: the fingerprint (computed and read) against one training step, for two model sizes."""
    rows = []
    for width in (512, 2048):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, width)
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(64, width), torch.randn(64, width)
        checker = ReplicaChecker.__new__(ReplicaChecker)
        checker._torch, checker._fp, checker._params = torch, None, list(model.parameters())
        checker.tracker = SimpleNamespace(global_step=1)  # type: ignore[assignment]
        for _ in range(5):
            _step(model, opt, x, y)
        step_t, check_t = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            _step(model, opt, x, y)
            t1 = time.perf_counter()
            checker._fingerprint()
            checker._ready()
            t2 = time.perf_counter()
            step_t.append(t1 - t0)
            check_t.append(t2 - t1)
        params = sum(p.numel() for p in model.parameters())
        step_ms, check_ms = statistics.median(step_t) * 1e3, statistics.median(check_t) * 1e3
        rows.append(
            {"params_m": params / 1e6, "step_ms": step_ms, "check_ms": check_ms, "ratio": check_ms / step_ms}
        )
    return rows


def countdown_ns(calls: int) -> float:
    """What a step that is not a check pays: the countdown in after_step (ns per call)."""
    checker = ReplicaChecker.__new__(ReplicaChecker)
    checker.enabled, checker._count, checker._exchange_due, checker.every = True, 0, False, 1 << 60
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        checker.after_step()
    return (time.perf_counter_ns() - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="size of the files hashed and written")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent) as name:
        tmp = Path(name)
        d = disk(tmp, args.mib)
        h = digests(tmp, args.mib, args.rounds)
        bg = background_manifest(tmp, args.mib, 40)
        io = sentinel_io(tmp, args.mib, budget_mib=64)
    rep = replica_cost(30)
    tick = countdown_ns(1_000_000)
    lines = [
        "# Checkpoint verification and replica check: what they cost",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {cpu_model()}, {os.cpu_count()} logical CPUs (shared), {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"OpenSSL {getattr(hashlib, 'openssl_version', '') or __import__('ssl').OPENSSL_VERSION}",
        f"- Command: `.venv/bin/python benchmarks/bench_checkpoints.py --mib {args.mib} --rounds "
        f"{args.rounds}` (files in a temporary directory under benchmarks/, on this machine's root disk)",
        "",
        "## Digests against the disk (MiB/s, one core)",
        "",
        "| | MiB/s | / disk write |",
        "|---|---:|---:|",
        f"| disk write + fsync ({args.mib} MiB) | {d['write']:.0f} | 1.00 |",
        f"| disk read, cached pages dropped | {d['read']:.0f} | {d['read'] / d['write']:.2f} |",
        *(f"| {alg} | {v:.0f} | {v / d['write']:.2f} |" for alg, v in h.items()),
        "",
        "## A manifest made in the background while training steps",
        "",
        f"{bg['mib']} MiB in 8 shards hashed with SHA-256 on a nice-19 thread (the manifest writer's), while "
        "a CPU MLP (512-2048-512, batch 64, one torch thread) steps on the main thread:",
        "",
        "| mean step alone | mean step while hashing | ratio | steps while hashing | manifest took |",
        "|---:|---:|---:|---:|---:|",
        f"| {bg['step_alone_ms']:.2f} ms | {bg['step_during_ms']:.2f} ms | {bg['ratio']:.2f}x | "
        f"{bg['steps_during']:.0f} | {bg['manifest_seconds']:.2f} s |",
        "",
        "## The sentinel's I/O per pass",
        "",
        f"A {args.mib} MiB checkpoint and a 1,000-file one; budget {io['budget_mib']:.0f} MiB per pass:",
        "",
        "| digest MiB read per pass | pass time | sizes-and-headers pass (1,001 files) | manifest of 1,000 "
        "files |",
        "|---:|---:|---:|---:|",
        f"| {io['read_mib_per_pass']:.1f} | {io['pass_seconds']:.2f} s | "
        f"{io['sizes_pass_seconds'] * 1e3:.1f} ms | {io['manifest_kib_1000_files']:.0f} KiB |",
        "",
        "## The replica check on CPU, per check (median of 30)",
        "",
        "| model params | training step | fingerprint (sums + host read) | check / step |",
        "|---:|---:|---:|---:|",
        *(
            f"| {r['params_m']:.1f} M | {r['step_ms']:.2f} ms | {r['check_ms']:.2f} ms | {r['ratio']:.2f}x |"
            for r in rep
        ),
        "",
        f"A step that is not a check pays the countdown in `after_step`: {tick:.0f} ns. Every N steps the "
        "check costs the fingerprint above plus issuing one asynchronous gloo all_gather of 4 int64 (its "
        "wait is on gloo's thread); amortized over N = 100 steps that is check/step / 100. On CUDA the sums "
        "are kernels queued on the training stream and the copy is non-blocking: not yet measured (no GPU "
        "here; benchmarks/gpu_check.py measures it when one is lent).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
