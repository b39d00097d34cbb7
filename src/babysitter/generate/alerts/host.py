"""Host alerts: host memory (EDAC) errors, CPU thermal throttling, and kernel lines that come before
trouble (soft lockups, hung tasks, mlx5 command timeouts and health failures, NFS not responding)."""

from __future__ import annotations

from babysitter.catalog import fabric as F
from babysitter.generate.alerts._common import _V, Alert, AlertTest, _l, _node_labels, _series, _with
from babysitter.generate.config import GenerateConfig, parse_duration
from babysitter.generate.promql import by, regex, select
from babysitter.generate.rules import Records
from babysitter.generate.rules_fabric import increased

__all__ = ["host_alerts"]


def _host(**extra: str) -> dict[str, str]:
    return {"cluster": "c1", "instance": "n1:9400", **extra}


def host_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ns, c = cfg.node_selector, cfg.cluster_label
    mc = by((c, "instance", "controller"))
    uw = cfg.host_memory_ue_window
    ue, ce = F.EDAC_UNCORRECTABLE, F.EDAC_CORRECTABLE
    where = f"memory controller {_l('controller')} of {_l('instance')} (cluster {_l(c)})"
    uncorrectable = Alert(
        name="HostMemoryUncorrectableError",
        expr=f"sum {mc} (\n  {increased(select(ue, ns), uw)}\n)",
        severity="critical",
        component="host",
        summary=(
            f"Uncorrectable host-memory error on {_l('instance')} (memory controller {_l('controller')})."
        ),
        description=(
            f"{where} counted {_V} uncorrectable ECC errors in the last {uw} (EDAC ue_count). The kernel "
            f"killed whatever touched the memory, or the host is about to panic: the rank on it has likely "
            f"died. Drain the host; the csrow counters under /sys/devices/system/edac/mc say which DIMM."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(ue, _with(_node_labels(), controller="1")), "0+0x20 1+0x30"),
                (_series(ue, _with(_node_labels(), controller="0")), "0+0x50"),
                (_series(ce, _with(_node_labels(), controller="0")), "0+3x50"),
            ),
            quiet=(("20m", "only correctable errors"), ("37m", f"left the {uw} window")),
            fire_at="22m",
            fire_labels=(_host(controller="1"),),
            fire_text=(
                (
                    "Uncorrectable host-memory error on n1:9400 (memory controller 1).",
                    "memory controller 1 of n1:9400 (cluster c1) counted 1 uncorrectable ECC errors in the "
                    "last 15m (EDAC ue_count). The kernel killed whatever touched the memory, or the host "
                    "is about to panic: the rank on it has likely died. Drain the host; the csrow counters "
                    "under /sys/devices/system/edac/mc say which DIMM.",
                ),
            ),
        ),
    )
    cw, base = cfg.host_ce_window, cfg.host_ce_baseline
    now = f"sum {mc} (increase({select(ce, ns)}[{cw}]))"
    before = f"sum {mc} (increase({select(ce, ns)}[{base}] offset {cw}))"
    hours_ratio = _seconds(base) / _seconds(cw)
    rising = Alert(
        name="HostMemoryCorrectableErrorsRising",
        expr=(
            f"{now} >= {cfg.host_ce_min}\nand\n{now} > {cfg.host_ce_factor:g} * {before} / {hours_ratio:g}"
        ),
        severity="warning",
        component="host",
        summary=(
            f"Correctable host-memory errors rise on {_l('instance')} (memory controller {_l('controller')})."
        ),
        description=(
            f"{where} counted {_V} correctable ECC errors in the last {cw}, more than "
            f"{cfg.host_ce_factor:g} times its rate over the {base} before: a DIMM wearing out. Correctable "
            "errors cost nothing yet; an uncorrectable one kills the job. Replace the DIMM at the next "
            "maintenance."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                # Controller 0: 3 an hour for 7 hours, then 30 in the last hour; 1: 24 an hour always.
                (_series(ce, _with(_node_labels(), controller="0")), "0+0.25x84 23.5+2.5x11"),
                (_series(ce, _with(_node_labels(), controller="1")), "0+2x96"),
            ),
            quiet=(("7h", "3 in the last hour"),),
            fire_at="8h",
            fire_labels=(_host(controller="0"),),
            fire_text=(
                (
                    "Correctable host-memory errors rise on n1:9400 (memory controller 0).",
                    "memory controller 0 of n1:9400 (cluster c1) counted 30 correctable ECC errors in the "
                    "last 1h, more than 2 times its rate over the 6h before: a DIMM wearing out. "
                    "Correctable errors cost nothing yet; an uncorrectable one kills the job. Replace the "
                    "DIMM at the next maintenance.",
                ),
            ),
            interval="5m",
            evaluation_interval="5m",
        ),
    )
    tw = cfg.cpu_throttle_window
    package = by((c, "instance", "package"))
    cores, packages = F.CPU_CORE_THROTTLES, F.CPU_PACKAGE_THROTTLES
    throttling = Alert(
        name="HostCpuThrottling",
        expr=(
            f"sum {package} (\n  {increased(select(cores, ns), tw)}\n  or "
            f"{increased(select(packages, ns), tw)}\n)"
        ),
        severity="warning",
        component="host",
        summary=f"CPU package {_l('package')} of {_l('instance')} keeps throttling.",
        description=(
            f"CPU package {_l('package')} of {_l('instance')} (cluster {_l(c)}) hit its thermal limit {_V} "
            f"times in the last {tw}, in every such window for {cfg.cpu_throttle_for}. A throttled host CPU "
            f"slows the input pipeline and the kernel launches of every rank on it: check the host's cooling "
            f"and fans."
        ),
        for_=cfg.cpu_throttle_for,
        test=AlertTest(
            series=(
                (_series(packages, _with(_node_labels(), package="1")), "0+0x10 1+1x30"),
                (_series(packages, _with(_node_labels(), package="0")), "4+0x40"),
                (_series(cores, _with(_node_labels(), package="0")), "9+0x40"),
            ),
            quiet=(("10m", "not throttling"), ("20m", "before for:")),
            fire_at="30m",
            fire_labels=(_host(package="1"),),
            fire_text=(
                (
                    "CPU package 1 of n1:9400 keeps throttling.",
                    "CPU package 1 of n1:9400 (cluster c1) hit its thermal limit 10 times in the last 10m, "
                    "in every such window for 15m. A throttled host CPU slows the input pipeline and the "
                    "kernel launches of every rank on it: check the host's cooling and fans.",
                ),
            ),
        ),
    )
    kw = cfg.kernel_trouble_window
    events = select(F.KERNEL_LOG_EVENTS, ns, regex("pattern", cfg.kernel_trouble_ignore, negate=True))
    kernel = Alert(
        name="NodeKernelTrouble",
        expr=f"sum by ({c}, instance, pattern) (\n  {increased(events, kw)}\n)",
        severity="warning",
        component="host",
        summary=f"The kernel of {_l('instance')} logged {_l('pattern')}.",
        description=(
            f"The kernel of {_l('instance')} (cluster {_l(c)}) logged {_V} {_l('pattern')} lines in the "
            f"last {kw}: a stuck CPU (soft_lockup), a task blocked on I/O (hung_task, often a dead file "
            "system), uncorrected PCIe errors, a NIC whose firmware stopped answering (mlx5_cmd_timeout, "
            "mlx5_health) or a lost NFS server (nfs_not_responding). Ranks there are likely to stall: read "
            "the host's kernel log (dmesg -T)."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(F.KERNEL_LOG_EVENTS, _with(_node_labels(), pattern="hung_task")), "0+0x20 1+0x30"),
                # Corrected PCIe errors are counted, never alerted on.
                (
                    _series(F.KERNEL_LOG_EVENTS, _with(_node_labels(), pattern="pcie_bus_error_corrected")),
                    "0+5x50",
                ),
            ),
            quiet=(("20m", "only corrected PCIe errors"),),
            fire_at="22m",
            fire_labels=(_host(pattern="hung_task"),),
            fire_text=(
                (
                    "The kernel of n1:9400 logged hung_task.",
                    "The kernel of n1:9400 (cluster c1) logged 1 hung_task lines in the last 15m: a stuck "
                    "CPU (soft_lockup), a task blocked on I/O (hung_task, often a dead file system), "
                    "uncorrected PCIe errors, a NIC whose firmware stopped answering (mlx5_cmd_timeout, "
                    "mlx5_health) or a lost NFS server (nfs_not_responding). Ranks there are likely to "
                    "stall: read the host's kernel log (dmesg -T).",
                ),
            ),
        ),
    )
    return [uncorrectable, rising, throttling, kernel]


def _seconds(duration: str) -> float:
    return float(parse_duration(duration))
