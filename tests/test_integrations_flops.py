"""MFU from the callbacks for models without a covered Hugging Face config (issue 32): nanoGPT and plain
LightningModules get FLOPs and MFU; where none can be had, one warning names the argument to pass.

Real Lightning and Hugging Face Trainer runs on CPU; the expected FLOPs come from the models' sizes
(tests/test_flops_any_model.py writes the formula out), not from the code under test.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("lightning")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import lightning as L
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments

from babysitter.catalog import train as T
from babysitter.integrations.hf import Babysitter as HFBabysitter
from babysitter.integrations.lightning import Babysitter
from integ_helpers import TOKEN_BATCH, random_token_batches, sample_value
from nanogpt import GPT, GPTConfig
from test_flops_any_model import nanogpt_expected

PEAK = 1e12
B, SEQ = TOKEN_BATCH
CFG = GPTConfig(block_size=32, vocab_size=128, n_layer=2, n_head=4, n_embd=32)


def _babysitter_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "babysitter" and r.levelno >= logging.WARNING]


# ---------------------------------------------------------------------------------------- Lightning


class LitNanoGPT(L.LightningModule):
    """A plain LightningModule around nanoGPT: no flops_per_batch, the GPTConfig on its child."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gpt = GPT(CFG)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        _, loss = self.gpt(*batch)
        assert loss is not None
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _token_pairs(batches: int) -> torch.utils.data.DataLoader[Any]:
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, CFG.vocab_size, (batches * B, SEQ + 1), generator=gen)
    rows = list(zip(data[:, :-1], data[:, 1:], strict=True))
    return torch.utils.data.DataLoader(rows, batch_size=B)  # type: ignore[arg-type]


def _fit(
    tmp_path: Path, module: L.LightningModule, callback: Babysitter, loader: Any, steps: int = 3
) -> None:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback],
        limit_val_batches=0,
    )
    trainer.fit(module, train_dataloaders=loader)


def _callback(**kwargs: Any) -> Babysitter:
    return Babysitter(
        run="lit-flops", port=-1, peak_flops=PEAK, hang_timeout=None, straggler_every=None, **kwargs
    )


def test_lightning_nanogpt_exports_flops_and_mfu(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No config the builders know, no flops_per_batch: the module's parameters and attention layers
    give the FLOPs, the first batch the sequence length; counters and MFU are exported, silently."""
    caplog.set_level(logging.INFO, logger="babysitter")
    callback = _callback()
    _fit(tmp_path, LitNanoGPT(), callback, _token_pairs(3))
    reg = callback.tracker.registry  # type: ignore[union-attr]
    tokens = 3 * B * SEQ
    assert sample_value(reg, T.TOKENS.name) == tokens
    assert sample_value(reg, T.MODEL_FLOPS.name) == pytest.approx(tokens * nanogpt_expected(CFG, SEQ))
    mfu = sample_value(reg, T.MFU.name)
    assert mfu is not None and mfu > 0
    assert sample_value(reg, T.INFO.name, flops_source="params") == 1
    assert _babysitter_warnings(caplog) == []


class _OpaqueAttention(nn.Module):
    """Attention whose width is nowhere to be read: a fused weight, no head count, no sizes."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv = nn.Parameter(torch.randn(width, 3 * width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (x @ self.qkv).chunk(3, dim=-1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class LitOpaque(L.LightningModule):
    """A plain LightningModule (no config, no flops_per_batch) whose FLOPs cannot be counted."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(CFG.vocab_size, 16)
        self.attn = _OpaqueAttention(16)
        self.head = nn.Linear(16, CFG.vocab_size)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.head(self.attn(self.embed(x)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_lightning_without_flops_says_so_once_naming_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tokens are counted but FLOPs cannot be: one warning (it used to be silence) naming the one
    argument that fixes it; passing it gives FLOPs and MFU."""
    caplog.set_level(logging.WARNING)
    callback = _callback()
    _fit(tmp_path, LitOpaque(), callback, _token_pairs(3))
    reg = callback.tracker.registry  # type: ignore[union-attr]
    assert sample_value(reg, T.TOKENS.name) == 3 * B * SEQ
    assert not sample_value(reg, T.MODEL_FLOPS.name)
    assert sample_value(reg, T.MFU.name) is None
    said = _babysitter_warnings(caplog)
    assert len(said) == 1, said
    assert (
        "no FLOPs per token" in said[0]
        and "Pass flops_per_token=" in said[0]
        and "_OpaqueAttention" in said[0]
    )
    caplog.clear()
    fixed = _callback(flops_per_token=5e4)
    _fit(tmp_path, LitOpaque(), fixed, _token_pairs(3))
    reg = fixed.tracker.registry  # type: ignore[union-attr]
    assert sample_value(reg, T.MODEL_FLOPS.name) == pytest.approx(3 * B * SEQ * 5e4)
    assert _babysitter_warnings(caplog) == []


class LitFeatures(L.LightningModule):
    """Attention over float features: the batches show no token ids, so no sequence length either."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = nn.Linear(16, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        h, _ = self.attn(batch, batch, batch, need_weights=False)
        return self.out(h).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_lightning_attention_without_a_sequence_length_names_seq_len(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    features = torch.utils.data.DataLoader(torch.randn(3 * B, SEQ, 16), batch_size=B)  # type: ignore[arg-type]
    callback = _callback()
    _fit(tmp_path, LitFeatures(), callback, features)
    said = _babysitter_warnings(caplog)
    assert len(said) == 1, said
    assert "Pass seq_len=" in said[0]
    caplog.clear()
    fixed = _callback(seq_len=SEQ, tokens_per_step=B * SEQ)
    _fit(tmp_path, LitFeatures(), fixed, features)
    # 6N (q, k, v, out projections 4 x 16 x 16; the output head 16 x 1) + 12·L·H·Q·T, one layer
    per_token = 6 * (4 * 16 * 16 + 16) + 12 * 1 * 16 * SEQ
    reg = fixed.tracker.registry  # type: ignore[union-attr]
    assert sample_value(reg, T.MODEL_FLOPS.name) == pytest.approx(3 * B * SEQ * per_token)
    assert _babysitter_warnings(caplog) == []


# ------------------------------------------------------------------------------------ Hugging Face


class NanoGPTConfig(PretrainedConfig):
    """A nanoGPT-style Hugging Face config: nanoGPT's field names, a model_type no builder covers."""

    model_type = "nanogpt-hf"

    def __init__(
        self,
        n_layer: int = 2,
        n_head: int = 4,
        n_embd: int = 32,
        block_size: int = 32,
        vocab_size: int = 128,
        **kw: Any,
    ) -> None:
        self.n_layer, self.n_head, self.n_embd, self.block_size = n_layer, n_head, n_embd, block_size
        super().__init__(vocab_size=vocab_size, **kw)
        self.vocab_size = vocab_size


class NanoGPTForCausalLM(PreTrainedModel):
    config_class = NanoGPTConfig
    base_model_prefix = "gpt"

    def __init__(self, config: NanoGPTConfig) -> None:
        super().__init__(config)
        torch.manual_seed(0)
        self.gpt = GPT(
            GPTConfig(
                block_size=config.block_size,
                vocab_size=config.vocab_size,
                n_layer=config.n_layer,
                n_head=config.n_head,
                n_embd=config.n_embd,
            )
        )

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any
    ) -> dict[str, torch.Tensor | None]:
        logits, loss = self.gpt(input_ids, labels)
        return {"loss": loss, "logits": logits}


class _Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, batches: int) -> None:
        self.rows = [{k: v[i] for k, v in b.items()} for b in random_token_batches(batches) for i in range(B)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]


def _hf_fit(tmp_path: Path, model: PreTrainedModel, callback: HFBabysitter) -> None:
    """Three steps of the Hugging Face Trainer on CPU, logging every step, saving nothing."""
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=B,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        save_strategy="no",
    )
    Trainer(model=model, args=args, train_dataset=_Rows(3), callbacks=[callback]).train()


def test_hf_trainer_with_a_nanogpt_style_config_exports_flops_and_mfu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    callback = HFBabysitter(
        run="hf-nanogpt", port=-1, peak_flops=PEAK, hang_timeout=None, straggler_every=None
    )
    _hf_fit(tmp_path, NanoGPTForCausalLM(NanoGPTConfig()), callback)
    reg = callback.tracker.registry  # type: ignore[union-attr]
    tokens = 3 * B * SEQ
    assert sample_value(reg, T.TOKENS.name) == tokens
    assert sample_value(reg, T.MODEL_FLOPS.name) == pytest.approx(tokens * nanogpt_expected(CFG, SEQ))
    mfu = sample_value(reg, T.MFU.name)
    assert mfu is not None and mfu > 0
    assert _babysitter_warnings(caplog) == []


class OpaqueConfig(PretrainedConfig):
    """A Hugging Face config that says nothing of the model's shape."""

    model_type = "opaque-hf"


class OpaqueForCausalLM(PreTrainedModel):
    """A PreTrainedModel whose FLOPs cannot be counted: attention of a width nowhere to be read."""

    config_class = OpaqueConfig

    def __init__(self, config: OpaqueConfig) -> None:
        super().__init__(config)
        torch.manual_seed(0)
        self.embed = nn.Embedding(CFG.vocab_size, 16)
        self.attn = _OpaqueAttention(16)
        self.head = nn.Linear(16, CFG.vocab_size)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any
    ) -> dict[str, torch.Tensor | None]:
        logits = self.head(self.attn(self.embed(input_ids)))
        loss = None if labels is None else nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


def test_hf_trainer_without_flops_says_so_once_and_trains_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As the Lightning callback: a model whose FLOPs cannot be counted trains, its tokens counted, with
    one warning naming the argument that fixes it, and no FLOPs or MFU made up."""
    caplog.set_level(logging.WARNING)
    callback = HFBabysitter(
        run="hf-opaque", port=-1, peak_flops=PEAK, hang_timeout=None, straggler_every=None
    )
    _hf_fit(tmp_path, OpaqueForCausalLM(OpaqueConfig()), callback)
    reg = callback.tracker.registry  # type: ignore[union-attr]
    assert sample_value(reg, T.TOKENS.name) == 3 * B * SEQ
    assert not sample_value(reg, T.MODEL_FLOPS.name)
    assert sample_value(reg, T.MFU.name) is None
    said = _babysitter_warnings(caplog)
    assert len(said) == 1, said
    assert "no FLOPs per token" in said[0] and "Pass flops_per_token=" in said[0], said
