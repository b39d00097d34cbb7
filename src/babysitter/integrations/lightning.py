"""``Trainer(callbacks=[Babysitter()])`` for PyTorch Lightning: the tracker, driven by Lightning's hooks.

What it reads, and where:

* **Tokens and samples** from each training batch's shapes (``input_ids.numel()`` of a dict batch,
  or the first integer tensor of a tuple) in ``on_train_batch_start``: metadata, no sync. With
  ``count_tokens="non_padding"`` the attention mask's sum when the mask is on the CPU;
  ``"non_padding_sync"`` sums it on the device too, at one device sync per micro-batch.
* **Steps**: one ``tracker.step()`` per *optimizer* step: Lightning calls the batch hooks per
  micro-batch, so the callback steps when ``trainer.global_step`` moves (gradient accumulation and
  skipped optimizer steps are respected). The loss tensor is handed over detached and read later
  by the tracker, off the training thread.
* **FLOPs** from ``flops_per_token=``; else ``pl_module.flops_per_batch`` when set
  (ThroughputMonitor's convention: FLOPs of one micro-batch through the whole model, forward and
  backward), divided by the first batch's tokens; else from the module
  (:func:`babysitter.flops.infer`): its (or its first child's) Hugging Face ``config`` of a covered
  type, else its parameters counted (6N) with the attention layers it holds (12·L·H·Q·T), which
  covers nanoGPT and plain modules. When the attention term needs the sequence length and
  ``seq_len`` is not given, the tracker starts at the first batch, whose shape gives it (so does a
  module whose parameters ``configure_model`` creates). When no FLOPs can be had, one warning says
  why and names the argument to pass (``seq_len=`` or ``flops_per_token=``).
* **The trainer's loggers** (W&B, TensorBoard, MLflow, CSV...) get tokens/s, MFU, HFU, data-wait
  fraction and goodput from rank 0's tracker snapshot every ``log_every_n_steps``, under
  ``log_prefix`` (``babysitter/mfu``...); plain floats, so logging adds no device sync.
* **Precision** from ``trainer.precision`` for the peak FLOP/s lookup.
* **Parallel layout** from the strategy's DeviceMesh (``ModelParallelStrategy``: its
  ``tensor_parallel`` ranks share each batch, so they share its tokens and FLOPs); ``parallelism=``
  overrides it. Tokens are counted from the batch as the loader gives it, before any sharding.
* **Checkpoints**: ``trainer.save_checkpoint`` (what ``ModelCheckpoint`` calls) and the strategy's
  ``load_checkpoint`` are timed by wrapping them on this trainer instance only.
* **Evaluation** during fit is a marked ``eval`` phase, kept out of step time and MFU.

Unlike Lightning's ``ThroughputMonitor`` it never synchronizes the device and every rank exports
its own metrics (``rank`` label); the straggler exchange runs every ``straggler_every`` steps.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from babysitter.integrations._core import TOKEN_COUNTS, CallbackCore, batch_counts, non_padding_tokens
from babysitter.integrations._logged import LoggedValues
from babysitter.training.tracker import Tracker

try:
    from lightning.pytorch import Callback as _Callback
except ImportError:  # pragma: no cover - the older package name
    from pytorch_lightning import Callback as _Callback  # type: ignore[assignment, no-redef, unused-ignore]

__all__ = ["Babysitter"]

log = logging.getLogger("babysitter")


class Babysitter(_Callback):  # type: ignore[misc, unused-ignore]
    """Lightning callback exporting babysitter's per-rank training metrics.

    >>> trainer = lightning.Trainer(callbacks=[Babysitter(seq_len=2048, run_dir="/ckpt/run1")])

    Args:
        straggler_every: steps between straggler score exchanges (None: off); only under
            torch.distributed with more than one rank.
        log_prefix: prefix of the keys logged to the trainer's loggers (``babysitter/mfu``...);
            None logs nothing there.
        count_tokens: ``"all"`` (padding included, from shapes), ``"non_padding"`` (the attention
            mask's sum when it is on the CPU, else all) or ``"non_padding_sync"`` (the mask's sum
            anywhere: one device sync per micro-batch on an accelerator).
        **watch_kwargs: anything :func:`babysitter.watch` takes except ``model`` (``run``,
            ``seq_len``, ``peak_flops``, ``run_dir``, ``port``, ``labels``, ``hang_timeout``,
            ``parallelism`` to override the layout read from the strategy...).
    """

    def __init__(
        self,
        *,
        straggler_every: int | None = 100,
        log_prefix: str | None = "babysitter/",
        count_tokens: str = "all",
        **watch_kwargs: Any,
    ) -> None:
        super().__init__()
        if count_tokens not in TOKEN_COUNTS:
            raise ValueError(f"count_tokens must be one of {TOKEN_COUNTS}, got {count_tokens!r}")
        if log_prefix is not None and not isinstance(log_prefix, str):
            raise ValueError(f"log_prefix must be a string or None, got {log_prefix!r}")
        self.core = CallbackCore(straggler_every=straggler_every, watch_kwargs=watch_kwargs)
        self.log_prefix = log_prefix
        self.count_tokens = count_tokens
        self._logged: LoggedValues | None = None
        self._fallback_logged = False
        self._last_global_step: int | None = None
        self._trainer: Any = None
        self._batch_t0 = 0.0
        # End of the previous training batch: the gap to the next batch's start is mostly the
        # loader (fetch + collate + host-to-device copy). Cleared across validation and saves,
        # which have their own accounting.
        self._gap_t0 = 0.0
        self._host_timed = False

    @property
    def tracker(self) -> Tracker | None:
        """The tracker (None before training starts)."""
        return self.core.tracker

    # ------------------------------------------------------------------ setup and teardown

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        self._trainer = trainer
        self._wrap_checkpointing(trainer)
        if not self.core.waits_for_batch(pl_module) and _flops_per_batch(pl_module) is None:
            self._start(trainer, pl_module, None, None)

    def _start(self, trainer: Any, pl_module: Any, seq_len: int | None, tokens: int | None) -> None:
        defaults = _defaults(trainer)
        per_batch = _flops_per_batch(pl_module)
        if per_batch is not None and self.core.watch_kwargs.get("flops_per_token") is None:
            if tokens:
                # The batch's FLOPs include its padding, so per token of the shapes (not of the mask).
                defaults["flops_per_token"] = per_batch / tokens
            else:
                log.warning("babysitter: flops_per_batch is set but the batch's tokens are unknown; ignored")
        tracker = self.core.ensure(pl_module, seq_len, **defaults)
        self._host_timed = tracker is not None and tracker.config.timing == "cpu"
        self._last_global_step = int(trainer.global_step)
        if tracker is not None and self.log_prefix is not None and self._logged is None:
            self._logged = LoggedValues(tracker)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self.core.close()

    # ------------------------------------------------------------------ training

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        tokens, samples, seq_len = batch_counts(batch)
        if self.core.tracker is None:
            self._start(trainer, pl_module, seq_len, tokens)
        if self.count_tokens != "all":
            counted = non_padding_tokens(batch, sync=self.count_tokens == "non_padding_sync")
            if counted is not None:
                tokens = counted
            elif not self._fallback_logged:
                self._fallback_logged = True
                log.warning(
                    "babysitter: count_tokens=%r: no CPU attention_mask in the batch; counting all tokens "
                    "(count_tokens='non_padding_sync' sums a device mask at one sync per micro-batch)",
                    self.count_tokens,
                )
        self.core.micro_batch(tokens, samples)
        self._batch_t0 = time.perf_counter()
        tracker = self.core.tracker
        if self._gap_t0 and tracker is not None:
            tracker.add_data_wait(max(0.0, self._batch_t0 - self._gap_t0))
        self._gap_t0 = 0.0

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        # Forward time is this rank's own work (DDP's all-reduce runs in backward): the straggler
        # score compares it across ranks, which step time cannot do when collectives align steps.
        # Host-timed, so only on CPU; on CUDA the host merely enqueues kernels.
        if self._host_timed and self._batch_t0:
            self.core.add_work(time.perf_counter() - self._batch_t0)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._gap_t0 = time.perf_counter()
        step = int(trainer.global_step)
        if step == self._last_global_step:
            return  # a micro-batch of gradient accumulation, or a skipped optimizer step
        self._last_global_step = step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        detach = getattr(loss, "detach", None)
        self.core.optimizer_step(step=step, loss=detach() if callable(detach) else loss)
        if self._logged is not None and trainer.is_global_zero:
            self._log(trainer)

    def _log(self, trainer: Any) -> None:
        """Hand rank 0's values to the trainer's loggers at their cadence (as ThroughputMonitor does)."""
        try:
            connector = getattr(trainer, "_logger_connector", None)
            if not trainer.loggers:
                return
            if connector is not None:
                if not connector.should_update_logs:
                    return
            elif trainer.log_every_n_steps <= 0 or trainer.global_step % trainer.log_every_n_steps:
                return
            assert self._logged is not None
            metrics = {f"{self.log_prefix}{k}": v for k, v in self._logged.values().items()}
            if not metrics:
                return
            # The step Lightning's own logs of this batch carry (it counts after this hook).
            step = (
                int(getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step - 1))
                + 1
            )
            if connector is not None:
                connector.log_metrics(metrics, step=step)
            else:
                for logger in trainer.loggers:
                    logger.log_metrics(metrics, step=step)
        except Exception as exc:  # a logger's failure must not stop training
            tracker = self.core.tracker
            if tracker is not None:
                tracker.errors.record("lightning_log", exc)

    # ------------------------------------------------------------------ evaluation

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._gap_t0 = 0.0
        if getattr(trainer.state, "fn", None) == "fit":  # validation inside fit, not trainer.validate()
            self.core.phase_begin("eval")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.core.phase_end()

    # ------------------------------------------------------------------ checkpoints

    def _wrap_checkpointing(self, trainer: Any) -> None:
        if getattr(trainer.save_checkpoint, "_babysitter", False):
            return
        core = self.core
        save = trainer.save_checkpoint

        @functools.wraps(save)
        def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> None:
            core.save_begin(step=int(trainer.global_step), path=str(filepath))
            ok = False
            try:
                save(filepath, *args, **kwargs)
                ok = True
            finally:
                core.save_end(filepath if ok else None, ok=ok)
                self._gap_t0 = 0.0

        save_checkpoint._babysitter = True  # type: ignore[attr-defined]
        trainer.save_checkpoint = save_checkpoint
        strategy = trainer.strategy
        load = strategy.load_checkpoint

        @functools.wraps(load)
        def load_checkpoint(checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
            tracker = core.tracker
            if tracker is None:
                return load(checkpoint_path, *args, **kwargs)
            with tracker.checkpoint_load(path=str(checkpoint_path)) as handle:
                checkpoint = load(checkpoint_path, *args, **kwargs)
                step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
                if isinstance(step, int) and step >= 0:
                    handle.step = step
            self._last_global_step = handle.step
            return checkpoint

        strategy.load_checkpoint = load_checkpoint


def _flops_per_batch(pl_module: Any) -> float | None:
    """``pl_module.flops_per_batch`` (ThroughputMonitor's attribute) when it is a positive number."""
    try:
        value = getattr(pl_module, "flops_per_batch", None)
    except Exception:  # a property that raises: not set
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value)


def _defaults(trainer: Any) -> dict[str, Any]:
    """watch() defaults from the trainer: the training dtype for the peak lookup, and the parallel
    layout from the strategy's DeviceMesh (``ModelParallelStrategy``: data x tensor parallel)."""
    from babysitter import hardware

    defaults: dict[str, Any] = {}
    mesh = _strategy_mesh(getattr(trainer, "strategy", None))
    if mesh is not None:
        defaults["parallelism"] = mesh
    precision = str(getattr(trainer, "precision", "") or "")
    try:
        defaults["dtype"] = hardware.matmul_dtype(precision)
    except (TypeError, ValueError):
        log.warning("babysitter: Lightning precision %r has no peak table dtype; assuming bf16", precision)
    return defaults


def _strategy_mesh(strategy: Any) -> Any:
    """The strategy's DeviceMesh once its processes are set up (``device_mesh`` raises before);
    None, with a warning, for a mesh whose dimensions do not say what they are."""
    from babysitter.flops.parallel import layout_from_mesh

    if strategy is None or "device_mesh" not in dir(type(strategy)):
        return None
    try:
        mesh = strategy.device_mesh
        layout_from_mesh(mesh)
    except ValueError as exc:
        log.warning("babysitter: %s; pass parallelism= to the callback", exc)
        return None
    except Exception:  # not set up yet, or a strategy whose mesh is something else
        return None
    return mesh
