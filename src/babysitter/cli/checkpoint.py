"""``babysitter checkpoint verify PATH`` and ``babysitter checkpoint manifest PATH``: check a checkpoint
against its manifest before resuming from it (a job's prolog, by hand), or write the manifest of one
saved without the tracker (:mod:`babysitter.checkpoints`).

``verify`` reads every byte back (``--sizes-only``: sizes and headers) and exits 0 when the checkpoint
verifies, 1 when it does not (each problem printed with its file), 2 when it has no readable manifest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from babysitter.terminal import clean

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``checkpoint`` subcommand with ``verify`` and ``manifest``."""
    p = subparsers.add_parser(
        "checkpoint",
        help="verify a checkpoint against its manifest, or write the manifest of one",
        description="Checkpoints that verify: check one against its manifest, or make its manifest.",
    )
    sub = p.add_subparsers(dest="checkpoint_command", metavar="ACTION")
    v = sub.add_parser("verify", help="check sizes, headers and every digest against the manifest")
    v.add_argument("path", type=Path, help="the checkpoint (directory or file)")
    v.add_argument("--sizes-only", action="store_true", help="sizes and headers only, no digests")
    v.add_argument("--json", action="store_true", help="print the result as JSON")
    v.set_defaults(func=_verify)
    m = sub.add_parser("manifest", help="write the manifest of a checkpoint saved without the tracker")
    m.add_argument("path", type=Path, help="the checkpoint (directory or file)")
    m.add_argument("--step", type=int, required=True, help="its training step")
    m.add_argument("--run", default="", help="the run's name")
    m.set_defaults(func=_manifest)
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])


def _verify(args: argparse.Namespace) -> int:
    from babysitter.checkpoints import verify_checkpoint

    manifest, mid, problems = verify_checkpoint(args.path, digests=not args.sizes_only, drop_cache=True)
    if args.json:
        out = {
            "path": str(args.path),
            "manifest": mid or None,
            "verified": manifest is not None and not problems,
            "problems": [p.__dict__ for p in problems],
        }
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    elif manifest is not None and not problems:
        what = "sizes and headers" if args.sizes_only or manifest.alg is None else f"every {manifest.alg}"
        sys.stdout.write(
            clean(
                f"{args.path}: verified ({len(manifest.files)} files, {manifest.nbytes} bytes, step "
                f"{manifest.step}: {what} match)"
            )
            + "\n"
        )
    else:
        for problem in problems:  # file names and details from the manifest: cleaned
            sys.stdout.write(clean(f"{args.path}: {problem.text()}") + "\n")
    if manifest is None:
        return 2
    return 1 if problems else 0


def _manifest(args: argparse.Namespace) -> int:
    from babysitter.checkpoints import build_manifest

    result = build_manifest(args.path, run=args.run, step=args.step, part_wait=0.0)
    if result.kind != "manifest":
        sys.stderr.write(clean(f"babysitter checkpoint manifest: {result.why or result.kind}") + "\n")
        return 1
    sys.stdout.write(
        clean(f"{result.path}: {result.hashed_bytes} bytes hashed in {result.seconds:.1f} s") + "\n"
    )
    return 0
