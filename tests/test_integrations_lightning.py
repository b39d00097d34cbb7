"""The Lightning callback on a real tiny training (GPT-2 from a config, CPU, a few steps)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("transformers")

import lightning as L

from babysitter import flops
from babysitter.catalog import train as T
from babysitter.integrations import _logged
from babysitter.integrations.lightning import Babysitter
from babysitter.ledger.writer import ENV_FLUSH
from integ_helpers import TOKEN_BATCH, random_token_batches, sample_value, tiny_gpt2, token_loader

PEAK = 1e12


class LitGPT(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_gpt2()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.model(**batch).loss  # type: ignore[no-any-return]

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.model(**batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_tiny_training_exports_steps_tokens_flops_mfu_checkpoints_and_eval(tmp_path: Path) -> None:
    """4 optimizer steps of 2 micro-batches each: one tracker step per optimizer step, tokens from shapes."""
    ckpt = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1
    )
    callback = Babysitter(
        run="lit",
        port=-1,
        peak_flops=PEAK,
        run_dir=tmp_path / "run",
        registry_dir=tmp_path / "reg",
        hang_timeout=None,
    )
    trainer = _fit(tmp_path, callback, ckpt)
    tracker = callback.tracker
    assert tracker is not None and tracker.closed
    assert trainer.global_step == 4
    reg = tracker.registry
    b, t = TOKEN_BATCH
    tokens = 4 * 2 * b * t
    assert sample_value(reg, T.STEPS.name) == 4
    assert sample_value(reg, T.STEP.name) == 4
    assert sample_value(reg, T.TOKENS.name) == tokens
    assert sample_value(reg, T.SAMPLES.name) == 4 * 2 * b
    per_token = flops.estimate(tiny_gpt2().config, seq_len=t).model
    assert sample_value(reg, T.MODEL_FLOPS.name) == pytest.approx(tokens * per_token)
    assert sample_value(reg, T.PEAK_FLOPS.name) == PEAK
    mfu = sample_value(reg, T.MFU.name)
    assert mfu is not None and mfu > 0
    assert sample_value(reg, T.CKPT_SAVE_DURATION.name + "_count") == 2  # steps 2 and 4
    assert sample_value(reg, T.CKPT_BYTES.name) > 0
    assert sample_value(reg, T.PHASE_SECONDS.name, phase="eval") > 0
    loss = sample_value(reg, T.LOSS.name)
    assert loss is not None and 0 < loss < 20
    # rank 0's ledger holds both saves and both eval phases
    records = [json.loads(line) for line in next((tmp_path / "run").glob("*.jsonl")).open()]
    saves = [r["step"] for r in records if r["k"] == "cke" and r["op"] == "save" and r["ok"]]
    assert saves == [2, 4]
    assert [r["name"] for r in records if r["k"] == "phb"] == ["eval", "eval"]


def _fit(tmp_path: Path, callback: Babysitter, ckpt: Any) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        accumulate_grad_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback, ckpt],
        val_check_interval=4,  # micro-batches: validation after optimizer steps 2 and 4
        num_sanity_val_steps=0,
    )
    trainer.fit(LitGPT(), train_dataloaders=token_loader(8), val_dataloaders=token_loader(2, seed=1))
    return trainer


def test_resume_times_the_load_and_continues_the_step_count(tmp_path: Path) -> None:
    """fit(ckpt_path=...) goes through the wrapped strategy load: a load is timed, steps continue."""
    first = Babysitter(run="lit", port=-1, hang_timeout=None, straggler_every=None)
    trainer = _fit(
        tmp_path, first, L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "c1", save_last=True)
    )
    assert trainer.global_step == 4
    ckpt = tmp_path / "c1" / "last.ckpt"
    assert ckpt.exists()
    second = Babysitter(run="lit", port=-1, hang_timeout=None, straggler_every=None, seq_len=TOKEN_BATCH[1])
    resumed = L.Trainer(
        accelerator="cpu",
        max_steps=6,
        accumulate_grad_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
        callbacks=[second],
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    resumed.fit(LitGPT(), train_dataloaders=token_loader(12), ckpt_path=str(ckpt))
    reg = second.tracker.registry  # type: ignore[union-attr]
    assert sample_value(reg, T.CKPT_LOAD_DURATION.name + "_count") == 1
    assert sample_value(reg, T.STEP.name) == 6
    assert sample_value(reg, T.STEPS.name) == 2  # steps this process ran


def test_batch_counts_reads_shapes_only() -> None:
    from babysitter.integrations._core import batch_counts

    ids = torch.zeros(4, 16, dtype=torch.long)
    assert batch_counts({"input_ids": ids, "labels": ids}) == (64, 4, 16)
    assert batch_counts({"attention_mask": ids}) == (64, 4, 16)
    assert batch_counts((ids, torch.zeros(4))) == (64, 4, 16)
    assert batch_counts(ids) == (64, 4, 16)
    assert batch_counts(torch.zeros(4, 16)) == (None, 4, None)  # float features: samples only
    assert batch_counts({"pixels": ids}) == (None, None, None)
    assert batch_counts([]) == (None, None, None)
    assert batch_counts("text") == (None, None, None)


class _SlowRows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Rows that take ``delay`` seconds each to load: a slow input pipeline."""

    def __init__(self, rows: list[dict[str, torch.Tensor]], delay: float) -> None:
        self.rows, self.delay = rows, delay

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        import time

        time.sleep(self.delay)
        return self.rows[index]


def test_slow_loader_shows_as_data_wait(tmp_path: Path) -> None:
    """The gap between one training batch's end and the next one's start (the loader) is data wait."""
    base = token_loader(8)
    rows = list(base.dataset)  # type: ignore[arg-type]
    delay = 0.02
    loader = torch.utils.data.DataLoader(_SlowRows(rows, delay), batch_size=TOKEN_BATCH[0])
    callback = Babysitter(run="lit-wait", port=-1, peak_flops=PEAK, hang_timeout=None, straggler_every=None)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=4,
        accumulate_grad_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback],
        limit_val_batches=0,
    )
    trainer.fit(LitGPT(), train_dataloaders=loader)
    wait = sample_value(callback.tracker.registry, T.DATA_WAIT.name)  # type: ignore[union-attr]
    # 8 batches of TOKEN_BATCH[0] rows each; the first fetch happens before the first batch start
    # and is not measured, so at least 7 batches' worth of sleeping shows up.
    assert wait is not None
    assert wait >= 7 * TOKEN_BATCH[0] * delay * 0.9


class _Capture(L.pytorch.loggers.Logger):
    """A Lightning logger that keeps what it is given, as W&B or TensorBoard would receive it."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "capture"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))


def _fit_logged(
    tmp_path: Path, callback: Babysitter, module: L.LightningModule, loader: Any, max_steps: int = 4
) -> _Capture:
    capture = _Capture()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        accumulate_grad_batches=2,
        log_every_n_steps=2,
        logger=capture,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback],
        limit_val_batches=0,
    )
    trainer.fit(module, train_dataloaders=loader)
    return capture


class _SlowLitGPT(LitGPT):
    """Micro-batches of 0.2 s: the ledger (every 20 ms) and housekeeping (every 50 ms) book the first
    steps well before the last log, even on a loaded machine (the tiny model alone steps in ~10 ms)."""

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(0.2)
        return super().training_step(batch, batch_idx)


def test_trainer_loggers_get_throughput_mfu_data_wait_and_goodput_at_log_every_n_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FLUSH, "0.02")  # the ledger books steps every 20 ms (5 s by default)
    monkeypatch.setattr(_logged, "GOODPUT_REFRESH_SECONDS", 0.0)  # refresh at every housekeeping pass
    callback = Babysitter(
        run="lit-log",
        flush_interval=0.05,
        port=-1,
        peak_flops=PEAK,
        run_dir=tmp_path / "run",
        hang_timeout=None,
        straggler_every=None,
    )
    capture = _fit_logged(tmp_path, callback, _SlowLitGPT(), token_loader(8), max_steps=6)
    ours = [(step, row) for step, row in capture.rows if any(k.startswith("babysitter/") for k in row)]
    assert [step for step, _ in ours] == [2, 4, 6]  # log_every_n_steps=2 over 6 optimizer steps
    per_token = flops.estimate(tiny_gpt2().config, seq_len=TOKEN_BATCH[1]).model
    for _, row in ours:
        values = {k.removeprefix("babysitter/"): v for k, v in row.items() if k.startswith("babysitter/")}
        assert set(values) - {"goodput"} == {"tokens_per_second", "mfu", "hfu", "data_wait_fraction"}
        assert all(isinstance(v, float) for v in values.values())  # plain floats: no tensor, no sync
        assert values["tokens_per_second"] > 0
        assert values["mfu"] == pytest.approx(values["tokens_per_second"] * per_token / PEAK)
        assert values["hfu"] == pytest.approx(values["mfu"])  # no recomputation declared
        assert 0.0 <= values["data_wait_fraction"] <= 1.0
        assert 0.0 <= values.get("goodput", 0.0) <= 1.0  # once the ledger is read
    # The ledger's view is computed off the training thread at the housekeeping pass after a log asks
    # for it, so a log carries the goodput of the previous log's time: the one at step 4 (0.8 s after
    # step 2, the ledger booking every 20 ms) has booked productive steps, whatever the machine's load.
    assert ours[-1][1]["babysitter/goodput"] > 0


class _LitWithFlops(LitGPT):
    """ThroughputMonitor's convention: FLOPs of one micro-batch, forward and backward."""

    flops_per_batch = 3.0e9


def _padded_loader() -> torch.utils.data.DataLoader[Any]:
    """8 batches whose attention masks zero the last ``i % 4`` positions of row ``i`` (CPU tensors)."""
    rows = []
    for batch in random_token_batches(8):
        for i in range(TOKEN_BATCH[0]):
            mask = torch.ones(TOKEN_BATCH[1], dtype=torch.long)
            if i % 4:
                mask[-(i % 4) :] = 0
            rows.append(
                {"input_ids": batch["input_ids"][i], "attention_mask": mask, "labels": batch["labels"][i]}
            )
    return torch.utils.data.DataLoader(rows, batch_size=TOKEN_BATCH[0])  # type: ignore[arg-type]


def test_flops_per_batch_and_non_padding_tokens(tmp_path: Path) -> None:
    """``flops_per_batch`` wins over the config; ``count_tokens="non_padding"`` sums CPU masks."""
    callback = Babysitter(
        run="lit-pad",
        port=-1,
        peak_flops=PEAK,
        hang_timeout=None,
        straggler_every=None,
        count_tokens="non_padding",
    )
    capture = _fit_logged(tmp_path, callback, _LitWithFlops(), _padded_loader())
    reg = callback.tracker.registry  # type: ignore[union-attr]
    b, t = TOKEN_BATCH
    padding = sum(i % 4 for i in range(b))  # per batch
    tokens = 8 * (b * t - padding)
    assert sample_value(reg, T.TOKENS.name) == tokens
    # FLOPs per token = the batch's FLOPs over its shape's tokens; padding is not useful work
    assert sample_value(reg, T.MODEL_FLOPS.name) == pytest.approx(
        tokens * _LitWithFlops.flops_per_batch / (b * t)
    )
    assert any("babysitter/mfu" in row for _, row in capture.rows)


def test_count_tokens_is_checked_and_a_device_mask_needs_the_sync_opt_in() -> None:
    from babysitter.integrations._core import non_padding_tokens

    with pytest.raises(ValueError, match="count_tokens"):
        Babysitter(count_tokens="nonpad")
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, -3:] = 0
    assert non_padding_tokens({"attention_mask": mask}, sync=False) == 13
    on_device = torch.ones(2, 8, dtype=torch.long, device="meta")  # stands in for an accelerator
    assert non_padding_tokens({"attention_mask": on_device}, sync=False) is None
    assert non_padding_tokens({"input_ids": mask}, sync=True) is None
