"""What runs inside a training process: ``watch()``, the tracker and everything that serves it.

Which thread runs what (the hot path is the only code on the training thread every step)::

    training thread, every step     tracker.Tracker.step / data / add_data_wait: plain field updates
      (the hot path)                and one ring slot; timing.CudaStepTimer.mark enqueues a CUDA
                                    event. No lock, no I/O, no tensor read, never raises.
    training thread, now and then   checkpoint_save / checkpoint_load / phase context managers
                                    (events.RunEvents begin/end); straggler.StragglerMonitor issues
                                    an async gloo all_gather every N steps and reads it later.
    housekeeping thread (~1 s)      Tracker.housekeep: fold the ring into histograms and windows,
                                    read the loss (loss.LossReader) and CUDA events once ready, hand
                                    step boundaries to the ledger (events.RunEvents, batched).
    watchdog thread (~1 s)          watchdog.Watchdog: step age against the hang threshold.
    scrape (HTTP server thread)     collector.TrackerCollector: Tracker.snapshot -> metric families
                                    named by the catalog; served by babysitter.export.
    OTLP thread (optional)          otlp.OtlpPusher: the same families pushed to a Collector.

Setup, before training starts: ``watch.watch`` checks its arguments (``config.resolve``, with
``dist`` for the rank), builds the tracker and starts the threads above; a mistake raises here,
never later. ``tally.Tally`` counts and logs once what the tracker swallows at run time;
``histogram`` is the plain histogram the housekeeping thread folds into.
"""

from __future__ import annotations

from babysitter.training.tracker import CheckpointHandle, Tracker, TrackerSnapshot
from babysitter.training.watch import watch

__all__ = ["CheckpointHandle", "Tracker", "TrackerSnapshot", "watch"]
