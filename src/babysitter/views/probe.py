"""The probe's report as a person reads it: a device table, the collectives, checkpoint storage and the
lemons (rich when installed, plain text otherwise), from a :class:`~babysitter.probe.results.ProbeReport`."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from babysitter.probe.results import ProbeReport
from babysitter.terminal import clean

__all__ = ["render_table"]


def _si(value: float | None, unit: str) -> str:
    """``value`` with an SI prefix picked for it (``312.4 TFLOP/s``, ``1.2 GB/s``)."""
    if value is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:,.1f} {prefix}{unit}"
    return f"{value:,.1f} {unit}"


def _lemon_mark(report: ProbeReport, host: str, gpu: str) -> str:
    checks = sorted(
        {x.check for x in report.lemons if x.scope == "device" and x.host == host and x.gpu == gpu}
    )
    return ", ".join(checks)


def _rows(report: ProbeReport) -> Iterable[list[str]]:
    for d in report.devices:
        ratio = d.matmul.peak_ratio
        yield [
            clean(d.host),
            str(d.rank),
            clean(d.gpu),
            clean(d.name)[:32],
            _si(d.matmul.flops_per_second, "FLOP/s") + f" {d.matmul.dtype}",
            "-" if ratio is None else f"{ratio:.0%}",
            _si(d.memory.bytes_per_second, "B/s"),
            _si(d.host_to_device.bytes_per_second, "B/s"),
            _si(d.device_to_host.bytes_per_second, "B/s"),
            _lemon_mark(report, d.host, d.gpu),
        ]


def render_table(report: ProbeReport, stream: Any = None) -> None:
    """Print the report as tables (rich when installed, plain text otherwise)."""
    headers = ["host", "rank", "device", "model", "matmul", "of peak", "memory", "H2D", "D2H", "lemon"]
    rows = list(_rows(report))
    c = report.collective
    # Host, device and path names and errors come from the probed hosts: cleaned, printed as Text.
    coll = (
        f"all-reduce ({c.backend}, {c.world_size} ranks, {c.bytes / 2**20:.0f} MiB): "
        f"busbw {_si(c.busbw_bytes_per_second, 'B/s')}, algbw {_si(c.algbw_bytes_per_second, 'B/s')}"
        if not c.skipped
        else f"all-reduce: skipped ({c.skipped})"
    )
    for n in report.node_collectives:
        coll += (
            f"\n  within {clean(n.host)} ({n.world_size} ranks): busbw {_si(n.busbw_bytes_per_second, 'B/s')}"
            if not n.skipped
            else f"\n  within {clean(n.host)}: skipped ({n.skipped})"
        )
    coll = clean(coll, multiline=True)
    storage = [
        [
            clean(s.host),
            clean(s.path),
            f"{s.size_bytes / 2**20:.0f} MiB",
            _si(s.write_bytes_per_second, "B/s"),
            "-" if s.fsync_seconds is None else f"{s.fsync_seconds:.3f} s",
            _si(s.read_bytes_per_second, "B/s"),
            clean(s.error),
        ]
        for s in report.storage
    ]
    nodes = [
        clean(f"{x.host}: {x.check} {x.below_median:.0%} below median")
        for x in report.lemons
        if x.scope == "node"
    ]
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        _plain(
            headers=headers, rows=rows, coll=coll, storage=storage, nodes=nodes, report=report, stream=stream
        )
        return
    console = Console(file=stream, width=160)
    table = Table(title=f"babysitter probe: {len(report.devices)} devices on {len(report.hosts)} hosts")
    for h in headers:
        table.add_column(
            h, justify="right" if h in ("rank", "matmul", "of peak", "memory", "H2D", "D2H") else "left"
        )
    for row in rows:
        table.add_row(*map(Text, row), style="bold red" if row[-1] else None)
    console.print(table)
    console.print(Text(coll))
    if storage:
        st = Table(title="checkpoint storage")
        for h in ("host", "path", "file", "write+fsync", "fsync", "cold read", "error"):
            st.add_column(h)
        for srow in storage:
            st.add_row(*map(Text, srow))
        console.print(st)
    _summary(report, nodes, lambda line: console.print(Text(line)))


def _plain(
    *,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    coll: str,
    storage: Sequence[Sequence[str]],
    nodes: Sequence[str],
    report: ProbeReport,
    stream: Any,
) -> None:
    def out(text: str) -> None:
        (stream or sys.stdout).write(text + "\n")

    out("\t".join(headers))
    for row in rows:
        out("\t".join(row))
    out(coll)
    for srow in storage:
        out("storage\t" + "\t".join(srow))
    _summary(report, nodes, out)


def _summary(report: ProbeReport, nodes: Sequence[str], out: Any) -> None:
    devices = sum(1 for x in report.lemons if x.scope == "device")
    if not report.lemons:
        out(f"no lemons (threshold: {report.lemon_fraction:.0%} below the fleet median)")
        return
    out(
        f"LEMONS (more than {report.lemon_fraction:.0%} below the fleet median): {devices} device checks, "
        f"{len(nodes)} node checks"
    )
    for line in nodes:
        out(f"  node {line}")
