"""What the Lightning and Hugging Face callbacks share: a tracker driven by framework events.

The frameworks differ only in which hook says what; this class turns "a micro-batch went through",
"the optimizer stepped", "evaluation started" and "a checkpoint is being written" into tracker
calls. Everything here runs on the training thread and is cheap: it reads tensor shapes (metadata,
never values), adds integers and reads the host clock.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from babysitter.flops import FlopsUnavailable, infer
from babysitter.training.config import missing_flops_said
from babysitter.training.straggler import StragglerMonitor
from babysitter.training.tracker import Tracker
from babysitter.training.watch import watch

__all__ = ["TOKEN_COUNTS", "CallbackCore", "batch_counts", "find_config_owner", "non_padding_tokens"]

log = logging.getLogger("babysitter")

_TOKEN_KEYS = ("input_ids", "attention_mask", "labels", "decoder_input_ids")
_UNSET: Any = object()
#: How a callback counts tokens: ``all`` (shapes, padding included, free), ``non_padding`` (the
#: attention mask's sum when the mask is on the CPU, else all tokens), ``non_padding_sync`` (the
#: mask's sum wherever it is: on an accelerator one device sync per micro-batch).
TOKEN_COUNTS = ("all", "non_padding", "non_padding_sync")


def batch_counts(batch: object) -> tuple[int | None, int | None, int | None]:
    """(tokens, samples, sequence length) of a batch from tensor shapes only (no device sync).

    Tokens are ``input_ids.numel()`` (padding included, as torchtitan and PaLM count them); a dict
    batch uses ``input_ids`` (else ``attention_mask``...), a tensor or a tuple's first tensor counts
    when it holds integer token ids of shape (batch, seq). Unknown shapes give None.
    """
    value: Any = None
    if type(batch) is dict or isinstance(batch, Mapping):  # the exact-type test skips the ABC check
        for key in _TOKEN_KEYS:
            if key in batch:
                value = batch[key]
                break
    elif isinstance(batch, (tuple, list)) and batch:
        value = batch[0]
    else:
        value = batch
    try:
        dim = value.dim()
        shape = value.shape
        if dim < 2 or value.is_floating_point() or value.is_complex():
            return None, (int(shape[0]) if dim else None), None
        return int(value.numel()), int(shape[0]), int(shape[-1])
    except Exception:  # not a tensor: nothing to count
        return None, None, None


def non_padding_tokens(batch: object, *, sync: bool) -> int | None:
    """The ``attention_mask``'s sum of a dict batch: the tokens that are not padding.

    A CPU mask is summed on the host (no device involved). A mask on an accelerator is summed only
    with ``sync`` (reading the sum waits for the device); otherwise None, and the caller counts
    all tokens.
    """
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    try:
        if mask is None or (mask.device.type != "cpu" and not sync):
            return None
        return int(mask.sum())
    except Exception:  # not a tensor
        return None


def find_config_owner(model: object) -> object | None:
    """The model itself or its first child carrying a ``config`` (Hugging Face style, for FLOPs)."""
    if model is None:
        return None
    if getattr(model, "config", None) is not None:
        return model
    children = getattr(model, "children", None)
    if callable(children):
        try:
            for child in children():
                if getattr(child, "config", None) is not None:
                    found: object = child
                    return found
        except Exception:  # noqa: S110 - not a module after all
            pass
    return None


class CallbackCore:
    """A tracker and its helpers, created when the framework is ready (lazily if seq_len is unknown)."""

    def __init__(self, *, straggler_every: int | None, watch_kwargs: dict[str, Any]) -> None:
        if straggler_every is not None and (
            isinstance(straggler_every, bool) or not isinstance(straggler_every, int) or straggler_every < 2
        ):
            raise ValueError(f"straggler_every must be an int >= 2 or None, got {straggler_every!r}")
        if "model" in watch_kwargs:
            raise ValueError("the callback takes the model from the framework; do not pass model=")
        self.watch_kwargs = watch_kwargs
        self.straggler_every = straggler_every
        self.tracker: Tracker | None = None
        self.straggler: StragglerMonitor | None = None
        self._model: object = None
        self._pending_tokens = 0
        self._pending_samples = 0
        self._counts_known = True
        self._work = 0.0
        self._phase: Any = None
        self._checkpoint: Any = None
        self._checkpoint_handle: Any = None

    # ------------------------------------------------------------------ setup

    def waits_for_batch(self, model: object) -> bool:
        """True when FLOPs must come from the model and it can give them only once training runs: its
        attention term needs the sequence length the first batch shows, or its parameters are created
        after setup (Lightning's ``configure_model``)."""
        kw = self.watch_kwargs
        if kw.get("flops_per_token") is not None or model is None:
            return False
        try:
            infer(model, seq_len=kw.get("seq_len"))
        except FlopsUnavailable as exc:
            return exc.pending
        except Exception:  # ensure() says what is wrong, once
            return False
        return False

    def ensure(self, model: object, seq_len: int | None = None, **defaults: Any) -> Tracker | None:
        """Create the tracker once (on every rank, at the same point of training). Never raises twice.

        FLOPs per token come from ``flops_per_token=``, else from the model (:func:`babysitter.flops.infer`
        with ``seq_len=`` or the first batch's length). When they cannot, one warning says why and
        names the argument that fixes it, and the tracker runs without FLOPs and MFU.
        """
        if self.tracker is not None:
            return self.tracker
        self._model = model
        kwargs = {**defaults, **self.watch_kwargs}
        if kwargs.get("flops_per_token") is None and defaults.get("flops_per_token") is not None:
            kwargs["flops_per_token"] = defaults["flops_per_token"]  # Lightning's flops_per_batch
        said = False
        if kwargs.get("flops_per_token") is None:
            length = kwargs.get("seq_len") or seq_len
            try:
                if model is None:
                    raise FlopsUnavailable("the framework gave no model", argument="flops_per_token")
                kwargs["flops_per_token"] = infer(model, seq_len=length)
            except FlopsUnavailable as exc:
                said = True
                log.warning(
                    "babysitter: no FLOPs per token, so train_model_flops_total and MFU are not reported: "
                    "%s. Pass %s= to the Babysitter callback%s",
                    exc.reason,
                    exc.argument,
                    " (the length of the sequences it trains on)" if exc.argument == "seq_len" else "",
                )
        with missing_flops_said() if said else contextlib.nullcontext():
            self.tracker = watch(find_config_owner(model), **kwargs)
        if self.straggler_every is not None:
            monitor = StragglerMonitor(self.tracker, every=self.straggler_every)
            if monitor.start() or monitor.waiting:
                self.straggler = monitor
        return self.tracker

    # ------------------------------------------------------------------ training thread

    def micro_batch(self, tokens: int | None, samples: int | None) -> None:
        """Count one micro-batch's tokens and samples toward the next optimizer step."""
        if tokens is None:
            self._counts_known = False
        else:
            self._pending_tokens += tokens
        if samples is not None:
            self._pending_samples += samples

    def add_work(self, seconds: float) -> None:
        """Add host seconds of this rank's own work (no waiting for peers) to the current step."""
        self._work += seconds

    def optimizer_step(self, step: int | None = None, loss: object = None, tokens: int | None = None) -> None:
        """One optimizer step finished (after all its micro-batches); ``tokens`` replaces the count of
        the micro-batches' shapes when the framework counted them itself."""
        tracker = self.tracker
        if tracker is None:
            return
        if tokens is None:
            tokens = self._pending_tokens if self._counts_known and self._pending_tokens else None
        samples = self._pending_samples or None
        self._pending_tokens = self._pending_samples = 0
        self._counts_known = True
        tracker.step(tokens=tokens, samples=samples, loss=loss, step=step)
        work, self._work = self._work, 0.0
        if self.straggler is not None:
            if work > 0:
                self.straggler.add_work(work)
            self.straggler.after_step()

    def phase_begin(self, name: str) -> None:
        """Enter a marked phase (evaluation) unless one is open."""
        if self.tracker is None or self._phase is not None:
            return
        self._phase = self.tracker.phase(name)
        self._phase.__enter__()

    def phase_end(self) -> None:
        """Leave the open phase, if any."""
        phase, self._phase = self._phase, None
        if phase is not None:
            phase.__exit__(None, None, None)

    @property
    def in_phase(self) -> bool:
        """True while a phase is open."""
        return self._phase is not None

    def save_begin(self, step: int | None = None, path: str | None = None) -> None:
        """A checkpoint save started (its blocking part is timed until :meth:`save_end`)."""
        if self.tracker is None or self._checkpoint is not None:
            return
        self._checkpoint = self.tracker.checkpoint_save(step=step, path=path)
        self._checkpoint_handle = self._checkpoint.__enter__()

    def save_end(self, path: str | os.PathLike[str] | None = _UNSET, *, ok: bool = True) -> None:
        """The save finished; ``path`` (file or directory) gives the bytes written."""
        context, self._checkpoint = self._checkpoint, None
        if context is None:
            return
        handle = self._checkpoint_handle
        if path is not _UNSET and path is not None:
            handle.path = str(path)
            handle.nbytes = _size(Path(path))
        exc = None if ok else RuntimeError("checkpoint save failed")
        context.__exit__(None if ok else RuntimeError, exc, None)

    def close(self) -> None:
        """Close open phases and the tracker (flushes the ledger, stops serving)."""
        self.phase_end()
        if self._checkpoint is not None:
            self.save_end(None, ok=False)
        if self.tracker is not None:
            self.tracker.close()


def _size(path: Path) -> int | None:
    """Bytes of a checkpoint file or directory; None when it cannot be read."""
    try:
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return None
    return None
