"""``babysitter probe``: qualify a cluster allocation (compute, memory, collective, storage, lemons).

Examples::

    babysitter probe --storage-path /ckpt --results-dir /var/lib/babysitter/probe
    torchrun --nnodes 16 --nproc-per-node 8 -m babysitter probe --storage-path /ckpt --json probe.json
    babysitter probe --device cpu --matmul-n 256 --skip storage
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from babysitter.terminal import clean

__all__ = ["register", "run"]

log = logging.getLogger("babysitter.probe")

_SIZES = (
    ("matmul_n", "side of the square matmul (default 8192 on GPUs, 1024 on CPUs)"),
    ("matmul_iterations", "matmuls per timed batch (default 50 GPU, 5 CPU)"),
    ("memory_bytes", "device memory copy size (default 1 GiB GPU, 64 MiB CPU)"),
    ("memory_iterations", "copies per timed batch (default 20 GPU, 5 CPU)"),
    ("host_device_bytes", "pinned host-device copy size (default 256 MiB)"),
    ("host_device_iterations", "host-device copies per timed batch (default 10)"),
    ("collective_bytes", "all-reduce size (default 256 MiB GPU, 4 MiB CPU)"),
    ("collective_iterations", "timed all-reduces (default 20 GPU, 10 CPU)"),
    ("storage_bytes", "checkpoint-sized file written per storage path (default 1 GiB GPU, 256 MiB CPU)"),
    ("repeats", "timed batches per measurement, best kept (default 3)"),
)


def register(subparsers: Any) -> None:
    """Add the ``probe`` subcommand."""
    from babysitter.probe.lemons import DEFAULT_FRACTION
    from babysitter.probe.runner import SECTIONS

    p = subparsers.add_parser(
        "probe",
        help="qualify an allocation: matmul vs peak, memory, host-device, all-reduce, storage; lemons",
        description=__doc__.split("\n\n")[0].replace("``", "") if __doc__ else None,
    )
    p.add_argument(
        "--device", choices=("auto", "cuda", "cpu"), default="auto", help="default: cuda if present"
    )
    p.add_argument(
        "--storage-path",
        type=Path,
        action="append",
        default=[],
        help="checkpoint directory to measure (repeatable; none: storage is skipped)",
    )
    p.add_argument(
        "--lemon-fraction",
        type=float,
        default=DEFAULT_FRACTION,
        help=f"flag what is more than this fraction below the fleet median (default {DEFAULT_FRACTION})",
    )
    p.add_argument("--skip", default="", help=f"comma-separated parts to leave out: {', '.join(SECTIONS)}")
    p.add_argument("--json", metavar="PATH", help="write the full report as JSON to PATH ('-': stdout)")
    p.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="write this host's results as probe-<host>.json here, for the node agent's probe collector",
    )
    p.add_argument("--fail-on-lemon", action="store_true", help="exit 1 when any lemon is flagged")
    p.add_argument("--timeout", type=float, default=600.0, help="collective setup/op timeout in seconds")
    for name, help_ in _SIZES:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=None, help=help_)
    p.add_argument(
        "--host",
        default=None,
        metavar="NAME",
        help="name to report this host as (default: its hostname; e.g. the node name in Kubernetes)",
    )
    p.add_argument("--test-slow-rank", type=int, action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--test-slow-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """0 on success (1 with --fail-on-lemon and lemons), 2 for bad arguments or a probe that cannot start."""
    from babysitter.probe.runner import ProbeConfig, run_probe
    from babysitter.views.probe import render_table

    sizes = {name: getattr(args, name) for name, _ in _SIZES if getattr(args, name) is not None}
    try:
        config = ProbeConfig(
            device=args.device,
            sizes=sizes,
            storage_paths=tuple(args.storage_path),
            lemon_fraction=args.lemon_fraction,
            skip=frozenset(s.strip() for s in args.skip.split(",") if s.strip()),
            results_dir=args.results_dir,
            timeout_seconds=args.timeout,
            host=args.host,
            slow_ranks=frozenset(args.test_slow_rank),
            slow_delay_seconds=args.test_slow_delay,
        )
        for path in config.storage_paths:
            if not path.is_dir():
                raise ValueError(f"--storage-path {path}: not a directory")
        report = run_probe(config)
    except (ValueError, ImportError) as exc:
        sys.stderr.write(clean(f"babysitter probe: {exc}") + "\n")
        return 2
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return 0  # rank 0 speaks for the job
    if args.json == "-":
        sys.stdout.write(report.to_json() + "\n")
    else:
        render_table(report)
        if args.json:
            try:
                Path(args.json).write_text(report.to_json() + "\n", encoding="utf-8")
            except OSError as exc:
                sys.stderr.write(clean(f"babysitter probe: cannot write {args.json}: {exc}") + "\n")
                return 2
    return 1 if args.fail_on_lemon and report.lemons else 0
