"""Kernel-log Xid source: parse rate, and the time to read a whole ring buffer at agent start.

- parse: ``parse_log`` over N generated lines (4% Xid lines in dmesg, ``/dev/kmsg`` and MIG formats,
  the rest noise), best of 5;
- history: a ``/dev/kmsg``-format file of S MiB (1% Xid records) read by ``KernelLogFollower`` from its
  start until it has caught up, the way the agent reads the ring buffer before NVML starts. Real ring
  buffers are ``log_buf_len`` (256 KiB to a few MiB on most distributions); 16 MiB is a generous bound.

Usage: python benchmarks/bench_kmsg.py [--lines 100000] [--mib 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from babysitter.node.xid.kmsg import KernelLogFollower, XidEvent, parse_log


def generate_lines(count: int) -> list[str]:
    rng = random.Random(count)
    buses = [f"0000:{b:02x}:00" for b in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)]
    lines = []
    for i in range(count):
        bus, kind = rng.choice(buses), rng.random()
        if kind < 0.02:
            mig = f"GPU-I:{i % 7 + 1:02d} GPU-CI:00"
            lines.append(f"[{i}.0] NVRM: Xid (PCI:{bus} {mig}): 13, pid={i}, name=python3, MIG")
        elif kind < 0.04:
            lines.append(f"6,{i},{i * 1000},-;NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, t")
        else:
            lines.append(f"[{i}.0] usb 1-1: new high-speed USB device number {i} using xhci_hcd")
    return lines


def bench_parse(count: int) -> tuple[float, int]:
    lines = generate_lines(count)
    best, found = float("inf"), 0
    for _ in range(5):
        start = time.perf_counter()
        found = len(parse_log(lines))
        best = min(best, time.perf_counter() - start)
    return best, found


def bench_history(mib: int) -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kmsg.txt"
        records = size = 0
        with path.open("w") as fh:
            while size < mib * 1024 * 1024:
                text = (
                    "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=python3, details"
                    if records % 100 == 0
                    else "mlx5_core 0000:19:00.0 eth0: Link up, 400Gbps, full duplex, flow control on"
                )
                line = f"6,{records},{records * 1000},-;{text}\n"
                fh.write(line)
                size += len(line)
                records += 1
        xids: list[XidEvent] = []
        done, stop = threading.Event(), threading.Event()
        follower = KernelLogFollower(
            str(path), lambda event, _live: xids.append(event), lambda _ok, _why: None, on_caught_up=done.set
        )
        start = time.perf_counter()
        thread = threading.Thread(target=follower.run, args=(stop,))
        thread.start()
        done.wait()
        elapsed = time.perf_counter() - start
        stop.set()
        thread.join()
    return elapsed, records, len(xids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None, help="append the Markdown result here")
    args = parser.parse_args()
    parse_s, parsed = bench_parse(args.lines)
    history_s, records, xids = bench_history(args.mib)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = platform.processor() or platform.machine()
    text = (
        f"\n## {now}\n\nMachine: {machine}, {os.cpu_count()} logical CPUs, "
        f"Python {platform.python_version()}, Linux {platform.release()}.\n"
        f"Command: `python benchmarks/bench_kmsg.py --lines {args.lines} --mib {args.mib}`\n\n"
        "| measure | value |\n|---|---|\n"
        f"| parse {args.lines} lines ({parsed} Xids), best of 5 | {parse_s * 1000:.0f} ms |\n"
        f"| read a {args.mib} MiB ring buffer at start ({records} records, {xids} Xids) | "
        f"{history_s * 1000:.0f} ms |\n"
    )
    sys.stdout.write(text)
    if args.out is not None:
        with args.out.open("a") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
