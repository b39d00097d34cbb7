"""A fake ``pynvml`` (nvidia-ml-py) for machines without a GPU: tests, the simulator and the demo.

An instance of :class:`FakeNvml` stands in for the ``pynvml`` module: the same function names and
argument orders, the same return shapes (ctypes structures with the real field names, ``bytes`` bus
ids, ``str`` UUIDs and names), the same constants and the same ``NVMLError`` hierarchy, where
``NVMLError(code)`` returns the ``NVMLError_<Name>`` subclass for ``code`` exactly as nvidia-ml-py does.
Code written against ``pynvml`` runs unchanged against it, including the Xid event loop
(``nvmlEventSetCreate`` / ``nvmlDeviceRegisterEvents`` / ``nvmlEventSetWait`` raising
``NVMLError_Timeout`` / ``nvmlEventSetFree``).

What the fake GPUs report is plain mutable state (:class:`FakeGpu`); tests and
:mod:`babysitter.node.gpu.simulate` change it between calls: a GPU that falls off the bus
(``lost = True``: every call on it raises ``NVMLError_GpuIsLost``), a query the GPU does not support
(``unsupported``), Xid events (:meth:`FakeNvml.inject_event`).

Only what babysitter calls is implemented; anything else raises ``AttributeError`` like a missing
symbol would. ``tests/test_node_gpu_fake.py`` checks every constant and error class against the real
nvidia-ml-py when it is installed.
"""

from __future__ import annotations

import ctypes
import itertools
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = ["FakeGpu", "FakeNvml", "NVMLError", "fake_gpus"]

# --- return codes (values as in nvml.h / nvidia-ml-py) -------------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

# --- enums ------------------------------------------------------------------------------------------------
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_NVLINK_ERROR_DL_ECC_DATA = 4
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_FI_DEV_MEMORY_TEMP = 82
# NVLink error counters summed over every link (nvml.h: "total for all Lanes").
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
_NVLINK_TOTALS = {
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: NVML_NVLINK_ERROR_DL_CRC_FLIT,
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: NVML_NVLINK_ERROR_DL_CRC_DATA,
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: NVML_NVLINK_ERROR_DL_REPLAY,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: NVML_NVLINK_ERROR_DL_RECOVERY,
}
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypePState = 0x4
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeClock = 0x10
nvmlEventTypeNone = 0x0

nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonDisplayClockSetting = 0x100
nvmlClocksEventReasonNone = 0x0


# --- errors: the same mechanism as nvidia-ml-py (NVMLError(code) -> subclass for code) -------------------
class NVMLError(Exception):
    """Base of every NVML error; ``NVMLError(code)`` returns the matching ``NVMLError_*`` subclass."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    _errcode_to_string: ClassVar[dict[int, str]] = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int = NVML_ERROR_UNKNOWN, *_args: object) -> NVMLError:
        typ: type[NVMLError] = cls
        if cls is NVMLError:
            typ = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _error_class(name: str, code: int) -> type[NVMLError]:
    def new(cls: type[NVMLError], *_args: object) -> NVMLError:
        return NVMLError.__new__(cls, code)

    klass = type(name, (NVMLError,), {"__new__": new})
    klass.__module__ = __name__
    NVMLError._valClassMapping[code] = klass
    return klass


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_AlreadyInitialized = _error_class("NVMLError_AlreadyInitialized", NVML_ERROR_ALREADY_INITIALIZED)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_InsufficientSize = _error_class("NVMLError_InsufficientSize", NVML_ERROR_INSUFFICIENT_SIZE)
NVMLError_InsufficientPower = _error_class("NVMLError_InsufficientPower", NVML_ERROR_INSUFFICIENT_POWER)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_Timeout = _error_class("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
NVMLError_IrqIssue = _error_class("NVMLError_IrqIssue", NVML_ERROR_IRQ_ISSUE)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_CorruptedInforom = _error_class("NVMLError_CorruptedInforom", NVML_ERROR_CORRUPTED_INFOROM)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_ResetRequired = _error_class("NVMLError_ResetRequired", NVML_ERROR_RESET_REQUIRED)
NVMLError_OperatingSystem = _error_class("NVMLError_OperatingSystem", NVML_ERROR_OPERATING_SYSTEM)
NVMLError_LibRmVersionMismatch = _error_class(
    "NVMLError_LibRmVersionMismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH
)
NVMLError_InUse = _error_class("NVMLError_InUse", NVML_ERROR_IN_USE)
NVMLError_Memory = _error_class("NVMLError_Memory", NVML_ERROR_MEMORY)
NVMLError_NoData = _error_class("NVMLError_NoData", NVML_ERROR_NO_DATA)
NVMLError_VgpuEccNotSupported = _error_class(
    "NVMLError_VgpuEccNotSupported", NVML_ERROR_VGPU_ECC_NOT_SUPPORTED
)
NVMLError_InsufficientResources = _error_class(
    "NVMLError_InsufficientResources", NVML_ERROR_INSUFFICIENT_RESOURCES
)
NVMLError_FreqNotSupported = _error_class("NVMLError_FreqNotSupported", NVML_ERROR_FREQ_NOT_SUPPORTED)
NVMLError_ArgumentVersionMismatch = _error_class(
    "NVMLError_ArgumentVersionMismatch", NVML_ERROR_ARGUMENT_VERSION_MISMATCH
)
NVMLError_Deprecated = _error_class("NVMLError_Deprecated", NVML_ERROR_DEPRECATED)
NVMLError_NotReady = _error_class("NVMLError_NotReady", NVML_ERROR_NOT_READY)
NVMLError_GpuNotFound = _error_class("NVMLError_GpuNotFound", NVML_ERROR_GPU_NOT_FOUND)
NVMLError_InvalidState = _error_class("NVMLError_InvalidState", NVML_ERROR_INVALID_STATE)
NVMLError_ResetTypeNotSupported = _error_class(
    "NVMLError_ResetTypeNotSupported", NVML_ERROR_RESET_TYPE_NOT_SUPPORTED
)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)


# --- structures: the field layout of nvidia-ml-py's ctypes structures ---------------------------------
class struct_c_nvmlDevice_t(ctypes.Structure):
    """Opaque in NVML; the fake keeps the device index in it."""

    _fields_ = [("index", ctypes.c_uint)]


c_nvmlDevice_t = ctypes.POINTER(struct_c_nvmlDevice_t)


class struct_c_nvmlEventSet_t(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint)]


c_nvmlEventSet_t = ctypes.POINTER(struct_c_nvmlEventSet_t)


class struct_c_nvmlGpmSample_t(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint)]


c_nvmlGpmSample_t = ctypes.POINTER(struct_c_nvmlGpmSample_t)


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class c_nvmlUtilization_t(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class nvmlPciInfo_t(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class c_nvmlEventData_t(ctypes.Structure):
    _fields_ = [
        ("device", c_nvmlDevice_t),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class c_nvmlValue_t(ctypes.Union):
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class c_nvmlFieldValue_t(ctypes.Structure):
    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", c_nvmlValue_t),
    ]


class c_metricInfo_t(ctypes.Structure):
    _fields_ = [("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p)]


class c_nvmlGpmMetric_t(ctypes.Structure):
    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
        ("metricInfo", c_metricInfo_t),
    ]


class c_nvmlGpmMetricsGet_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", c_nvmlGpmSample_t),
        ("sample2", c_nvmlGpmSample_t),
        ("metrics", c_nvmlGpmMetric_t * NVML_GPM_METRIC_MAX),
    ]


class c_nvmlGpmSupport_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


# --- the fake devices -------------------------------------------------------------------------------------
@dataclass
class FakeGpu:
    """What one fake GPU reports; change fields between calls to script a scenario.

    Units are NVML's: milliwatts, millijoules, MHz, percent, bytes.
    """

    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = ""  # NVML spelling, e.g. "00000000:18:00.0"; derived from the index when empty
    memory_total: int = 80 * 1024**3
    memory_used: int = 0
    utilization_gpu: int = 0
    utilization_memory: int = 0
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    energy_mj: int = 0
    temperature_c: int = 35
    memory_temperature_c: int = 40
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    clock_event_reasons: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (errorType, counterType) -> count
    retired_pages: dict[int, list[int]] = field(default_factory=dict)  # cause -> page addresses
    retired_pages_pending: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    nvlink_active: int = 18  # links 0..n-1 report FEATURE_ENABLED
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, counter) -> count
    pcie_replays: int = 0
    gpm_supported: bool = True
    tensor_active_pct: float = 0.0
    lost: bool = False
    delay_seconds: float = 0.0  # every call on this GPU blocks this long first (a GPU that hangs NVML)
    unsupported: set[str] = field(default_factory=set)  # NVML function names that raise NotSupported
    errors: dict[str, int] = field(default_factory=dict)  # NVML function name -> error code to raise

    def __post_init__(self) -> None:
        if not self.pci_bus_id:
            self.pci_bus_id = f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"


def fake_gpus(
    count: int, name: str = "NVIDIA H100 80GB HBM3", *, host: int = 0, **fields: Any
) -> list[FakeGpu]:
    """``count`` identical fake GPUs with distinct, stable UUIDs and PCI addresses. ``host`` numbers a
    simulated host: UUIDs are globally unique, so each host's differ (host 0's are the original ones);
    PCI addresses repeat from host to host, as on real ones."""
    if not 0 <= host < 1 << 16:
        raise ValueError(f"host must lie in 0..65535, got {host}")
    return [
        FakeGpu(index=i, uuid=f"GPU-{i:08x}-fa4e-4bab-8e5d-{host:04x}{i:08x}", name=name, **fields)
        for i in range(count)
    ]


_ERROR_CLASSES = {name: cls for name, cls in globals().items() if name.startswith("NVMLError_")}
_CONSTANTS = {
    name: value
    for name, value in globals().items()
    if (name.startswith(("NVML_", "nvmlEventType", "nvmlClocksEventReason"))) and isinstance(value, int)
}
_STRUCTS = {
    name: value
    for name, value in globals().items()
    if name.startswith(("c_nvml", "struct_c_nvml", "nvmlPciInfo_t")) and isinstance(value, type)
}


class FakeNvml:
    """A ``pynvml`` stand-in over a list of :class:`FakeGpu`; thread-safe like NVML itself."""

    NVMLError = NVMLError

    def __init__(self, gpus: Sequence[FakeGpu], *, driver_version: str = "570.124.06") -> None:
        self.gpus = list(gpus)
        self.driver_version = driver_version
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._init_count = 0
        self._handles = [ctypes.pointer(struct_c_nvmlDevice_t(i)) for i in range(len(self.gpus))]
        self._ids = itertools.count(1)
        self._event_sets: dict[int, tuple[queue.Queue[tuple[int, int, int]], dict[int, int]]] = {}
        self._samples: dict[int, tuple[int, float] | None] = {}
        self._sample_objs: dict[int, Any] = {}
        # pynvml's constants, error classes and structs are module globals: plain attributes here too
        # (a lookup through __getattr__ per access cost the agent's GPU collector a tenth of its time).
        self.__dict__.update({**_CONSTANTS, **_STRUCTS, **_ERROR_CLASSES})

    def __getattr__(self, name: str) -> Any:
        if name in _ERROR_CLASSES:
            return _ERROR_CLASSES[name]
        if name in _CONSTANTS:
            return _CONSTANTS[name]
        if name in _STRUCTS:
            return _STRUCTS[name]
        raise AttributeError(f"fake pynvml has no attribute {name!r}")

    # --- scenario hooks (not part of pynvml) -----------------------------------------------------------
    def gpu(self, index: int) -> FakeGpu:
        """The mutable state of GPU ``index``."""
        return self.gpus[index]

    def inject_event(self, index: int, event_type: int, data: int) -> int:
        """Deliver an NVML event (e.g. Xid ``data``) to every event set registered for it on GPU ``index``.

        Returns how many event sets received it.
        """
        delivered = 0
        with self._lock:
            for events, registered in self._event_sets.values():
                if registered.get(index, 0) & event_type:
                    events.put((index, event_type, data))
                    delivered += 1
        return delivered

    # --- library ---------------------------------------------------------------------------------------
    def _enter(self, fn: str) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if self._init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _dev(self, handle: Any, fn: str) -> FakeGpu:
        self._enter(fn)
        try:
            index = int(handle.contents.index)
            gpu = self.gpus[index]
        except (AttributeError, ValueError, IndexError, TypeError):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT) from None
        if gpu.delay_seconds > 0:
            time.sleep(gpu.delay_seconds)
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.errors:
            raise NVMLError(gpu.errors[fn])
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        with self._lock:
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._init_count <= 0:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return self._handles[index]

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Any:
        """NVML takes any spelling of the address (``00000000:18:00.0``, ``0000:18:00.0``, any case)."""
        self._enter("nvmlDeviceGetHandleByPciBusId")
        wanted = pciBusId.decode() if isinstance(pciBusId, bytes) else str(pciBusId)
        try:
            key = _pci_key(wanted)
        except ValueError:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT) from None
        for index, gpu in enumerate(self.gpus):
            if _pci_key(gpu.pci_bus_id) == key:
                if gpu.lost:
                    raise NVMLError(NVML_ERROR_GPU_IS_LOST)
                return self._handles[index]
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetIndex").index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._dev(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._dev(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> nvmlPciInfo_t:
        gpu = self._dev(handle, "nvmlDeviceGetPciInfo")
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info = nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = f"{int(domain, 16) & 0xFFFF:04X}:{bus}:{rest}".encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> c_nvmlMemory_t:
        gpu = self._dev(handle, "nvmlDeviceGetMemoryInfo")
        return c_nvmlMemory_t(gpu.memory_total, gpu.memory_total - gpu.memory_used, gpu.memory_used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> c_nvmlUtilization_t:
        gpu = self._dev(handle, "nvmlDeviceGetUtilizationRates")
        return c_nvmlUtilization_t(gpu.utilization_gpu, gpu.utilization_memory)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_c

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[int]) -> Any:
        gpu = self._dev(handle, "nvmlDeviceGetFieldValues")
        values = (c_nvmlFieldValue_t * len(fieldIds))()
        for i, field_id in enumerate(fieldIds):
            values[i].fieldId = field_id
            if field_id == NVML_FI_DEV_MEMORY_TEMP and "NVML_FI_DEV_MEMORY_TEMP" not in gpu.unsupported:
                values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = gpu.memory_temperature_c
                values[i].nvmlReturn = NVML_SUCCESS
            elif (
                field_id in _NVLINK_TOTALS
                and gpu.nvlink_active > 0
                and "nvlink_totals" not in gpu.unsupported
            ):
                counter, active = _NVLINK_TOTALS[field_id], gpu.nvlink_active
                values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = sum(
                    n for (link, kind), n in gpu.nvlink_errors.items() if kind == counter and link < active
                )
                values[i].nvmlReturn = NVML_SUCCESS
            else:
                values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetClockInfo")
        if type == NVML_CLOCK_SM:
            return gpu.sm_clock_mhz
        if type == NVML_CLOCK_MEM:
            return gpu.mem_clock_mhz
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetTotalEccErrors")
        return gpu.ecc.get((errorType, counterType), 0)

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        gpu = self._dev(device, "nvmlDeviceGetRetiredPages")
        return list(gpu.retired_pages.get(sourceFilter, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        return self._dev(device, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pages_pending

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return self._dev(device, "nvmlDeviceGetRemappedRows").remapped_rows

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._dev(device, "nvmlDeviceGetNvLinkState")
        if not 0 <= link < NVML_NVLINK_MAX_LINKS:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if gpu.nvlink_active <= 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED if link < gpu.nvlink_active else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        gpu = self._dev(device, "nvmlDeviceGetNvLinkErrorCounter")
        if not 0 <= link < gpu.nvlink_active:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlink_errors.get((link, counter), 0)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    # --- GPM (Hopper+) ------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> c_nvmlGpmSupport_t:
        gpu = self._dev(device, "nvmlGpmQueryDeviceSupport")
        return c_nvmlGpmSupport_t(NVML_GPM_SUPPORT_VERSION, int(gpu.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        with self._lock:
            sample_id = next(self._ids)
            obj = struct_c_nvmlGpmSample_t(sample_id)
            self._sample_objs[sample_id] = obj
            self._samples[sample_id] = None
        return ctypes.pointer(obj)

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        with self._lock:
            sample_id = int(gpmSample.contents.id)
            self._samples.pop(sample_id, None)
            self._sample_objs.pop(sample_id, None)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu = self._dev(device, "nvmlGpmSampleGet")
        if not gpu.gpm_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            sample_id = int(gpmSample.contents.id)
            if sample_id not in self._samples:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            self._samples[sample_id] = (gpu.index, gpu.tensor_active_pct)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        self._enter("nvmlGpmMetricsGet")
        if metricsGet.version != NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        with self._lock:
            first = self._samples.get(int(metricsGet.sample1.contents.id))
            second = self._samples.get(int(metricsGet.sample2.contents.id))
        if first is None or second is None or first[0] != second[0]:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            if metric.metricId == NVML_GPM_METRIC_ANY_TENSOR_UTIL:
                metric.value = (first[1] + second[1]) / 2.0
                metric.nvmlReturn = NVML_SUCCESS
            else:
                metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return metricsGet

    # --- events ---------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        with self._lock:
            set_id = next(self._ids)
            self._event_sets[set_id] = (queue.Queue(), {})
        return ctypes.pointer(struct_c_nvmlEventSet_t(set_id))

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._dev(handle, "nvmlDeviceRegisterEvents")
        with self._lock:
            entry = self._event_sets.get(int(eventSet.contents.id))
            if entry is None:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            entry[1][gpu.index] = entry[1].get(gpu.index, 0) | int(eventTypes)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._dev(handle, "nvmlDeviceGetSupportedEventTypes")
        return (
            nvmlEventTypeSingleBitEccError
            | nvmlEventTypeDoubleBitEccError
            | nvmlEventTypePState
            | nvmlEventTypeXidCriticalError
            | nvmlEventTypeClock
        )

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> c_nvmlEventData_t:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> c_nvmlEventData_t:
        self._enter("nvmlEventSetWait")
        with self._lock:
            entry = self._event_sets.get(int(eventSet.contents.id))
        if entry is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        try:
            index, event_type, data = entry[0].get(timeout=max(timeoutms, 0) / 1000.0)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None
        event = c_nvmlEventData_t()
        event.device = self._handles[index]
        event.eventType = event_type
        event.eventData = data
        event.gpuInstanceId = 0xFFFFFFFF
        event.computeInstanceId = 0xFFFFFFFF
        return event

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        with self._lock:
            if self._event_sets.pop(int(eventSet.contents.id), None) is None:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def _pci_key(bus_id: str) -> tuple[int, int, int, int]:
    """(domain, bus, device, function) of a PCI address in any of NVML's spellings."""
    text = bus_id.strip().lower()
    head, _, function = text.partition(".")
    parts = head.split(":")
    if len(parts) != 3:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return (int(parts[0], 16), int(parts[1], 16), int(parts[2], 16), int(function or "0", 16))
