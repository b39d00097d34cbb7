"""``babysitter flops CONFIG.json``: parameters, FLOPs per token and per step, and the throughput a
target MFU needs on a given device, from a Hugging Face ``config.json``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from babysitter import jsonout
from babysitter.views.flops import render_text

__all__ = ["register", "run"]

_TARGETS = (0.3, 0.4, 0.5)


def register(subparsers: Any) -> None:
    """Add the ``flops`` subcommand."""
    p = subparsers.add_parser(
        "flops",
        help="parameters, FLOPs per token/step and tokens/s for a target MFU, from a config.json",
        description=(
            "Model FLOPs per token (PaLM: 6N + 12·L·H·Q·T, N = active non-embedding matmul weights incl. the "
            "LM head) from a Hugging Face config.json; see docs/flops.md for the conventions."
        ),
    )
    p.add_argument("config", type=Path, help="a Hugging Face config.json")
    p.add_argument("--seq-len", type=int, help="training sequence length (decoder/target length for T5)")
    p.add_argument("--encoder-seq-len", type=int, help="encoder (input) length, encoder-decoder models only")
    p.add_argument(
        "--batch-tokens", type=int, help="tokens per optimizer step (whole job), for FLOPs per step"
    )
    p.add_argument("--device", help="device name for the peak (e.g. 'H100 SXM', 'NVIDIA H200', 'TPU v5e')")
    p.add_argument("--dtype", default="bf16", help="training dtype for the peak (default bf16)")
    p.add_argument(
        "--devices", type=int, default=1, help="devices in the job, for job-wide tokens/s (default 1)"
    )
    p.add_argument(
        "--target-mfu", type=float, action="append", help="MFU targets (repeatable; default 0.3 0.4 0.5)"
    )
    p.add_argument(
        "--recompute", default="none", choices=("none", "selective", "full"), help="activation recompute"
    )
    p.add_argument("--causal-halved", action="store_true", help="count causal attention as about T/2 keys")
    p.add_argument("--prefix-len", type=int, default=0, help="bidirectional prefix length of a prefix-LM")
    p.add_argument(
        "--images-per-sequence", type=float, default=0.0, help="images per sequence (vision-language)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def _report(args: argparse.Namespace) -> dict[str, Any]:
    from babysitter import flops as F
    from babysitter import hardware as hw

    try:
        config = json.loads(args.config.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {args.config}: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{args.config} is not a JSON object")
    for name in ("seq_len", "encoder_seq_len", "batch_tokens"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    if args.devices <= 0:
        raise ValueError("--devices must be positive")
    arch = F.architecture_from_config(config)
    counts = F.count_parameters(arch)
    out: dict[str, Any] = {
        "config": str(args.config),
        "model_type": arch.family,
        "parameters": {
            "total": counts.total,
            "active": counts.active,
            "embedding": counts.embedding,
            "non_embedding": counts.non_embedding,
            "active_non_embedding": counts.active_non_embedding,
        },
    }
    if args.seq_len is None:
        out["note"] = "FLOPs need --seq-len (the attention term grows with the training sequence length)"
        return out
    b = F.estimate_breakdown(
        config,
        seq_len=args.seq_len,
        recompute=args.recompute,
        causal_halved=args.causal_halved,
        encoder_seq_len=args.encoder_seq_len,
        prefix_len=args.prefix_len,
        images_per_sequence=args.images_per_sequence,
    )
    per_token = b.per_token()
    out["seq_len"] = args.seq_len
    if args.encoder_seq_len is not None:
        out["encoder_seq_len"] = args.encoder_seq_len
    out["flops_per_token"] = {
        "model": per_token.model,
        "hardware": per_token.hardware,
        "source": per_token.source,
        "forward": {
            "dense": b.dense_forward,
            "attention": b.attention_forward,
            "lm_head": b.lm_head_forward,
            "vision": b.vision_forward,
        },
    }
    if args.batch_tokens is not None:
        out["batch_tokens"] = args.batch_tokens
        out["flops_per_step"] = {
            "model": per_token.model * args.batch_tokens,
            "hardware": per_token.hardware * args.batch_tokens,
        }
    if args.device:
        entry = hw.lookup_peak(args.device, args.dtype)
        if entry is None:
            raise LookupError(
                f"no dense {hw.normalize_dtype(args.dtype)} peak for device {args.device!r}; "
                f"table rows: {', '.join(hw.PEAK_TABLE)}"
            )
        targets = args.target_mfu or list(_TARGETS)
        out["device"] = {
            "name": args.device,
            "row": entry.device,
            "dtype": entry.dtype,
            "peak_flops_per_second": entry.flops_per_second,
            "source": entry.source,
            "devices": args.devices,
        }
        out["tokens_per_second_for_mfu"] = {
            f"{t:g}": {
                "per_device": F.tokens_per_second_for_mfu(per_token.model, entry.flops_per_second, t),
                "job": F.tokens_per_second_for_mfu(
                    per_token.model, entry.flops_per_second, t, devices=args.devices
                ),
            }
            for t in targets
        }
        if args.batch_tokens is not None:
            out["step_seconds_for_mfu"] = {
                key: args.batch_tokens / need["job"] for key, need in out["tokens_per_second_for_mfu"].items()
            }
    return out


def run(args: argparse.Namespace) -> int:
    """Print the report; 0 on success, 1 on a bad config, device or dtype (message on stderr)."""
    try:
        report = _report(args)
    except (ValueError, LookupError, TypeError) as exc:
        sys.stderr.write(f"babysitter flops: {exc}\n")
        return 1
    if args.json:
        sys.stdout.write(jsonout.dumps(report, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(render_text(report) + "\n")
    return 0
