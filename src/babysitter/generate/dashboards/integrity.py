"""The run overview's "Silent corruption" row: checkpoints that fail verification, ranks whose parameters
left their replicas', where NaN began, and what verifying costs (manifests, the sentinel's reads)."""

from __future__ import annotations

from babysitter.catalog import integrity as I
from babysitter.catalog import storage as S
from babysitter.generate.config import GenerateConfig
from babysitter.generate.dashboards._builder import Panel, Row, Target
from babysitter.generate.dashboards._common import var_matcher
from babysitter.generate.promql import by, join_matchers, select
from babysitter.generate.rules import Records

__all__ = ["integrity_row"]


def integrity_row(cfg: GenerateConfig, r: Records, tracker: str) -> list[Panel | Row]:
    """The row's panels; ``tracker`` holds the tracker series matchers of the selected runs."""
    c = cfg.cluster_label
    node_run = join_matchers(cfg.node_selector, var_matcher(c, "cluster"), var_matcher("run", "run"))
    node = join_matchers(cfg.node_selector, var_matcher(c, "cluster"))
    run = by(r.run_key)
    ri = "$__rate_interval"
    return [
        Row("Silent corruption"),
        Panel(
            "Checkpoints that fail verification",
            (
                Target(f"max {by((c, 'run'))} ({select(S.CHECKPOINT_CORRUPT, node_run)})", "{{run}} corrupt"),
                Target(f"max {by((c, 'run'))} ({select(S.CHECKPOINT_MISSING, node_run)})", "{{run}} missing"),
            ),
            unit="short",
            min=0,
            red_above=0.5,
            width=8,
            description="Of the run's newest checkpoints the node agent's sentinel checks, how many fail "
            "verification against their manifest (a file truncated or changed, a digest mismatch, no "
            "manifest after the save, a save that never ended: CheckpointCorrupt) and how many are gone "
            "(CheckpointMissing). docs/checkpoints.md.",
        ),
        Panel(
            "Newest checkpoint failing verification",
            (
                Target(
                    f"max {by((c, 'run', 'file', 'reason'))} ({select(S.CHECKPOINT_CORRUPT_STEP, node_run)})",
                    mode="instant",
                ),
            ),
            kind="table",
            width=8,
            columns=(("Value", "step"),),
            description="The step, the first bad file (relative to the checkpoint) and the reason; resume "
            "from the newest checkpoint that verifies instead (babysitter report RUN_DIR names it).",
        ),
        Panel(
            "Ranks whose parameters left their replicas'",
            (
                Target(
                    f"max {by((*r.rank_key, 'instance'))} ({select(I.REPLICA_MISMATCH_STEP, tracker)})",
                    mode="instant",
                ),
            ),
            kind="table",
            width=8,
            columns=(("Value", "since step"),),
            description="Ranks whose parameter fingerprint disagrees with their data-parallel replicas' "
            "(watch(replica_check_every=N)), with their host: likely silent data corruption on that GPU "
            "(TrainingReplicaDiverged). With two replicas per shard both are listed.",
        ),
        Panel(
            "Replica checks",
            (Target(f"sum {run} (rate({select(I.REPLICA_CHECKS, tracker)}[{ri}]))", "{{run}} checks/s"),),
            unit="short",
            min=0,
            width=8,
            description="Comparisons of each rank's fingerprint with its replicas', all ranks together "
            "(absent where the check is off).",
        ),
        Panel(
            "First non-finite step by rank",
            (
                Target(
                    f"min {by((*r.rank_key, 'instance', 'signal'))} "
                    f"({select(I.NONFINITE_FIRST_STEP, tracker)})",
                    mode="instant",
                ),
            ),
            kind="table",
            width=8,
            columns=(("Value", "first step"),),
            description="The first step at which each rank's loss (or gradient norm) was NaN or infinite, "
            "every step read. The rank with the lowest loss step is where it began "
            "(TrainingNonFiniteLoss names it); a gradient norm taken after the all-reduce ties everywhere.",
        ),
        Panel(
            "Checkpoint manifests",
            (
                Target(
                    f"sum {by((*r.run_key, 'result'))} (increase({select(I.CKPT_MANIFESTS, tracker)}[{ri}]))",
                    "{{run}} {{result}}",
                ),
                Target(
                    f"max {run} ({select(I.CKPT_MANIFEST_SECONDS, tracker)})",
                    "{{run}} seconds for the last (slowest rank)",
                ),
            ),
            unit="short",
            min=0,
            width=8,
            description="Manifests the trackers made off the training thread after each save, by result "
            "(failed: the save was found incomplete, see the tracker's log), and how long the last one "
            "took: listing, header checks, hashing, waiting for the other ranks' parts.",
        ),
        Panel(
            "Sentinel digest reads",
            (
                Target(
                    f"sum by ({c}, instance) (rate({select(S.CHECKPOINT_VERIFY_READ, node)}[{ri}]))",
                    "{{instance}} read",
                ),
                Target(
                    f"max by ({c}, instance) ({select(S.CHECKPOINT_VERIFY_BUDGET, node)})"
                    f" / {cfg.sentinel_pass_seconds:g}",
                    "{{instance}} budget",
                ),
            ),
            unit="Bps",
            min=0,
            width=8,
            description="Bytes per second each node agent's checkpoint sentinel reads back to verify "
            "digests, and its stated budget (--checkpoint-verify-bytes per pass over a "
            f"{cfg.sentinel_pass_seconds:g} s pass, the default --checkpoint-interval). Reads stop once "
            "every checked checkpoint was swept, until its next sweep.",
        ),
    ]
