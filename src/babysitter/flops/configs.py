"""Build an :class:`Architecture` from a Hugging Face config (object or ``config.json`` dict).

Covered ``model_type``\\ s: gpt2; llama, mistral, qwen2, qwen3 (dense decoders with GQA/MQA and
sliding windows); mixtral, qwen2_moe, qwen3_moe (MoE); t5, mt5 (encoder-decoder); bert, roberta
(encoders); llava (a vision tower feeding any of the decoders). Each builder reproduces the
Hugging Face implementation's parameter count exactly (tests check it against ``sum(p.numel())``).
A config with no ``model_type`` (or ``"nanogpt"``) and nanoGPT's fields (``n_layer``, ``n_head``,
``n_embd``, ``vocab_size``; ``block_size`` and ``bias`` optional), such as nanoGPT's ``GPTConfig``
dataclass, is nanoGPT's model (tests check its parameter count against a module of that shape).
Other model types raise ValueError naming the covered ones: an approximate guess is how MoE models
got 5x wrong FLOPs elsewhere (pytorch/torchtitan#4300).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from babysitter.flops.arch import Architecture, Attention, Layer, Mlp, Moe, Stack, VisionTower

__all__ = ["NANOGPT_FIELDS", "SUPPORTED_MODEL_TYPES", "architecture_from_config", "config_dict", "is_nanogpt"]

#: The fields that make a config without a ``model_type`` nanoGPT's (``block_size`` is optional).
NANOGPT_FIELDS = ("n_layer", "n_head", "n_embd", "vocab_size")


def config_dict(config: object) -> dict[str, Any]:
    """A plain dict of a config: a Mapping as is, a ``PretrainedConfig`` through ``to_dict()``."""
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        if isinstance(result, Mapping):
            return dict(result)
    if hasattr(config, "__dict__"):
        return {k: v for k, v in vars(config).items() if not k.startswith("_")}
    raise TypeError(f"cannot read a config from {type(config).__name__}")


class _Cfg:
    """Typed reads from a config dict, with clear errors for missing or bad fields."""

    def __init__(self, data: Mapping[str, Any], model_type: str) -> None:
        self.data = data
        self.model_type = model_type

    def get_int(self, *names: str, default: int | None = None) -> int:
        for name in names:
            value = self.data.get(name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(
                        f"{self.model_type} config field {name!r} must be an int >= 0: {value!r}"
                    )
                return value
        if default is None:
            raise ValueError(f"{self.model_type} config lacks {' / '.join(repr(n) for n in names)}")
        return default

    def opt_int(self, name: str) -> int | None:
        value = self.data.get(name)
        return None if value is None else self.get_int(name)

    def flag(self, name: str, default: bool) -> bool:
        value = self.data.get(name)
        return default if value is None else bool(value)


def _norm(hidden: int, *, bias: bool) -> int:
    return 2 * hidden if bias else hidden


def _gpt2(c: _Cfg) -> Architecture:
    h = c.get_int("n_embd", "hidden_size")
    n_layer = c.get_int("n_layer", "num_hidden_layers")
    heads = c.get_int("n_head", "num_attention_heads")
    inner = c.get_int("n_inner", default=4 * h)
    att = Attention(h, heads, heads, h // heads, qkv_bias=True, out_bias=True)
    layer = Layer(att, Mlp(h, inner, gated=False, bias=True), norm_params=2 * _norm(h, bias=True))
    return Architecture(
        family="gpt2",
        vocab_size=c.get_int("vocab_size"),
        hidden=h,
        decoder=Stack((layer,) * n_layer, causal=True, extra_params=_norm(h, bias=True)),
        tied_embeddings=c.flag("tie_word_embeddings", True),
        position_embeddings=c.get_int("n_positions", "max_position_embeddings"),
    )


def _nanogpt(c: _Cfg) -> Architecture:
    """nanoGPT's ``GPT``: GPT-2's blocks, ``bias`` on or off in every Linear and LayerNorm, a 4x MLP,
    the LM head tied to the token embedding, a learned position table of ``block_size`` rows."""
    h = c.get_int("n_embd")
    heads = c.get_int("n_head")
    if not h or not heads or h % heads:
        raise ValueError(f"nanogpt config: n_embd {h} must be a positive multiple of n_head {heads}")
    bias = c.flag("bias", True)
    att = Attention(h, heads, heads, h // heads, qkv_bias=bias, out_bias=bias)
    layer = Layer(att, Mlp(h, 4 * h, gated=False, bias=bias), norm_params=2 * _norm(h, bias=bias))
    return Architecture(
        family="nanogpt",
        vocab_size=c.get_int("vocab_size"),
        hidden=h,
        decoder=Stack((layer,) * c.get_int("n_layer"), causal=True, extra_params=_norm(h, bias=bias)),
        tied_embeddings=True,
        position_embeddings=c.get_int("block_size", "n_positions", default=0),
    )


def _layer_windows(c: _Cfg, n_layers: int) -> list[int | None]:
    """Per-layer sliding window: ``layer_types`` when the config lists them, else the model's rule."""
    window = c.opt_int("sliding_window") or None  # some configs write 0 for "no window"
    types = c.data.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        return [window if t == "sliding_attention" else None for t in types]
    if window is None:
        return [None] * n_layers
    if c.model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        # Qwen: windows only with use_sliding_window, and only from max_window_layers on.
        if not c.flag("use_sliding_window", False):
            return [None] * n_layers
        first = c.get_int("max_window_layers", default=n_layers)
        return [window if i >= first else None for i in range(n_layers)]
    return [window] * n_layers


def _decoder_attention(c: _Cfg, h: int, window: int | None) -> Attention:
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", default=heads)
    head_dim = c.get_int("head_dim", default=h // heads)
    qwen2 = c.model_type in ("qwen2", "qwen2_moe")
    qkv_bias = True if qwen2 else c.flag("attention_bias", False)
    out_bias = False if qwen2 else c.flag("attention_bias", False)
    qk_norm = 2 * head_dim if c.model_type in ("qwen3", "qwen3_moe") else 0
    return Attention(
        h, heads, kv, head_dim, window=window, qkv_bias=qkv_bias, out_bias=out_bias, extra_params=qk_norm
    )


def _ffn(c: _Cfg, h: int, index: int) -> Mlp | Moe:
    mt = c.model_type
    dense = Mlp(h, c.get_int("intermediate_size", default=0), gated=True, bias=c.flag("mlp_bias", False))
    if mt == "mixtral":
        experts = c.get_int("num_local_experts")
        return Moe(
            h, experts, c.get_int("num_experts_per_tok"), Mlp(h, c.get_int("intermediate_size"), gated=True)
        )
    if mt in ("qwen2_moe", "qwen3_moe"):
        experts = c.get_int("num_experts", default=0)
        step = c.get_int("decoder_sparse_step", default=1)
        mlp_only = c.data.get("mlp_only_layers") or []
        if experts == 0 or index in mlp_only or step == 0 or (index + 1) % step:
            return dense
        expert = Mlp(h, c.get_int("moe_intermediate_size"), gated=True)
        shared_size = c.get_int("shared_expert_intermediate_size", default=0) if mt == "qwen2_moe" else 0
        shared = Mlp(h, shared_size, gated=True) if shared_size else None
        return Moe(
            h,
            experts,
            c.get_int("num_experts_per_tok"),
            expert,
            shared=shared,
            shared_gate=shared is not None,
        )
    return dense


def _llama_like(c: _Cfg) -> Architecture:
    h = c.get_int("hidden_size")
    n = c.get_int("num_hidden_layers")
    layers = tuple(
        Layer(_decoder_attention(c, h, window), _ffn(c, h, i), norm_params=2 * h)
        for i, window in enumerate(_layer_windows(c, n))
    )
    return Architecture(
        family=c.model_type,
        vocab_size=c.get_int("vocab_size"),
        hidden=h,
        decoder=Stack(layers, causal=True, extra_params=h),
        tied_embeddings=c.flag("tie_word_embeddings", False),
    )


def _t5(c: _Cfg) -> Architecture:
    d = c.get_int("d_model")
    heads = c.get_int("num_heads")
    d_kv = c.get_int("d_kv")
    d_ff = c.get_int("d_ff")
    gated = str(c.data.get("feed_forward_proj", "relu")).startswith("gated")
    n_enc = c.get_int("num_layers")
    n_dec = c.get_int("num_decoder_layers", default=n_enc)
    buckets = c.get_int("relative_attention_num_buckets", default=32)
    att = Attention(d, heads, heads, d_kv)
    mlp = Mlp(d, d_ff, gated=gated)
    enc = Layer(att, mlp, norm_params=2 * d)
    dec = Layer(att, mlp, cross_attention=att, norm_params=3 * d)
    # Each stack's first self-attention owns the relative-position bias table; each has a final norm.
    return Architecture(
        family=c.model_type,
        vocab_size=c.get_int("vocab_size"),
        hidden=d,
        encoder=Stack((enc,) * n_enc, causal=False, extra_params=buckets * heads + d),
        decoder=Stack((dec,) * n_dec, causal=True, extra_params=buckets * heads + d),
        tied_embeddings=c.flag("tie_word_embeddings", True),
    )


def _bert(c: _Cfg) -> Architecture:
    h = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    att = Attention(h, heads, heads, h // heads, qkv_bias=True, out_bias=True)
    layer = Layer(att, Mlp(h, c.get_int("intermediate_size"), gated=False, bias=True), norm_params=4 * h)
    positions = c.get_int("max_position_embeddings")  # RoBERTa's count already includes its padding offset
    return Architecture(
        family=c.model_type,
        vocab_size=c.get_int("vocab_size"),
        hidden=h,
        encoder=Stack((layer,) * c.get_int("num_hidden_layers"), causal=False),
        tied_embeddings=c.flag("tie_word_embeddings", True),
        lm_head_bias=True,
        position_embeddings=positions,
        extra_embedding_params=c.get_int("type_vocab_size", default=2) * h,
        # MLM head: dense h x h (+bias) and a LayerNorm before the vocabulary projection.
        head_matmul=h * h,
        head_params=h * h + h + 2 * h,
        extra_params=2 * h,  # embedding LayerNorm
    )


def _clip_vision(v: _Cfg) -> tuple[Stack, int, int, int]:
    """CLIP vision tower: (stack, patches, tokens incl. class token, params outside the stack)."""
    h = v.get_int("hidden_size")
    heads = v.get_int("num_attention_heads")
    att = Attention(h, heads, heads, h // heads, qkv_bias=True, out_bias=True)
    layer = Layer(att, Mlp(h, v.get_int("intermediate_size"), gated=False, bias=True), norm_params=4 * h)
    patches = (v.get_int("image_size") // v.get_int("patch_size")) ** 2
    tokens = patches + 1
    # class embedding, position table, pre- and post-layernorm
    extra = h + tokens * h + 2 * h + 2 * h
    return Stack((layer,) * v.get_int("num_hidden_layers"), causal=False), patches, tokens, extra


def _llava(c: _Cfg) -> Architecture:
    text_raw = c.data.get("text_config")
    vision_raw = c.data.get("vision_config")
    if not isinstance(text_raw, Mapping) or not isinstance(vision_raw, Mapping):
        raise ValueError("llava config needs text_config and vision_config")
    text = architecture_from_config(text_raw)
    v = _Cfg(vision_raw, str(vision_raw.get("model_type", "clip_vision_model")))
    stack, patches, tokens, extra = _clip_vision(v)
    vh = v.get_int("hidden_size")
    th = text.hidden
    channels = v.get_int("num_channels", default=3)
    patch = v.get_int("patch_size")
    strategy = c.data.get("vision_feature_select_strategy", "default")
    image_tokens = patches if strategy == "default" else tokens
    projector_bias = th + th if c.flag("multimodal_projector_bias", True) else 0
    tower = VisionTower(
        stack=stack,
        patches_per_image=patches,
        tokens_per_image=tokens,
        image_tokens=image_tokens,
        patch_matmul=channels * patch * patch * vh,
        projector_matmul=vh * th + th * th,
        projector_input_matmul=vh * th,
        extra_params=extra + projector_bias,
        trainable=c.flag("vision_trainable", False),
    )
    return Architecture(
        family=f"llava+{text.family}",
        vocab_size=text.vocab_size,
        hidden=th,
        decoder=text.decoder,
        tied_embeddings=text.tied_embeddings,
        extra_params=text.extra_params,
        vision=tower,
    )


_BUILDERS: dict[str, Callable[[_Cfg], Architecture]] = {
    "gpt2": _gpt2,
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _llama_like,
    "qwen3": _llama_like,
    "mixtral": _llama_like,
    "qwen2_moe": _llama_like,
    "qwen3_moe": _llama_like,
    "t5": _t5,
    "mt5": _t5,
    "bert": _bert,
    "roberta": _bert,
    "llava": _llava,
    "nanogpt": _nanogpt,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_BUILDERS))


def is_nanogpt(data: Mapping[str, Any]) -> bool:
    """True for a config dict that is nanoGPT's: no ``model_type`` (or ``"nanogpt"``) and its fields."""
    return str(data.get("model_type") or "nanogpt") == "nanogpt" and all(
        data.get(name) is not None for name in NANOGPT_FIELDS
    )


def architecture_from_config(config: object) -> Architecture:
    """The architecture a config describes: a Hugging Face config (object with HF attribute names, or
    dict) of a covered ``model_type``, or a nanoGPT-style config (``GPTConfig`` dataclass or dict)."""
    data = config_dict(config)
    model_type = str(data.get("model_type") or "")
    if is_nanogpt(data):
        model_type = "nanogpt"
    builder = _BUILDERS.get(model_type)
    if builder is None:
        what = f"model_type {model_type!r}" if model_type else "a config without model_type"
        raise ValueError(
            f"no FLOPs builder for {what}; supported: {', '.join(SUPPORTED_MODEL_TYPES)} (nanogpt: "
            f"{', '.join(NANOGPT_FIELDS)}). Pass the torch module instead (its parameters are counted), "
            "describe the model with babysitter.flops.Architecture, or measure it with "
            "babysitter.flops.measure"
        )
    return builder(_Cfg(data, model_type))
