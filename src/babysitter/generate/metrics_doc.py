"""``docs/metrics.md``: the metric reference, generated from the catalog so it never drifts."""

from __future__ import annotations

from types import ModuleType

from babysitter import catalog
from babysitter.catalog import MetricSpec, budget
from babysitter.generate.config import GenerateConfig
from babysitter.generate.rules import recording_rules

__all__ = ["render_metrics_doc"]

_TRACKER = "run, rank, plus the constant labels given to `watch(labels=...)` (e.g. `{cluster}`)"
_AGENT = "`instance` (the host's agent target) and `{cluster}` from Prometheus target or external labels"

#: Sections in reading order: catalog module name, title, labels every series of it also carries.
#: Catalog modules not listed here still get a section (titled from their docstring), so a new
#: module never drops out of the reference.
_SECTIONS = (
    ("train", "Training (tracker, one set per rank)", _TRACKER),
    ("runtime", "Run health (tracker, computed in-process)", _TRACKER),
    ("goodput", "Goodput (tracker, rank 0, from the ledger)", _TRACKER),
    ("node", "Node agent: GPUs, trainers and collectors", _AGENT),
    ("storage", "Node agent: checkpoint storage", _AGENT),
    ("probe", "Cluster probe (through the node agent)", _AGENT),
    ("remediate", "Remediation (`babysitter remediate`)", "`instance` (the remediator) and `{cluster}`"),
    ("selfmon", "babysitter itself", "those of the process that exports them"),
)


def _sections() -> list[tuple[str, tuple[MetricSpec, ...], str]]:
    listed = {name for name, _, _ in _SECTIONS}
    found = [
        (title, tuple(getattr(catalog, name).METRICS), implicit)
        for name, title, implicit in _SECTIONS
        if hasattr(catalog, name)
    ]
    for name in sorted(catalog.__all__):
        module = getattr(catalog, name)
        if isinstance(module, ModuleType) and name not in listed and hasattr(module, "METRICS"):
            title = (module.__doc__ or name).strip().splitlines()[0].rstrip(".")
            found.append((title, tuple(module.METRICS), "see the module's documentation"))
    covered = {spec.name for _, specs, _ in found for spec in specs}
    rest = tuple(spec for spec in catalog.ALL if spec.name not in covered)
    if rest:
        found.append(("Other", rest, "see the catalog"))
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _series(spec: MetricSpec) -> str:
    if spec.kind == "histogram":
        return f"`{spec.name}_bucket{{le}}`, `_sum`, `_count`"
    if spec.kind == "summary" and spec.quantiles:
        return f"`{spec.name}{{quantile}}`, `_sum`, `_count`"
    if spec.kind == "summary":
        return f"`{spec.name}_sum`, `_count`"
    return f"`{spec.name}`"


def _budget() -> list[str]:
    b, m = budget.BUDGET, budget.MEASURED
    rows = (
        ("a training rank other than 0", b.rank, m.rank, m.rank_before),
        ("rank 0 (with the run's goodput and ledger series)", b.rank0, m.rank0, m.rank0_before),
        ("a GPU (node agent, default collectors)", b.gpu, m.gpu, m.gpu_before),
        (
            "a host's own series (agent health, one storage path, one sentinel run)",
            b.host,
            m.host,
            m.host_before,
        ),
        ("an InfiniBand/RoCE port (default counters)", b.fabric_port, m.fabric_port, 0),
        ("a watched PCIe device (a GPU or a NIC function)", b.pcie_device, m.pcie_device, 0),
        ("a GPU's nearest-NIC info", b.gpu_nic, m.gpu_nic, 0),
        (
            "a host's hardware (EDAC, CPU thermal, kernel-log patterns, sysfs collectors' health)",
            b.host_hardware,
            m.host_hardware,
            0,
        ),
    )
    fabric = 8 * m.fabric_port + 16 * m.pcie_device + 8 * m.gpu_nic + m.host_hardware
    asked = 8 * m.fabric_port + 10 * m.pcie_device + 8 * m.gpu_nic + m.host_hardware
    return [
        "## Series budget",
        "",
        "What one exporter may serve with the default collectors (`src/babysitter/catalog/budget.py`), and",
        "what it serves: `tests/test_series_budget.py` scrapes a real tracker on rank 0 and on rank 1",
        "(after steps, a checkpoint save, a load and an eval phase) and a real node agent with 8 simulated",
        "GPUs, one storage path and one sentinel run, reading the fabric of a fake HGX-like host (8 GPUs",
        "and 8 single-port NICs: 8 ports, 16 PCIe devices, 2 memory controllers, 2 CPU packages), fails",
        "over the budget, and fails when the counts below are out of date. Before: the same test run",
        "against the code before the budget (commit 16f5ca2); the fabric and host rows are new (0 before).",
        "",
        "| exporter | budget | measured | before |",
        "|---|---|---|---|",
        *(f"| {what} | {limit} | {now} | {before} |" for what, limit, now, before in rows),
        "",
        f"At 16,384 GPUs (2,048 hosts of 8 GPUs, 8 ranks and 8 fabric ports) the budget bounds the fleet at "
        f"{budget.per_node() * 2048:,} active series; the measured counts come to "
        f"{(m.host + 8 * m.gpu + 7 * m.rank + m.rank0 + fabric) * 2048:,} "
        f"(before: {(m.host_before + 8 * m.gpu_before + 7 * m.rank_before + m.rank0_before) * 2048:,}), of "
        f"which the fabric and the host's hardware are {fabric * 2048:,} ({fabric} per host; a host with 8 "
        f"ports and 10 PCIe devices adds {asked}).",
        "Series marked *rank 0 only* below are the run's view (identical on every rank of a synchronous",
        "job); every other tracker series is exported by every rank.",
        "",
    ]


def render_metrics_doc(cfg: GenerateConfig) -> str:
    """The Markdown text of ``docs/metrics.md``."""
    lines = [
        "# Metrics reference",
        "",
        "Generated by `babysitter generate` from `src/babysitter/catalog/`; do not edit by hand.",
        "Names follow Prometheus conventions: base units, `_total` on counters, `_ratio` for 0..1.",
        "",
        *_budget(),
    ]
    for title, specs, implicit in _sections():
        lines += [
            f"## {title}",
            "",
            f"Every series also carries: {implicit.format(cluster=cfg.cluster_label)}.",
            "",
        ]
        if not specs:
            lines += ["None yet.", ""]
            continue
        lines += ["| Series | Type | Unit | Labels | Meaning |", "|---|---|---|---|---|"]
        for spec in specs:
            labels = ", ".join(f"`{label}`" for label in spec.labels) or "-"
            extra = ""
            if spec.buckets:
                extra = " Buckets: " + ", ".join(f"{b:g}" for b in spec.buckets) + "."
            if spec.ranks == "rank0" and spec.source in ("tracker", "self"):
                extra += " *Rank 0 only.*"
            unit = spec.unit or "-"
            lines.append(f"| {_series(spec)} | {spec.kind} | {unit} | {labels} | {_cell(spec.help)}{extra} |")
        lines.append("")
    lines += [
        "## Recording rules",
        "",
        "Named `level:metric:operations`; every rule keeps the cluster label. Defined in "
        "`alerts/babysitter-rules.yaml`.",
        "",
        "| Rule | Expression |",
        "|---|---|",
    ]
    for record, expr in recording_rules(cfg):
        lines.append(f"| `{record}` | `{_cell(' '.join(expr.split()))}` |")
    return "\n".join(lines) + "\n"
