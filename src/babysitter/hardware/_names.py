"""Device name strings (NVML, torch, rocm-smi, JAX device kinds, TPU accelerator types) to table rows.

Matching is by whole tokens, never by substring: "NVIDIA L40S" contains "l4", "NVIDIA GH200 480GB"
contains "h200" and "NVIDIA A100" contains "a10", and substring tables (Lightning's) pick the wrong
row for exactly these. A name that says the model but not the variant, when variants differ in peak
(a bare "H100", "H200" or "H800"), resolves to nothing and says why and which rows it could mean,
rather than guessing. The names the hardware itself reports are not guesses: NVML and torch call the
H200 SXM "NVIDIA H200" and the H800 SXM "NVIDIA H800" (the other parts add "NVL" or "PCIe"), so
those resolve, with a note saying which part the name stands for.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from babysitter.hardware._table import PEAK_TABLE

__all__ = ["SPELLINGS", "DeviceMatch", "canonical_device", "did_you_mean"]

#: How NVML, torch, rocm-smi and JAX spell the devices of the table (the "did you mean" vocabulary,
#: next to the table's own row names). The matcher below accepts more; these are the usual ones.
SPELLINGS = (
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H100 PCIe",
    "NVIDIA H100 NVL",
    "NVIDIA H200",
    "NVIDIA H200 NVL",
    "NVIDIA H800",
    "NVIDIA H800 PCIe",
    "NVIDIA H20",
    "NVIDIA GH200 480GB",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100 80GB PCIe",
    "NVIDIA A800-SXM4-80GB",
    "NVIDIA A800 80GB PCIe",
    "NVIDIA B200",
    "NVIDIA GB200",
    "NVIDIA B300 SXM6 AC",
    "NVIDIA GB300",
    "NVIDIA L4",
    "NVIDIA L20",
    "NVIDIA L40",
    "NVIDIA L40S",
    "NVIDIA A10",
    "NVIDIA A10G",
    "Tesla V100-SXM2-16GB",
    "AMD Instinct MI250X",
    "AMD Instinct MI300X",
    "AMD Instinct MI325X",
    "AMD Instinct MI350X",
    "AMD Instinct MI355X",
)


def did_you_mean(name: str, *, limit: int = 3) -> list[str]:
    """The table's row names and usual spellings closest to ``name`` (difflib), best first; only those
    that resolve to a row, so a suggestion never names a device the table lacks. Spellings that share
    a model token with ``name`` come first ("NVIDIA H100" gets the H100's variants, not the H200)."""
    text = name.strip().lower()
    vocabulary = {v.lower(): v for v in (*PEAK_TABLE, *SPELLINGS) if canonical_device(v).device is not None}
    mine = set(_tokens(text)) - _VENDOR_WORDS
    sharing = [v for v in vocabulary if mine & set(_tokens(v))]
    if sharing:
        ranked = sorted(sharing, key=lambda v: -difflib.SequenceMatcher(None, text, v).ratio())
        return [vocabulary[v] for v in ranked[:limit]]
    return [vocabulary[v] for v in difflib.get_close_matches(text, list(vocabulary), n=limit, cutoff=0.6)]


#: Words of a device name that say nothing about the model.
_VENDOR_WORDS = frozenset({"nvidia", "amd", "instinct", "tesla", "gpu"})

_SPLIT = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True)
class DeviceMatch:
    """The row a name maps to (None when none), and why not when it does not."""

    device: str | None
    reason: str = ""
    #: The rows an ambiguous name could mean (their peaks differ): pass one of these instead.
    choices: tuple[str, ...] = ()
    #: Which part a name that does not spell out its variant stands for, to say next to its peak.
    note: str = ""


_VARIANT = "{model} variant ({parts}) not in the name; their peaks differ"
_REPORTED = "{name!r} is how NVML and torch name the {part}; the {other} card's name says {other}"


def _tokens(name: str) -> list[str]:
    return [t for t in _SPLIT.split(name.lower()) if t]


def _has_prefix(tokens: list[str], prefix: str) -> bool:
    return any(t.startswith(prefix) for t in tokens)


def _nvidia(tok: list[str], s: set[str]) -> DeviceMatch | None:
    if "gb300" in s:
        return DeviceMatch("GB300")
    if "b300" in s:  # "NVIDIA B300 SXM6 AC"
        return DeviceMatch("B300")
    if "gb200" in s:
        return DeviceMatch("GB200")
    if "b200" in s:
        return DeviceMatch("B200")
    if "gh200" in s:
        return DeviceMatch("GH200")
    reported = "nvidia" in s  # spelled as NVML and torch report it, not a model typed by a person
    if "h200" in s:
        # NVML reports the SXM part as plain "NVIDIA H200" (NVIDIA/mig-parted#120) and the PCIe card
        # as "NVIDIA H200 NVL"; "SXM" in the name is accepted too. A bare "H200" is either.
        if "nvl" in s:
            return DeviceMatch("H200 NVL")
        if _has_prefix(tok, "sxm"):
            return DeviceMatch("H200 SXM")
        if reported:
            return DeviceMatch(
                "H200 SXM", note=_REPORTED.format(name="NVIDIA H200", part="H200 SXM", other="NVL")
            )
        return DeviceMatch(None, _VARIANT.format(model="H200", parts="SXM or NVL"), ("H200 SXM", "H200 NVL"))
    if "h800" in s:
        # "NVIDIA H800" (the SXM5 part, as torch and NVML name it) and "NVIDIA H800 PCIe"; no NVL part.
        if _has_prefix(tok, "pcie"):
            return DeviceMatch("H800 PCIe")
        if _has_prefix(tok, "sxm"):
            return DeviceMatch("H800 SXM")
        if reported:
            return DeviceMatch(
                "H800 SXM", note=_REPORTED.format(name="NVIDIA H800", part="H800 SXM", other="PCIe")
            )
        return DeviceMatch(
            None, _VARIANT.format(model="H800", parts="SXM or PCIe"), ("H800 SXM", "H800 PCIe")
        )
    if "h20" in s:  # "NVIDIA H20"; whole tokens, so "H200" and "GH200" never land here
        return DeviceMatch("H20")
    if "h100" in s:
        if "nvl" in s:  # "NVIDIA H100 NVL" (fastfetch-cli/fastfetch#1658)
            return DeviceMatch("H100 NVL")
        if _has_prefix(tok, "pcie") or "hbm2e" in s:  # "NVIDIA H100 PCIe"
            return DeviceMatch("H100 PCIe")
        if _has_prefix(tok, "sxm") or "hbm3" in s:  # "NVIDIA H100 80GB HBM3"
            return DeviceMatch("H100 SXM")
        return DeviceMatch(
            None,
            _VARIANT.format(model="H100", parts="SXM, PCIe or NVL"),
            ("H100 SXM", "H100 PCIe", "H100 NVL"),
        )
    if "a100" in s:
        if _has_prefix(tok, "pcie"):  # "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"
            return DeviceMatch("A100 PCIe")
        # "NVIDIA A100-SXM4-80GB"; a name without the form factor also lands here, which changes
        # no number: the datasheet gives SXM and PCIe the same peaks.
        return DeviceMatch("A100 SXM")
    if "a800" in s:
        # "NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe", "NVIDIA A800 40GB Active": one set of peaks.
        return DeviceMatch("A800 PCIe" if _has_prefix(tok, "pcie") or "active" in s else "A800 SXM")
    if "l20" in s:  # "NVIDIA L20"
        return DeviceMatch("L20")
    if "l40s" in s:
        return DeviceMatch("L40S")
    if "l40" in s:
        return DeviceMatch("L40")
    if "l4" in s:
        return DeviceMatch("L4")
    if "a10g" in s:
        return DeviceMatch("A10G")
    if "a10" in s:
        return DeviceMatch("A10")
    if "v100" in s:
        if _has_prefix(tok, "pcie"):
            return DeviceMatch("V100 PCIe")
        if _has_prefix(tok, "sxm"):  # "Tesla V100-SXM2-16GB"
            return DeviceMatch("V100 SXM")
        return DeviceMatch(
            None, _VARIANT.format(model="V100", parts="SXM2 or PCIe"), ("V100 SXM", "V100 PCIe")
        )
    return None


def _amd(s: set[str]) -> DeviceMatch | None:
    if "mi355x" in s:
        return DeviceMatch("MI355X")
    if "mi350x" in s:
        return DeviceMatch("MI350X")
    if "mi325x" in s:
        return DeviceMatch("MI325X")
    if "mi300x" in s:
        return DeviceMatch("MI300X")
    if "mi250x" in s:
        if "mi250" in s:
            # Some ROCm releases name both parts "AMD Instinct MI250X / MI250" (one PCI id, 0x740c).
            return DeviceMatch(None, "name covers both MI250X and MI250, whose peaks differ")
        return DeviceMatch("MI250X")
    return None


_ACCELERATOR_TYPE = re.compile(r"v\d+[a-z]*(-\d+)?")


def _tpu(text: str, s: set[str]) -> DeviceMatch | None:
    # JAX device_kind: "TPU v4", "TPU v4 lite" (v4i), "TPU v5 lite" (v5e), "TPU v5" (v5p), "TPU v6 lite"
    # (v6e), as in jax's Pallas tests; accelerator types (ACCELERATOR_TYPE, TPU_ACCELERATOR_TYPE):
    # "v4-8", "v5litepod-16", "v5p-128", "v6e-8".
    if "tpu" not in s and not _ACCELERATOR_TYPE.fullmatch(text.lower()):
        return None
    lite = "lite" in s
    if "v4" in s and not lite:
        return DeviceMatch("TPU v4")
    if ("v5" in s and lite) or "v5e" in s or "v5litepod" in s:
        return DeviceMatch("TPU v5e")
    if "v5p" in s or "v5" in s:
        return DeviceMatch("TPU v5p")
    if ("v6" in s and lite) or "v6e" in s:
        return DeviceMatch("TPU v6e")
    return None


def canonical_device(name: str) -> DeviceMatch:
    """The peak-table row for a device name as NVML, torch, rocm-smi, JAX or a TPU VM spell it.

    Canonical row names ("H100 SXM", "TPU v5e") map to themselves, so users can pass them as overrides.
    """
    text = name.strip()
    if not text:
        return DeviceMatch(None, "empty device name")
    for row in PEAK_TABLE:
        if text.lower() == row.lower():
            return DeviceMatch(row)
    tok = _tokens(text)
    s = set(tok)
    for match in (_nvidia(tok, s), _amd(s), _tpu(text, s)):
        if match is not None:
            return match
    return DeviceMatch(None, "not in the peak table")
