"""Model FLOPs per token, for MFU: analytic (from configs or architecture descriptions) or measured.

``estimate(config, seq_len=...)`` gives :class:`FlopsPerToken` (``model``: forward + backward without
recomputation, MFU's numerator; ``hardware``: with recomputation, HFU's); ``infer(model, seq_len=...)``
takes whatever a training script has (a config, a Hugging Face or nanoGPT model, any torch module,
whose parameters are then counted). ``measure(model, step_fn)``
counts one real step with ``torch.utils.flop_counter.FlopCounterMode``. ``resolve_layout`` says how a
data-parallel replica's tokens and FLOPs are shared among its tensor/pipeline/context parallel ranks.
docs/flops.md explains the conventions and why the two disagree where they do. torch is imported
only by ``measure`` and by the module counting (which is handed a torch module).
"""

from __future__ import annotations

from babysitter.flops.arch import Architecture, Attention, Layer, Mlp, Moe, Stack, VisionTower
from babysitter.flops.configs import SUPPORTED_MODEL_TYPES, architecture_from_config
from babysitter.flops.estimate import as_architecture, estimate, estimate_breakdown, infer, parameter_counts
from babysitter.flops.formulas import (
    RECOMPUTE_MODES,
    FlopsBreakdown,
    FlopsPerToken,
    ParameterCounts,
    count_parameters,
    from_parameters,
    mean_keys_per_query,
)
from babysitter.flops.measure import MeasuredFlops, measure
from babysitter.flops.mfu import mfu, tokens_per_second_for_mfu
from babysitter.flops.modules import FlopsUnavailable, ModuleCounts, from_module, module_counts
from babysitter.flops.parallel import ParallelLayout, layout_from_mesh, resolve_layout

__all__ = [
    "RECOMPUTE_MODES",
    "SUPPORTED_MODEL_TYPES",
    "Architecture",
    "Attention",
    "FlopsBreakdown",
    "FlopsPerToken",
    "FlopsUnavailable",
    "Layer",
    "MeasuredFlops",
    "Mlp",
    "ModuleCounts",
    "Moe",
    "ParallelLayout",
    "ParameterCounts",
    "Stack",
    "VisionTower",
    "architecture_from_config",
    "as_architecture",
    "count_parameters",
    "estimate",
    "estimate_breakdown",
    "from_module",
    "from_parameters",
    "infer",
    "layout_from_mesh",
    "mean_keys_per_query",
    "measure",
    "mfu",
    "module_counts",
    "parameter_counts",
    "resolve_layout",
    "tokens_per_second_for_mfu",
]
