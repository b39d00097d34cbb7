"""FLOPs per token and parameter counts from an :class:`~babysitter.flops.arch.Architecture`.

Conventions (docs/flops.md has the derivations):

* A matmul with ``W`` weights costs ``2W`` FLOPs per token forward; backward costs twice the forward
  (gradient of inputs and of weights), so training costs ``6W`` per token: PaLM's ``6N``.
* ``N`` is the weights each token is multiplied by: active experts only for MoE, no embedding lookup
  tables (a lookup is not a matmul), but the LM head's projection, tied or not, since it is a real
  ``hidden x vocab`` matmul on every token (PaLM's literal ``N`` leaves a tied head out).
* Attention scores and the weighted sum cost ``4 * n_heads * head_dim * keys`` forward per query
  token and layer (PaLM's ``12·L·H·Q·T`` after the x3 for training), with ``keys = T``, or the window
  for sliding-window layers. ``causal_halved`` counts only the keys a causal query can see (about
  ``T/2``): the work a causal kernel does, not what PaLM's MFU counts.
* Norms, softmax, activations, residual adds and the optimizer are not counted (a few percent at
  most; see the docs), and neither are biases.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from babysitter.flops.arch import Architecture, Layer, Stack

__all__ = [
    "RECOMPUTE_MODES",
    "FlopsBreakdown",
    "FlopsPerToken",
    "ParameterCounts",
    "breakdown",
    "count_parameters",
    "from_parameters",
    "mean_keys_per_query",
]

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token: ``model`` (forward + backward, no recomputation: MFU's numerator),
    ``hardware`` (with activation recomputation: HFU's; equals ``model`` without), where the
    numbers came from (``"config:llama"``, ``"explicit"``, ``"measured"``, ``"params"``) and, for
    counted parameters, a ``note`` saying what was counted."""

    model: float
    hardware: float
    source: str
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not (self.model > 0 and self.hardware >= self.model):
            raise ValueError(f"need 0 < model <= hardware FLOPs per token, got {self}")


@dataclass(frozen=True)
class ParameterCounts:
    """``total``: every parameter once (a tied head is the embedding); ``active``: those one token
    uses (MoE: top-k routed plus shared experts; embeddings included, as model cards count);
    ``embedding``: lookup tables (token, position, token-type embeddings)."""

    total: int
    active: int
    embedding: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding

    @property
    def active_non_embedding(self) -> int:
        return self.active - self.embedding


@dataclass(frozen=True)
class FlopsBreakdown:
    """Forward FLOPs per counted token by part, and the training totals built from them.

    For encoder-decoder models a counted token is a decoder (target) token; encoder work is folded in
    at ``encoder_seq_len / seq_len`` encoder tokens per decoder token.
    """

    dense_forward: float  # projections and feed-forward blocks (2 x active matmul weights)
    attention_forward: float  # scores and weighted sums
    lm_head_forward: float  # vocabulary projection (and MLM transform)
    vision_forward: float  # image tower and projector, per LM token
    vision_backward: float  # their backward: 2x forward if trained; a frozen tower's is skipped
    recompute_forward: float  # extra forward work done again under activation checkpointing
    source: str

    @property
    def forward(self) -> float:
        return self.dense_forward + self.attention_forward + self.lm_head_forward + self.vision_forward

    @property
    def model(self) -> float:
        """Forward + backward: 3x the forward of the language model, and the vision part's own sum."""
        trained = self.dense_forward + self.attention_forward + self.lm_head_forward
        return 3 * trained + self.vision_forward + self.vision_backward

    @property
    def hardware(self) -> float:
        return self.model + self.recompute_forward

    def per_token(self) -> FlopsPerToken:
        return FlopsPerToken(model=self.model, hardware=self.hardware, source=self.source)


def _prefix_sum(n: int, window: int | None) -> float:
    """sum_{i=1..n} min(i, window): keys seen by the first n causal queries."""
    if window is None or window >= n:
        return n * (n + 1) / 2
    return window * (window + 1) / 2 + (n - window) * window


def mean_keys_per_query(
    seq_len: int,
    *,
    causal: bool,
    causal_halved: bool = False,
    window: int | None = None,
    prefix_len: int = 0,
) -> float:
    """Keys each query attends to, on average, as counted for FLOPs.

    PaLM's convention (default) counts every query against ``seq_len`` keys (``window`` when the
    layer's sliding window is shorter), causal or not. With ``causal_halved`` a causal query ``i``
    counts the ``min(i, window)`` keys it can see; a prefix-LM's first ``prefix_len`` queries see the
    whole prefix (bidirectional) and the rest are causal.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if not 0 <= prefix_len <= seq_len:
        raise ValueError(f"prefix_len must be in 0..seq_len ({seq_len}), got {prefix_len}")
    full = float(min(seq_len, window) if window else seq_len)
    if not (causal and causal_halved):
        return full
    p = prefix_len
    seen = p * (min(p, window) if window else p) + _prefix_sum(seq_len, window) - _prefix_sum(p, window)
    return seen / seq_len


def _layer_forward(
    layer: Layer,
    *,
    keys: float,
    cross_keys: float,
) -> tuple[float, float]:
    """(dense, attention) forward FLOPs per query token of one layer; cross-attention K/V projections
    are not here (they run on encoder tokens)."""
    att = layer.attention
    dense = 2.0 * (att.q_out_matmul + att.kv_matmul + layer.ffn.matmul)
    attention = 4.0 * att.n_heads * att.head_dim * keys
    cross = layer.cross_attention
    if cross is not None:
        dense += 2.0 * cross.q_out_matmul
        attention += 4.0 * cross.n_heads * cross.head_dim * cross_keys
    return dense, attention


def _stack_forward(
    stack: Stack,
    seq_len: int,
    *,
    causal_halved: bool,
    prefix_len: int = 0,
    cross_keys: float = 0.0,
) -> tuple[float, float]:
    dense = attention = 0.0
    for layer in stack.layers:
        keys = mean_keys_per_query(
            seq_len,
            causal=stack.causal,
            causal_halved=causal_halved,
            window=layer.attention.window,
            prefix_len=prefix_len if stack.causal else 0,
        )
        d, a = _layer_forward(layer, keys=keys, cross_keys=cross_keys)
        dense += d
        attention += a
    return dense, attention


def breakdown(
    arch: Architecture,
    *,
    seq_len: int,
    recompute: str = "none",
    causal_halved: bool = False,
    encoder_seq_len: int | None = None,
    prefix_len: int = 0,
    images_per_sequence: float = 0.0,
    source: str | None = None,
) -> FlopsBreakdown:
    """Forward FLOPs per token by part for training on sequences of ``seq_len`` tokens.

    ``recompute``: ``"none"``; ``"selective"`` (the attention core is recomputed in backward, as
    Megatron's selective recomputation and FlashAttention do); ``"full"`` (every transformer layer's
    forward runs again in backward; embeddings and LM head do not). Encoder-decoder: ``seq_len`` is the
    decoder (target) length and ``encoder_seq_len`` the encoder (input) length. Vision: each sequence
    holds ``images_per_sequence`` images whose ``image_tokens`` count inside ``seq_len``.
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    if images_per_sequence < 0:
        raise ValueError("images_per_sequence must be >= 0")
    if prefix_len and arch.decoder is None:
        raise ValueError("prefix_len applies to a causal decoder; this architecture has none")
    dense = attention = 0.0
    if arch.is_encoder_decoder:
        assert arch.encoder is not None
        assert arch.decoder is not None
        if encoder_seq_len is None:
            raise ValueError(
                "encoder-decoder models need encoder_seq_len (input tokens per example) as well as "
                "seq_len (target tokens per example)"
            )
        ratio = encoder_seq_len / seq_len
        ed, ea = _stack_forward(arch.encoder, encoder_seq_len, causal_halved=causal_halved)
        # Cross-attention keys/values are projected once per encoder token in every decoder layer.
        cross_kv = sum(
            2.0 * layer.cross_attention.kv_matmul for layer in arch.decoder.layers if layer.cross_attention
        )
        dd, da = _stack_forward(
            arch.decoder, seq_len, causal_halved=causal_halved, cross_keys=float(encoder_seq_len)
        )
        dense = dd + ratio * (ed + cross_kv)
        attention = da + ratio * ea
    else:
        stack = arch.decoder if arch.decoder is not None else arch.encoder
        assert stack is not None
        if encoder_seq_len is not None:
            raise ValueError("encoder_seq_len applies to encoder-decoder models only")
        dense, attention = _stack_forward(stack, seq_len, causal_halved=causal_halved, prefix_len=prefix_len)
    lm_head = 0.0
    if arch.lm_head:
        lm_head = 2.0 * (arch.head_matmul + arch.hidden * arch.vocab_size)
    vision = vision_back = 0.0
    tower = arch.vision
    if tower is not None and images_per_sequence:
        vd, va = _stack_forward(tower.stack, tower.tokens_per_image, causal_halved=False)
        encoder = 2.0 * tower.patch_matmul * tower.patches_per_image + (vd + va) * tower.tokens_per_image
        projector = 2.0 * tower.projector_matmul * tower.image_tokens
        if tower.trainable:
            back = 2.0 * (encoder + projector)
        else:
            # Frozen tower: no backward through it, and the projector's first layer needs no input
            # gradient (only its weight gradient).
            back = 2.0 * projector - 2.0 * tower.projector_input_matmul * tower.image_tokens
        scale = images_per_sequence / seq_len
        vision, vision_back = (encoder + projector) * scale, back * scale
    if recompute == "full":
        again = dense + attention
    elif recompute == "selective":
        again = attention
    else:
        again = 0.0
    return FlopsBreakdown(
        dense_forward=dense,
        attention_forward=attention,
        lm_head_forward=lm_head,
        vision_forward=vision,
        vision_backward=vision_back,
        recompute_forward=again,
        source=source or f"arch:{arch.family}",
    )


def count_parameters(arch: Architecture) -> ParameterCounts:
    """Total, active and embedding parameters of ``arch``."""
    embedding = (arch.vocab_size + arch.position_embeddings) * arch.hidden + arch.extra_embedding_params
    head = 0
    if arch.lm_head:
        head = arch.head_params + (0 if arch.tied_embeddings else arch.hidden * arch.vocab_size)
        head += arch.vocab_size if arch.lm_head_bias else 0
    stacks = sum(s.params for s in arch.stacks)
    vision = arch.vision.params if arch.vision else 0
    total = embedding + head + stacks + vision + arch.extra_params
    inactive = sum(s.inactive_params for s in arch.stacks)
    return ParameterCounts(total=total, active=total - inactive, embedding=embedding)


def from_parameters(
    n_params_non_embedding: float, *, n_layers: int, n_heads: int, head_dim: int, seq_len: int
) -> FlopsPerToken:
    """PaLM's model FLOPs per token from explicit numbers: ``6N + 12·L·H·Q·T``.

    ``N`` excludes embedding tables (and, as PaLM defines it, a tied LM head); pass active parameters
    for MoE. No recomputation: ``hardware == model``.
    """
    for name, value in (("n_layers", n_layers), ("n_heads", n_heads), ("head_dim", head_dim)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if not n_params_non_embedding > 0:
        raise ValueError(f"n_params_non_embedding must be positive, got {n_params_non_embedding}")
    flops = 6.0 * n_params_non_embedding + 12.0 * n_layers * n_heads * head_dim * seq_len
    return FlopsPerToken(model=flops, hardware=flops, source="explicit")
