"""MFU for any model (issue 32): nanoGPT-style configs and plain torch modules get PaLM's 6N + 12·L·H·Q·T.

Every expected number is computed here from the model's sizes (the matrices of each block, written
out), never by the code under test: N is the matmul weights a token goes through, the LM head
included (tied or not), embedding tables, biases and norm scales excluded (docs/flops.md).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import babysitter
from babysitter import flops
from nanogpt import GPT, GPTConfig, nanogpt_flops_per_token
from tinygpt import TinyConfig, TinyGPT

T = 24  # training sequence length of these tests (below every block_size)


def palm(n_weights: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> float:
    """PaLM's 6N + 12·L·H·Q·T."""
    return float(6 * n_weights + 12 * n_layers * n_heads * head_dim * seq_len)


def nanogpt_weights(cfg: GPTConfig) -> int:
    """A nanoGPT block's matrices: c_attn (3h x h), attn c_proj (h x h), c_fc (4h x h), mlp c_proj
    (h x 4h); plus the LM head (V x h, tied to wte: one matmul per token all the same)."""
    h = cfg.n_embd
    return cfg.n_layer * (3 * h * h + h * h + 4 * h * h + 4 * h * h) + cfg.vocab_size * h


def nanogpt_expected(cfg: GPTConfig, seq_len: int) -> float:
    return palm(nanogpt_weights(cfg), cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, seq_len)


CONFIGS = [
    GPTConfig(block_size=32, vocab_size=100, n_layer=3, n_head=4, n_embd=48, bias=True),
    GPTConfig(block_size=64, vocab_size=96, n_layer=2, n_head=2, n_embd=32, bias=False),
]


def _watched_flops(model: object, **kwargs: object) -> float | None:
    tracker = babysitter.watch(model, port=-1, peak_flops=1e12, ledger=False, hang_timeout=None, **kwargs)  # type: ignore[arg-type]
    try:
        return tracker.config.flops.model
    finally:
        tracker.close()


@pytest.mark.parametrize("cfg", CONFIGS, ids=["bias", "no-bias"])
def test_nanogpt_module_and_config_get_palms_formula(cfg: GPTConfig) -> None:
    """nanoGPT's GPT module, its GPTConfig dataclass and the same config as a dict: one number, the
    formula's, in flops.infer and in watch() (whose error used to be "no FLOPs builder for model_type ''")."""
    torch.manual_seed(0)
    model = GPT(cfg)
    want = nanogpt_expected(cfg, T)
    for source in (model, cfg, dataclasses.asdict(cfg)):
        assert flops.infer(source, seq_len=T).model == want, type(source).__name__
        assert _watched_flops(source, seq_len=T) == want, type(source).__name__
    assert flops.infer(model, seq_len=T).source == "params"  # the module's own weights, counted
    assert flops.infer(cfg, seq_len=T).source == "config:nanogpt"
    # The config builder's parameter count is the module's, tied head and optional biases included.
    assert flops.parameter_counts(cfg).total == sum(p.numel() for p in model.parameters())


def test_nanogpts_own_estimate_differs_by_its_one_dimensional_parameters() -> None:
    """nanoGPT's estimate_mfu counts every parameter but the position table; babysitter leaves biases
    and norm scales out of N (not matmul weights). The difference is exactly 6x those."""
    cfg = CONFIGS[0]
    model = GPT(cfg)
    one_dim = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert one_dim > 0
    assert nanogpt_flops_per_token(model, T) - flops.infer(model, seq_len=T).model == 6 * one_dim


class PlainLM(nn.Module):
    """A causal LM from torch's own layers, with no config at all."""

    def __init__(
        self, vocab: int = 80, width: int = 32, heads: int = 4, ff: int = 96, layers: int = 3
    ) -> None:
        super().__init__()
        self.sizes = (vocab, width, heads, ff, layers)
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=ff, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        out: torch.Tensor = self.head(self.encoder(self.embed(idx), mask=mask, is_causal=True))
        return out


def plain_expected(model: PlainLM, seq_len: int) -> float:
    vocab, width, heads, ff, layers = model.sizes
    # per layer: q, k, v and out projections (4 x h x h), the feed-forward (h x ff and ff x h); the head
    weights = layers * (4 * width * width + 2 * width * ff) + width * vocab
    return palm(weights, layers, heads, width // heads, seq_len)


def test_plain_modules_get_palms_formula() -> None:
    """Modules nobody described: torch's TransformerEncoder (its nn.MultiheadAttention layers found)
    and the demo's GPT (nn.MultiheadAttention, untied head, a GPT-2-style config without model_type)."""
    plain = PlainLM()
    assert flops.infer(plain, seq_len=T).model == plain_expected(plain, T)
    assert _watched_flops(plain, seq_len=T) == plain_expected(plain, T)
    cfg = TinyConfig()
    tiny = TinyGPT(cfg)
    h = cfg.n_embd
    weights = cfg.n_layer * (4 * h * h + 8 * h * h) + h * cfg.vocab_size
    want = palm(weights, cfg.n_layer, cfg.n_head, h // cfg.n_head, T)
    assert flops.infer(tiny, seq_len=T).model == want
    assert flops.infer(cfg, seq_len=T).model == want  # its config alone reads as nanoGPT's: same FLOPs


def test_torch_counts_what_the_formula_says() -> None:
    """FlopCounterMode over a real training step agrees with the formula for both kinds of module, to
    the FLOP: every weight 6x per token, and attention 3.5x its forward rather than 3x, because
    torch counts the flash kernel's backward as five matmuls (it recomputes the scores; docs/flops.md):
    measured = expected + 0.5 x 4·L·H·Q·T."""
    torch.manual_seed(0)
    cfg = CONFIGS[0]
    nano = GPT(cfg)
    plain = PlainLM()
    vocab, width, _, _, layers = plain.sizes
    cases = [
        (nano, cfg.vocab_size, nanogpt_expected(cfg, T), cfg.n_layer * cfg.n_embd),
        (plain, vocab, plain_expected(plain, T), layers * width),
    ]
    for model, vocab_size, expected, layers_x_width in cases:
        idx = torch.randint(0, vocab_size, (2, T))

        def step(model: nn.Module = model, idx: torch.Tensor = idx) -> None:
            out = model(idx)
            logits = out[0] if isinstance(out, tuple) else out
            logits.float().pow(2).mean().backward()

        measured = flops.measure(model, step, tokens=idx.numel()).per_token().model
        assert measured == pytest.approx(expected + 2 * layers_x_width * T, rel=1e-9), type(model).__name__


def test_what_is_counted_is_said_once_and_a_module_without_attention_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Counted parameters are a guess about what runs: one info line says what was counted; with no
    attention layer recognised (6N alone) it is a warning naming flops_per_token=."""
    caplog.set_level(logging.INFO, logger="babysitter")
    _watched_flops(PlainLM(), seq_len=T)
    counted = [r for r in caplog.records if "counted from its parameters" in r.getMessage()]
    assert [r.levelno for r in counted] == [logging.INFO]
    assert "T = 24" in counted[0].getMessage()
    caplog.clear()
    mlp = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
    assert _watched_flops(mlp) == 6 * (16 * 64 + 64 * 16)  # no attention: no seq_len needed
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "flops_per_token=" in said[0].getMessage()


class _OpaqueAttention(nn.Module):
    """Attention whose width is held nowhere the counter can read (a fused weight, no sizes)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, 3 * width))


class _OpaqueLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.attn = _OpaqueAttention(16)
        self.head = nn.Linear(16, 64)


def test_what_cannot_be_counted_fails_in_watch_naming_the_argument() -> None:
    """watch() is called with the model at setup: a model it cannot count is a clear error there,
    naming the one argument to pass."""
    with pytest.raises(flops.FlopsUnavailable, match=r"Pass seq_len="):
        babysitter.watch(GPT(CONFIGS[0]), port=-1, peak_flops=1e12, ledger=False, hang_timeout=None)
    with pytest.raises(flops.FlopsUnavailable, match=r"_OpaqueAttention.*Pass flops_per_token="):
        babysitter.watch(_OpaqueLM(), seq_len=T, port=-1, peak_flops=1e12, ledger=False, hang_timeout=None)
    with pytest.raises(ValueError, match="seq_len="):
        flops.infer(CONFIGS[0])  # a config alone: block_size is a limit, not the length trained on
    # The fix the message names works.
    assert _watched_flops(_OpaqueLM(), flops_per_token=1e6) == 1e6


def test_a_config_that_says_its_sizes_covers_attention_the_module_hides() -> None:
    """The config's n_layer/n_head/n_embd stand in for attention modules that do not say their width."""
    model = _OpaqueLM()
    model.config = {"n_layer": 1, "n_head": 2, "n_embd": 16}  # type: ignore[assignment]
    weights = 16 * 3 * 16 + 16 * 64  # the opaque fused q/k/v matrix, the head
    assert flops.infer(model, seq_len=T).model == palm(weights, 1, 2, 8, T)


def test_watch_without_a_model_or_flops_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="babysitter")
    tracker = babysitter.watch(port=-1, peak_flops=1e12, ledger=False, hang_timeout=None, tokens_per_step=8)
    tracker.close()
    said = [r.getMessage() for r in caplog.records if "FLOPs" in r.getMessage()]
    assert len(said) == 1 and "flops_per_token=" in said[0], said


def test_steps_without_tokens_say_so_once(caplog: pytest.LogCaptureFixture) -> None:
    """FLOPs per token known, but no token ever counted: no FLOPs, no MFU, and one warning naming
    tokens_per_step=."""
    caplog.set_level(logging.WARNING, logger="babysitter")
    tracker = babysitter.watch(port=-1, peak_flops=1e12, flops_per_token=6e3, ledger=False, hang_timeout=None)
    try:
        for _ in range(2):
            for _ in range(4):
                time.sleep(0.001)
                tracker.step()
            tracker.housekeep()
    finally:
        tracker.close()
    said = [r.getMessage() for r in caplog.records if "no tokens counted" in r.getMessage()]
    assert len(said) == 1 and "tokens_per_step=" in said[0], said


def test_parameters_flattened_by_fsdp_or_every_expert_are_refused(tmp_path: Path) -> None:
    """Counting would be wrong by a factor: refused, naming flops_per_token=."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        for orig in (False, True):
            sharded = FullyShardedDataParallel(
                nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)),
                device_id=torch.device("cpu"),
                use_orig_params=orig,
            )
            with pytest.raises(flops.FlopsUnavailable, match="FSDP") as caught:
                flops.infer(sharded, seq_len=T)
            assert caught.value.argument == "flops_per_token"
    finally:
        dist.destroy_process_group()

    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    with pytest.raises(flops.FlopsUnavailable, match="mixture of experts") as caught:
        flops.infer(Experts(), seq_len=T)
    assert caught.value.argument == "flops_per_token"
    moe_config = nn.Linear(8, 8)
    moe_config.config = {"model_type": "olmoe", "num_experts": 64}  # type: ignore[assignment]
    with pytest.raises(flops.FlopsUnavailable, match="num_experts=64"):
        flops.infer(moe_config, seq_len=T)


def _uncovered_hf_configs() -> dict[str, object]:
    tf = pytest.importorskip("transformers")
    return {
        "phi3": tf.Phi3Config(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=0,
        ),
        "gemma": tf.GemmaConfig(  # 4 heads x head_dim 32: H·Q = 128, twice the hidden size
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
        ),
        "gpt_neox": tf.GPTNeoXConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
        ),
        "opt": tf.OPTConfig(
            vocab_size=128,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=64,
        ),
        "bloom": tf.BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4),
        "falcon": tf.FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
        "gpt_bigcode": tf.GPTBigCodeConfig(vocab_size=128, n_embd=64, n_layer=2, n_head=4, multi_query=True),
    }


@pytest.mark.parametrize("name", ["phi3", "gemma", "gpt_neox", "opt", "bloom", "falcon", "gpt_bigcode"])
def test_hugging_face_models_no_builder_covers_are_counted(name: str) -> None:
    """Hugging Face architectures without a config builder: their parameters counted and their attention
    found (or taken from the config where the attention module hides its width) agree with
    FlopCounterMode over a real step, within the flash backward's +0.5 x attention forward."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(_uncovered_hf_configs()[name])
    ids = torch.randint(1, 128, (2, 16))
    counted = flops.infer(model, seq_len=16)
    assert counted.source == "params"

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    measured = flops.measure(model, step, tokens=ids.numel())
    assert 1.0 <= measured.per_token().model / counted.model < 1.02


def test_a_hugging_face_mixture_of_experts_no_builder_covers_is_refused() -> None:
    tf = pytest.importorskip("transformers")
    config = tf.OlmoeConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
    )
    with pytest.raises(flops.FlopsUnavailable, match=r"mixture of experts.*pass flops_per_token="):
        flops.infer(tf.AutoModelForCausalLM.from_config(config), seq_len=16)
