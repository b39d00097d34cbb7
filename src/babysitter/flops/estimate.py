"""One entry point for analytic FLOPs: from a config, a model, or an architecture description."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from babysitter.flops.arch import Architecture
from babysitter.flops.configs import (
    NANOGPT_FIELDS,
    SUPPORTED_MODEL_TYPES,
    architecture_from_config,
    config_dict,
)
from babysitter.flops.formulas import (
    FlopsBreakdown,
    FlopsPerToken,
    ParameterCounts,
    breakdown,
    count_parameters,
)
from babysitter.flops.modules import FlopsUnavailable, from_module

__all__ = ["as_architecture", "estimate", "estimate_breakdown", "infer", "parameter_counts"]


def _is_module(source: object) -> bool:
    torch: Any = sys.modules.get("torch")
    return torch is not None and isinstance(source, torch.nn.Module)


def _is_config(source: object) -> bool:
    """A config rather than a model: a dict, an object with ``model_type`` (Hugging Face), or an
    object with nanoGPT's fields that is not a module (its ``GPTConfig`` dataclass)."""
    if _is_module(source):
        return False
    if isinstance(source, Mapping) or hasattr(source, "model_type"):
        return True
    return all(hasattr(source, name) for name in NANOGPT_FIELDS)


def as_architecture(source: object) -> Architecture:
    """An :class:`Architecture` from one itself, a config (Hugging Face or nanoGPT style, object or
    dict), or a model with ``.config``."""
    if isinstance(source, Architecture):
        return source
    if _is_config(source):
        return architecture_from_config(source)
    config = getattr(source, "config", None)
    if config is not None:
        return architecture_from_config(config)
    raise TypeError(
        f"cannot describe a {type(source).__name__}: pass a Hugging Face or nanoGPT config (object or dict), "
        "a model with .config, or a babysitter.flops.Architecture"
    )


def _source_label(source: object, arch: Architecture) -> str:
    return f"arch:{arch.family}" if isinstance(source, Architecture) else f"config:{arch.family}"


def estimate_breakdown(
    source: object,
    *,
    seq_len: int | None = None,
    recompute: str = "none",
    causal_halved: bool = False,
    encoder_seq_len: int | None = None,
    prefix_len: int = 0,
    images_per_sequence: float = 0.0,
) -> FlopsBreakdown:
    """Like :func:`estimate`, with the forward FLOPs split by part (dense, attention, head, vision)."""
    arch = as_architecture(source)
    if seq_len is None:
        raise FlopsUnavailable(
            "seq_len is required: the attention term (12·L·H·Q·T) grows with the training sequence length "
            "and no config says what it is (max_position_embeddings or block_size is a limit, not the "
            "length trained on)",
            argument="seq_len",
            pending=True,
        )
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    return breakdown(
        arch,
        seq_len=seq_len,
        recompute=recompute,
        causal_halved=causal_halved,
        encoder_seq_len=encoder_seq_len,
        prefix_len=prefix_len,
        images_per_sequence=images_per_sequence,
        source=_source_label(source, arch),
    )


def estimate(
    source: object,
    *,
    seq_len: int | None = None,
    recompute: str = "none",
    causal_halved: bool = False,
    encoder_seq_len: int | None = None,
    prefix_len: int = 0,
    images_per_sequence: float = 0.0,
) -> FlopsPerToken:
    """Training FLOPs per token of a model, from its description.

    ``source``: a Hugging Face config (object or ``config.json`` dict), a model with ``.config``, or an
    :class:`Architecture`. ``seq_len`` (required; ValueError without it): tokens per training sequence,
    the decoder (target) length for encoder-decoder models, which also need ``encoder_seq_len``; their
    result is per decoder token with the encoder's work folded in, so the tracker counts target tokens
    (``labels.numel()``). ``recompute``: ``"none"``, ``"selective"`` or ``"full"`` activation
    recomputation, which only raises ``hardware``. ``causal_halved``: count the keys a causal query
    sees instead of PaLM's full ``T``. ``prefix_len``: bidirectional prefix of a prefix-LM (matters only
    with ``causal_halved``). ``images_per_sequence``: images whose tokens sit inside each sequence.
    """
    return estimate_breakdown(
        source,
        seq_len=seq_len,
        recompute=recompute,
        causal_halved=causal_halved,
        encoder_seq_len=encoder_seq_len,
        prefix_len=prefix_len,
        images_per_sequence=images_per_sequence,
    ).per_token()


def _module_config(module: Any) -> object | None:
    """The module's ``config``, else its first child's (a Lightning module wrapping a Hugging Face model)."""
    own: object = getattr(module, "config", None)
    if own is not None:
        return own
    for child in module.children():
        if getattr(child, "config", None) is not None:
            found: object = child.config
            return found
    return None


def infer(source: object, *, seq_len: int | None = None) -> FlopsPerToken:
    """Model FLOPs per token of whatever a training script has, as ``watch()`` and the callbacks use it.

    * an :class:`Architecture` or a config (Hugging Face of a covered ``model_type``, or nanoGPT
      style: a ``GPTConfig`` dataclass or a dict): :func:`estimate`;
    * a torch module whose (or whose first child's) ``config`` has a covered ``model_type``:
      :func:`estimate` from that config (exact, MoE's active parameters included);
    * any other torch module (nanoGPT's ``GPT``, a plain ``nn.Module``, a ``LightningModule``):
      its parameters counted, :func:`~babysitter.flops.modules.from_module`, with the attention term
      of the attention layers it holds (or its config's ``n_layer``/``n_head``/``n_embd``).

    Raises :class:`~babysitter.flops.modules.FlopsUnavailable` (a ValueError) naming the one argument
    that fixes it: ``seq_len`` when the attention term needs the sequence length, else
    ``flops_per_token``.
    """
    try:
        if isinstance(source, Architecture) or _is_config(source):
            return estimate(source, seq_len=seq_len)
        if not _is_module(source):
            config = getattr(source, "config", None)
            if config is None:
                raise TypeError(
                    f"cannot describe a {type(source).__name__}: pass a torch module, a Hugging Face or "
                    "nanoGPT config, or a babysitter.flops.Architecture"
                )
            return estimate(config, seq_len=seq_len)
        config = _module_config(source)
        data = config_dict(config) if config is not None else None
        model_type = str((data or {}).get("model_type") or "")
        if data is not None and model_type in SUPPORTED_MODEL_TYPES and model_type != "nanogpt":
            return estimate(data, seq_len=seq_len)
        return from_module(source, seq_len=seq_len, config=data)
    except FlopsUnavailable:
        raise
    except (TypeError, ValueError) as exc:
        raise FlopsUnavailable(str(exc), argument="flops_per_token") from exc
    except Exception as exc:  # an odd module: a reason to name, never a traceback into training
        raise FlopsUnavailable(
            f"counting {type(source).__name__} failed: {exc!r}", argument="flops_per_token"
        ) from exc


def parameter_counts(config: object) -> ParameterCounts:
    """Total, active (MoE: routed top-k plus shared experts) and embedding parameters."""
    return count_parameters(as_architecture(config))
