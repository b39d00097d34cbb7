"""Node health: what dcgm-exporter's dashboard lacks (Xid, ECC, row remaps, NVLink) next to the usual
temperatures, power and clocks, plus the storage probe, per host and GPU."""

from __future__ import annotations

from babysitter.catalog import node as N
from babysitter.catalog import storage as S
from babysitter.generate.config import GenerateConfig
from babysitter.generate.dashboards._builder import Dashboard, Panel, Row, Target
from babysitter.generate.dashboards._common import (
    gpu_matchers,
    host_matchers,
    node_variables,
    temperature_steps,
)
from babysitter.generate.dashboards.fabric import node_health_fabric, node_health_tiles
from babysitter.generate.promql import eq, new_or_increased, regex, select

__all__ = ["FILE_NAME", "dashboard"]

FILE_NAME = "babysitter-node-health.json"


def dashboard(cfg: GenerateConfig) -> Dashboard:
    """The node health dashboard for ``cfg``."""
    g, h = gpu_matchers(cfg), host_matchers(cfg)
    ri, rng = "$__rate_interval", "$__range"
    gpu = "{{instance}} GPU {{gpu}}"
    uncorrected = select(N.GPU_ECC_ERRORS, g, eq("type", cfg.ecc_uncorrected_type))
    throttling = select(N.GPU_CLOCK_EVENT_ACTIVE, g, regex("reason", cfg.throttle_reasons))
    xids = select(N.GPU_XID_ERRORS, g)

    def xid_by_code(window: str) -> str:
        # New series count too: a GPU's first Xid creates its counter at 1, which increase() misses.
        return f"sum by (instance, gpu, xid, action) {new_or_increased(xids, window)}"

    items: list[Panel | Row] = [
        Row("Overview"),
        Panel("GPUs up", (Target(f"sum({select(N.GPU_UP, g)})"),), kind="stat", width=4, height=5),
        _alarm("GPUs down", f"count({select(N.GPU_UP, g)} == 0) or vector(0)"),
        _alarm("Xid errors in range", f"sum {new_or_increased(xids, rng)} or vector(0)"),
        _alarm("Uncorrectable ECC in range", f"sum {new_or_increased(uncorrected, rng)} or vector(0)"),
        _alarm("GPUs throttled now", f"count(max by (instance, gpu) ({throttling}) > 0) or vector(0)"),
        _alarm("Collectors failing", f"count({select(N.COLLECTOR_SUCCESS, h)} == 0) or vector(0)"),
        *node_health_tiles(cfg),
        Row("Errors"),
        Panel(
            "Xid events by code and action",
            (
                Target(
                    xid_by_code(ri),
                    "{{instance}} GPU {{gpu}} Xid {{xid}} ({{action}})",
                ),
            ),
            bars=True,
            min=0,
            width=12,
            description="Xid errors by code and recovery action (reset, reboot and drain page).",
        ),
        Panel(
            "Xid totals",
            (
                Target(
                    xid_by_code(rng),
                    mode="instant",
                ),
            ),
            kind="table",
            width=12,
            columns=(("Value", "errors in range"),),
        ),
        Panel(
            "ECC errors",
            (
                Target(
                    f"sum by (instance, gpu, type) {new_or_increased(select(N.GPU_ECC_ERRORS, g), ri)}",
                    gpu + " {{type}}",
                ),
            ),
            bars=True,
            min=0,
            width=8,
        ),
        Panel(
            "Remapped rows",
            (Target(select(N.GPU_REMAPPED_ROWS, g), gpu + " {{state}}"),),
            min=0,
            width=8,
            description="Pending remaps apply at the next GPU reset; any failure means RMA.",
        ),
        Panel(
            "NVLink and PCIe errors",
            (
                Target(
                    f"sum by (instance, gpu, link, type) (rate({select(N.GPU_NVLINK_ERRORS, g)}[{ri}]))",
                    gpu + " link {{link}} {{type}}",
                ),
                Target(f"rate({select(N.GPU_PCIE_REPLAYS, g)}[{ri}])", gpu + " PCIe replays"),
            ),
            unit="short",
            min=0,
            width=8,
            description="Errors per second.",
        ),
        Row("Thermals, power, clocks"),
        Panel(
            "Throttle reasons active",
            (Target(f"{select(N.GPU_CLOCK_EVENT_ACTIVE, g)} > 0", gpu + " {{reason}}"),),
            bars=True,
            min=0,
            max=1,
            width=12,
        ),
        Panel(
            "GPU temperature",
            (Target(select(N.GPU_TEMPERATURE, g, eq("sensor", "gpu")), gpu),),
            unit="celsius",
            width=6,
            thresholds=temperature_steps(cfg),
            description=f"The GPU die. Amber from {cfg.gpu_temperature_warm:g} C, red from "
            f"{cfg.gpu_temperature_hot:g} C, where datacenter GPUs start to slow down (nvidia-smi -q: "
            "GPU Slowdown Temp).",
        ),
        Panel(
            "Memory temperature",
            (Target(select(N.GPU_TEMPERATURE, g, eq("sensor", "memory")), gpu),),
            unit="celsius",
            width=6,
            description="HBM, where the GPU reports it; its limits differ from the die's (no colours).",
        ),
        Panel(
            "Power / limit",
            (Target(f"{select(N.GPU_POWER, g)} / {select(N.GPU_POWER_LIMIT, g)}", gpu),),
            unit="percentunit",
            min=0,
            width=8,
        ),
        Panel("Power", (Target(select(N.GPU_POWER, g), gpu),), unit="watt", min=0, width=8),
        Panel("SM clock", (Target(select(N.GPU_SM_CLOCK, g), gpu),), unit="hertz", min=0, width=8),
        Panel(
            "Utilization and tensor activity",
            (
                Target(select(N.GPU_UTILIZATION, g), gpu + " busy"),
                Target(select(N.GPU_TENSOR_ACTIVE, g), gpu + " tensor"),
            ),
            unit="percentunit",
            min=0,
            max=1,
            width=12,
        ),
        Panel(
            "Memory used",
            (Target(f"{select(N.GPU_MEMORY_USED, g)} / {select(N.GPU_MEMORY_TOTAL, g)}", gpu),),
            unit="percentunit",
            min=0,
            max=1,
            width=12,
        ),
        *node_health_fabric(cfg),
        Row("Storage and agent"),
        Panel(
            "Storage probe latency",
            (
                Target(select(S.STORAGE_PROBE_WRITE, h), "{{instance}} {{path}} write"),
                Target(select(S.STORAGE_PROBE_FSYNC, h), "{{instance}} {{path}} fsync"),
                Target(select(S.STORAGE_PROBE_READ, h), "{{instance}} {{path}} read"),
                Target(select(S.STORAGE_PROBE_RUNNING, h), "{{instance}} {{path}} running"),
            ),
            unit="s",
            min=0,
            red_above=cfg.storage_probe_slow_seconds,
            width=8,
            description="A small write, fsync and read-back in each checkpoint directory, per host; "
            "'running' grows while a probe hangs.",
        ),
        Panel(
            "Storage probe up and errors",
            (
                Target(select(S.STORAGE_PROBE_UP, h), "{{instance}} {{path}} up"),
                # A reason's series appears with its first failure: count that one too.
                Target(
                    f"sum by (instance, path, reason) "
                    f"({new_or_increased(select(S.STORAGE_PROBE_ERRORS, h), ri)})",
                    "{{instance}} {{path}} {{reason}}",
                ),
            ),
            min=0,
            width=8,
        ),
        Panel(
            "Storage free",
            (Target(f"{select(S.STORAGE_FREE, h)} / {select(S.STORAGE_SIZE, h)}", "{{instance}} {{path}}"),),
            unit="percentunit",
            min=0,
            max=1,
            width=8,
        ),
        Panel(
            "Missing checkpoints",
            (
                Target(f"{select(S.CHECKPOINT_MISSING, h)} > 0", "{{run}} missing"),
                Target(select(S.CHECKPOINT_MISSING_STEP, h), "{{run}} newest missing step"),
            ),
            min=0,
            width=8,
            description="How many of a run's last checkpoints the ledger says completed are gone from disk, "
            "and the newest of them.",
        ),
        Panel(
            "Newest verified checkpoint age",
            (Target(select(S.CHECKPOINT_NEWEST_VERIFIED_AGE, h), "{{run}}"),),
            unit="s",
            min=0,
            width=8,
            description="Age of the newest checkpoint the sentinel found intact on disk, per run.",
        ),
        Panel(
            "Trainers served",
            (
                Target(select(N.TRAINER_SCRAPE_SUCCESS, h), "{{instance}} {{run}} rank {{rank}}"),
                Target(select(N.TRAINERS, h), "{{instance}} registered"),
            ),
            min=0,
            width=8,
            description="Training processes the agent serves; success 0 means a registered trainer does not "
            "answer (stopped or hung).",
        ),
        Panel(
            "Trainer fetch errors and refused registrations",
            (
                # A reason's series appears with its first failure: count that one too.
                Target(
                    f"sum by (instance, reason) ({new_or_increased(select(N.TRAINER_SCRAPE_ERRORS, h), ri)})",
                    "{{instance}} fetch {{reason}}",
                ),
                Target(
                    f"sum by (instance, reason) "
                    f"({new_or_increased(select(N.TRAINER_REGISTRATIONS_SKIPPED, h), ri)})",
                    "{{instance}} registration {{reason}}",
                ),
            ),
            bars=True,
            min=0,
            width=8,
            description="Failed fetches of registered trainer endpoints and registration files the agent "
            "refused, by reason (docs/security.md); a failure that keeps coming back warns as "
            "NodeTrainerFetchFailing or NodeTrainerRegistrationSkipped.",
        ),
        Panel("GPU up", (Target(select(N.GPU_UP, g), gpu),), min=0, max=1, width=8),
        Panel(
            "Collector success",
            (Target(select(N.COLLECTOR_SUCCESS, h), "{{instance}} {{collector}}"),),
            min=0,
            max=1,
            width=8,
        ),
        Panel(
            "Collector duration",
            (Target(select(N.COLLECTOR_DURATION, h), "{{instance}} {{collector}}"),),
            unit="s",
            min=0,
            width=8,
        ),
    ]
    return Dashboard(
        title="babysitter / Node health",
        file_name=FILE_NAME,
        description="GPU health per host and GPU: Xid by code and action, ECC, remapped rows, throttle "
        "reasons, temperature, power, NVLink and PCIe errors; the fabric (InfiniBand/RoCE ports, PCIe "
        "links and AER) and the host (EDAC, CPU thermal, kernel-log trouble); storage probe and collector "
        "health.",
        variables=node_variables(cfg),
        items=tuple(items),
    )


def _alarm(title: str, expr: str) -> Panel:
    """An overview tile that counts trouble: 0 is fine, anything above turns it red."""
    return Panel(title, (Target(expr),), kind="stat", width=4, height=5, red_above=0.5)
