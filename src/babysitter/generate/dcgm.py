"""dcgm-exporter mode: recording rules that turn NVIDIA dcgm-exporter's series into the ``gpu_*`` series.

Sites that already run dcgm-exporter turn the node agent's GPU collector off (``--gpu-backend none``)
and load this rule file next to the others; every alert, dashboard and rank-to-GPU join then reads
``gpu_*`` series as if the agent had exported them (docs/dcgm-exporter.md says which lose fidelity).

Each rule renames a ``DCGM_FI_DEV_*`` / ``DCGM_EXP_*`` series to its catalog name, converts the unit
(MHz to Hz, MiB to bytes, mJ to J, percent to ratio) and rewrites the labels to the node agent's:
``UUID`` -> ``uuid``, ``modelName`` -> ``model``, ``pci_bus_id`` from ``00000000:53:00.0`` to
``0000:53:00`` (lower case, as ``labels.normalize_pci_bus_id`` writes it), ``gpu`` kept; the exporter's
other labels (``Hostname``, ``device``, the driver version, pod attribution, MIG instance) are
aggregated away so a GPU keeps one series per metric. DCGM's "blank" values (not supported, not
found: 2^47 and above) are dropped rather than mapped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from babysitter.catalog import node as N
from babysitter.catalog._spec import MetricSpec
from babysitter.generate.config import GenerateConfig

__all__ = [
    "CLOCK_EVENT_BITS",
    "DCGM_DROPPED_LABELS",
    "GROUP",
    "UP_FIELDS",
    "Mapping_",
    "dcgm_groups",
    "mapped_specs",
    "mappings",
    "normalize_labels",
]

GROUP = "babysitter-dcgm-exporter.rules"
#: dcgm-exporter labels that are not GPU identity; aggregated away by every mapping.
DCGM_DROPPED_LABELS = (
    "UUID",
    "modelName",
    "Hostname",
    "hostname",
    "device",
    "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_PROCESS_NAME",
    "container",
    "namespace",
    "pod",
    "pod_uid",
    "err_code",
    "err_msg",
    "GPU_I_PROFILE",
    "GPU_I_ID",
)
#: DCGM's smallest "blank" value (DCGM_FP64_BLANK, 2^47); the int64 blanks are larger still.
_BLANK = 140737488355328
#: NVML's clock event reason bits (nvml.h, nvmlClocksEventReason*) in DCGM_FI_DEV_CLOCKS_EVENT_REASONS,
#: for the reasons the node agent exports (node/gpu/collector.py, EXPORTED_CLOCK_EVENT_REASONS).
CLOCK_EVENT_BITS: tuple[tuple[str, int], ...] = (
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
)
#: The field's name before DCGM 3.3 renamed "throttle reasons" to "clock event reasons".
CLOCK_EVENT_FIELDS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")


@dataclass(frozen=True)
class Mapping_:
    """One dcgm-exporter field as one catalog series: ``value * scale`` with ``labels`` added."""

    field: str
    spec: MetricSpec
    scale: float = 1.0
    labels: tuple[tuple[str, str], ...] = ()


def mappings() -> tuple[Mapping_, ...]:
    """The plain field-to-series mappings (clock events and Xids need their own expressions)."""
    mib = 1024.0 * 1024.0
    ecc = tuple(
        Mapping_(
            f"DCGM_FI_DEV_ECC_{bits}_{scope[:3].upper()}_TOTAL",
            N.GPU_ECC_ERRORS,
            1.0,
            (("type", kind), ("scope", scope)),
        )
        for bits, kind in (("SBE", "corrected"), ("DBE", "uncorrected"))
        for scope in ("volatile", "aggregate")
    )
    nvlink = tuple(
        Mapping_(
            f"DCGM_FI_DEV_NVLINK_{field}_ERROR_COUNT_TOTAL",
            N.GPU_NVLINK_ERRORS,
            1.0,
            (("link", "all"), ("type", kind)),
        )
        for field, kind in (
            ("CRC_FLIT", "crc_flit"),
            ("CRC_DATA", "crc_data"),
            ("REPLAY", "replay"),
            ("RECOVERY", "recovery"),
        )
    )
    return (
        Mapping_("DCGM_FI_DEV_SM_CLOCK", N.GPU_SM_CLOCK, 1e6),
        Mapping_("DCGM_FI_DEV_MEM_CLOCK", N.GPU_MEMORY_CLOCK, 1e6),
        Mapping_("DCGM_FI_DEV_GPU_TEMP", N.GPU_TEMPERATURE, 1.0, (("sensor", "gpu"),)),
        Mapping_("DCGM_FI_DEV_MEMORY_TEMP", N.GPU_TEMPERATURE, 1.0, (("sensor", "memory"),)),
        Mapping_("DCGM_FI_DEV_POWER_USAGE", N.GPU_POWER),
        Mapping_("DCGM_FI_DEV_POWER_MGMT_LIMIT", N.GPU_POWER_LIMIT),
        Mapping_("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", N.GPU_ENERGY, 1e-3),
        Mapping_("DCGM_FI_DEV_GPU_UTIL", N.GPU_UTILIZATION, 1e-2),
        Mapping_("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", N.GPU_TENSOR_ACTIVE),
        Mapping_("DCGM_FI_DEV_FB_USED", N.GPU_MEMORY_USED, mib),
        Mapping_("DCGM_FI_DEV_FB_TOTAL", N.GPU_MEMORY_TOTAL, mib),
        Mapping_("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", N.GPU_PCIE_REPLAYS),
        *ecc,
        Mapping_(
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", N.GPU_REMAPPED_ROWS, 1.0, (("state", "correctable"),)
        ),
        Mapping_(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", N.GPU_REMAPPED_ROWS, 1.0, (("state", "uncorrectable"),)
        ),
        Mapping_("DCGM_FI_DEV_ROW_REMAP_PENDING", N.GPU_REMAPPED_ROWS, 1.0, (("state", "pending"),)),
        Mapping_("DCGM_FI_DEV_ROW_REMAP_FAILURE", N.GPU_REMAPPED_ROWS, 1.0, (("state", "failure"),)),
        *nvlink,
    )


def _set(expr: str, label: str, value: str) -> str:
    return f'label_replace({expr}, "{label}", "{value}", "", "")'


def _copy(expr: str, target: str, source: str) -> str:
    return f'label_replace({expr}, "{target}", "$1", "{source}", "(.*)")'


def normalize_labels(expr: str, drop: tuple[str, ...] = ()) -> str:
    """dcgm-exporter's identity labels rewritten to the node agent's, the others aggregated away."""
    out = _copy(_copy(expr, "uuid", "UUID"), "model", "modelName")
    # 00000000:53:00.0 -> 0000:53:00, then upper-case hex letters to lower case (label_replace cannot
    # change case, so each letter is replaced once per position it can hold: 4 domain, 2 bus, 2 device).
    out = (
        f'label_replace({out}, "pci_bus_id", "$1:$2:$3", "pci_bus_id", '
        f'"(?:[0-9A-Fa-f]{{4}})?([0-9A-Fa-f]{{4}}):([0-9A-Fa-f]{{2}}):([0-9A-Fa-f]{{2}})(?:\\\\.[0-7])?")'
    )
    for letter in "ABCDEF":
        for _ in range(4):
            lower = f'"${{1}}{letter.lower()}${{2}}", "pci_bus_id", "(.*){letter}(.*)"'
            out = f'label_replace({out}, "pci_bus_id", {lower})'
    return f"max without ({', '.join((*DCGM_DROPPED_LABELS, *drop))}) (\n  {out}\n)"


def _field(name: str, cfg: GenerateConfig) -> str:
    matchers = cfg.dcgm_selector
    return f"{name}{{{matchers}}}" if matchers else name


def _mapped(m: Mapping_, cfg: GenerateConfig) -> str:
    value = f"{_field(m.field, cfg)} < {_BLANK}"
    if m.scale != 1.0:
        value = f"({value}) * {m.scale!r}"
    for label, label_value in m.labels:
        value = _set(value, label, label_value)
    return normalize_labels(value)


def _clock_events(cfg: GenerateConfig) -> str:
    field = " or ".join(f"({_field(name, cfg)} < {_BLANK})" for name in CLOCK_EVENT_FIELDS)
    parts = [_set(f"floor(({field}) / {bit}) % 2", "reason", reason) for reason, bit in CLOCK_EVENT_BITS]
    return normalize_labels("\n  or ".join(parts))


def _xids(cfg: GenerateConfig, xid_actions: Mapping[int, str]) -> str:
    """A 1 per GPU and Xid code while dcgm-exporter shows it: a new code (or one back after it left) is
    a new series, which ``new_or_increased`` counts as one Xid; a repeat of the code it shows is lost."""
    if cfg.dcgm_xid_source == "exp":
        # xid in a label; the count covers the exporter's --xid-count-window-size (5 minutes by default).
        shown = f"0 * ({_field('DCGM_EXP_XID_ERRORS_COUNT', cfg)} > 0) + 1"
    else:
        # The last Xid's code as the value, held until the next one ("sticky").
        shown = f'count_values without () ("xid", {_field("DCGM_FI_DEV_XID_ERRORS", cfg)} > 0 < {_BLANK})'
    out = _set(shown, "action", "unknown")
    by_action: dict[str, list[int]] = {}
    for code, action in sorted(xid_actions.items()):
        by_action.setdefault(action, []).append(code)
    for action, codes in sorted(by_action.items()):
        out = f'label_replace({out}, "action", "{action}", "xid", "{"|".join(map(str, codes))}")'
    return normalize_labels(out)


#: Fields of dcgm-exporter's default counters that every GPU reports while DCGM can read it.
UP_FIELDS = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_UTIL",
)


def _gpu_up(cfg: GenerateConfig) -> str:
    """1 for every GPU of which DCGM reads any of :data:`UP_FIELDS`, 0 when it reads only blanks."""
    names = "|".join(UP_FIELDS)
    selector = f'{{__name__=~"{names}"{", " + cfg.dcgm_selector if cfg.dcgm_selector else ""}}}'
    # The field name goes into a label first: comparing with bool drops __name__, and the fields of
    # one GPU must stay apart until the max over them.
    field = f'label_replace({selector}, "dcgm_field", "$1", "__name__", "(.*)")'
    return normalize_labels(f"{field} < bool {_BLANK}", drop=("dcgm_field",))


def dcgm_groups(cfg: GenerateConfig, xid_actions: Mapping[int, str]) -> list[dict[str, object]]:
    """The rule group of ``alerts/babysitter-dcgm-exporter-rules.yaml``; ``xid_actions`` maps Xid codes
    to the node agent's action buckets (node/xid/codes.py), so the Xid alerts route as they do there."""
    rules: list[dict[str, object]] = [{"record": N.GPU_UP.name, "expr": _gpu_up(cfg)}]
    by_spec: dict[str, list[str]] = {}
    for m in mappings():
        by_spec.setdefault(m.spec.name, []).append(_mapped(m, cfg))
    # One rule per catalog series: fields that share a name (the ECC counters) go in one expression.
    for name, exprs in by_spec.items():
        rules.append({"record": name, "expr": "\nor\n".join(exprs)})
    rules.append({"record": N.GPU_CLOCK_EVENT_ACTIVE.name, "expr": _clock_events(cfg)})
    if cfg.dcgm_xid_source != "none":
        rules.append({"record": N.GPU_XID_ERRORS.name, "expr": _xids(cfg, xid_actions)})
    return [{"name": GROUP, "rules": rules}]


def mapped_specs() -> Sequence[MetricSpec]:
    """The catalog series this mode produces (docs and tests list them)."""
    seen: dict[str, MetricSpec] = {N.GPU_UP.name: N.GPU_UP}
    for m in mappings():
        seen.setdefault(m.spec.name, m.spec)
    seen[N.GPU_CLOCK_EVENT_ACTIVE.name] = N.GPU_CLOCK_EVENT_ACTIVE
    seen[N.GPU_XID_ERRORS.name] = N.GPU_XID_ERRORS
    return tuple(seen.values())
