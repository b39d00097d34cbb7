"""Silent corruption alerts: a checkpoint that fails verification, a rank whose parameters left its
replicas', and (in the non-finite loss page) the rank where NaN began."""

from __future__ import annotations

from babysitter.catalog import integrity as I
from babysitter.catalog import node as N
from babysitter.catalog import storage as S
from babysitter.catalog import train as T
from babysitter.generate.alerts._common import (
    _GPU,
    _STEP,
    _TRAIN,
    Alert,
    AlertTest,
    _l,
    _node_labels,
    _series,
    _with,
)
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, eq, join_matchers, select
from babysitter.generate.rules import Records

__all__ = ["checkpoint_corrupt_alert", "first_nonfinite_text", "integrity_alerts"]


def _query(expr: str, *args: str, then: str = "") -> str:
    """``{{ with query (printf "EXPR" $labels.a ...) }}``: a Go template query over ``expr`` whose
    ``%q`` take the alert's labels ``args`` (``then``: a pipeline stage after it, ``sortByLabel``)."""
    quoted = expr.replace("\\", "\\\\").replace('"', '\\"')
    labels = " ".join(f"$labels.{a}" for a in args)
    return '{{ with query (printf "' + quoted + '" ' + labels + ")" + (f" | {then}" if then else "") + " }}"


def first_nonfinite_text(cfg: GenerateConfig) -> str:
    """`` The loss went non-finite first on rank 2 (host n1:9400) at step 100.``, read from each rank's
    first non-finite loss step (``integrity.NONFINITE_FIRST_STEP``) when the page is rendered (nothing
    while no rank exports it; of ranks that went together, the first by name). The loss is computed
    before any collective, so its first non-finite step points at the rank the NaN came from; the next
    step every rank's loss is NaN."""
    c = cfg.cluster_label
    first = select(
        I.NONFINITE_FIRST_STEP,
        cfg.tracker_selector,
        join_matchers(f"{c}=%[1]q", "run=%[2]q", eq("signal", "loss")),
    )
    ranks = f"min by (rank, instance) ({first})"
    expr = f"{ranks} == on () group_left () min({ranks})"
    return (
        _query(expr, c, "run", then='sortByLabel "rank"')
        + "{{ $n := len . }}{{ with index . 0 }} The loss went non-finite first on rank {{ .Labels.rank }}"
        ' (host {{ .Labels.instance }}) at step {{ .Value | printf "%.0f" }}{{ end }}'
        "{{ if gt $n 1 }} ({{ $n }} ranks at that step){{ end }}.{{ end }}"
    )


def _gpu_text(r: Records, cluster: str) -> str:
    """``, GPU 3 (GPU-8c5d...)`` of the alert's rank from the rank-to-GPU rule, nothing without one."""
    rule = f"{r.rank_gpu}{{{cluster}=%q,run=%q,rank=%q}}"
    return (
        _query(rule, cluster, "run", "rank")
        + "{{ with index . 0 }}, GPU {{ .Labels.gpu }} ({{ .Labels.uuid }}){{ end }}{{ end }}"
    )


def integrity_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ts, c = cfg.tracker_selector, cfg.cluster_label
    keep = by((*r.rank_key, "instance"))
    gpu = _gpu_text(r, c)
    rank2 = _with(_TRAIN, rank="2", instance="n2:9400")
    diverged = Alert(
        name="TrainingReplicaDiverged",
        expr=f"max {keep} ({select(I.REPLICA_MISMATCH_STEP, ts)})",
        severity="critical",
        component="training",
        summary=f"Rank {_l('rank')} of run {_l('run')} holds parameters its replicas do not.",
        description=(
            f"The parameter fingerprint of rank {_l('rank')} of run {_l('run')} on cluster {_l(c)} (host "
            f"{_l('instance')}{gpu}) disagrees with its data-parallel replicas' since step {_STEP}: likely "
            "silent data corruption on that GPU or host (a flipped bit, a wrong result). Its gradients "
            "still enter the all-reduce, so every step from here on is suspect: stop the run, drain the "
            "host, and resume on other hardware from the newest checkpoint that verifies and was saved "
            "before that step."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                # Run r1: rank 2 (host n2, GPU 3) disagrees from step 1200; ranks 0 and 1 check and agree.
                *((_series(I.REPLICA_CHECKS, _with(_TRAIN, rank=k)), "0+1x20") for k in ("0", "1", "2")),
                (_series(I.REPLICA_MISMATCH_STEP, rank2), "_x5 1200+0x15"),
                (_series(T.INFO, _with(rank2, uuid=_GPU["uuid"], pci_bus_id=_GPU["pci_bus_id"])), "1+0x20"),
                (_series(N.GPU_UP, _with(_GPU, instance="n2:9400")), "1+0x20"),
                # Run r2 checks and agrees.
                (_series(I.REPLICA_CHECKS, _with(_TRAIN, run="r2")), "0+1x20"),
            ),
            quiet=(("4m", "every replica agrees"),),
            fire_at="6m",
            fire_labels=({"cluster": "c1", "run": "r1", "rank": "2", "instance": "n2:9400"},),
            fire_text=(
                (
                    "Rank 2 of run r1 holds parameters its replicas do not.",
                    "The parameter fingerprint of rank 2 of run r1 on cluster c1 (host n2:9400, GPU 3 "
                    f"({_GPU['uuid']})) disagrees with its data-parallel replicas' since step 1200: likely "
                    "silent data corruption on that GPU or host (a flipped bit, a wrong result). Its "
                    "gradients still enter the all-reduce, so every step from here on is suspect: stop the "
                    "run, drain the host, and resume on other hardware from the newest checkpoint that "
                    "verifies and was saved before that step.",
                ),
            ),
        ),
    )
    return [diverged]


def checkpoint_corrupt_alert(cfg: GenerateConfig, r: Records) -> Alert:
    """CheckpointCorrupt (in the checkpoint group)."""
    ns, c = cfg.node_selector, cfg.cluster_label
    key = (c, "run")
    named = (*key, "file", "reason")
    node_r1 = _with(_node_labels(), run="r1")
    return Alert(
        name="CheckpointCorrupt",
        # The value is the newest failing step; the file and the reason are labels of that one series.
        expr=(
            f"max {by(named)} ({select(S.CHECKPOINT_CORRUPT_STEP, ns)})\n"
            f"and on ({', '.join(key)})\n"
            f"max {by(key)} ({select(S.CHECKPOINT_CORRUPT, ns)}) > 0"
        ),
        severity="critical",
        component="checkpoint",
        summary=f"Checkpoint of step {_STEP} of run {_l('run')} is corrupt: {_l('file')} ({_l('reason')}).",
        description=(
            f"The checkpoint sentinel found the checkpoint of step {_STEP} of run {_l('run')} on cluster "
            f"{_l(c)} failing verification against its manifest: {_l('file')}, {_l('reason')} (size: "
            "truncated or rewritten; digest: its bytes changed; missing_file: gone; structure: a broken "
            "header; no_manifest or incomplete: the save never completed). A restart from it would fail "
            "or train on garbage: resume from the newest checkpoint that verifies (babysitter report "
            "names it)."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(S.CHECKPOINT_CORRUPT, node_r1), "0+0x5 1+0x10"),
                (
                    _series(S.CHECKPOINT_CORRUPT_STEP, _with(node_r1, file="__2_0.distcp", reason="digest")),
                    "_x5 4000+0x10",
                ),
                (_series(S.CHECKPOINT_CORRUPT, _with(_node_labels(), run="r2")), "0+0x15"),
            ),
            quiet=(("5m", "every checkpoint verifies"),),
            fire_at="7m",
            fire_labels=({"cluster": "c1", "run": "r1", "file": "__2_0.distcp", "reason": "digest"},),
            fire_text=(
                (
                    "Checkpoint of step 4000 of run r1 is corrupt: __2_0.distcp (digest).",
                    "The checkpoint sentinel found the checkpoint of step 4000 of run r1 on cluster c1 "
                    "failing verification against its manifest: __2_0.distcp, digest (size: truncated or "
                    "rewritten; digest: its bytes changed; missing_file: gone; structure: a broken header; "
                    "no_manifest or incomplete: the save never completed). A restart from it would fail or "
                    "train on garbage: resume from the newest checkpoint that verifies (babysitter report "
                    "names it).",
                ),
            ),
        ),
    )
