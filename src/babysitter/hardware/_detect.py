"""Find the name of the accelerator this process trains on, without importing torch or jax.

Order: torch's current device when torch is already imported and CUDA/ROCm is initialized (the
device this rank really uses); NVML (nvidia-ml-py, when importable and a GPU is present); torch on
ROCm (no NVML there); JAX's device kind when jax is already imported; the TPU VM's accelerator type
variables. Every probe is guarded: detection never raises and never initializes CUDA itself.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["detect_device_name"]

_log = logging.getLogger(__name__)

_TPU_ENV = ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE")


def _from_torch(*, rocm_only: bool) -> str | None:
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    cuda = torch.cuda
    if rocm_only:
        if not getattr(torch.version, "hip", None) or not cuda.is_available():
            return None
    elif not cuda.is_initialized():
        return None
    name = cuda.get_device_name(cuda.current_device())
    return str(name) or None


def _from_nvml(module: object | None) -> str | None:
    nvml: Any = module
    if nvml is None:
        try:
            import pynvml  # nvidia-ml-py
        except Exception:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # no driver, no GPU: the usual case on CPU and AMD hosts
        return None
    try:
        names = []
        for index in range(nvml.nvmlDeviceGetCount()):
            raw = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index))
            names.append(raw.decode() if isinstance(raw, bytes) else str(raw))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            _log.debug("nvmlShutdown failed", exc_info=True)
    distinct = sorted(set(names))
    if len(distinct) == 1:
        return distinct[0]
    if len(distinct) > 1:
        _log.warning(
            "this host has different GPU models %s and torch has not picked one yet: pass the device "
            "name explicitly",
            distinct,
        )
    return None


def _from_jax() -> str | None:
    jax: Any = sys.modules.get("jax")
    if jax is None:
        return None
    device = jax.devices()[0]
    if getattr(device, "platform", "") == "cpu":
        return None
    return str(device.device_kind) or None


def detect_device_name(*, nvml: object | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """This process's accelerator name (e.g. ``"NVIDIA H100 80GB HBM3"``), or None when there is none
    or it cannot be told. ``nvml`` (a module with pynvml's functions) and ``environ`` exist for tests."""
    env = os.environ if environ is None else environ
    probes: tuple[Callable[[], str | None], ...] = (
        lambda: _from_torch(rocm_only=False),
        lambda: _from_nvml(nvml),
        lambda: _from_torch(rocm_only=True),
        _from_jax,
    )
    for probe in probes:
        try:
            name = probe()
        except Exception:
            _log.debug("device probe failed", exc_info=True)
            continue
        if name:
            return name.strip()
    for var in _TPU_ENV:
        value = env.get(var, "").strip()
        if value:
            return value
    return None
