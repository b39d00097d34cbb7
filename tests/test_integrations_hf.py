"""The Hugging Face callback on a real tiny Trainer run (GPT-2 from a config, CPU, a few steps)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from transformers import Trainer, TrainerCallback, TrainingArguments

from babysitter import flops
from babysitter.catalog import train as T
from babysitter.integrations import _logged
from babysitter.integrations.hf import Babysitter
from babysitter.ledger.writer import ENV_FLUSH
from integ_helpers import TOKEN_BATCH, random_token_batches, sample_value, tiny_gpt2

PEAK = 1e12


class Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Single sequences; the Trainer collates ``TOKEN_BATCH[0]`` of them per micro-batch."""

    def __init__(self, batches: int, seed: int = 0) -> None:
        self.rows = [
            {k: v[i] for k, v in b.items()}
            for b in random_token_batches(batches, seed)
            for i in range(TOKEN_BATCH[0])
        ]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]


def _args(tmp_path: Path, **kw: object) -> TrainingArguments:
    settings: dict[str, object] = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": TOKEN_BATCH[0],
        "per_device_eval_batch_size": TOKEN_BATCH[0],
        "gradient_accumulation_steps": 2,
        "max_steps": 4,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    return TrainingArguments(**{**settings, **kw})  # type: ignore[arg-type]


def test_tiny_trainer_exports_steps_tokens_flops_mfu_checkpoints_and_eval(tmp_path: Path) -> None:
    """4 optimizer steps of 2 micro-batches, eval and save every 2 steps."""
    callback = Babysitter(
        run="hf",
        port=-1,
        peak_flops=PEAK,
        run_dir=tmp_path / "run",
        registry_dir=tmp_path / "reg",
        hang_timeout=None,
    )
    args = _args(tmp_path, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2)
    trainer = Trainer(
        model=tiny_gpt2(),
        args=args,
        train_dataset=Rows(8),
        eval_dataset=Rows(2, seed=1),
        callbacks=[callback],
    )
    trainer.train()
    tracker = callback.tracker
    assert tracker is not None and tracker.closed
    reg = tracker.registry
    b, t = TOKEN_BATCH
    tokens = 4 * 2 * b * t
    assert sample_value(reg, T.STEPS.name) == 4
    assert sample_value(reg, T.STEP.name) == 4
    assert sample_value(reg, T.TOKENS.name) == tokens
    assert sample_value(reg, T.SAMPLES.name) == 4 * 2 * b
    per_token = flops.estimate(tiny_gpt2().config, seq_len=t).model
    assert sample_value(reg, T.MODEL_FLOPS.name) == pytest.approx(tokens * per_token)
    mfu = sample_value(reg, T.MFU.name)
    assert mfu is not None and mfu > 0
    assert sample_value(reg, T.CKPT_SAVE_DURATION.name + "_count") == 2
    saved = sum(p.stat().st_size for p in (tmp_path / "out" / "checkpoint-4").rglob("*") if p.is_file())
    assert sample_value(reg, T.CKPT_BYTES.name) >= saved > 0
    assert sample_value(reg, T.PHASE_SECONDS.name, phase="eval") > 0
    loss = sample_value(reg, T.LOSS.name)
    assert loss is not None and 0 < loss < 20
    records = [json.loads(line) for line in next((tmp_path / "run").glob("*.jsonl")).open()]
    assert [r["step"] for r in records if r["k"] == "cke" and r["ok"]] == [2, 4]
    assert [r["name"] for r in records if r["k"] == "phb"] == ["eval", "eval"]
    # ordering: each save starts after the step's eval phase ended
    order = [r["k"] for r in records if r["k"] in ("phb", "phe", "ckb", "cke")]
    assert order == ["phb", "phe", "ckb", "cke"] * 2


def test_no_seq_len_starts_at_the_first_batch_with_its_length(tmp_path: Path) -> None:
    """FLOPs need the training sequence length: the forward hook reads it from the first batch."""
    callback = Babysitter(run="hf2", port=-1, peak_flops=PEAK, hang_timeout=None)
    trainer = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path, save_strategy="no"),
        train_dataset=Rows(8),
        callbacks=[callback],
    )
    trainer.train()
    reg = callback.tracker.registry  # type: ignore[union-attr]
    per_token = flops.estimate(tiny_gpt2().config, seq_len=TOKEN_BATCH[1]).model
    assert sample_value(reg, T.MODEL_FLOPS.name) == pytest.approx(
        4 * 2 * TOKEN_BATCH[0] * TOKEN_BATCH[1] * per_token
    )


class _Recorder(TrainerCallback):
    """Stands in for a ``report_to`` integration (W&B, MLflow...): it keeps the logs it is given."""

    def __init__(self) -> None:
        self.logs: list[dict[str, float]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.logs.append(dict(logs))


class _SlowRows(Rows):
    """Rows that take ``delay`` seconds each to load: a slow input pipeline."""

    delay = 0.01

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(self.delay)
        return self.rows[i]


def test_report_to_integrations_see_mfu_tokens_per_second_goodput_and_data_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Trainer lists report_to integrations before user callbacks; the values still reach them."""
    import transformers.trainer

    monkeypatch.setenv(ENV_FLUSH, "0.02")  # the ledger books steps every 20 ms (5 s by default)
    monkeypatch.setattr(_logged, "GOODPUT_REFRESH_SECONDS", 0.0)  # refresh at every housekeeping pass
    recorder = _Recorder()
    monkeypatch.setattr(
        transformers.trainer, "get_reporting_integration_callbacks", lambda report_to: [recorder]
    )
    callback = Babysitter(
        run="hf-log",
        flush_interval=0.05,
        port=-1,
        peak_flops=PEAK,
        seq_len=TOKEN_BATCH[1],
        run_dir=tmp_path / "run",
        hang_timeout=None,
        straggler_every=None,
    )
    trainer = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path, save_strategy="no"),
        train_dataset=_SlowRows(8),
        callbacks=[callback],
    )
    trainer.train()
    rows = [row for row in recorder.logs if "loss" in row]
    assert len(rows) == 4  # logging_steps=1
    per_token = flops.estimate(tiny_gpt2().config, seq_len=TOKEN_BATCH[1]).model
    assert "data_wait_fraction" in rows[0]  # one step: no rate yet
    for row in rows[1:]:
        assert {"tokens_per_second", "mfu", "hfu", "data_wait_fraction"} <= set(row)
        assert row["tokens_per_second"] > 0
        assert row["mfu"] == pytest.approx(row["tokens_per_second"] * per_token / PEAK)
        assert 0.0 < row["data_wait_fraction"] <= 1.0
        assert 0.0 <= row.get("goodput", 0.0) <= 1.0
    assert rows[-1]["goodput"] > 0  # the ledger's view, once it booked steps
    # a step's rows are loaded before on_step_begin: booked as data wait (the tracker started at
    # on_train_begin, seq_len being given, so every batch counts)
    wait = sample_value(callback.tracker.registry, T.DATA_WAIT.name)  # type: ignore[union-attr]
    assert wait is not None and wait >= 4 * 2 * TOKEN_BATCH[0] * _SlowRows.delay * 0.9


class _PaddedRows(Rows):
    """Row ``i`` has its last ``i % 4`` positions masked as padding."""

    def __init__(self, batches: int) -> None:
        super().__init__(batches)
        for i, row in enumerate(self.rows):
            mask = torch.ones_like(row["input_ids"])
            if i % 4:
                mask[-(i % 4) :] = 0
            row["attention_mask"] = mask


def test_num_input_tokens_seen_is_the_token_count_when_the_trainer_keeps_it(tmp_path: Path) -> None:
    callback = Babysitter(run="hf-tok", port=-1, peak_flops=PEAK, hang_timeout=None, straggler_every=None)
    data = _PaddedRows(8)
    trainer = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path, save_strategy="no", include_num_input_tokens_seen="non_padding"),
        train_dataset=data,
        callbacks=[callback],
    )
    trainer.train()
    reg = callback.tracker.registry  # type: ignore[union-attr]
    non_padding = sum(int(row["attention_mask"].sum()) for row in data.rows)
    assert trainer.state.num_input_tokens_seen == non_padding
    assert sample_value(reg, T.TOKENS.name) == non_padding  # not 8 x 4 x 16 from the shapes


def test_resume_times_the_loads_and_continues_the_step_count(tmp_path: Path) -> None:
    """train(resume_from_checkpoint=...) loads before any callback runs: the wrapped loads are timed."""
    first = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path, save_strategy="steps", save_steps=4),
        train_dataset=Rows(8),
    )
    first.train()
    checkpoint = tmp_path / "out" / "checkpoint-4"
    assert checkpoint.is_dir()
    callback = Babysitter(
        run="hf-resume",
        port=-1,
        seq_len=TOKEN_BATCH[1],
        run_dir=tmp_path / "run",
        hang_timeout=None,
        straggler_every=None,
    )
    resumed = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path, save_strategy="no", max_steps=6),
        train_dataset=Rows(12),
        callbacks=[callback],
    )
    resumed.train(resume_from_checkpoint=str(checkpoint))
    reg = callback.tracker.registry  # type: ignore[union-attr]
    assert sample_value(reg, T.CKPT_LOAD_DURATION.name + "_count") == 2  # weights, optimizer state
    load_seconds = sample_value(reg, T.CKPT_LOAD_DURATION.name + "_sum")
    assert load_seconds is not None and load_seconds > 0
    assert sample_value(reg, T.STEP.name) == 6
    assert sample_value(reg, T.STEPS.name) == 2  # steps this process ran
    records = [json.loads(line) for line in next((tmp_path / "run").glob("*.jsonl")).open()]
    loads = [r for r in records if r["k"] == "cke" and r["op"] == "load"]
    assert [(r["step"], r["ok"]) for r in loads] == [(4, True), (4, True)]


def test_the_callback_runs_right_after_the_flow_callback_and_before_report_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trainer.__init__ lists DefaultFlowCallback, then report_to's integrations, then callbacks=."""
    import transformers.trainer
    from transformers.trainer_callback import DefaultFlowCallback

    recorder = _Recorder()
    monkeypatch.setattr(
        transformers.trainer, "get_reporting_integration_callbacks", lambda report_to: [recorder]
    )
    callback = Babysitter(run="hf-order", port=-1, hang_timeout=None, straggler_every=None)
    trainer = Trainer(model=tiny_gpt2(), args=_args(tmp_path), train_dataset=Rows(1), callbacks=[callback])
    order = trainer.callback_handler.callbacks
    assert isinstance(order[0], DefaultFlowCallback)
    assert order[1] is callback and order.index(recorder) > 1
    quiet = Babysitter(run="hf-quiet", port=-1, log_values=False, hang_timeout=None, straggler_every=None)
    other = Trainer(model=tiny_gpt2(), args=_args(tmp_path), train_dataset=Rows(1), callbacks=[quiet])
    assert other.callback_handler.callbacks.index(quiet) > other.callback_handler.callbacks.index(recorder)
