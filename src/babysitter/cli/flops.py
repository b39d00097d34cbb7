"""``babysitter flops CONFIG.json``: parameters, FLOPs per token and per step, and the throughput a
target MFU needs on a given device, from a Hugging Face ``config.json``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from babysitter import jsonin, jsonout
from babysitter.terminal import clean
from babysitter.userfiles import read_regular
from babysitter.views.flops import render_text

_MAX_CONFIG = 16 << 20  # a model config is a few KB

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

    try:  # a regular file of sane size and depth (a FIFO or a 100,000-deep document: a clear error)
        config = jsonin.loads(read_regular(args.config, limit=_MAX_CONFIG), max_bytes=_MAX_CONFIG)
    except (OSError, ValueError) as exc:
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
        raise _NeedsSeqLen(_seq_len_hint(args.config, config))
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
        entry, note = _peak(args.device, args.dtype)
        targets = args.target_mfu or list(_TARGETS)
        out["device"] = {
            "name": args.device,
            "row": entry.device,
            "dtype": entry.dtype,
            "peak_flops_per_second": entry.flops_per_second,
            "source": entry.source,
            "devices": args.devices,
        }
        if note:
            out["device"]["note"] = note
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


class _NeedsSeqLen(ValueError):
    """No --seq-len: nothing to compute FLOPs per token from."""


#: Config keys that give a model's context length, the usual training sequence length.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length", "block_size")


def _seq_len_hint(path: Path, config: dict[str, Any]) -> str:
    context = next(
        ((k, config[k]) for k in _CONTEXT_KEYS if isinstance(config.get(k), int) and config[k] > 0), None
    )
    example = context[1] if context else 4096
    said = f" (its {context[0]} is {context[1]})" if context else ""
    return (
        f"FLOPs per token need --seq-len, the training sequence length (the attention term grows with "
        f"it): e.g. babysitter flops {path} --seq-len {example}{said}"
    )


def _peak(device: str, dtype: str) -> tuple[Any, str]:
    """The peak row for --device and --dtype, and the note to print with it; LookupError naming the
    flags to pass when the table has no row (the library's own warning names Python arguments)."""
    from babysitter import hardware as hw

    key = hw.normalize_dtype(dtype)
    match = hw.canonical_device(device)
    if match.device is None:
        if match.choices:
            raise LookupError(
                f"--device {device!r}: {match.reason}; pass one of --device "
                f"{hw.describe_rows(match.choices, key)}"
            )
        close = hw.did_you_mean(device)
        hint = f"did you mean --device {' or '.join(repr(c) for c in close)}? " if close else ""
        raise LookupError(
            f"no dense {key} peak for device {device!r} ({match.reason}): {hint}the table's rows: "
            f"{', '.join(hw.PEAK_TABLE)}; or leave --device out for FLOPs without a peak"
        )
    row = hw.PEAK_TABLE[match.device]
    if key not in row.peaks:
        raise LookupError(
            f"no dense {key} peak for device {device!r} ({row.device} has: {', '.join(row.peaks)}): "
            f"pass one of them with --dtype"
        )
    entry = hw.PeakEntry(device=row.device, dtype=key, flops_per_second=row.peaks[key], source=row.source)
    return entry, match.note


def run(args: argparse.Namespace) -> int:
    """Print the report; 0 on success, 1 on a bad config, device or dtype, 2 without --seq-len
    (message on stderr)."""
    try:
        report = _report(args)
    except _NeedsSeqLen as exc:
        sys.stderr.write(clean(f"babysitter flops: {exc}") + "\n")
        return 2
    except (ValueError, LookupError, TypeError) as exc:
        sys.stderr.write(clean(f"babysitter flops: {exc}") + "\n")  # quotes the config's values
        return 1
    if args.json:
        sys.stdout.write(jsonout.dumps(report, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(render_text(report) + "\n")
    return 0
