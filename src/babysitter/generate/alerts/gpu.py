"""GPU alerts: a GPU off the bus, Xid errors by the action they call for, ECC errors, row remapping and
throttling."""

from __future__ import annotations

from babysitter.catalog import node as N
from babysitter.generate.alerts._common import (
    _GPU,
    _V,
    _VP,
    Alert,
    AlertTest,
    _gpu_labels,
    _l,
    _series,
    _with,
)
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, eq, new_or_increased, regex, select
from babysitter.generate.rules import Records

__all__ = ["FATAL", "gpu_alerts", "gpu_fatal_alerts", "gpu_other_alerts"]


def gpu_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ns, c = cfg.node_selector, cfg.cluster_label
    gpu = by(r.gpu_key)
    where = f"GPU {_l('gpu')} ({_l('uuid')}, {_l('model')}) on {_l('instance')}, cluster {_l(c)}"
    xid = N.GPU_XID_ERRORS
    xid_key = by((*r.gpu_key, "xid", "action"))
    page = regex("action", cfg.xid_page_actions)
    rest = regex("action", (*cfg.xid_page_actions, *cfg.xid_ignore_actions), negate=True)
    xw = cfg.xid_window
    xid_series = (
        (_series(xid, _with(_GPU, xid="79", action="reboot")), "_x10 1+0x30"),
        (_series(xid, _with(_GPU, xid="13", action="restart_app")), "0+0x10 1+0x30"),
        (_series(xid, _with(_GPU, xid="43", action="ignore")), "0+0x10 5+0x30"),
    )
    xid_critical = Alert(
        name="GpuXidCritical",
        expr=f"sum {xid_key} (\n  {new_or_increased(select(xid, ns, page), xw)}\n)",
        severity="critical",
        component="gpu",
        summary=f"Xid {_l('xid')} on GPU {_l('gpu')} of {_l('instance')}: {_l('action')}.",
        description=(
            f"{where} reported Xid {_l('xid')} ({_V} in the last {xw}); its recovery action is "
            f"{_l('action')}. The job on this GPU is lost or will be: drain the node, then reset or reboot."
        ),
        for_="0s",
        test=AlertTest(
            series=xid_series,
            quiet=(("9m", "no Xid yet"), ("27m", f"the Xid left the {xw} window")),
            fire_at="12m",
            fire_labels=(_gpu_labels(action="reboot", xid="79"),),
            fire_text=(
                (
                    "Xid 79 on GPU 3 of n1:9400: reboot.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 reported Xid 79 "
                    "(1 in the last 15m); its recovery action is reboot. The job on this GPU is lost or will "
                    "be: drain the node, then reset or reboot.",
                ),
            ),
        ),
    )
    xid_warning = Alert(
        name="GpuXidError",
        expr=f"sum {xid_key} (\n  {new_or_increased(select(xid, ns, rest), xw)}\n)",
        severity="warning",
        component="gpu",
        summary=f"Xid {_l('xid')} on GPU {_l('gpu')} of {_l('instance')}.",
        description=(
            f"{where} reported Xid {_l('xid')} ({_V} in the last {xw}), recovery action {_l('action')}: "
            f"usually the application's fault; watch for repeats and for the job restarting."
        ),
        for_="0s",
        test=AlertTest(
            series=xid_series,
            quiet=(("10m", "no Xid yet"),),
            fire_at="12m",
            fire_labels=(_gpu_labels(action="restart_app", xid="13"),),
            fire_text=(
                (
                    "Xid 13 on GPU 3 of n1:9400.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 reported Xid 13 "
                    "(1 in the last 15m), recovery action restart_app: usually the application's fault; "
                    "watch for repeats and for the job restarting.",
                ),
            ),
        ),
    )
    down = Alert(
        name="GpuDown",
        expr=f"max {gpu} ({select(N.GPU_UP, ns)}) == 0",
        severity="critical",
        component="gpu",
        summary=f"GPU {_l('gpu')} of {_l('instance')} does not answer.",
        description=(
            f"{where} does not answer NVML/DCGM queries (fallen off the bus, driver hung). The job using "
            f"it is stuck or dead; drain and reboot the node."
        ),
        for_=cfg.gpu_down_for,
        test=AlertTest(
            series=(
                (_series(N.GPU_UP, _GPU), "1+0x5 0+0x10"),
                (_series(N.GPU_UP, _with(_GPU, gpu="0", uuid="GPU-11aa22bb")), "1+0x15"),
            ),
            quiet=(("5m", "up"), ("6m", "before for:")),
            fire_at="8m",
            fire_labels=(_gpu_labels(),),
            fire_text=(
                (
                    "GPU 3 of n1:9400 does not answer.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 does not answer "
                    "NVML/DCGM queries (fallen off the bus, driver hung). The job using it is stuck or dead; "
                    "drain and reboot the node.",
                ),
            ),
        ),
    )
    ecc_sel = select(N.GPU_ECC_ERRORS, ns, eq("type", cfg.ecc_uncorrected_type))
    ecc = Alert(
        name="GpuEccUncorrectable",
        expr=f"max {gpu} (\n  {new_or_increased(ecc_sel, cfg.ecc_window)}\n)",
        severity="critical",
        component="gpu",
        summary=f"Uncorrectable ECC error on GPU {_l('gpu')} of {_l('instance')}.",
        description=(
            f"{where} counted {_V} uncorrectable ECC errors in the last {cfg.ecc_window}. The job on it "
            f"has likely crashed; the GPU needs a reset before new work, and an RMA if it repeats."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (
                    _series(N.GPU_ECC_ERRORS, _with(_GPU, type="uncorrected", scope="volatile")),
                    "0+0x10 2+0x10",
                ),
                (_series(N.GPU_ECC_ERRORS, _with(_GPU, type="corrected", scope="volatile")), "0+5x20"),
            ),
            quiet=(("10m", "only corrected errors"),),
            fire_at="12m",
            fire_labels=(_gpu_labels(),),
            fire_text=(
                (
                    "Uncorrectable ECC error on GPU 3 of n1:9400.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 counted 2 "
                    "uncorrectable ECC errors in the last 15m. The job on it has likely crashed; the GPU "
                    "needs a reset before new work, and an RMA if it repeats.",
                ),
            ),
        ),
    )
    remap = N.GPU_REMAPPED_ROWS
    pending = Alert(
        name="GpuRowRemapPending",
        expr=f"max {gpu} ({select(remap, ns, eq('state', cfg.remap_pending_state))}) > 0",
        severity="warning",
        component="gpu",
        summary=f"GPU {_l('gpu')} of {_l('instance')} needs a reset to remap memory rows.",
        description=(
            f"{where} has {_V} memory row remaps pending; they take effect at the next GPU reset. Reset it "
            f"at the next job boundary (drain, nvidia-smi -r)."
        ),
        for_=cfg.remap_pending_for,
        test=AlertTest(
            series=(
                (_series(remap, _with(_GPU, state="pending")), "0+0x5 1+0x20"),
                (_series(remap, _with(_GPU, state="failure")), "0+0x25"),
            ),
            quiet=(("5m", "none pending"), ("15m", "before for:")),
            fire_at="20m",
            fire_labels=(_gpu_labels(),),
            fire_text=(
                (
                    "GPU 3 of n1:9400 needs a reset to remap memory rows.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 has 1 memory row "
                    "remaps pending; they take effect at the next GPU reset. Reset it at the next job "
                    "boundary (drain, nvidia-smi -r).",
                ),
            ),
        ),
    )
    failed = Alert(
        name="GpuRowRemapFailed",
        expr=f"max {gpu} ({select(remap, ns, eq('state', cfg.remap_failure_state))}) > 0",
        severity="critical",
        component="gpu",
        summary=f"GPU {_l('gpu')} of {_l('instance')} failed to remap a memory row.",
        description=(
            f"{where} reports a failed row remap: it has run out of spare rows. Drain the node and RMA "
            f"the GPU."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(remap, _with(_GPU, state="failure")), "0+0x5 1+0x10"),
                (_series(remap, _with(_GPU, state="pending")), "2+0x15"),
            ),
            quiet=(("5m", "no failure"),),
            fire_at="7m",
            fire_labels=(_gpu_labels(),),
            fire_text=(
                (
                    "GPU 3 of n1:9400 failed to remap a memory row.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 reports a failed "
                    "row remap: it has run out of spare rows. Drain the node and RMA the GPU.",
                ),
            ),
        ),
    )
    clock = N.GPU_CLOCK_EVENT_ACTIVE
    throttled = Alert(
        name="GpuThrottled",
        expr=(
            f"max {by((*r.gpu_key, 'reason'))} (\n"
            f"  avg_over_time({select(clock, ns, regex('reason', cfg.throttle_reasons))}"
            f"[{cfg.throttle_window}])\n) > {cfg.throttle_fraction:g}"
        ),
        severity="warning",
        component="gpu",
        summary=f"GPU {_l('gpu')} of {_l('instance')} is throttled: {_l('reason')}.",
        description=(
            f"{where} had clock event {_l('reason')} active {_VP} of the last {cfg.throttle_window}. "
            f"The whole job runs at the pace of this GPU: check cooling, power and the board."
        ),
        for_=cfg.throttle_for,
        test=AlertTest(
            series=(
                (_series(clock, _with(_GPU, reason="hw_thermal_slowdown")), "0+0x5 1+0x40"),
                (_series(clock, _with(_GPU, reason="sw_power_cap")), "1+0x45"),
            ),
            quiet=(("8m", "not sustained"), ("25m", "before for:")),
            fire_at="30m",
            fire_labels=(_gpu_labels(reason="hw_thermal_slowdown"),),
            fire_text=(
                (
                    "GPU 3 of n1:9400 is throttled: hw_thermal_slowdown.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 had clock event "
                    "hw_thermal_slowdown active 100% of the last 10m. The whole job runs at the pace of this "
                    "GPU: check cooling, power and the board.",
                ),
            ),
        ),
    )
    return [xid_critical, ecc, failed, xid_warning, down, pending, throttled]


#: The alerts on a GPU that failed hard (a paging Xid, an uncorrectable ECC error, a failed row remap):
#: their own rule group, evaluated every ``fatal_eval_interval``, so that they page within 30 s.
FATAL = ("GpuXidCritical", "GpuEccUncorrectable", "GpuRowRemapFailed")


def gpu_fatal_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    """The hard GPU faults' alerts (:data:`FATAL`), in their own group."""
    return [a for a in gpu_alerts(cfg, r) if a.name in FATAL]


def gpu_other_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    """The other GPU alerts (a warning-level Xid, a GPU down for a minute, throttling, pending remaps)."""
    return [a for a in gpu_alerts(cfg, r) if a.name not in FATAL]
