"""Analytic FLOPs and parameter counts: hand-computed cases, published model sizes, conventions."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from babysitter import flops as F
from babysitter.flops import Architecture, Attention, Layer, Mlp, Moe, Stack

CONFIGS = Path(__file__).parent / "data" / "configs"


def load(name: str) -> dict[str, object]:
    data = json.loads((CONFIGS / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


def tiny_arch(*, window: int | None = None, tied: bool = True) -> Architecture:
    """One layer: hidden 8, 2 heads of 4, MLP 8->16->8 (no gate), vocabulary 10."""
    layer = Layer(Attention(8, 2, 2, 4, window=window), Mlp(8, 16, gated=False))
    return Architecture(
        "tiny", vocab_size=10, hidden=8, decoder=Stack((layer,), causal=True), tied_embeddings=tied
    )


class TestHandComputed:
    def test_palm_from_parameters(self) -> None:
        """6N + 12·L·H·Q·T with N=1e9, L=24, H=16, Q=128, T=2048, worked by hand."""
        f = F.from_parameters(1e9, n_layers=24, n_heads=16, head_dim=128, seq_len=2048)
        assert f.model == 6e9 + 1_207_959_552
        assert f.hardware == f.model
        assert f.source == "explicit"

    def test_tiny_architecture(self) -> None:
        """Per-token forward: dense 2·(128+128+256)=1024, attention 4·2·4·6=192, head 2·8·10=160; x3."""
        b = F.estimate_breakdown(tiny_arch(), seq_len=6)
        assert (b.dense_forward, b.attention_forward, b.lm_head_forward) == (1024, 192, 160)
        assert F.estimate(tiny_arch(), seq_len=6).model == 3 * (1024 + 192 + 160) == 4128

    def test_recompute_modes(self) -> None:
        """Full recompute adds the layers' forward (1216), selective attention's (192); model unchanged."""
        full = F.estimate(tiny_arch(), seq_len=6, recompute="full")
        selective = F.estimate(tiny_arch(), seq_len=6, recompute="selective")
        assert (full.model, full.hardware) == (4128, 4128 + 1216)
        assert (selective.model, selective.hardware) == (4128, 4128 + 192)
        with pytest.raises(ValueError, match="recompute"):
            F.estimate(tiny_arch(), seq_len=6, recompute="sometimes")

    def test_sliding_window_caps_keys(self) -> None:
        """A window of 2 over 6 tokens counts 2 keys per query: attention 4·2·4·2 = 64."""
        assert F.estimate_breakdown(tiny_arch(window=2), seq_len=6).attention_forward == 64
        assert F.estimate_breakdown(tiny_arch(window=100), seq_len=6).attention_forward == 192

    @pytest.mark.parametrize(
        ("kwargs", "keys"),
        [
            ({"causal": True}, 4.0),  # PaLM: every query against T keys
            ({"causal": True, "causal_halved": True}, 2.5),  # (1+2+3+4)/4
            ({"causal": True, "causal_halved": True, "window": 2}, 1.75),  # (1+2+2+2)/4
            ({"causal": True, "causal_halved": True, "prefix_len": 2}, 2.75),  # (2+2+3+4)/4
            ({"causal": True, "causal_halved": True, "prefix_len": 4}, 4.0),  # all bidirectional
            ({"causal": True, "prefix_len": 2}, 4.0),  # prefix changes nothing under PaLM's count
            ({"causal": False, "causal_halved": True}, 4.0),  # encoders are never halved
            ({"causal": True, "window": 2}, 2.0),
        ],
    )
    def test_keys_per_query(self, kwargs: dict[str, object], keys: float) -> None:
        """Mean keys per query for T=4 under each convention, enumerated by hand."""
        assert F.mean_keys_per_query(4, **kwargs) == keys  # type: ignore[arg-type]

    def test_tied_head_still_costs_flops(self) -> None:
        """Tying the LM head removes its parameters, not its matmul."""
        tied, untied = tiny_arch(tied=True), tiny_arch(tied=False)
        assert F.count_parameters(untied).total - F.count_parameters(tied).total == 80
        assert F.estimate(tied, seq_len=6).model == F.estimate(untied, seq_len=6).model

    def test_mfu_and_required_throughput(self) -> None:
        """MFU = 6e9 FLOPs/token x 1e4 tokens/s / 989.5e12 = 0.060637; 40% on 8 GPUs: 527,733 tokens/s."""
        assert F.mfu(6e9, 1e4, 989.5e12) == pytest.approx(0.0606367, rel=1e-6)
        assert F.tokens_per_second_for_mfu(6e9, 989.5e12, 0.4, devices=8) == pytest.approx(
            527_733.333, rel=1e-9
        )
        with pytest.raises(ValueError):
            F.mfu(6e9, float("nan"), 989.5e12)
        with pytest.raises(ValueError):
            F.tokens_per_second_for_mfu(6e9, 989.5e12, 1.5)


class TestPublishedSizes:
    @pytest.mark.parametrize(
        ("config", "total", "active", "rel"),
        [
            ("llama-2-7b", 6.74e9, 6.74e9, 0.001),  # Llama 2: 6.74B
            ("mixtral-8x7b", 46.7e9, 12.9e9, 0.002),  # 46.7B total, 12.9B active
            ("t5-base", 220e6, 220e6, 0.02),  # "about 220M" (HF: 222,903,552)
            ("gpt2", 124e6, 124e6, 0.005),  # 124M
            ("bert-base-uncased", 110e6, 110e6, 0.01),  # 110M
            ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, 0.005),  # 14.3B total, 2.7B activated
            ("mistral-7b-v0.1", 7.24e9, 7.24e9, 0.001),
            ("llama-3-8b", 8.03e9, 8.03e9, 0.001),
            ("llava-1.5-7b", 7.06e9, 7.06e9, 0.001),
        ],
    )
    def test_published_counts(self, config: str, total: float, active: float, rel: float) -> None:
        """Parameter counts from hand-copied config.json files match the model cards."""
        counts = F.parameter_counts(load(config))
        assert counts.total == pytest.approx(total, rel=rel)
        assert counts.active == pytest.approx(active, rel=rel)

    def test_exact_hf_counts(self) -> None:
        """Exact totals as Hugging Face reports them for the full-size models."""
        assert F.parameter_counts(load("gpt2")).total == 124_439_808
        assert F.parameter_counts(load("t5-base")).total == 222_903_552
        assert F.parameter_counts(load("llama-2-7b")).total == 6_738_415_616


class TestConventions:
    def test_llama_equals_palm_with_head(self) -> None:
        """For Llama-2-7B, the config estimate is PaLM's 6N + 12·L·H·Q·T with N = non-embedding
        matmul weights (LM head included, norms excluded)."""
        cfg = load("llama-2-7b")
        counts = F.parameter_counts(cfg)
        norms = 32 * 2 * 4096 + 4096
        palm = F.from_parameters(
            counts.non_embedding - norms, n_layers=32, n_heads=32, head_dim=128, seq_len=4096
        )
        assert F.estimate(cfg, seq_len=4096).model == pytest.approx(palm.model, rel=1e-12)

    def test_moe_counts_active_not_total(self) -> None:
        """Mixtral's FLOPs follow its 12.9B active parameters: about 3.5x less than 6 x 46.7B."""
        cfg = load("mixtral-8x7b")
        counts = F.parameter_counts(cfg)
        f = F.estimate(cfg, seq_len=4096)
        attention = 12 * 32 * 32 * 128 * 4096
        norms = 32 * 2 * 4096 + 4096
        assert f.model == pytest.approx(6 * (counts.active_non_embedding - norms) + attention, rel=1e-12)
        assert 6 * counts.total / f.model > 3.3

    def test_gqa_shrinks_projections_not_attention(self) -> None:
        """Llama-3-8B style GQA (8 KV heads) costs less than MHA only in the K/V projections."""
        mha = dict(load("llama-3-8b"), num_key_value_heads=32)
        gqa = load("llama-3-8b")
        b_mha = F.estimate_breakdown(mha, seq_len=8192)
        b_gqa = F.estimate_breakdown(gqa, seq_len=8192)
        assert b_mha.attention_forward == b_gqa.attention_forward
        assert b_mha.dense_forward - b_gqa.dense_forward == 32 * 2 * (2 * 4096 * (32 - 8) * 128)

    def test_mistral_sliding_window(self) -> None:
        """Mistral-7B at 8192 tokens counts its 4096-token window, not 8192 keys."""
        windowed = F.estimate_breakdown(load("mistral-7b-v0.1"), seq_len=8192)
        full = F.estimate_breakdown(dict(load("mistral-7b-v0.1"), sliding_window=None), seq_len=8192)
        assert full.attention_forward - windowed.attention_forward == 4 * 32 * 32 * 128 * 4096
        short = F.estimate_breakdown(load("mistral-7b-v0.1"), seq_len=2048)
        short_full = F.estimate_breakdown(dict(load("mistral-7b-v0.1"), sliding_window=None), seq_len=2048)
        assert short.attention_forward == short_full.attention_forward

    def test_qwen_windows_follow_use_sliding_window_and_layer_types(self) -> None:
        """Qwen's sliding_window is ignored unless use_sliding_window; explicit layer_types win."""
        cfg = load("qwen1.5-moe-a2.7b")
        off = F.estimate_breakdown(cfg, seq_len=65536)
        on = F.estimate_breakdown(dict(cfg, use_sliding_window=True), seq_len=65536)
        assert on.attention_forward < off.attention_forward  # layers 21..23 windowed at 32768
        expected = off.attention_forward - 3 * 4 * 16 * 128 * (65536 - 32768)
        assert on.attention_forward == expected
        types_ = ["full_attention"] * 23 + ["sliding_attention"]
        listed = F.estimate_breakdown(dict(cfg, layer_types=types_), seq_len=65536)
        assert listed.attention_forward == off.attention_forward - 4 * 16 * 128 * 32768

    def test_encoder_decoder_folds_encoder_per_decoder_token(self) -> None:
        """T5: per decoder token, the encoder's share grows with encoder_seq_len / seq_len."""
        cfg = load("t5-base")
        with pytest.raises(ValueError, match="encoder_seq_len"):
            F.estimate(cfg, seq_len=128)
        same = F.estimate_breakdown(cfg, seq_len=128, encoder_seq_len=128)
        double = F.estimate_breakdown(cfg, seq_len=128, encoder_seq_len=256)
        # encoder layer dense: 2·(4·768² + 2·768·3072); cross K/V: 2·(2·768²) in each of 12 decoder layers
        enc_dense = 12 * 2 * (4 * 768 * 768 + 2 * 768 * 3072) + 12 * 2 * (2 * 768 * 768)
        assert double.dense_forward - same.dense_forward == pytest.approx(enc_dense)

    def test_prefix_lm_only_matters_when_halved(self) -> None:
        """A bidirectional prefix costs more than causal under causal_halved, nothing extra under PaLM."""
        cfg = load("llama-2-7b")
        plain = F.estimate(cfg, seq_len=2048, causal_halved=True).model
        prefix = F.estimate(cfg, seq_len=2048, causal_halved=True, prefix_len=1024).model
        assert prefix > plain
        assert F.estimate(cfg, seq_len=2048, prefix_len=1024).model == F.estimate(cfg, seq_len=2048).model

    def test_frozen_vision_tower_is_forward_only(self) -> None:
        """LLaVA: images add tower work; a frozen tower costs less than a trained one."""
        cfg = load("llava-1.5-7b")
        text = F.estimate(cfg, seq_len=2048).model
        frozen = F.estimate(cfg, seq_len=2048, images_per_sequence=1)
        trained = F.estimate(dict(cfg, vision_trainable=True), seq_len=2048, images_per_sequence=1)
        assert text < frozen.model < trained.model

    def test_causal_halved_lowers_attention_only(self) -> None:
        """causal_halved changes only the attention term, by (T+1)/(2T)."""
        cfg = load("llama-2-7b")
        full = F.estimate_breakdown(cfg, seq_len=4096)
        half = F.estimate_breakdown(cfg, seq_len=4096, causal_halved=True)
        assert half.dense_forward == full.dense_forward
        assert half.attention_forward == pytest.approx(full.attention_forward * 4097 / 8192)


class TestInputs:
    def test_seq_len_required(self) -> None:
        """No seq_len: a clear error, never a max_position_embeddings guess."""
        with pytest.raises(ValueError, match="seq_len is required"):
            F.estimate(load("gpt2"))
        with pytest.raises(ValueError, match="positive int"):
            F.estimate(load("gpt2"), seq_len=0)

    def test_sources(self) -> None:
        """Dict, config-like object, model with .config and Architecture all work and agree."""
        cfg = load("gpt2")
        as_obj = types.SimpleNamespace(**cfg)
        model = types.SimpleNamespace(config=cfg)
        values = {
            F.estimate(s, seq_len=1024).model for s in (cfg, as_obj, model, F.architecture_from_config(cfg))
        }
        assert len(values) == 1
        assert F.estimate(cfg, seq_len=1024).source == "config:gpt2"
        assert F.estimate(F.architecture_from_config(cfg), seq_len=1024).source == "arch:gpt2"

    def test_unknown_model_type(self) -> None:
        """An uncovered model_type names the covered ones instead of guessing."""
        with pytest.raises(ValueError, match="mixtral"):
            F.estimate({"model_type": "mamba"}, seq_len=128)
        with pytest.raises(TypeError):
            F.estimate(42, seq_len=128)

    def test_bad_config_fields(self) -> None:
        """Missing or wrong-typed fields name the field."""
        cfg = load("llama-2-7b")
        del cfg["hidden_size"]
        with pytest.raises(ValueError, match="hidden_size"):
            F.parameter_counts(cfg)
        with pytest.raises(ValueError, match="num_hidden_layers"):
            F.parameter_counts(dict(load("llama-2-7b"), num_hidden_layers="32"))

    def test_architecture_validation(self) -> None:
        """Impossible shapes fail at construction."""
        with pytest.raises(ValueError, match="multiple"):
            Attention(64, 6, 4, 16)
        with pytest.raises(ValueError, match="top_k"):
            Moe(8, 4, 5, Mlp(8, 16, gated=True))
        with pytest.raises(ValueError, match="decoder or an encoder"):
            Architecture("x", vocab_size=1, hidden=1)
        with pytest.raises(ValueError, match="model <= hardware"):
            F.FlopsPerToken(model=2.0, hardware=1.0, source="x")


def test_zero_sliding_window_means_none() -> None:
    """Qwen2-MoE configs from transformers 5 write sliding_window=0 for no window: no error, no window."""
    cfg = dict(load("qwen1.5-moe-a2.7b"), sliding_window=0, use_sliding_window=True, max_window_layers=0)
    assert F.estimate(cfg, seq_len=4096).model == F.estimate(load("qwen1.5-moe-a2.7b"), seq_len=4096).model


class TestKeysProperty:
    @staticmethod
    def brute_force(seq_len: int, window: int | None, prefix: int) -> float:
        """Enumerate the visible keys of every query of a causal prefix-LM with a sliding window."""
        seen = 0
        for i in range(1, seq_len + 1):
            visible = prefix if i <= prefix else i
            seen += min(visible, window) if window else visible
        return seen / seq_len

    @given(
        seq_len=st.integers(1, 300),
        window=st.one_of(st.none(), st.integers(1, 400)),
        prefix_frac=st.floats(0, 1),
    )
    @settings(max_examples=200, deadline=None)
    def test_causal_halved_matches_enumeration(
        self, seq_len: int, window: int | None, prefix_frac: float
    ) -> None:
        """The closed form for causal-halved keys equals enumerating every query's visible keys."""
        prefix = int(prefix_frac * seq_len)
        got = F.mean_keys_per_query(
            seq_len, causal=True, causal_halved=True, window=window, prefix_len=prefix
        )
        assert got == pytest.approx(self.brute_force(seq_len, window, prefix), rel=1e-12)
        full = F.mean_keys_per_query(seq_len, causal=True, window=window, prefix_len=prefix)
        assert got <= full
