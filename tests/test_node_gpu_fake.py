"""The fake pynvml has the shape of the real nvidia-ml-py: constants, error classes, return types."""

from __future__ import annotations

import threading

import pytest

from babysitter.node.gpu import fake as fake_nvml
from babysitter.node.gpu.fake import FakeNvml, fake_gpus


@pytest.fixture(name="nvml")
def _nvml() -> FakeNvml:
    lib = FakeNvml(fake_gpus(2))
    lib.nvmlInit()
    return lib


def test_constants_match_real_pynvml() -> None:
    """Every constant the fake defines has the value nvidia-ml-py gives it."""
    pynvml = pytest.importorskip("pynvml")
    names = [n for n in dir(fake_nvml) if n.startswith(("NVML_", "nvmlEventType", "nvmlClocksEventReason"))]
    assert len(names) > 50
    for name in names:
        assert getattr(pynvml, name) == getattr(fake_nvml, name), name


def test_error_classes_match_real_pynvml() -> None:
    """The fake has exactly the NVMLError_* subclasses of nvidia-ml-py, mapped to the same codes."""
    pynvml = pytest.importorskip("pynvml")
    real = {n for n in dir(pynvml) if n.startswith("NVMLError_")}
    fake = {n for n in dir(fake_nvml) if n.startswith("NVMLError_")}
    assert fake == real
    for name in real:
        code = getattr(pynvml, name)().value
        err = fake_nvml.NVMLError(code)
        assert type(err).__name__ == name
        assert isinstance(err, fake_nvml.NVMLError)
        assert str(err) == str(getattr(pynvml, name)())


def test_function_names_exist_in_real_pynvml() -> None:
    """Every nvml* function of the fake is a function of nvidia-ml-py (no invented API)."""
    pynvml = pytest.importorskip("pynvml")
    names = [n for n in dir(FakeNvml) if n.startswith("nvml")]
    assert len(names) > 30
    for name in names:
        assert callable(getattr(pynvml, name)), name


def test_struct_fields_match_real_pynvml() -> None:
    """Returned structures carry nvidia-ml-py's field names in the same order."""
    pynvml = pytest.importorskip("pynvml")
    for name in (
        "c_nvmlMemory_t",
        "c_nvmlUtilization_t",
        "nvmlPciInfo_t",
        "c_nvmlEventData_t",
        "c_nvmlFieldValue_t",
        "c_nvmlGpmMetric_t",
        "c_nvmlGpmMetricsGet_t",
        "c_nvmlGpmSupport_t",
    ):
        real = [f[0] for f in getattr(pynvml, name)._fields_]
        fake = [f[0] for f in getattr(fake_nvml, name)._fields_]
        assert fake == real, name


def test_calls_before_init_raise_uninitialized() -> None:
    """Like NVML, every query before nvmlInit raises NVMLError_Uninitialized."""
    lib = FakeNvml(fake_gpus(1))
    with pytest.raises(fake_nvml.NVMLError_Uninitialized):
        lib.nvmlDeviceGetCount()


def test_return_shapes(nvml: FakeNvml) -> None:
    """Strings come back as str (UUID, name), the bus id as bytes, structs with real field names."""
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetUUID(h) == nvml.gpu(1).uuid
    assert isinstance(nvml.nvmlDeviceGetName(h), str)
    pci = nvml.nvmlDeviceGetPciInfo(h)
    assert isinstance(pci.busId, bytes)
    assert pci.busId.decode() == nvml.gpu(1).pci_bus_id
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.total == mem.free + mem.used
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)


def test_lost_gpu_and_not_supported(nvml: FakeNvml) -> None:
    """A lost GPU raises GpuIsLost on every query; an unsupported query raises NotSupported."""
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.gpu(1).unsupported.add("nvmlDeviceGetPowerUsage")
    h1 = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.gpu(0).lost = True
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetPowerUsage(h0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(h1)
    assert nvml.nvmlDeviceGetTemperature(h1, nvml.NVML_TEMPERATURE_GPU) == 35


def test_event_set_delivers_xid_and_times_out(nvml: FakeNvml) -> None:
    """Xid events reach a registered event set; an empty wait raises NVMLError_Timeout; free works."""
    es = nvml.nvmlEventSetCreate()
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(es, 10)
    assert nvml.inject_event(0, nvml.nvmlEventTypeXidCriticalError, 79) == 0  # GPU 0 not registered
    timer = threading.Timer(0.05, nvml.inject_event, (1, nvml.nvmlEventTypeXidCriticalError, 79))
    timer.start()
    event = nvml.nvmlEventSetWait(es, 5000)
    timer.join()
    assert event.eventType == nvml.nvmlEventTypeXidCriticalError
    assert event.eventData == 79
    assert nvml.nvmlDeviceGetUUID(event.device) == nvml.gpu(1).uuid
    nvml.nvmlEventSetFree(es)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait(es, 10)


def test_gpm_tensor_util(nvml: FakeNvml) -> None:
    """Two GPM samples give the tensor-active percentage through nvmlGpmMetricsGet."""
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.gpu(0).tensor_active_pct = 40.0
    nvml.nvmlGpmSampleGet(h, s1)
    nvml.gpu(0).tensor_active_pct = 60.0
    nvml.nvmlGpmSampleGet(h, s2)
    mg = nvml.c_nvmlGpmMetricsGet_t()
    mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = 1
    mg.sample1, mg.sample2 = s1, s2
    mg.metrics[0].metricId = nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    nvml.nvmlGpmMetricsGet(mg)
    assert mg.metrics[0].nvmlReturn == nvml.NVML_SUCCESS
    assert mg.metrics[0].value == pytest.approx(50.0)
    nvml.nvmlGpmSampleFree(s1)
    nvml.nvmlGpmSampleFree(s2)
