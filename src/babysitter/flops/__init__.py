"""Model FLOPs per token, for MFU: analytic (from configs or architecture descriptions) or measured.

``estimate(config, seq_len=...)`` gives :class:`FlopsPerToken` (``model``: forward + backward without
recomputation, MFU's numerator; ``hardware``: with recomputation, HFU's). ``measure(model, step_fn)``
counts one real step with ``torch.utils.flop_counter.FlopCounterMode``. docs/flops.md explains the
conventions and why the two disagree where they do. torch is imported only by ``measure``.
"""

from __future__ import annotations

from babysitter.flops.arch import Architecture, Attention, Layer, Mlp, Moe, Stack, VisionTower
from babysitter.flops.configs import SUPPORTED_MODEL_TYPES, architecture_from_config
from babysitter.flops.estimate import as_architecture, estimate, estimate_breakdown, parameter_counts
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

__all__ = [
    "RECOMPUTE_MODES",
    "SUPPORTED_MODEL_TYPES",
    "Architecture",
    "Attention",
    "FlopsBreakdown",
    "FlopsPerToken",
    "Layer",
    "MeasuredFlops",
    "Mlp",
    "Moe",
    "ParameterCounts",
    "Stack",
    "VisionTower",
    "architecture_from_config",
    "as_architecture",
    "count_parameters",
    "estimate",
    "estimate_breakdown",
    "from_parameters",
    "mean_keys_per_query",
    "measure",
    "mfu",
    "parameter_counts",
    "tokens_per_second_for_mfu",
]
