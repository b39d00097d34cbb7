"""The GPU collector over NVML: per-GPU health, one scrape at a time, never failing as a whole.

Every reading is its own NVML call and fails on its own: ``NotSupported`` (or a function the installed
driver or nvidia-ml-py lacks) omits that metric for that GPU from then on; ``GpuIsLost`` (and the
other "this GPU is gone" codes) turns the GPU's ``gpu_up`` to 0, drops its other readings for the
scrape and logs one line per transition; any other NVML error omits the reading, counts it in
``babysitter_gpu_query_errors_total`` and logs once per GPU, query and error. The other GPUs are never
affected.

Series per GPU stay within the 35 of the series budget (``catalog.budget``): clock events only for
the reasons that throttle (:data:`EXPORTED_CLOCK_EVENT_REASONS`), NVLink errors summed over links
(``link="all"``) unless ``nvlink_per_link`` is set (4 series per active link: 72 on an H100).
Tensor activity comes from GPM (Hopper and later): two samples per GPU, the metric is the average
over the time between two scrapes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client.core import Metric

from babysitter.catalog import node as N
from babysitter.catalog._spec import MetricSpec
from babysitter.node.collector import GpuIdentity, family_of
from babysitter.node.gpu.nvml import Nvml, NvmlUnavailable, error_name

__all__ = ["CLOCK_EVENT_REASONS", "EXPORTED_CLOCK_EVENT_REASONS", "GpuCollector"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Clock event (throttle) reasons exported as ``gpu_clock_event_active{reason}``: label, pynvml constant.
CLOCK_EVENT_REASONS: tuple[tuple[str, str], ...] = (
    ("gpu_idle", "nvmlClocksEventReasonGpuIdle"),
    ("applications_clocks_setting", "nvmlClocksEventReasonApplicationsClocksSetting"),
    ("sw_power_cap", "nvmlClocksEventReasonSwPowerCap"),
    ("hw_slowdown", "nvmlClocksEventReasonHwSlowdown"),
    ("sync_boost", "nvmlClocksEventReasonSyncBoost"),
    ("sw_thermal_slowdown", "nvmlClocksEventReasonSwThermalSlowdown"),
    ("hw_thermal_slowdown", "nvmlClocksEventReasonHwThermalSlowdown"),
    ("hw_power_brake_slowdown", "nvmlClocksEventReasonHwPowerBrakeSlowdown"),
    ("display_clock_setting", "nvmlClocksEventReasonDisplayClockSetting"),
)
#: The reasons exported: those that lower clocks under load (power and thermal limits, slowdowns).
#: Idle, application clocks, sync boost and display clock say nothing a training job can act on;
#: leaving them out keeps a GPU within the series budget (catalog.budget: 5 series, not 9).
EXPORTED_CLOCK_EVENT_REASONS: tuple[tuple[str, str], ...] = tuple(
    (label, const)
    for label, const in CLOCK_EVENT_REASONS
    if label
    in (
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    )
)
_ECC_TYPES = (
    ("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
    ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
)
_ECC_SCOPES = (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC"))
_RETIRE_CAUSES = (
    ("multiple_single_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
    ("double_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
)
_REMAP_STATES = ("correctable", "uncorrectable", "pending", "failure")
_NVLINK_TYPES = (
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"),
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
)
#: The same counters summed over every link by the driver: one field-values call instead of one call
#: per link and counter (72 on an H100), when every one of them is supported.
_NVLINK_TOTALS = (
    ("replay", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    ("recovery", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    ("crc_flit", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    ("crc_data", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
)
#: Errors that mean the GPU itself is gone (fallen off the bus, needs a reset), not one query failing.
_LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired", "NVMLError_GpuNotFound")
_UNSUPPORTED_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
_MAX_LABEL = 128
#: Minimum seconds between NVML (re)initialisation attempts while the driver does not answer.
_INIT_RETRY_SECONDS = 30.0
#: Seconds between attempts to get a fresh handle for a lost GPU.
_REACQUIRE_SECONDS = 60.0


class _GpuLost(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


@dataclass
class _Device:
    index: int
    handle: Any = None
    identity: GpuIdentity | None = None
    labels: tuple[str, ...] = ()
    up: bool = True
    lost_error: str = ""
    unsupported: set[str] = field(default_factory=set)
    nvlinks: list[int] | None = None
    gpm: list[Any] | None = None  # [previous sample, current sample] while GPM works
    gpm_primed: bool = False
    last_reacquire: float = 0.0


Sample = tuple[MetricSpec, tuple[str, ...], float]


def _clean(text: str) -> str:
    return "".join(ch for ch in text if ch.isprintable()).strip()[:_MAX_LABEL]


class GpuCollector:
    """Per-GPU health from NVML (or the fake NVML of the simulator); see the module docstring."""

    def __init__(
        self,
        lib: Nvml,
        *,
        nvlink_per_link: bool = False,
        gpm: bool = True,
        name: str = "gpu",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._lib = lib
        self._nvlink_per_link = nvlink_per_link
        self._gpm_enabled = gpm
        self._clock = clock
        self._lock = threading.Lock()
        self._devices: list[_Device] = []
        self._started = False
        self._last_init_attempt: float | None = None
        self._driver_version = ""
        self._query_errors: dict[tuple[tuple[str, ...], str, str], int] = {}
        self._logged: set[tuple[int, str, str]] = set()
        lost = tuple(getattr(lib, n) for n in _LOST_ERRORS if _has(lib, n))
        self._lost_errors: tuple[type[BaseException], ...] = lost
        self._unsupported_errors: tuple[type[BaseException], ...] = tuple(
            getattr(lib, n) for n in _UNSUPPORTED_ERRORS if _has(lib, n)
        )
        self._nvml_error: type[BaseException] = lib.NVMLError

    # --- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Initialise NVML and enumerate the GPUs; :class:`NvmlUnavailable` when NVML does not answer."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._started:
            return
        self._last_init_attempt = self._clock()
        try:
            self._lib.nvmlInit()
        except self._nvml_error as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc} ({error_name(exc)})") from exc
        try:
            try:
                self._driver_version = _clean(str(self._lib.nvmlSystemGetDriverVersion()))
            except self._nvml_error:
                self._driver_version = ""
            count = int(self._lib.nvmlDeviceGetCount())
        except self._nvml_error as exc:
            self._lib.nvmlShutdown()
            raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {exc} ({error_name(exc)})") from exc
        self._devices = [_Device(index=i) for i in range(count)]
        for dev in self._devices:
            self._identify(dev)
        self._started = True
        log.info(
            "babysitter: NVML driver %s, %d GPU(s): %s",
            self._driver_version or "unknown",
            count,
            ", ".join(f"{d.index}={d.identity.model if d.identity else 'lost'}" for d in self._devices),
        )

    def close(self) -> None:
        """Free GPM samples and shut NVML down (NVML reference-counts init/shutdown)."""
        with self._lock:
            if not self._started:
                return
            for dev in self._devices:
                self._free_gpm(dev)
            self._started = False
            try:
                self._lib.nvmlShutdown()
            except self._nvml_error as exc:
                log.warning("babysitter: nvmlShutdown failed: %s", exc)

    # --- what others need -----------------------------------------------------------------------------
    @property
    def driver_version(self) -> str:
        """The driver version NVML reported at start ("" when unknown)."""
        return self._driver_version

    def identities(self) -> list[GpuIdentity]:
        """The GPUs identified so far (a GPU lost before it was identified is missing)."""
        with self._lock:
            return [d.identity for d in self._devices if d.identity is not None]

    # --- collection --------------------------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        """One reading of every GPU; raises only when NVML itself cannot be initialised."""
        with self._lock:
            if not self._started:
                now = self._clock()
                if (
                    self._last_init_attempt is not None
                    and now - self._last_init_attempt < _INIT_RETRY_SECONDS
                ):
                    raise NvmlUnavailable("NVML is not initialised (retrying every 30 s)")
                self._start_locked()
            samples: list[Sample] = []
            for dev in self._devices:
                samples.extend(self._collect_device(dev))
            for (labels, query, error), count in self._query_errors.items():
                samples.append((N.GPU_QUERY_ERRORS, (*labels, query, error), float(count)))
        return _families(samples)

    def _identify(self, dev: _Device) -> bool:
        lib = self._lib
        try:
            dev.handle = lib.nvmlDeviceGetHandleByIndex(dev.index)
            uuid = _clean(str(lib.nvmlDeviceGetUUID(dev.handle)))
            bus = lib.nvmlDeviceGetPciInfo(dev.handle).busId
            bus_id = bus.decode() if isinstance(bus, bytes) else str(bus)
            try:
                model = _clean(str(lib.nvmlDeviceGetName(dev.handle)))
            except self._lost_errors:
                raise
            except self._nvml_error:
                model = ""  # the name is a label, not worth losing the GPU's metrics over
            identity = GpuIdentity(index=dev.index, uuid=uuid, pci_bus_id=bus_id, model=model)
            dev.labels = identity.label_values()
        except (self._nvml_error, ValueError) as exc:
            dev.handle = None
            self._mark_lost(dev, error_name(exc))
            return False
        dev.identity = identity
        if self._gpm_enabled:
            self._setup_gpm(dev)
        return True

    def _collect_device(self, dev: _Device) -> list[Sample]:
        if dev.identity is None and not self._identify(dev):
            return [(N.GPU_UP, (str(dev.index), "", "", ""), 0.0)]
        if not dev.up and self._clock() - dev.last_reacquire >= _REACQUIRE_SECONDS:
            # After a GPU reset the old handle may stay invalid: ask NVML for a fresh one now and then.
            dev.last_reacquire = self._clock()
            with contextlib.suppress(self._nvml_error):
                dev.handle = self._lib.nvmlDeviceGetHandleByIndex(dev.index)
        labels = dev.labels
        out: list[Sample] = []
        try:
            self._read_all(dev, out)
        except _GpuLost as lost:
            self._mark_lost(dev, lost.error)
            dev.gpm_primed = False
            return [(N.GPU_UP, labels, 0.0)]
        if not dev.up:
            log.warning("babysitter: GPU %s (%s) answers again", dev.index, labels[1])
            dev.up = True
        out.insert(0, (N.GPU_UP, labels, 1.0))
        return out

    def _mark_lost(self, dev: _Device, error: str) -> None:
        if dev.up or dev.lost_error != error:
            ident = f"{dev.labels[1]}, {dev.labels[2]}" if dev.labels else "not identified"
            log.error("babysitter: GPU %s (%s) is lost: %s; exporting gpu_up=0", dev.index, ident, error)
        if dev.up:
            dev.last_reacquire = self._clock()
        dev.up = False
        dev.lost_error = error

    def _q(self, dev: _Device, query: str, fn: Callable[[], T]) -> T | None:
        """One NVML reading: None when unsupported or failed; raises _GpuLost when the GPU is gone."""
        if query in dev.unsupported:
            return None
        try:
            return fn()
        except self._lost_errors as exc:
            raise _GpuLost(error_name(exc)) from exc
        except self._unsupported_errors:
            dev.unsupported.add(query)
            return None
        except self._nvml_error as exc:
            self._count_error(dev, query, error_name(exc))
            return None
        except AttributeError:
            # An older nvidia-ml-py without this function: same as the driver not supporting it.
            dev.unsupported.add(query)
            self._log_once(dev, query, "missing in the installed nvidia-ml-py")
            return None

    def _count_error(self, dev: _Device, query: str, error: str) -> None:
        key = (dev.labels, query, error)
        self._query_errors[key] = self._query_errors.get(key, 0) + 1
        self._log_once(dev, query, error)

    def _log_once(self, dev: _Device, query: str, error: str) -> None:
        if (dev.index, query, error) not in self._logged:
            self._logged.add((dev.index, query, error))
            log.warning("babysitter: GPU %s: %s failed: %s (logged once)", dev.index, query, error)

    def _read_all(self, dev: _Device, out: list[Sample]) -> None:
        lib, h, labels = self._lib, dev.handle, dev.labels

        def add(spec: MetricSpec, value: float | None, *extra: str) -> None:
            if value is not None:
                out.append((spec, (*labels, *extra) if extra else labels, float(value)))

        util = self._q(dev, "utilization", lambda: lib.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            add(N.GPU_UTILIZATION, util.gpu / 100.0)
        mem = self._q(dev, "memory", lambda: lib.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            add(N.GPU_MEMORY_USED, mem.used)
            add(N.GPU_MEMORY_TOTAL, mem.total)
        power = self._q(dev, "power", lambda: lib.nvmlDeviceGetPowerUsage(h))
        add(N.GPU_POWER, None if power is None else power / 1000.0)
        limit = self._q(dev, "power_limit", lambda: lib.nvmlDeviceGetEnforcedPowerLimit(h))
        add(N.GPU_POWER_LIMIT, None if limit is None else limit / 1000.0)
        energy = self._q(dev, "energy", lambda: lib.nvmlDeviceGetTotalEnergyConsumption(h))
        add(N.GPU_ENERGY, None if energy is None else energy / 1000.0)
        temp = self._q(dev, "temperature", lambda: lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU))
        add(N.GPU_TEMPERATURE, temp, "gpu")
        add(N.GPU_TEMPERATURE, self._memory_temperature(dev), "memory")
        sm = self._q(dev, "sm_clock", lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM))
        add(N.GPU_SM_CLOCK, None if sm is None else sm * 1e6)
        mclk = self._q(dev, "memory_clock", lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_MEM))
        add(N.GPU_MEMORY_CLOCK, None if mclk is None else mclk * 1e6)
        self._clock_events(dev, add)
        for type_label, type_const in _ECC_TYPES:
            for scope_label, scope_const in _ECC_SCOPES:
                count = self._q(
                    dev,
                    "ecc",
                    lambda t=type_const, s=scope_const: lib.nvmlDeviceGetTotalEccErrors(  # type: ignore[misc]
                        h, getattr(lib, t), getattr(lib, s)
                    ),
                )
                add(N.GPU_ECC_ERRORS, count, type_label, scope_label)
        for cause_label, cause_const in _RETIRE_CAUSES:
            pages = self._q(
                dev,
                "retired_pages",
                lambda c=cause_const: lib.nvmlDeviceGetRetiredPages(h, getattr(lib, c)),  # type: ignore[misc]
            )
            add(N.GPU_RETIRED_PAGES, None if pages is None else len(pages), cause_label)
        pending = self._q(dev, "retired_pages_pending", lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h))
        add(N.GPU_RETIRED_PAGES_PENDING, None if pending is None else float(bool(pending)))
        rows = self._q(dev, "remapped_rows", lambda: lib.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            for state, value in zip(_REMAP_STATES, rows, strict=False):
                add(N.GPU_REMAPPED_ROWS, value, state)
        self._nvlink(dev, add)
        add(N.GPU_PCIE_REPLAYS, self._q(dev, "pcie_replays", lambda: lib.nvmlDeviceGetPcieReplayCounter(h)))
        add(N.GPU_TENSOR_ACTIVE, self._tensor_active(dev))

    def _memory_temperature(self, dev: _Device) -> float | None:
        lib = self._lib
        if not _has(lib, "NVML_FI_DEV_MEMORY_TEMP"):
            return None
        values = self._q(
            dev,
            "memory_temperature",
            lambda: lib.nvmlDeviceGetFieldValues(dev.handle, [lib.NVML_FI_DEV_MEMORY_TEMP]),
        )
        if values is None:
            return None
        value = values[0]
        if value.nvmlReturn != lib.NVML_SUCCESS:
            dev.unsupported.add("memory_temperature")
            return None
        return float(_field_value(lib, value))

    def _clock_events(self, dev: _Device, add: Callable[..., None]) -> None:
        lib, h = self._lib, dev.handle
        reasons = self._q(dev, "clock_events", lambda: lib.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is None and "clock_events" in dev.unsupported:
            # Drivers and nvidia-ml-py before 12.535 name it "throttle reasons".
            reasons = self._q(
                dev, "throttle_reasons", lambda: lib.nvmlDeviceGetCurrentClocksThrottleReasons(h)
            )
        if reasons is None:
            return
        for label, const in EXPORTED_CLOCK_EVENT_REASONS:
            if _has(lib, const):
                add(N.GPU_CLOCK_EVENT_ACTIVE, 1.0 if int(reasons) & int(getattr(lib, const)) else 0.0, label)

    def _nvlink(self, dev: _Device, add: Callable[..., None]) -> None:
        lib, h = self._lib, dev.handle
        if not self._nvlink_per_link and self._nvlink_totals(dev, add):
            return
        if dev.nvlinks is None:
            dev.nvlinks = self._discover_links(dev)
        if not dev.nvlinks:
            return
        for type_label, const in _NVLINK_TYPES:
            counter = getattr(lib, const)
            total: float | None = None
            for link in dev.nvlinks:
                value = self._q(
                    dev,
                    f"nvlink_{type_label}",
                    lambda link=link, counter=counter: lib.nvmlDeviceGetNvLinkErrorCounter(h, link, counter),  # type: ignore[misc]
                )
                if value is None:
                    continue
                if self._nvlink_per_link:
                    add(N.GPU_NVLINK_ERRORS, value, str(link), type_label)
                total = (total or 0.0) + value
            if not self._nvlink_per_link:
                add(N.GPU_NVLINK_ERRORS, total, "all", type_label)

    def _nvlink_totals(self, dev: _Device, add: Callable[..., None]) -> bool:
        """The summed NVLink counters from the driver's totals; False (for good) when any is missing."""
        lib = self._lib
        if "nvlink_totals" in dev.unsupported or not all(_has(lib, const) for _, const in _NVLINK_TOTALS):
            return False
        ids = [int(getattr(lib, const)) for _, const in _NVLINK_TOTALS]
        values = self._q(dev, "nvlink_totals", lambda: lib.nvmlDeviceGetFieldValues(dev.handle, ids))
        if values is None or any(v.nvmlReturn != lib.NVML_SUCCESS for v in values):
            dev.unsupported.add("nvlink_totals")  # no NVLink, or an older driver: count link by link
            return False
        for (type_label, _), value in zip(_NVLINK_TOTALS, values, strict=True):
            add(N.GPU_NVLINK_ERRORS, _field_value(lib, value), "all", type_label)
        return True

    def _discover_links(self, dev: _Device) -> list[int]:
        lib = self._lib
        links: list[int] = []
        for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if lib.nvmlDeviceGetNvLinkState(dev.handle, link) == lib.NVML_FEATURE_ENABLED:
                    links.append(link)
            except self._lost_errors as exc:
                raise _GpuLost(error_name(exc)) from exc
            except self._nvml_error:
                break  # NotSupported (no NVLink) or InvalidArgument (past the last link)
            except AttributeError:
                break
        return links

    def _setup_gpm(self, dev: _Device) -> None:
        lib = self._lib
        try:
            if not lib.nvmlGpmQueryDeviceSupport(dev.handle).isSupportedDevice:
                return
            dev.gpm = [lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()]
        except (self._nvml_error, AttributeError):
            dev.gpm = None

    def _free_gpm(self, dev: _Device) -> None:
        if dev.gpm is None:
            return
        for sample in dev.gpm:
            with contextlib.suppress(self._nvml_error, AttributeError):
                self._lib.nvmlGpmSampleFree(sample)
        dev.gpm = None

    def _tensor_active(self, dev: _Device) -> float | None:
        lib = self._lib
        if dev.gpm is None:
            return None
        previous, current = dev.gpm
        if self._q(dev, "gpm_sample", lambda: lib.nvmlGpmSampleGet(dev.handle, current)) is None:
            if "gpm_sample" in dev.unsupported:
                self._free_gpm(dev)
            return None
        dev.gpm = [current, previous]
        if not dev.gpm_primed:
            dev.gpm_primed = True
            return None
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = lib.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = previous
        request.sample2 = current
        request.metrics[0].metricId = lib.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        result = self._q(dev, "gpm_metrics", lambda: lib.nvmlGpmMetricsGet(request))
        if result is None or result.metrics[0].nvmlReturn != lib.NVML_SUCCESS:
            return None
        return min(max(float(result.metrics[0].value) / 100.0, 0.0), 1.0)


def _has(lib: Any, name: str) -> bool:
    try:
        getattr(lib, name)
    except AttributeError:
        return False
    return True


def _field_value(lib: Any, value: Any) -> float:
    kind = value.valueType
    union = value.value
    if kind == lib.NVML_VALUE_TYPE_DOUBLE:
        return float(union.dVal)
    if kind == lib.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(union.uiVal)
    if kind == lib.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(union.ulVal)
    if kind == lib.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return float(union.ullVal)
    if kind == lib.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(union.sllVal)
    return float(union.siVal)


def _families(samples: Sequence[Sample]) -> list[Metric]:
    """Group samples into one family per catalog entry, in catalog order."""
    families: dict[str, Metric] = {}
    specs: dict[str, MetricSpec] = {}
    for spec, labels, value in samples:
        family = families.get(spec.name)
        if family is None:
            family = families[spec.name] = family_of(spec)
            specs[spec.name] = spec
        family.add_metric(labels, value)  # type: ignore[attr-defined]
    return [families[name] for name in sorted(families, key=lambda n: _ORDER.get(n, len(_ORDER)))]


_ORDER = {spec.name: i for i, spec in enumerate(N.METRICS)}
