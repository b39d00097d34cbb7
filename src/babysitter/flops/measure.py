"""Measured FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over one real training step.

Method. One run of ``step_fn`` (forward and backward) under a FlopCounterMode gives the hardware
FLOPs: every counted op that ran, activation recomputation included. While it runs, global module
forward hooks note whether a module's forward is executing *inside a backward pass*
(``torch._C._current_graph_task_id() != -1``): that is exactly recomputation by activation
checkpointing (reentrant or not, Hugging Face's ``gradient_checkpointing`` included), and the FLOPs
counted meanwhile are subtracted to give the model FLOPs. One step, no second run, no need to know how
checkpointing was switched on. Non-reentrant checkpointing's early stop (which skips the tail of a
recomputed forward) is switched off for the measured step, so hardware FLOPs include a full
recomputed forward; with early stop on, training may do slightly less.

Two gaps of FlopCounterMode (torch 2.13) are filled, both ops it counts as zero: on CPU,
``scaled_dot_product_attention`` runs ``_scaled_dot_product_flash_attention_for_cpu`` (and its
backward), counted here with torch's own SDPA formulas so CPU and GPU measurements agree; and
``torch._grouped_mm``, which transformers >= 5 uses for MoE experts (without it a Mixtral step
measures at a third of its real FLOPs). Elementwise ops, norms, softmax and other custom kernels are
still counted as zero.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from babysitter.flops.formulas import FlopsPerToken

__all__ = ["MeasuredFlops", "measure"]


@dataclass(frozen=True)
class MeasuredFlops:
    """FLOPs of one measured step: ``model`` (no recomputation) and ``hardware`` (as run).

    ``recompute_detected``: some module forward ran during backward. ``by_module``: hardware FLOPs
    per module name as FlopCounterMode attributes them (``"Global"`` is the total).
    """

    model: int
    hardware: int
    tokens: int | None
    recompute_detected: bool
    method: str
    by_module: Mapping[str, int] = field(default_factory=dict, repr=False)

    def per_token(self, tokens: int | None = None) -> FlopsPerToken:
        """FLOPs per token of the measured step (``tokens`` overrides the count given to measure)."""
        n = tokens if tokens is not None else self.tokens
        if not n or n <= 0:
            raise ValueError("per-token FLOPs need the step's token count: measure(..., tokens=N)")
        return FlopsPerToken(model=self.model / n, hardware=self.hardware / n, source="measured")


def _grouped_mm_formula(torch: Any) -> dict[Any, Callable[..., int]]:
    """FLOPs of ``torch._grouped_mm`` (MoE experts in transformers >= 5, torchtitan), which
    FlopCounterMode (torch 2.13) counts as zero; its backward is grouped matmuls too."""
    op = getattr(torch.ops.aten, "_grouped_mm", None)
    if op is None:
        return {}

    def grouped(a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        if len(a) == 2 and len(b) == 2:
            # (M, T) x (T, N) split along T into groups: every group's output is M x N over its T slice.
            return int(2 * a[0] * a[1] * b[1])
        # 2d x 3d, 3d x 2d, 3d x 3d: each output element contracts over a's last dimension.
        return int(2 * math.prod(out_shape) * a[-1])

    return {op: grouped}


def _sdpa_cpu_formulas(torch: Any) -> dict[Any, Callable[..., int]]:
    """FLOP formulas for the CPU flash-attention kernels, as torch counts the CUDA ones."""
    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is None or backward is None:
        return {}

    def fwd(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        b, h, s_q, d = q
        s_k, d_v = k[2], v[3]
        return int(2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v)

    def bwd(grad_out: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        # torch's flash/efficient backward formula: recompute scores, then grad_v, grad_scores,
        # grad_q, grad_k: five matmuls of the forward's size class.
        b, h, s_q, d = q
        s_k, d_v = k[2], v[3]
        return int(2 * b * h * s_q * s_k * (3 * d + 2 * d_v))

    return {forward: fwd, backward: bwd}


def measure(
    model: object,
    step_fn: Callable[[], object],
    *,
    tokens: int | None = None,
) -> MeasuredFlops:
    """Count the FLOPs of one real training step: ``step_fn()`` must run the forward and the
    backward (``loss.backward()``), e.g. ``lambda: model(**batch).loss.backward()``.

    It really runs: use a copy, or a model on the meta device (dense models; data-dependent routing,
    as in MoE, needs real tensors). ``model`` is only checked to be a torch module (its modules are
    what the recomputation detector watches); ``tokens`` is the number of tokens in the step, for
    :meth:`MeasuredFlops.per_token`. Run this at setup, never per step: it is slow.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"measure needs a torch.nn.Module, got {type(model).__name__}")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0):
        raise ValueError(f"tokens must be a positive int, got {tokens!r}")

    state = {"depth": 0, "recompute": 0, "seen": False}
    stack: list[bool] = []

    def in_backward() -> bool:
        return bool(torch._C._current_graph_task_id() != -1)

    def pre_hook(module: Any, args: Any) -> None:
        inside = in_backward()
        stack.append(inside)
        if inside:
            state["depth"] += 1
            state["seen"] = True

    def post_hook(module: Any, args: Any, output: Any) -> None:
        if stack and stack.pop():
            state["depth"] -= 1

    class _Counter(FlopCounterMode):
        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            if not state["depth"]:
                return super()._count_flops(func_packet, out, args, kwargs)  # type: ignore[no-untyped-call]
            before = sum(self.flop_counts["Global"].values())
            result = super()._count_flops(func_packet, out, args, kwargs)  # type: ignore[no-untyped-call]
            state["recompute"] += sum(self.flop_counts["Global"].values()) - before
            return result

    separable = hasattr(FlopCounterMode, "_count_flops")
    counter = _Counter(
        display=False, custom_mapping={**_sdpa_cpu_formulas(torch), **_grouped_mm_formula(torch)}
    )
    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(pre_hook),
        torch.nn.modules.module.register_module_forward_hook(post_hook),
    ]
    early_stop_off: Any = contextlib.nullcontext()
    set_early_stop = getattr(torch.utils.checkpoint, "set_checkpoint_early_stop", None)
    if set_early_stop is not None:
        # Non-reentrant checkpointing otherwise aborts a recomputed forward midway (by raising), so
        # module forward hooks would never see it end.
        early_stop_off = set_early_stop(False)
    try:
        with early_stop_off, counter:
            step_fn()
    finally:
        for handle in hooks:
            handle.remove()
    hardware = int(counter.get_total_flops())
    recompute = int(state["recompute"])
    if hardware <= 0:
        raise ValueError(
            "FlopCounterMode counted no FLOPs: step_fn ran no matmuls it knows (under torch.inference_mode "
            "it counts nothing, pytorch/pytorch#126268)"
        )
    seen = bool(state["seen"])
    if seen and not separable:
        method = "FlopCounterMode; recomputation detected but not separable in this torch: model = hardware"
    elif seen:
        method = "FlopCounterMode; FLOPs of module forwards run during backward (recomputation) excluded"
    else:
        method = "FlopCounterMode; no recomputation detected: model = hardware"
    by_module = {name: int(sum(ops.values())) for name, ops in counter.get_flop_counts().items()}
    model_flops = hardware - recompute
    if not (model_flops > 0 and math.isfinite(model_flops)):
        raise ValueError(f"measured model FLOPs are not positive ({model_flops}); hardware = {hardware}")
    return MeasuredFlops(
        model=model_flops,
        hardware=hardware,
        tokens=tokens,
        recompute_detected=seen,
        method=method,
        by_module=MappingProxyType(by_module),
    )
