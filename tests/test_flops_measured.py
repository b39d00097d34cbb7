"""Analytic FLOPs against FlopCounterMode on tiny real models built from configs (no downloads).

Tolerance: analytic and measured model FLOPs agree within 3% (the issue asks for 10% on a dense
decoder). What remains is explained in docs/flops.md: torch counts the flash-attention backward as
2.5x its forward (it recomputes the scores), the formulas use 2x.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from babysitter import flops as F  # noqa: E402

TOLERANCE = 0.03
B, S = 2, 16


def _lm_step(model: Any, vocab: int, seq: int = S) -> Callable[[], None]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (B, seq), generator=gen)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    return step


def _tiny(name: str) -> tuple[Any, Any]:
    t = transformers
    configs: dict[str, tuple[Any, Any]] = {
        "gpt2": (
            t.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4),
            t.GPT2LMHeadModel,
        ),
        "llama": (
            t.LlamaConfig(
                vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2,
            ),
            t.LlamaForCausalLM,
        ),
        "mistral": (
            t.MistralConfig(
                vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=1, sliding_window=None,
            ),
            t.MistralForCausalLM,
        ),
        "mixtral": (
            t.MixtralConfig(
                vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            ),
            t.MixtralForCausalLM,
        ),
        "qwen2_moe": (
            t.Qwen2MoeConfig(
                vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, mlp_only_layers=[1],
            ),
            t.Qwen2MoeForCausalLM,
        ),
        "bert": (
            t.BertConfig(
                vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, max_position_embeddings=64,
            ),
            t.BertForMaskedLM,
        ),
        "t5": (
            t.T5Config(
                vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=3,
                num_heads=4, decoder_start_token_id=0, pad_token_id=0,
            ),
            t.T5ForConditionalGeneration,
        ),
    }  # fmt: skip
    cfg, cls = configs[name]
    torch.manual_seed(0)
    return cfg, cls(cfg)


DECODERS = ["gpt2", "llama", "mistral", "mixtral", "qwen2_moe", "bert"]


@pytest.mark.parametrize("name", [*DECODERS, "t5"])
def test_parameter_count_matches_hf(name: str) -> None:
    """The config builders count exactly the parameters the Hugging Face implementation allocates."""
    cfg, model = _tiny(name)
    assert F.parameter_counts(cfg).total == sum(p.numel() for p in model.parameters())


def test_llava_parameters_and_flops() -> None:
    """LLaVA (CLIP tower, frozen, feeding Llama): exact parameters; FLOPs within tolerance."""
    t = transformers
    text = t.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    vision = t.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
    )
    cfg = t.LlavaConfig(
        text_config=text, vision_config=vision, image_token_index=127, vision_feature_layer=-1
    )
    torch.manual_seed(0)
    model = t.LlavaForConditionalGeneration(cfg)
    assert F.parameter_counts(cfg).total == sum(p.numel() for p in model.parameters())
    for p in model.model.vision_tower.parameters():
        p.requires_grad_(False)
    seq = 24
    ids = torch.randint(0, 120, (B, seq))
    ids[:, 2:18] = 127  # 16 image tokens: (32 / 8) ** 2 patches
    pixels = torch.randn(B, 3, 32, 32)

    def step() -> None:
        model(input_ids=ids, pixel_values=pixels, labels=ids).loss.backward()

    measured = F.measure(model, step)
    analytic = F.estimate(cfg, seq_len=seq, images_per_sequence=1)
    assert measured.model / (B * seq) == pytest.approx(analytic.model, rel=TOLERANCE)


@pytest.mark.parametrize("name", DECODERS)
def test_analytic_matches_flop_counter(name: str) -> None:
    """Config FLOPs per token agree with FlopCounterMode over one real forward+backward step."""
    cfg, model = _tiny(name)
    measured = F.measure(model, _lm_step(model, cfg.vocab_size), tokens=B * S)
    analytic = F.estimate(cfg, seq_len=S)
    assert not measured.recompute_detected
    assert measured.model == measured.hardware
    assert measured.per_token().model == pytest.approx(analytic.model, rel=TOLERANCE)


def test_moe_measured_uses_active_experts() -> None:
    """Mixtral's measured step is far below what its total parameters would predict (6N_total)."""
    cfg, model = _tiny("mixtral")
    measured = F.measure(model, _lm_step(model, cfg.vocab_size), tokens=B * S).per_token()
    total = F.parameter_counts(cfg).total
    assert measured.model < 0.75 * 6 * total


def test_encoder_decoder_matches_flop_counter() -> None:
    """T5 with 24 encoder and 8 decoder tokens: per-decoder-token FLOPs agree with the counter."""
    cfg, model = _tiny("t5")
    enc, dec = 24, 8
    x = torch.randint(0, 128, (B, enc))
    y = torch.randint(0, 128, (B, dec))

    def step() -> None:
        model(input_ids=x, labels=y).loss.backward()

    measured = F.measure(model, step, tokens=B * dec)
    analytic = F.estimate(cfg, seq_len=dec, encoder_seq_len=enc)
    assert measured.per_token().model == pytest.approx(analytic.model, rel=TOLERANCE)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_separates_model_and_hardware(reentrant: bool) -> None:
    """With HF gradient checkpointing, model FLOPs equal an un-checkpointed step exactly; hardware
    FLOPs add one forward of the layers, as recompute="full" predicts."""
    cfg, model = _tiny("llama")
    plain = F.measure(model, _lm_step(model, cfg.vocab_size), tokens=B * S)
    kwargs = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    ckpt = F.measure(model, _lm_step(model, cfg.vocab_size), tokens=B * S)
    assert ckpt.recompute_detected
    assert ckpt.model == plain.model
    assert ckpt.hardware > ckpt.model
    analytic = F.estimate(cfg, seq_len=S, recompute="full")
    assert ckpt.per_token().hardware == pytest.approx(analytic.hardware, rel=TOLERANCE)


def test_cpu_sdpa_is_counted() -> None:
    """CPU SDPA forward+backward, which FlopCounterMode alone counts as 0: 1024 forward (2 matmuls of
    2·B·H·S·S·D) plus 2560 backward (torch's five-matmul flash backward) for B=1, H=2, S=4, D=8."""

    class Sdpa(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3))
    module = Sdpa()
    measured = F.measure(module, lambda: module(q, k, v).sum().backward())
    assert measured.hardware == 1024 + 2560


def test_grouped_mm_is_counted() -> None:
    """torch._grouped_mm (MoE experts), which FlopCounterMode alone counts as 0: 2·6·8·4 = 384."""
    a = torch.randn(6, 8)
    b = torch.randn(2, 8, 4)
    offs = torch.tensor([2, 6], dtype=torch.int32)
    measured = F.measure(torch.nn.Module(), lambda: torch._grouped_mm(a, b, offs=offs))
    assert measured.hardware == 384


def test_measure_rejects_bad_input() -> None:
    """Setup errors are clear: not a module, bad token count, nothing counted, per-token without tokens."""
    with pytest.raises(TypeError):
        F.measure(object(), lambda: None)
    with pytest.raises(ValueError, match="tokens"):
        F.measure(torch.nn.Linear(2, 2), lambda: None, tokens=0)
    with pytest.raises(ValueError, match="no FLOPs"):
        F.measure(torch.nn.Linear(2, 2), lambda: None)
    lin = torch.nn.Linear(4, 4)
    measured = F.measure(lin, lambda: lin(torch.randn(3, 4)).sum().backward())
    with pytest.raises(ValueError, match="token count"):
        measured.per_token()
    assert measured.per_token(3).model == measured.model / 3


def _meta_model(config: dict[str, Any]) -> Any:
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if not k.startswith("_")})
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def _config(name: str) -> dict[str, Any]:
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "data" / "configs" / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


def test_full_size_llama_on_meta_device() -> None:
    """Llama-2-7B at 4096 tokens, counted on the meta device (no memory, no weights): the analytic
    46.08 GFLOP per token agree with the counter."""
    cfg = _config("llama-2-7b")
    model = _meta_model(cfg)
    ids = torch.zeros(1, 4096, dtype=torch.long, device="meta")

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    measured = F.measure(model, step, tokens=4096).per_token()
    assert measured.model == pytest.approx(F.estimate(cfg, seq_len=4096).model, rel=TOLERANCE)


def test_sliding_window_measured_as_dense_masked_attention() -> None:
    """Mistral-7B at 8192 tokens (window 4096): SDPA with a window mask computes all 8192 keys, so the
    counter matches the estimate *without* the window, 13% above the windowed (useful-work) estimate."""
    cfg = _config("mistral-7b-v0.1")
    model = _meta_model(cfg)
    ids = torch.zeros(1, 8192, dtype=torch.long, device="meta")

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    measured = F.measure(model, step, tokens=8192).per_token().model
    windowed = F.estimate(cfg, seq_len=8192).model
    unwindowed = F.estimate(dict(cfg, sliding_window=None), seq_len=8192).model
    assert measured == pytest.approx(unwindowed, rel=0.01)
    assert measured > 1.1 * windowed
