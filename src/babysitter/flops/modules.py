"""FLOPs per token of a torch module that no config describes: its weights counted, its attention found.

PaLM's ``6N + 12·L·H·Q·T`` needs ``N`` and, per attention layer, ``H·Q``. From a module:

* ``N`` is every parameter of two or more dimensions (the matrices a token is multiplied by: Linear
  and attention projections, convolution kernels) except embedding tables (``nn.Embedding``,
  ``nn.EmbeddingBag``: a lookup is not a matmul), unless the table is also a Linear's weight (a tied
  LM head, as in nanoGPT and GPT-2: that matmul runs on every token). Biases and norm scales (1-D)
  are left out. This is the ``N`` of the config builders, so a nanoGPT module and its config give
  the same FLOPs. nanoGPT's own ``estimate_mfu`` also counts the 1-D parameters (docs/flops.md).
* Attention layers: each ``nn.MultiheadAttention`` (``H·Q = embed_dim``) and each module whose class
  name contains "Attention" and that says its width: heads x ``head_dim`` attributes, its query
  projection's output width (``q_proj``...), or a width attribute (``n_embd``, ``embed_dim``,
  ``all_head_size``...). A recognised module's children are not searched again (nanoGPT's
  ``CausalSelfAttention``, GPT-2's and Llama's attention classes, BERT's self-attention are found;
  an ``nn.TransformerEncoderLayer`` through its ``self_attn``).

What this cannot see, and so refuses rather than guesses (``FlopsUnavailable``, naming the argument
that fixes it): mixture-of-experts modules (counting every expert over-states FLOPs by the expert
count over top-k, the "MoE 5x" reports), parameters that FSDP (v1) flattened and sharded, lazy
parameters not created yet, attention modules whose width cannot be read. Also not seen: attention
run outside any module named so (then no attention term; the caller says so), a head that reuses
the embedding table functionally (``x @ wte.weight.T``) rather than through a Linear, and weights
that do not multiply every token (a frozen teacher, an EMA copy held as a submodule).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from babysitter.flops.formulas import FlopsPerToken

__all__ = ["FlopsUnavailable", "ModuleCounts", "attention_from_config", "from_module", "module_counts"]

_EXPERTS = re.compile(r"moe|expert", re.IGNORECASE)
_HEADS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "nhead")
_HEAD_DIM = ("head_dim", "head_size", "attention_head_size", "d_head", "d_k")
_QUERY = ("q_proj", "query", "q", "to_q", "wq", "q_lin")
_WIDTH = ("all_head_size", "inner_dim", "embed_dim", "n_embd", "hidden_size", "d_model", "dim", "embed_size")
_CONFIG_LAYERS = ("n_layer", "num_hidden_layers", "num_layers", "n_layers")
_CONFIG_HEADS = ("n_head", "num_attention_heads", "num_heads", "n_heads")
_CONFIG_WIDTH = ("n_embd", "hidden_size", "d_model", "dim")
_CONFIG_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


class FlopsUnavailable(ValueError):
    """FLOPs per token cannot be had from what was given: ``reason`` says why, ``argument`` names the
    one argument that fixes it (``"seq_len"`` or ``"flops_per_token"``), ``pending`` is True when the
    answer may come later in training (the first batch shows the sequence length, or a framework
    creates the parameters after setup)."""

    def __init__(
        self, reason: str, *, argument: str, pending: bool = False, message: str | None = None
    ) -> None:
        super().__init__(message or f"{reason}; pass {argument}=")
        self.reason = reason
        self.argument = argument
        self.pending = pending


@dataclass(frozen=True)
class ModuleCounts:
    """What :func:`module_counts` read from a module.

    ``weights``: N (parameters of 2+ dimensions, embedding tables excluded unless tied to a Linear);
    ``embedding``: the excluded tables' parameters; ``attention``: ``H·Q`` of each attention layer
    found, with ``attention_names``; ``unreadable``: attention-named modules whose width could not
    be read; ``experts``: mixture-of-experts modules; ``unmaterialized``: parameters not created
    yet (lazy modules); ``sharded``: why the parameters are not the whole model's (FSDP v1), or "".
    """

    weights: int
    embedding: int
    attention: tuple[int, ...]
    attention_names: tuple[str, ...]
    unreadable: tuple[str, ...]
    experts: tuple[str, ...]
    unmaterialized: int
    sharded: str


def _int_attr(module: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _attention_width(module: Any, torch: Any) -> int | None:
    """``H·Q`` of an attention module, from what it says about itself; None when it says nothing."""
    if isinstance(module, torch.nn.MultiheadAttention):
        return int(module.embed_dim)
    heads, head_dim = _int_attr(module, _HEADS), _int_attr(module, _HEAD_DIM)
    if heads and head_dim:
        return heads * head_dim
    for name in _QUERY:
        query = getattr(module, name, None)
        out = getattr(query, "out_features", None) if isinstance(query, torch.nn.Module) else None
        if isinstance(out, int) and out > 0:
            return out
    return _int_attr(module, _WIDTH)


def _shape_numel(param: Any) -> int:
    """Elements of a parameter as the model defines it: DeepSpeed ZeRO-3 keeps the shape in ``ds_shape``
    (the tensor itself is an empty placeholder); a DTensor's ``numel()`` is the global one."""
    shape = getattr(param, "ds_shape", None)
    if shape is not None:
        n = 1
        for d in shape:
            n *= int(d)
        return n
    return int(param.numel())


def _shape_dims(param: Any) -> int:
    shape = getattr(param, "ds_shape", None)
    return len(shape) if shape is not None else int(param.dim())


def module_counts(module: Any) -> ModuleCounts:
    """Weights, embedding tables and attention layers of a torch module (see the module docstring)."""
    import torch
    from torch import nn

    if not isinstance(module, nn.Module):
        raise TypeError(f"module_counts needs a torch.nn.Module, got {type(module).__name__}")
    tables = (nn.Embedding, nn.EmbeddingBag)
    linear_weights: set[int] = set()
    table_weights: set[int] = set()
    sharded = ""
    for _, sub in module.named_modules():
        if isinstance(sub, nn.Linear):
            linear_weights.add(id(sub.weight))
        elif isinstance(sub, tables):
            table_weights.add(id(sub.weight))
        if not sharded and type(sub).__name__ == "FullyShardedDataParallel":
            sharded = "FSDP (v1) flattens and shards the parameters, so they cannot be counted whole"
    weights = embedding = lazy = 0
    uninitialized = getattr(nn.parameter, "UninitializedParameter", ())
    for _, param in module.named_parameters():
        if isinstance(param, uninitialized):
            lazy += 1
            continue
        if type(param).__name__ == "FlatParameter" and not sharded:
            sharded = "FSDP (v1) flattens and shards the parameters, so they cannot be counted whole"
        if _shape_dims(param) < 2:
            continue
        if id(param) in table_weights and id(param) not in linear_weights:
            embedding += _shape_numel(param)
        else:
            weights += _shape_numel(param)
    widths: list[int] = []
    names: list[str] = []
    unreadable: list[str] = []
    experts: list[str] = []

    def walk(prefix: str, sub: Any) -> None:
        label = prefix or type(sub).__name__
        if _EXPERTS.search(type(sub).__name__) or _EXPERTS.search(prefix.rsplit(".", 1)[-1]):
            experts.append(label)
            return
        is_attention = isinstance(sub, nn.MultiheadAttention) or "attention" in type(sub).__name__.lower()
        if is_attention:
            width = _attention_width(sub, torch)
            if width is not None:
                widths.append(width)
                names.append(label)
                return
        before = len(widths)
        for name, child in sub.named_children():
            walk(f"{prefix}.{name}" if prefix else name, child)
        if is_attention and len(widths) == before:
            unreadable.append(f"{prefix} ({type(sub).__name__})" if prefix else label)

    walk("", module)
    return ModuleCounts(
        weights=weights,
        embedding=embedding,
        attention=tuple(widths),
        attention_names=tuple(names),
        unreadable=tuple(unreadable),
        experts=tuple(experts),
        unmaterialized=lazy,
        sharded=sharded,
    )


def attention_from_config(config: Mapping[str, Any]) -> tuple[int, ...] | None:
    """``H·Q`` per layer from a config's layer count, heads and width (``head_dim`` when it has one);
    None when the config does not say."""

    def first(names: tuple[str, ...]) -> int | None:
        for name in names:
            value = config.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    layers, heads = first(_CONFIG_LAYERS), first(_CONFIG_HEADS)
    head_dim, width = first(("head_dim",)), first(_CONFIG_WIDTH)
    per_layer = heads * head_dim if heads and head_dim else width
    if not layers or not per_layer:
        return None
    return (per_layer,) * layers


def _refusals(counts: ModuleCounts, config: Mapping[str, Any] | None) -> None:
    if counts.sharded:
        raise FlopsUnavailable(counts.sharded, argument="flops_per_token")
    if counts.unmaterialized:
        raise FlopsUnavailable(
            f"{counts.unmaterialized} parameter(s) are not created yet (lazy modules)",
            argument="flops_per_token",
        )
    cfg = config or {}
    experts = [n for n in _CONFIG_EXPERTS if isinstance(cfg.get(n), int) and cfg[n] > 1]
    if counts.experts or experts:
        where = ", ".join(counts.experts[:3]) or ", ".join(f"{n}={cfg[n]}" for n in experts)
        raise FlopsUnavailable(
            f"a mixture of experts ({where}): counting its parameters would count every expert, not the "
            "top-k a token uses",
            argument="flops_per_token",
        )
    if cfg.get("is_encoder_decoder") is True:
        raise FlopsUnavailable(
            "an encoder-decoder model: its FLOPs per target token depend on the input length too "
            "(babysitter.flops.estimate(config, seq_len=..., encoder_seq_len=...) covers T5)",
            argument="flops_per_token",
        )


def from_module(
    module: Any, *, seq_len: int | None = None, config: Mapping[str, Any] | None = None
) -> FlopsPerToken:
    """PaLM's model FLOPs per token of a torch module, its parameters counted: ``6N + 12·T·ΣH·Q``
    over the attention layers found (from ``config``'s layer count and width when the module's own
    cannot be read). Raises :class:`FlopsUnavailable` (a ValueError) naming what to pass instead.

    The result's ``note`` says what was counted; its ``source`` is ``"params"``, or
    ``"params:no-attention"`` when no attention layer was found (``6N`` alone: right for a model
    without attention, an under-count for one whose attention went unseen, so callers warn).
    """
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0):
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    counts = module_counts(module)
    _refusals(counts, config)
    name = type(module).__name__
    if counts.weights <= 0:
        raise FlopsUnavailable(
            f"{name} holds no weight matrices (yet: a framework may create them after setup)",
            argument="flops_per_token",
            pending=True,
        )
    widths, where = counts.attention, f"{len(counts.attention)} attention layer(s) found in the module"
    if not widths or counts.unreadable:
        from_config = attention_from_config(config) if config is not None else None
        if from_config is not None:
            widths, where = from_config, f"the config's {len(from_config)} layer(s)"
        elif counts.unreadable:
            raise FlopsUnavailable(
                f"attention module(s) {', '.join(counts.unreadable[:3])} of {name} do not say their width "
                "(no head count and head_dim, query projection or embed_dim)",
                argument="flops_per_token",
            )
    weights = f"N = {counts.weights:,} weights of 2+ dimensions, embedding tables excluded"
    if not widths:
        flops = 6.0 * counts.weights
        note = (
            f"FLOPs per token of {name} counted from its parameters: 6N = {flops:.4g} ({weights}). No "
            "attention layer was recognised (nn.MultiheadAttention, or a module named *Attention that says "
            "its head count and head_dim or its width), so no 12·L·H·Q·T term: if the model attends, pass "
            "flops_per_token="
        )
        return FlopsPerToken(model=flops, hardware=flops, source="params:no-attention", note=note)
    if seq_len is None:
        raise FlopsUnavailable(
            f"the attention term 12·L·H·Q·T of {name} ({where}) needs the training sequence length",
            argument="seq_len",
            pending=True,
        )
    flops = 6.0 * counts.weights + 12.0 * sum(widths) * seq_len
    note = (
        f"FLOPs per token of {name} counted from its parameters: 6N + 12·T·ΣH·Q = {flops:.4g} ({weights}; "
        f"ΣH·Q = {sum(widths):,} over {where}; T = {seq_len}); pass flops_per_token= to override"
    )
    return FlopsPerToken(model=flops, hardware=flops, source="params", note=note)
