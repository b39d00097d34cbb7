"""Architecture descriptions: just enough of a transformer to count its parameters and FLOPs.

A model is stacks of layers; a layer is self-attention, an optional cross-attention and a feed-forward
block (dense MLP or mixture of experts). Counts are exact for the models the config builders cover
(they match ``sum(p.numel())`` of the Hugging Face implementation); anything else can be described by
hand with these dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Architecture", "Attention", "Layer", "Mlp", "Moe", "Stack", "VisionTower"]


@dataclass(frozen=True)
class Attention:
    """Multi-head attention with ``n_kv_heads`` key/value heads (MHA: = n_heads, MQA: 1, GQA: between).

    ``hidden`` is the width of the queries' input and of the output; ``kv_hidden`` the width of the
    key/value source (an encoder of another width, for cross-attention). ``window`` limits how many
    keys a query sees (sliding-window attention). ``qkv_bias`` / ``out_bias``: projection biases.
    """

    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    window: int | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    kv_hidden: int | None = None
    extra_params: int = 0  # e.g. per-head q/k norms

    def __post_init__(self) -> None:
        if min(self.hidden, self.n_heads, self.n_kv_heads, self.head_dim) <= 0:
            raise ValueError(f"attention sizes must be positive: {self}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.window is not None and self.window <= 0:
            raise ValueError(f"sliding window must be positive, got {self.window}")

    @property
    def q_out_matmul(self) -> int:
        """Weights of the query and output projections (applied once per query token)."""
        return 2 * self.hidden * self.n_heads * self.head_dim

    @property
    def kv_matmul(self) -> int:
        """Weights of the key and value projections (applied once per key/value source token)."""
        return 2 * (self.kv_hidden or self.hidden) * self.n_kv_heads * self.head_dim

    @property
    def params(self) -> int:
        """All parameters, biases and extras included."""
        bias = 0
        if self.qkv_bias:
            bias += (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        if self.out_bias:
            bias += self.hidden
        return self.q_out_matmul + self.kv_matmul + bias + self.extra_params


@dataclass(frozen=True)
class Mlp:
    """A feed-forward block: two matrices, or three when gated (SwiGLU, GeGLU)."""

    hidden: int
    intermediate: int
    gated: bool
    bias: bool = False

    @property
    def matmul(self) -> int:
        """Weights applied to every token that goes through the block."""
        return (3 if self.gated else 2) * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        """All parameters, biases included."""
        bias = ((2 if self.gated else 1) * self.intermediate + self.hidden) if self.bias else 0
        return self.matmul + bias


@dataclass(frozen=True)
class Moe:
    """A mixture of experts: a router, ``n_experts`` routed experts of which each token uses ``top_k``,
    and optional shared experts every token uses (``shared``: their combined MLP) with an optional
    sigmoid gate (Qwen2-MoE's ``shared_expert_gate``)."""

    hidden: int
    n_experts: int
    top_k: int
    expert: Mlp
    shared: Mlp | None = None
    shared_gate: bool = False
    router_bias: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.n_experts:
            raise ValueError(f"top_k {self.top_k} must be in 1..n_experts ({self.n_experts})")

    @property
    def router_matmul(self) -> int:
        return self.hidden * self.n_experts + (self.hidden if self.shared_gate else 0)

    @property
    def matmul(self) -> int:
        """Weights one token is multiplied by: router, top-k experts, shared experts."""
        shared = self.shared.matmul if self.shared else 0
        return self.router_matmul + self.top_k * self.expert.matmul + shared

    @property
    def params(self) -> int:
        """All parameters, every expert included."""
        shared = self.shared.params if self.shared else 0
        router_bias = self.n_experts if self.router_bias else 0
        return self.router_matmul + router_bias + self.n_experts * self.expert.params + shared

    @property
    def inactive_params(self) -> int:
        """Parameters of the experts a token does not use."""
        return (self.n_experts - self.top_k) * self.expert.params


@dataclass(frozen=True)
class Layer:
    """One transformer block; ``norm_params`` counts its normalization weights (no FLOPs counted)."""

    attention: Attention
    ffn: Mlp | Moe
    cross_attention: Attention | None = None
    norm_params: int = 0

    @property
    def params(self) -> int:
        cross = self.cross_attention.params if self.cross_attention else 0
        return self.attention.params + cross + self.ffn.params + self.norm_params

    @property
    def inactive_params(self) -> int:
        return self.ffn.inactive_params if isinstance(self.ffn, Moe) else 0


@dataclass(frozen=True)
class Stack:
    """Layers run in order; ``causal`` for decoders (a query sees earlier keys only)."""

    layers: tuple[Layer, ...]
    causal: bool
    extra_params: int = 0  # final norm, relative-position tables, ...

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers) + self.extra_params

    @property
    def inactive_params(self) -> int:
        return sum(layer.inactive_params for layer in self.layers)


@dataclass(frozen=True)
class VisionTower:
    """An image encoder feeding a language model (LLaVA-style).

    Each image is cut into ``patches_per_image`` patches (embedded by a matmul of ``patch_matmul``
    weights), run through ``stack`` over ``tokens_per_image`` tokens (patches plus class tokens), and
    ``image_tokens`` of them are projected (``projector_matmul`` weights per image token) into the
    language model's sequence. A frozen tower (``trainable=False``, the usual LLaVA recipe) costs a
    forward pass only: nothing before it needs gradients.
    """

    stack: Stack
    patches_per_image: int
    tokens_per_image: int
    image_tokens: int
    patch_matmul: int
    projector_matmul: int
    projector_input_matmul: int = 0  # the projector's first layer (no input gradient when frozen)
    extra_params: int = 0  # patch-embedding bias, class and position embeddings, norms, projector biases
    trainable: bool = False

    @property
    def params(self) -> int:
        return self.stack.params + self.patch_matmul + self.projector_matmul + self.extra_params


@dataclass(frozen=True)
class Architecture:
    """A whole model: a decoder stack (causal LM), an encoder stack, or both (T5-style), the token
    embedding (``vocab_size`` x ``hidden``), an LM head (tied to the embedding or not), and optionally
    a vision tower.

    ``position_embeddings``: rows of a learned absolute-position table; ``extra_embedding_params``:
    other lookup tables (BERT's token types). ``head_matmul`` / ``head_params``: a transform before
    the vocabulary projection (BERT's MLM head). ``extra_params``: norms and biases outside the stacks.
    """

    family: str
    vocab_size: int
    hidden: int
    decoder: Stack | None = None
    encoder: Stack | None = None
    tied_embeddings: bool = False
    lm_head: bool = True
    lm_head_bias: bool = False
    position_embeddings: int = 0
    extra_embedding_params: int = 0
    head_matmul: int = 0
    head_params: int = 0
    extra_params: int = 0
    vision: VisionTower | None = None

    def __post_init__(self) -> None:
        if self.decoder is None and self.encoder is None:
            raise ValueError("an architecture needs a decoder or an encoder stack")

    @property
    def is_encoder_decoder(self) -> bool:
        return self.decoder is not None and self.encoder is not None

    @property
    def stacks(self) -> tuple[Stack, ...]:
        return tuple(s for s in (self.encoder, self.decoder) if s is not None)
