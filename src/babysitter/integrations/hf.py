"""``transformers.Trainer(callbacks=[Babysitter()])``: the tracker, driven by the Trainer's events.

Hugging Face callbacks see neither the batch nor the start of evaluation or of a save, so:

* **Tokens and samples** come from a forward pre-hook on the model, registered in
  ``on_train_begin``: it reads ``input_ids``' shape (metadata, no sync) of every training
  micro-batch. The same hook notices the first evaluation forward and opens the ``eval`` phase,
  which ``on_evaluate`` closes. With ``include_num_input_tokens_seen`` on (``"all"`` or
  ``"non_padding"``: the Trainer then pays for its count), tokens come from
  ``state.num_input_tokens_seen`` instead, per process.
* **Data wait**: the Trainer fetches a step's micro-batches before ``on_step_begin``; the time from
  the end of the previous step's hooks (``on_step_end``, ``on_log``, ``on_save``, ``on_evaluate``)
  to ``on_step_begin`` is booked as data wait.
* **The logs** every ``report_to`` integration receives get ``tokens_per_second``, ``mfu``, ``hfu``,
  ``data_wait_fraction`` and ``goodput`` (rank 0's tracker snapshot; floats). Integrations run
  before user callbacks, so at ``on_init_end`` the callback moves itself right after the
  Trainer's ``DefaultFlowCallback``.
* **Steps**: one ``tracker.step()`` per ``on_step_end``, i.e. per optimizer step
  (``gradient_accumulation_steps`` micro-batches are summed).
* **Loss**: the value the Trainer logs (``on_log``), already a Python float, so no extra sync.
* **Checkpoint loads** (``resume_from_checkpoint``) happen before any callback runs: at
  ``on_init_end`` the callback wraps the Trainer's weight and optimizer-state loads on that
  instance, and times each as a load.
* **Checkpoint saves**: ``DefaultFlowCallback`` decides ``control.should_save`` before this
  callback's ``on_step_end``; the save starts right after that hook (or after ``on_evaluate``
  when the step also evaluates) and ends at ``on_save``.
* **FLOPs** from ``flops_per_token=``, else from the model (:func:`babysitter.flops.infer`):
  ``model.config`` of a covered ``model_type``, else the model's parameters counted (6N) with its
  attention layers, or its config's ``n_layer``/``n_head``/``n_embd`` (a nanoGPT-style config),
  for 12·L·H·Q·T. Without ``seq_len`` the tracker starts at the first batch, whose shape gives it.
  When no FLOPs can be had, one warning says why and names the argument to pass.
* **Parallel layout** from ``args.parallelism_config`` (accelerate's ``ParallelismConfig``: tensor,
  context and sequence parallel sizes) or the model's own tensor-parallel size (``tp_plan``);
  ``parallelism=`` overrides it. Under context or sequence parallelism the Trainer hands the model
  ``1 / (cp x sp)`` of each sequence, so the forward hook scales what it sees back to the replica's
  tokens (and sequence length) before the tracker shares them out.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from babysitter.integrations._core import CallbackCore, batch_counts
from babysitter.integrations._logged import LoggedValues
from babysitter.training.tracker import Tracker

__all__ = ["Babysitter"]

log = logging.getLogger("babysitter")


class Babysitter(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Hugging Face Trainer callback exporting babysitter's per-rank training metrics.

    >>> trainer = transformers.Trainer(model, args, callbacks=[Babysitter(run_dir=args.output_dir)])

    Args:
        straggler_every: steps between straggler score exchanges (None: off).
        log_values: add tokens/s, MFU, HFU, data-wait fraction and goodput to the Trainer's logs.
        **watch_kwargs: anything :func:`babysitter.watch` takes except ``model``; ``parallelism=``
            overrides the layout read from the Trainer.
    """

    def __init__(
        self, *, straggler_every: int | None = 100, log_values: bool = True, **watch_kwargs: Any
    ) -> None:
        self.core = CallbackCore(straggler_every=straggler_every, watch_kwargs=watch_kwargs)
        self.log_values = bool(log_values)
        self._logged: LoggedValues | None = None
        self._ready = 0.0  # end of the previous step's hooks: from here to on_step_begin is data wait
        self._tokens_seen: int | None = None  # state.num_input_tokens_seen at the last step
        self._tokens_carry = 0
        self._handler_warned = False
        self._load_warned = False
        self._hook: Any = None
        self._model: Any = None
        self._args: Any = None
        self._loss: float | None = None
        self._training = False
        self._seq_shards = 1  # the Trainer splits each sequence over this many ranks (cp x sp)

    @property
    def tracker(self) -> Tracker | None:
        """The tracker (None before training starts)."""
        return self.core.tracker

    # ------------------------------------------------------------------ lifecycle

    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._run_before_integrations()
        self._args, self._model = args, model
        trainer = _calling_trainer()
        if trainer is not None:
            self._wrap_loads(trainer)

    def _wrap_loads(self, trainer: Any) -> None:
        """Time a resume's loads: ``Trainer.train(resume_from_checkpoint=...)`` reads the weights
        (``_load_from_checkpoint``) and the optimizer and scheduler state
        (``_load_optimizer_and_scheduler``) before any callback runs, so both are wrapped on this
        Trainer instance; each is one timed load. The tracker starts at the first load when it can
        (``seq_len`` known or FLOPs not from a config), else the loads are not timed (logged once)."""
        for name in ("_load_from_checkpoint", "_load_optimizer_and_scheduler"):
            original = getattr(trainer, name, None)
            if original is None or getattr(original, "_babysitter", False):
                continue
            wrapper = functools.partial(self._timed_load, original)
            wrapper._babysitter = True  # type: ignore[attr-defined]
            setattr(trainer, name, wrapper)

    def _timed_load(self, load: Any, checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
        tracker = self.core.tracker
        if tracker is None and checkpoint is not None:
            try:
                if self.core.waits_for_batch(self._model):
                    if not self._load_warned:
                        self._load_warned = True
                        log.warning(
                            "babysitter: the resume's checkpoint load is not timed: the tracker starts at "
                            "the first batch (pass seq_len= to time it)"
                        )
                else:
                    self._start(None)
                    tracker = self.core.tracker
            except Exception as exc:
                log.warning("babysitter: could not start tracking before the checkpoint load: %r", exc)
        if tracker is None or checkpoint is None:
            return load(checkpoint, *args, **kwargs)
        with tracker.checkpoint_load(step=_checkpoint_step(checkpoint), path=str(checkpoint)):
            return load(checkpoint, *args, **kwargs)

    def _run_before_integrations(self) -> None:
        """Move this callback right after ``DefaultFlowCallback`` in the handler calling it, so the
        ``report_to`` integrations (listed before user callbacks) see the values added in ``on_log``.

        The handler is the caller's ``self`` (``CallbackHandler.call_event``): callbacks get no
        reference to it. The callback only ever moves to an earlier index, which leaves every later
        element where it was while the handler iterates: no callback is skipped or called twice.
        """
        if not self.log_values:
            return
        try:
            frame: Any = sys._getframe(1)
            for _ in range(4):
                if frame is None:
                    break
                handler = frame.f_locals.get("self")
                if isinstance(handler, CallbackHandler) and self in handler.callbacks:
                    callbacks = handler.callbacks
                    here = callbacks.index(self)
                    flow = [
                        i for i, c in enumerate(callbacks) if isinstance(c, DefaultFlowCallback) and i < here
                    ]
                    target = flow[-1] + 1 if flow else 0
                    if target < here:
                        callbacks.insert(target, callbacks.pop(here))
                    return
                frame = frame.f_back
        except Exception as exc:  # ordering is a convenience: never fail the Trainer for it
            log.warning("babysitter: could not order the Hugging Face callback before report_to: %r", exc)
            return
        if not self._handler_warned:
            self._handler_warned = True
            log.warning(
                "babysitter: no CallbackHandler calls this callback; report_to may not see its values"
            )

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._run_before_integrations()  # added with trainer.add_callback() after __init__
        self._args, self._model, self._training = args, model, True
        self._tokens_seen = int(state.num_input_tokens_seen) if _counts_tokens(args) else None
        self._tokens_carry = 0
        self._seq_shards = _sequence_shards(args)
        if model is not None and hasattr(model, "register_forward_pre_hook") and self._hook is None:
            self._hook = model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        if not self.core.waits_for_batch(model):
            self._start(None)

    def _start(self, seq_len: int | None) -> None:
        tracker = self.core.ensure(self._model, seq_len, **_defaults(self._args, self._model))
        if tracker is not None and self.log_values and self._logged is None:
            self._logged = LoggedValues(tracker)
        self._ready = time.perf_counter()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._training = False
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.core.close()

    # ------------------------------------------------------------------ training thread

    def _pre_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            if not self._training:
                return
            if not module.training:
                if self.core.tracker is not None:
                    self.core.phase_begin("eval")
                return
            tokens, samples, seq_len = batch_counts(kwargs if kwargs else args)
            if self._seq_shards > 1:  # this rank saw its slice of each sequence: count the replica's
                tokens = None if tokens is None else tokens * self._seq_shards
                seq_len = None if seq_len is None else seq_len * self._seq_shards
            if self.core.tracker is None:
                self._start(seq_len)
            self.core.micro_batch(tokens, samples)
        except Exception as exc:  # a hook must never break the forward pass
            tracker = self.core.tracker
            if tracker is not None:
                tracker.errors.record("hf_callback", exc)
            else:
                log.warning("babysitter: Hugging Face callback failed: %r", exc)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._ready = time.perf_counter()  # the epoch's loader starts after this

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tracker = self.core.tracker
        if self._ready and tracker is not None:
            tracker.add_data_wait(max(0.0, time.perf_counter() - self._ready))
        self._ready = 0.0

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loss, self._loss = self._loss, None
        self.core.optimizer_step(
            step=int(state.global_step), loss=loss, tokens=self._step_tokens(args, state)
        )
        if control.should_save and not control.should_evaluate:
            self.core.save_begin(step=int(state.global_step), path=_checkpoint_dir(args, state))
        self._ready = time.perf_counter()

    def _step_tokens(self, args: Any, state: Any) -> int | None:
        """This step's tokens of one replica from ``state.num_input_tokens_seen`` (summed over all
        processes by the Trainer, before any sequence split: the mean per process); None when the
        Trainer does not count them."""
        if self._tokens_seen is None:
            return None
        try:
            seen = int(state.num_input_tokens_seen)
            world = max(1, int(getattr(args, "world_size", 1) or 1))
            tokens, self._tokens_carry = divmod(seen - self._tokens_seen + self._tokens_carry, world)
            self._tokens_seen = seen
            return tokens if tokens >= 0 else None
        except Exception:  # an odd state: count from shapes instead
            self._tokens_seen = None
            return None

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        value = logs.get("loss") if isinstance(logs, dict) else None
        if isinstance(value, (int, float)):
            self._loss = float(value)
            # A training log (not eval's, not the final summary): add rank 0's values.
            if self._logged is not None and state.is_world_process_zero:
                try:
                    logs.update(self._logged.values())
                except Exception as exc:
                    self.core.tracker.errors.record("hf_log", exc)  # type: ignore[union-attr]
        self._ready = time.perf_counter()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.core.phase_end()
        if self._training and control.should_save:
            self.core.save_begin(step=int(state.global_step), path=_checkpoint_dir(args, state))
        self._ready = time.perf_counter()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.core.save_end(_checkpoint_dir(args, state))
        self._ready = time.perf_counter()


def _calling_trainer() -> Any:
    """The ``transformers.Trainer`` whose ``__init__`` is calling ``on_init_end`` (a few frames up)."""
    from transformers import Trainer

    frame: Any = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None


def _checkpoint_step(checkpoint: Any) -> int | None:
    """N of a ``checkpoint-N`` directory (the Trainer's naming); None for another name."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    name = os.path.basename(os.path.normpath(str(checkpoint)))
    prefix = f"{PREFIX_CHECKPOINT_DIR}-"
    if name.startswith(prefix) and name[len(prefix) :].isdigit():
        return int(name[len(prefix) :])
    return None


def _counts_tokens(args: Any) -> bool:
    """True when the Trainer counts input tokens (``include_num_input_tokens_seen``)."""
    value = getattr(args, "include_num_input_tokens_seen", "no")
    return value not in ("no", False, None)


def _checkpoint_dir(args: Any, state: Any) -> str:
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return os.path.join(str(args.output_dir), f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


def _defaults(args: Any, model: Any = None) -> dict[str, Any]:
    """watch() defaults from the TrainingArguments and the model: the training dtype for the peak
    lookup and the parallel layout."""
    defaults: dict[str, Any] = {}
    layout = _layout(args, model)
    if layout:
        defaults["parallelism"] = layout
    if args is None:
        return defaults
    if getattr(args, "bf16", False):
        defaults["dtype"] = "bf16"
    elif getattr(args, "fp16", False):
        defaults["dtype"] = "fp16"
    elif getattr(args, "tf32", False):
        defaults["dtype"] = "tf32"
    else:
        defaults["dtype"] = "fp32"
    return defaults


def _size(owner: object, name: str) -> int:
    """A parallel size attribute (accelerate's config, the model); 1 when absent or odd."""
    try:
        value = getattr(owner, name, None)
    except Exception:  # a property that raises: no size from it
        return 1
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _sequence_shards(args: Any) -> int:
    """Ranks each sequence is split over by the Trainer: context x sequence (Ulysses) parallel."""
    config = getattr(args, "parallelism_config", None)
    return _size(config, "cp_size") * _size(config, "sp_size")


def _layout(args: Any, model: Any) -> dict[str, int]:
    """Tensor and context parallel degrees as the Trainer counts them (its ranks "with the same
    batch": tp x cp x sp); empty when there is no model parallelism."""
    tp = _size(getattr(args, "parallelism_config", None), "tp_size")
    if tp == 1:
        tp = max(_size(model, "_tp_size"), _size(model, "tp_size"))
    cp = _sequence_shards(args)
    return {k: v for k, v in (("tp", tp), ("cp", cp)) if v > 1}
