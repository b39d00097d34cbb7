"""One entry point for analytic FLOPs: from a config, a model, or an architecture description."""

from __future__ import annotations

from collections.abc import Mapping

from babysitter.flops.arch import Architecture
from babysitter.flops.configs import architecture_from_config
from babysitter.flops.formulas import (
    FlopsBreakdown,
    FlopsPerToken,
    ParameterCounts,
    breakdown,
    count_parameters,
)

__all__ = ["as_architecture", "estimate", "estimate_breakdown", "parameter_counts"]


def as_architecture(source: object) -> Architecture:
    """An :class:`Architecture` from one itself, a HF config (object or dict), or a model with ``.config``."""
    if isinstance(source, Architecture):
        return source
    if isinstance(source, Mapping) or hasattr(source, "model_type"):
        return architecture_from_config(source)
    config = getattr(source, "config", None)
    if config is not None:
        return architecture_from_config(config)
    raise TypeError(
        f"cannot describe a {type(source).__name__}: pass a Hugging Face config (object or dict), a model "
        "with .config, or a babysitter.flops.Architecture"
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
        raise ValueError(
            "seq_len is required: the attention term (12·L·H·Q·T) grows with the training sequence length "
            "and no config says what it is (max_position_embeddings is a limit, not the length trained on)"
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


def parameter_counts(config: object) -> ParameterCounts:
    """Total, active (MoE: routed top-k plus shared experts) and embedding parameters."""
    return count_parameters(as_architecture(config))
