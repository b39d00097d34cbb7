"""Shared bits of the GPU checks (``pytest -m gpu``, run by ``make gpu-check``).

* ``requires_gpu``: the marks every GPU test carries; elsewhere the test is skipped, saying why.
* :func:`record`: a check's measured numbers, appended as one JSON line to the file named by
  ``BABYSITTER_GPU_RESULTS`` (``benchmarks/gpu_check.py`` renders them into
  ``benchmarks/results/gpu.md``); a no-op when the variable is unset.
* :class:`SmiGpu`: one GPU of ``nvidia-smi -q -x``, read tolerantly across driver generations
  (``N/A`` and unknown tags are ``None``, never a guess).
* :func:`sync_log`: torch's CUDA sync debug mode set to ``warn`` process-wide, with the Python stack
  of every synchronizing call kept, so that a sync can be attributed to babysitter or to the framework.
* :func:`strict_methods`: the named methods of an object run under sync debug mode ``error``.
* :func:`tiny_cuda_gpt`: a small decoder whose step takes milliseconds on a datacenter GPU and
  whose forward never synchronizes (the demo's CPU model builds its mask on the host).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import traceback
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import babysitter
from babysitter.node.gpu.collector import CLOCK_EVENT_REASONS

__all__ = [
    "GPU_SKIP_REASON",
    "SmiGpu",
    "SyncRecord",
    "gpu_skip_reason",
    "parse_smi_xml",
    "record",
    "requires_gpu",
    "strict_methods",
    "sync_log",
    "tiny_cuda_gpt",
]

RESULTS_ENV = "BABYSITTER_GPU_RESULTS"
PACKAGE_DIR = str(Path(babysitter.__file__).resolve().parent)


def gpu_skip_reason() -> str | None:
    """Why the GPU checks cannot run here (None when they can)."""
    if shutil.which("nvidia-smi") is None:
        return "needs an NVIDIA GPU: nvidia-smi is not on PATH"
    try:
        import torch
    except ImportError:
        return "needs an NVIDIA GPU: torch is not installed"
    if not torch.cuda.is_available():
        return f"needs an NVIDIA GPU: torch {torch.__version__} sees no CUDA device"
    return None


GPU_SKIP_REASON = gpu_skip_reason()
requires_gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPU_SKIP_REASON is not None, reason=GPU_SKIP_REASON or ""),
]


def record(check: str, **values: Any) -> None:
    """Append ``{"check": check, **values}`` to the results file, if one is configured."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"check": check, **values}, default=str) + "\n")


# --------------------------------------------------------------------------------------- nvidia-smi -q -x

_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    match = _NUMBER.match(text)
    return float(match.group(1)) if match else None


@dataclass
class SmiGpu:
    """One ``<gpu>`` element of ``nvidia-smi -q -x``: the readings the NVML collector also exports."""

    element: ET.Element

    def text(self, *paths: str) -> str | None:
        """The text of the first of ``paths`` present and not N/A (tags differ across drivers)."""
        for path in paths:
            node = self.element.find(path)
            if node is not None and node.text is not None:
                value = node.text.strip()
                if value and value not in ("N/A", "[N/A]", "Not Supported", "[Not Supported]"):
                    return value
        return None

    def number(self, *paths: str) -> float | None:
        """The leading number of the first of ``paths`` present (``"45 C"`` -> 45.0)."""
        return _num(self.text(*paths))

    def flag(self, *paths: str) -> bool | None:
        """``Active``/``Yes`` -> True, ``Not Active``/``No`` -> False."""
        value = self.text(*paths)
        if value is None:
            return None
        return value.lower() in ("active", "yes", "enabled")

    @property
    def bus_id(self) -> str:
        return self.text("pci/pci_bus_id") or self.element.get("id", "")

    def clock_events(self) -> dict[str, bool]:
        """Clock event (throttle) reasons by the collector's label; older drivers say "throttle"."""
        out: dict[str, bool] = {}
        for parent, prefix in (
            ("clocks_event_reasons", "clocks_event_reason_"),
            ("clocks_throttle_reasons", "clocks_throttle_reason_"),
        ):
            node = self.element.find(parent)
            if node is None:
                continue
            for child in node:
                if child.tag.startswith(prefix) and child.text:
                    label = child.tag[len(prefix) :]
                    label = {"display_clocks_setting": "display_clock_setting"}.get(label, label)
                    out[label] = child.text.strip().lower() == "active"
            if out:
                break
        return out

    def ecc(self, scope: str) -> dict[str, float] | None:
        """ECC error totals of ``scope`` (volatile or aggregate): ``{"corrected": n, "uncorrected": n}``.

        Drivers since ~R525 list SRAM and DRAM counts (summed here, as NVML's total is); older ones
        give ``single_bit``/``double_bit`` with a ``total``."""
        node = self.element.find(f"ecc_errors/{scope}")
        if node is None:
            return None
        old_c, old_u = node.find("single_bit/total"), node.find("double_bit/total")
        if old_c is not None and old_u is not None:
            c, u = _num(old_c.text), _num(old_u.text)
            return None if c is None or u is None else {"corrected": c, "uncorrected": u}
        corrected = uncorrected = 0.0
        seen = False
        for child in node:
            value = _num(child.text)
            if value is None or not child.tag.startswith(("sram_", "dram_")):
                continue
            if child.tag.endswith("_correctable"):
                corrected += value
                seen = True
            elif "_uncorrectable" in child.tag:
                uncorrected += value
                seen = True
        return {"corrected": corrected, "uncorrected": uncorrected} if seen else None

    def readings(self) -> dict[str, float | None]:
        """Every reading the NVML collector also exports, in the collector's units where they differ
        only by a prefix (MiB, W, C, MHz and ratios as nvidia-smi gives them); None when N/A."""
        out: dict[str, float | None] = {
            "memory_total_mib": self.number("fb_memory_usage/total"),
            "memory_reserved_mib": self.number("fb_memory_usage/reserved"),
            "memory_used_mib": self.number("fb_memory_usage/used"),
            # R535+ splits the reading into average and instant; NVML's power usage is the average.
            "power_w": self.number(
                "gpu_power_readings/power_draw",
                "gpu_power_readings/average_power_draw",
                "gpu_power_readings/instant_power_draw",
                "power_readings/power_draw",
            ),
            "power_limit_w": self.number(
                "gpu_power_readings/current_power_limit",
                "gpu_power_readings/enforced_power_limit",
                "power_readings/enforced_power_limit",
                "power_readings/power_limit",
            ),
            "temp_gpu_c": self.number("temperature/gpu_temp"),
            "temp_memory_c": self.number("temperature/memory_temp"),
            "sm_clock_mhz": self.number("clocks/sm_clock"),
            "mem_clock_mhz": self.number("clocks/mem_clock"),
            "util_ratio": None,
            "retired_pending": _as_float(
                self.flag("retired_pages/pending_retirement", "retired_pages/pending_blacklist")
            ),
            "pcie_replays": self.number("pci/replay_counter"),
        }
        util = self.number("utilization/gpu_util")
        out["util_ratio"] = None if util is None else util / 100
        events = self.clock_events()
        for label in CLOCK_EVENT_LABELS:
            out[f"clock_event:{label}"] = _as_float(events.get(label))
        for scope in ("volatile", "aggregate"):
            ecc = self.ecc(scope)
            for kind in ("corrected", "uncorrected"):
                out[f"ecc:{kind}:{scope}"] = None if ecc is None else ecc[kind]
        out["remapped:correctable"] = self.number("remapped_rows/remapped_row_corr")
        out["remapped:uncorrectable"] = self.number("remapped_rows/remapped_row_unc")
        out["remapped:pending"] = _as_float(self.flag("remapped_rows/remapped_row_pending"))
        out["remapped:failure"] = _as_float(self.flag("remapped_rows/remapped_row_failure"))
        for cause, tag in (
            ("multiple_single_bit_ecc", "multiple_single_bit_retirement"),
            ("double_bit_ecc", "double_bit_retirement"),
        ):
            out[f"retired:{cause}"] = self.number(f"retired_pages/{tag}/retired_count")
        return out


#: The collector's clock event labels, in its order.
CLOCK_EVENT_LABELS = tuple(label for label, _ in CLOCK_EVENT_REASONS)


def _as_float(flag: bool | None) -> float | None:
    return None if flag is None else float(flag)


def parse_smi_xml(text: str) -> tuple[dict[str, str], list[SmiGpu]]:
    """(``{"driver_version", "cuda_version"}``, the GPUs) of ``nvidia-smi -q -x`` output."""
    root = ET.fromstring(text)  # noqa: S314  # nvidia-smi's own output, not untrusted input
    info = {tag: (root.findtext(tag) or "").strip() for tag in ("driver_version", "cuda_version")}
    return info, [SmiGpu(gpu) for gpu in root.findall("gpu")]


# ------------------------------------------------------------------------------------- sync attribution


@dataclass
class SyncRecord:
    """One synchronizing CUDA call seen in sync debug mode ``warn``."""

    message: str
    thread: str
    stack: list[traceback.FrameSummary] = field(default_factory=list)

    @property
    def ours(self) -> bool:
        """True when a babysitter frame is on the stack: the sync is babysitter's doing."""
        return any(frame.filename.startswith(PACKAGE_DIR) for frame in self.stack)

    def where(self) -> str:
        """Who asked for the sync: the innermost frame outside torch and the Python standard library
        (a framework's or the user's line), then the innermost frame of all (the torch call)."""
        torch_dir = _torch_dir()
        stdlib = os.path.dirname(contextlib.__file__)
        caller = "?"
        for frame in reversed(self.stack):
            name = frame.filename
            if name.startswith((torch_dir, stdlib)) or name == __file__:
                continue
            caller = f"{_short(name)}:{frame.lineno} {frame.name}"
            break
        frames = [f for f in self.stack if not f.filename.endswith("warnings.py")]
        last = frames[-1] if frames else None
        inner = f"{_short(last.filename)}:{last.lineno} {last.name}" if last else "?"
        return f"{caller} [{self.thread}] -> {inner}"


def _torch_dir() -> str:
    import torch

    return os.path.dirname(torch.__file__)


def _short(path: str) -> str:
    """A path from its package on: ``.../site-packages/lightning/x.py`` -> ``lightning/x.py``."""
    for marker in ("site-packages/", "dist-packages/", "/tests/", "/src/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


@contextlib.contextmanager
def sync_log() -> Iterator[list[SyncRecord]]:
    """Sync debug mode ``warn`` for the block; every synchronizing call, from any thread, is kept."""
    import threading

    import torch

    records: list[SyncRecord] = []
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        original = warnings.showwarning

        def show(  # noqa: PLR0917  # the signature of warnings.showwarning
            message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
        ) -> None:
            if "synchroniz" in str(message):
                stack = traceback.extract_stack()[:-1]
                records.append(SyncRecord(str(message), threading.current_thread().name, stack))
            else:
                original(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield records
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def strict_methods(obj: object, names: list[str]) -> list[str]:
    """Run each of ``obj``'s methods ``names`` under sync debug mode ``error``; the names wrapped."""
    import torch

    wrapped = []
    for name in names:
        method = getattr(obj, name, None)
        if not callable(method):
            continue

        @functools.wraps(method)
        def strict(*args: Any, __method: Any = method, **kwargs: Any) -> Any:
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                return __method(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(previous)

        setattr(obj, name, strict)
        wrapped.append(name)
    return wrapped


def hook_names(cls: type, base: type) -> list[str]:
    """The framework hooks ``cls`` overrides (``on_*``, ``setup``, ``teardown``) below ``base``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is base or klass is object:
            break
        names.update(
            n
            for n, v in vars(klass).items()
            if callable(v) and (n.startswith("on_") or n in ("setup", "teardown"))
        )
    return sorted(names)


# ------------------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class CudaGptConfig:
    """GPT-2 style names, so babysitter's FLOPs formulas read it like a Hugging Face config."""

    model_type: str = "gpt2"
    vocab_size: int = 8192
    n_positions: int = 512
    n_embd: int = 1024
    n_layer: int = 8
    n_head: int = 16


def tiny_cuda_gpt(cfg: CudaGptConfig | None = None, device: str = "cuda") -> Any:
    """A pre-LN decoder with causal SDPA (no mask tensor), built on ``device``."""
    import torch
    from torch import nn

    cfg = cfg or CudaGptConfig()

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(cfg.n_embd)
            self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
            self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
            self.ln2 = nn.LayerNorm(cfg.n_embd)
            self.mlp = nn.Sequential(
                nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, cfg.n_head, c // cfg.n_head).unbind(2)
            y = nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            out: torch.Tensor = x + self.mlp(self.ln2(x))
            return out

    class Gpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = cfg
            self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.n_embd)
            self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits: torch.Tensor = self.head(self.ln_f(x))
            return logits

    torch.manual_seed(0)
    return Gpt().to(device)
