"""Which GPU this rank runs on, as ``train_info`` labels the node agent's GPU series also carry.

PromQL joins a rank's step time or MFU with its GPU's clocks, throttling, temperature, ECC and Xids
on ``uuid`` (``generate/rules.py``, the ``rank_gpu*`` records). The rank knows its CUDA device; the node
agent knows GPUs by NVML. So the PCI address comes from torch's device properties (no CUDA call that
synchronizes, no kernel), and NVML, asked by that address, gives the UUID and its own spelling of the
address, normalized as the node agent normalizes it (``0000:53:00``).

Without nvidia-ml-py (many training images lack it) the UUID comes from torch's device properties
instead: CUDA's 16 bytes, which torch prints as ``8-4-4-4-12`` hex and NVML as the same hex after
``GPU-``; the address is then torch's, normalized the same way. Under MIG, CUDA's UUID is the MIG
instance's, which the node agent's per-GPU series do not carry: the join then finds nothing, as it
would with NVML.

Runs once, at ``watch()``, on a rank whose model is on a CUDA device. A CPU run, a torch without PCI
fields in its device properties, or any NVML failure gives empty labels: counted once in
``babysitter_internal_errors_total{where="gpu_identity"}``, logged once, never raised.
"""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from babysitter.catalog import train as T
from babysitter.labels import normalize_pci_bus_id, sanitize_value
from babysitter.training.tally import Tally

__all__ = ["RankNvml", "gpu_labels", "load_nvml", "nvml_bus_id", "torch_uuid"]

_EMPTY = dict.fromkeys(T.GPU_INFO_LABELS, "")


class RankNvml(Protocol):
    """The few pynvml calls a rank makes (the node agent's ``Nvml`` and its fake have them too)."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...


def load_nvml() -> RankNvml:
    """nvidia-ml-py's ``pynvml`` module; ImportError when it is not installed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated ``pynvml`` package's redirector
        module: Any = importlib.import_module("pynvml")
    if not hasattr(module, "nvmlDeviceGetHandleByPciBusId"):
        raise ImportError(f"{getattr(module, '__file__', module)!s} is not nvidia-ml-py's pynvml")
    lib: RankNvml = module
    return lib


def nvml_bus_id(properties: Any) -> str:
    """NVML's spelling (``00000000:53:00.0``) of the PCI address in torch's CUDA device properties."""
    domain = int(properties.pci_domain_id)
    bus = int(properties.pci_bus_id)
    device = int(properties.pci_device_id)
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def torch_uuid(properties: Any) -> str:
    """NVML's spelling (``GPU-`` + hex) of the UUID in torch's CUDA device properties; ValueError when
    torch has none or prints it in a shape NVML would not."""
    text = str(getattr(properties, "uuid", "")).strip().lower().removeprefix("gpu-")
    if not _UUID.fullmatch(text):
        raise ValueError(f"torch's device properties give no UUID in 8-4-4-4-12 hex: {text[:40]!r}")
    return f"GPU-{text}"


def gpu_labels(
    torch: Any,
    device_index: int,
    errors: Tally,
    *,
    nvml: Callable[[], RankNvml] | None = None,
) -> dict[str, str]:
    """``{"uuid": ..., "pci_bus_id": ...}`` of CUDA device ``device_index``; empty values when unknown."""
    try:
        properties = torch.cuda.get_device_properties(device_index)
        bus_id = nvml_bus_id(properties)
        try:
            lib = (nvml or load_nvml)()
        except ImportError:  # no nvidia-ml-py: torch's own UUID, in NVML's spelling
            return {"uuid": torch_uuid(properties), "pci_bus_id": normalize_pci_bus_id(bus_id)}
        lib.nvmlInit()
        try:
            handle = lib.nvmlDeviceGetHandleByPciBusId(bus_id)
            uuid = sanitize_value(lib.nvmlDeviceGetUUID(handle))
            raw = lib.nvmlDeviceGetPciInfo(handle).busId
        finally:
            lib.nvmlShutdown()
        pci = normalize_pci_bus_id(raw.decode() if isinstance(raw, bytes) else str(raw))
    except Exception as exc:  # a missing nvidia-ml-py, an old torch, NVML errors: no labels, never a raise
        errors.record("gpu_identity", exc)
        return dict(_EMPTY)
    if not uuid:
        errors.record("gpu_identity", f"NVML gave no UUID for the GPU at {bus_id}")
        return dict(_EMPTY)
    return {"uuid": uuid, "pci_bus_id": pci}
