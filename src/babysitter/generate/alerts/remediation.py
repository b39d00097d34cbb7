"""Remediation alerts: the remediator failing to act, or stopped by its own rails."""

from __future__ import annotations

from babysitter.catalog import remediate as M
from babysitter.generate.alerts._common import _V, Alert, AlertTest, _l, _series, _with
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import eq, new_or_increased, regex, select
from babysitter.generate.rules import Records

__all__ = ["remediation_alerts"]


def remediation_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    c, w = cfg.cluster_label, cfg.remediation_window
    labels = {"cluster": "c1", "instance": "mon1:9097", "job": "babysitter-remediate"}
    failed = select(M.ACTIONS, eq("result", "failed"))
    failing = Alert(
        name="RemediationFailing",
        expr=f"sum by ({c}, instance, action) (\n  {new_or_increased(failed, w)}\n)",
        severity="critical",
        component="remediation",
        summary=f"Remediation {_l('action')} failed on {_l('instance')}.",
        description=(
            f"{_V} {_l('action')} actions of the remediator at {_l('instance')} (cluster {_l(c)}) failed in "
            f"the last {w}: the scheduler refused or timed out. The fault they answered is not handled; "
            f"read the audit log and act by hand."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(M.ACTIONS, _with(labels, action="drain", result="failed")), "0+0x10 1+0x20"),
                (_series(M.ACTIONS, _with(labels, action="drain", result="ok")), "0+1x30"),
                (_series(M.ACTIONS, _with(labels, action="requeue", result="failed")), "0+0x30"),
            ),
            quiet=(("9m", "every action succeeded so far"), ("28m", f"the failure left the {w} window")),
            fire_at="12m",
            fire_labels=({"action": "drain", "cluster": "c1", "instance": "mon1:9097"},),
            fire_text=(
                (
                    "Remediation drain failed on mon1:9097.",
                    "1 drain actions of the remediator at mon1:9097 (cluster c1) failed in the last 15m: the "
                    "scheduler refused or timed out. The fault they answered is not handled; read the audit "
                    "log and act by hand.",
                ),
            ),
        ),
    )
    capped = select(M.REFUSALS, regex("reason", ("drain_cap", "rate_limit")))
    cap_hit = Alert(
        name="RemediationCapHit",
        expr=f"sum by ({c}, instance, reason) (\n  {new_or_increased(capped, w)}\n)",
        severity="critical",
        component="remediation",
        summary=f"The remediator on {_l('instance')} stopped acting: {_l('reason')}.",
        description=(
            f"The remediator at {_l('instance')} (cluster {_l(c)}) refused {_V} actions in the last {w} "
            f"because of its {_l('reason')} rail: more nodes failing at once than the policy allows, or "
            f"an alert rule firing everywhere. Nothing more is drained automatically; look before resuming."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(M.REFUSALS, _with(labels, action="drain", reason="drain_cap")), "0+0x10 3+0x20"),
                (_series(M.REFUSALS, _with(labels, action="drain", reason="missing_labels")), "0+1x30"),
                (_series(M.REFUSALS, _with(labels, action="requeue", reason="rate_limit")), "0+0x30"),
            ),
            quiet=(("9m", "only refusals for missing labels"), ("28m", f"the refusals left the {w} window")),
            fire_at="12m",
            fire_labels=({"cluster": "c1", "instance": "mon1:9097", "reason": "drain_cap"},),
            fire_text=(
                (
                    "The remediator on mon1:9097 stopped acting: drain_cap.",
                    "The remediator at mon1:9097 (cluster c1) refused 3 actions in the last 15m because of "
                    "its drain_cap rail: more nodes failing at once than the policy allows, or an alert rule "
                    "firing everywhere. Nothing more is drained automatically; look before resuming.",
                ),
            ),
        ),
    )
    return [failing, cap_hit]
