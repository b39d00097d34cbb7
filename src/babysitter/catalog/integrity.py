"""Silent corruption, as the tracker sees it: checkpoint manifests, replicas that disagree, and the
step at which each rank's loss or gradient norm stopped being finite.

Same labels as the tracker's metrics (``run``, ``rank``, the user's constant labels). In a healthy run a
rank exports at most three of these (two for manifests, one for the replica check where it is on): the
mismatch and the first non-finite step exist only once something went wrong, so they cost the fleet's
series budget nothing until then.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "CKPT_MANIFESTS",
    "CKPT_MANIFEST_SECONDS",
    "MANIFEST_RESULTS",
    "METRICS",
    "NONFINITE_FIRST_STEP",
    "NONFINITE_SIGNALS",
    "REPLICA_CHECKS",
    "REPLICA_MISMATCH_STEP",
]

#: Values of ``train_checkpoint_manifests_total{result}``: a manifest committed, this rank's part of a
#: shared directory's manifest committed, nothing for this rank to write, or the save was found
#: incomplete or could not be hashed (the tracker logs why).
MANIFEST_RESULTS = ("manifest", "part", "skipped", "failed")
#: Values of ``train_nonfinite_first_step{signal}``.
NONFINITE_SIGNALS = ("loss", "grad_norm")

CKPT_MANIFESTS = MetricSpec(
    "train_checkpoint_manifests_total",
    "counter",
    "",
    "Checkpoint manifests this rank's tracker made off the training thread, by result (manifest, part, "
    "skipped, failed); a result's series appears with its first count.",
    labels=("result",),
    counts="manifest",
)
CKPT_MANIFEST_SECONDS = MetricSpec(
    "train_checkpoint_manifest_seconds",
    "gauge",
    "seconds",
    "How long the last checkpoint manifest took off the training thread: listing, structure checks, "
    "hashing and waiting for the other ranks' parts.",
)
REPLICA_CHECKS = MetricSpec(
    "train_replica_checks_total",
    "counter",
    "",
    "Comparisons of this rank's parameter fingerprint with its data-parallel replicas' "
    "(watch(replica_check_every=N)).",
    counts="check",
)
REPLICA_MISMATCH_STEP = MetricSpec(
    "train_replica_mismatch_step",
    "gauge",
    "",
    "The step at which this rank's parameter fingerprint first disagreed with the majority of its "
    "data-parallel replicas (with two replicas: with the other); absent while it agrees. Likely silent "
    "data corruption on this rank's GPU or host.",
)
NONFINITE_FIRST_STEP = MetricSpec(
    "train_nonfinite_first_step",
    "gauge",
    "",
    "The first step at which this rank's loss (signal=loss) or gradient norm (signal=grad_norm) was NaN "
    "or infinite, every step read; absent until one was.",
    labels=("signal",),
)

METRICS: tuple[MetricSpec, ...] = (
    CKPT_MANIFESTS,
    CKPT_MANIFEST_SECONDS,
    REPLICA_CHECKS,
    REPLICA_MISMATCH_STEP,
    NONFINITE_FIRST_STEP,
)
