"""watch() takes FLOPs from a model or config: MoE counted by active parameters."""

from __future__ import annotations

import pytest

import babysitter
from babysitter import flops


def _mixtral_config() -> object:
    transformers = pytest.importorskip("transformers")
    return transformers.MixtralConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
    )


def test_mixtral_style_config_gives_mfu_from_active_parameters() -> None:
    """With 8 experts and top-2 routing, the tracker's FLOPs per token follow the active experts only."""
    config = _mixtral_config()
    tracker = babysitter.watch(config, seq_len=128, peak_flops=1e12, port=-1, run="moe")
    try:
        counts = flops.parameter_counts(config)
        fpt = tracker.config.flops.model
        assert fpt == flops.estimate(config, seq_len=128).model
        assert tracker.config.flops.source.startswith("config:")
        # 6 x active non-embedding parameters plus the attention term: far below 6 x total.
        assert counts.active < counts.total
        assert fpt is not None
        assert 6 * (counts.active - counts.embedding) <= fpt < 6 * (counts.total - counts.embedding)
    finally:
        tracker.close()


def test_model_whose_flops_cannot_be_counted_is_a_clear_setup_error() -> None:
    """A module whose parameters would over-count (a mixture of experts: every expert, not the top-k a
    token uses) fails at watch(), saying what to pass instead. (A plain module is counted: issue 32,
    tests/test_flops_any_model.py.)"""
    torch = pytest.importorskip("torch")

    class SparseMoeBlock(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(8))

    with pytest.raises(ValueError, match="flops_per_token="):
        babysitter.watch(SparseMoeBlock(), seq_len=16, peak_flops=1e12, port=-1)


def test_hf_config_without_seq_len_asks_for_it() -> None:
    """The attention term needs the sequence length: the error says to pass seq_len=."""
    with pytest.raises(ValueError, match="seq_len="):
        babysitter.watch(_mixtral_config(), peak_flops=1e12, port=-1)
