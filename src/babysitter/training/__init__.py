"""What runs inside a training process: ``watch()``, the tracker and everything that serves it.

Which thread runs what (the hot path is the only code on the training thread every step)::

    training thread, every step     tracker.Tracker.step / data / add_data_wait: plain field updates
      (the hot path)                and one ring slot; timing.CudaStepTimer.mark enqueues a CUDA
                                    event. No lock, no I/O, no tensor read, never raises.
    training thread, now and then   checkpoint_save / checkpoint_load / phase context managers
                                    (events.RunEvents begin/end); straggler.StragglerMonitor issues
                                    an async gloo all_gather and MAX all_reduce every N steps and
                                    reads them later.
    housekeeping thread (~1 s)      Tracker.housekeep: fold the ring into histograms and windows,
                                    read the loss (loss.LossReader) and CUDA events once ready, look
                                    at every step's loss and gradient norm (nonfinite.NonFiniteWatch),
                                    hand step boundaries to the ledger (events.RunEvents, batched);
                                    replicas.ReplicaChecker reads its finished rounds.
    training thread, every N steps  replicas.ReplicaChecker: queue a parameter fingerprint on the
                                    device; issue an async gloo all_gather of the last one.
    manifest thread (after saves)   manifests.ManifestWriter: list, check and hash what a save wrote,
                                    commit its manifest (babysitter.checkpoints), tell the ledger.
    watchdog thread (~1 s)          watchdog.Watchdog: step age against the hang threshold.
    collectives thread (~1 s)       collectives.CollectiveMonitor: torch's flight recorder (flight),
                                    the groups' counters every second, a full dump when a straggler
                                    round asks (arrival: the score's arithmetic), a stall begins
                                    or a new group appears; a round's completion stamp.
    incidents thread (~1 s)         incidents.IncidentResponder: a stat of RUN_DIR/incidents; on a
                                    request, every thread's stack and one flight-recorder dump into
                                    the incident's bundle (incident_files: its layout, no link
                                    followed). crash.install: the uncaught exception's record, from
                                    sys.excepthook, on the thread that raised it.
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
