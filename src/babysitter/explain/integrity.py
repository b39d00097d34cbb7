"""Silent corruption in ``babysitter explain``: a replica that diverged, a checkpoint that fails
verification, and the rank whose loss went non-finite first, when they fall in the window.

None of them costs time the way a straggler does (the run keeps its pace while it trains on garbage),
so they are listed as untimed causes, after the timed ones; a page for them already went out
(``TrainingReplicaDiverged``, ``CheckpointCorrupt``, ``TrainingNonFiniteLoss``), and explain says
so next to whatever else slowed the run.
"""

from __future__ import annotations

from typing import Any

from babysitter.catalog import integrity as I
from babysitter.catalog import storage as S
from babysitter.explain.queries import ExplainQueries, _r
from babysitter.generate.promql import eq, join_matchers, select

__all__ = ["CAUSES", "TEAMS", "IntegrityQueries", "integrity_causes"]

#: The causes this module adds to explain's list (key -> what it checks).
CAUSES = {
    "replica_divergence": "a data-parallel replica whose parameters left the others' (silent corruption)",
    "checkpoint_corrupt": "a checkpoint that fails verification against its manifest",
}
#: Both are the hardware's or the storage's: infra acts.
TEAMS = {"replica_divergence": "infra", "checkpoint_corrupt": "infra"}


class IntegrityQueries:
    """The PromQL of these causes, for one run (from the catalog, like :class:`ExplainQueries`)."""

    def __init__(self, q: ExplainQueries) -> None:
        self.q = q

    def mismatch(self, seconds: float) -> str:
        """Ranks whose parameter fingerprint disagreed with their replicas' in the range, and since when."""
        q = self.q
        series = select(I.REPLICA_MISMATCH_STEP, q.cfg.tracker_selector, q.matchers)
        return f"min by (rank, instance) (min_over_time({series}[{_r(seconds)}]))"

    def corrupt(self, seconds: float) -> str:
        """The run's newest checkpoint failing verification in the range, with its file and reason."""
        q = self.q
        parts = [eq("run", q.run)]
        if q.cluster:
            parts.append(eq(q.cfg.cluster_label, q.cluster))
        series = select(S.CHECKPOINT_CORRUPT_STEP, q.cfg.node_selector, join_matchers(*parts))
        return f"max by (file, reason) (max_over_time({series}[{_r(seconds)}]))"

    def first_nonfinite(self, seconds: float) -> str:
        """Each rank's first non-finite loss step seen in the range."""
        q = self.q
        series = select(I.NONFINITE_FIRST_STEP, q.cfg.tracker_selector, q.matchers, eq("signal", "loss"))
        return f"min by (rank, instance) (min_over_time({series}[{_r(seconds)}]))"


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


def integrity_causes(scan: Any, cause: Any, evidence: Any) -> None:
    """Add the causes found to ``scan`` (explain's ``_Scan``), or what was checked to its ``checked``;
    ``cause`` and ``evidence`` are the engine's ``Cause`` and ``Evidence`` (passed in: the engine
    imports this module)."""
    Cause, Evidence = cause, evidence
    iq = IntegrityQueries(scan.q)
    window = scan.W
    mismatch = scan.ask("replica_mismatch", iq.mismatch(window), scan.t1)
    if mismatch:
        ranks = sorted((s.labels.get("rank", "?") for s in mismatch), key=_rank_order)
        first = min(mismatch, key=lambda s: (s.value, _rank_order(s.labels.get("rank", "?"))))
        rank = first.labels.get("rank", "?")
        others = [r for r in ranks if r != rank]
        also = f" (also disagreeing: rank {', '.join(others)})" if others else ""
        scan.causes.append(
            Cause(
                "replica_divergence",
                f"{scan._where(rank)} holds parameters that differ from its data-parallel replicas' since "
                f"step {first.value:.0f}: likely silent data corruption on its GPU or host; every step "
                f"since then is suspect{also}",
                0.0,
                TEAMS["replica_divergence"],
                ranks=ranks,
                hosts=sorted({s.labels.get("instance", "") for s in mismatch} - {""}),
                evidence=[
                    Evidence(
                        "replica fingerprint mismatch since step",
                        s.value,
                        labels=dict(s.labels),
                        query=scan.ask_q("replica_mismatch"),
                    )
                    for s in mismatch
                ],
            )
        )
    else:
        scan.checked["replica_divergence"] = (
            "no rank's parameters disagreed with its replicas' (where checked)"
        )
    corrupt = scan.ask("checkpoint_corrupt", iq.corrupt(window), scan.t1)
    if corrupt:
        worst = max(corrupt, key=lambda s: s.value)
        scan.causes.append(
            Cause(
                "checkpoint_corrupt",
                f"the checkpoint of step {worst.value:.0f} fails verification: "
                f"{worst.labels.get('file', '?')} ({worst.labels.get('reason', '?')}); a restart must resume "
                "from an older one that verifies (babysitter report names it)",
                0.0,
                TEAMS["checkpoint_corrupt"],
                evidence=[
                    Evidence(
                        "newest checkpoint failing verification (step)",
                        s.value,
                        labels={"path": s.labels.get("file", ""), "reason": s.labels.get("reason", "")},
                        query=scan.ask_q("checkpoint_corrupt"),
                    )
                    for s in corrupt
                ],
            )
        )
    else:
        scan.checked["checkpoint_corrupt"] = (
            "every checked checkpoint verifies (or no sentinel watches the run)"
        )
    _name_first_rank(scan, iq, Evidence)


def _name_first_rank(scan: Any, iq: IntegrityQueries, evidence: Any) -> None:
    """Say on the loss cause which rank's loss went non-finite first (nothing when none says so)."""
    loss = next((c for c in scan.causes if c.key == "loss"), None)
    if loss is None:
        return
    firsts = scan.ask("nonfinite_first", iq.first_nonfinite(scan.W + scan.B), scan.t1)
    if not firsts:
        return
    step = min(s.value for s in firsts)
    went = sorted(
        (s for s in firsts if s.value == step), key=lambda s: _rank_order(s.labels.get("rank", "?"))
    )
    first = went[0].labels.get("rank", "?")
    together = f" ({len(went)} ranks at that step)" if len(went) > 1 else ""
    loss.text += f"; the loss went non-finite first on {scan._where(first)} at step {step:.0f}{together}"
    loss.ranks = [s.labels.get("rank", "?") for s in went]
    loss.hosts = sorted({s.labels.get("instance", "") for s in went} - {""})
    loss.evidence.append(
        evidence(
            "first non-finite loss step",
            step,
            labels=dict(went[0].labels),
            query=scan.ask_q("nonfinite_first"),
        )
    )
