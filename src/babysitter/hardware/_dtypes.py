"""One spelling per training dtype, so the peak table has one key per number it stores."""

from __future__ import annotations

import difflib
import sys

__all__ = ["DTYPES", "matmul_dtype", "normalize_dtype"]

#: The dtype keys of the peak table, narrowest last.
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")

_ALIASES: dict[str, str] = {
    # fp32
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "32": "fp32",
    "32-true": "fp32",
    "single": "fp32",
    # tf32 (fp32 tensors, TF32 tensor-core matmuls)
    "tf32": "tf32",
    "tfloat32": "tf32",
    # bf16
    "bf16": "bf16",
    "bfloat16": "bf16",
    "bf16-mixed": "bf16",
    "bf16-true": "bf16",
    "amp_bf16": "bf16",
    # fp16
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "16": "fp16",
    "16-mixed": "fp16",
    "16-true": "fp16",
    "amp_fp16": "fp16",
    # fp8 (every 8-bit float format runs at the same tensor-core rate on the chips in the table)
    "fp8": "fp8",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "float8_e8m0fnu": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "amp_fp8": "fp8",
    "transformer-engine": "fp8",
    # int8
    "int8": "int8",
    "i8": "int8",
    "qint8": "int8",
}


def normalize_dtype(dtype: object) -> str:
    """The table key (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``int8``) for any usual spelling.

    Accepts strings (``"bfloat16"``, ``"torch.bfloat16"``, ``"bf16-mixed"``), torch and numpy dtypes
    (by ``str()``), case-insensitively. Anything else raises :class:`ValueError` listing the
    accepted spellings, because a wrong dtype silently picks a wrong peak (2x or more).
    """
    text = str(dtype).strip().lower()
    for prefix in ("torch.", "numpy.", "np.", "jnp."):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if text.startswith("<class '") and text.endswith("'>"):  # numpy scalar types: <class 'numpy.float16'>
        text = text[len("<class '") : -2].rsplit(".", 1)[-1]
    key = _ALIASES.get(text)
    if key is None:
        close = difflib.get_close_matches(text, list(_ALIASES), n=2, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise ValueError(
            f"unknown training dtype {dtype!r}: {hint}accepted spellings: {', '.join(DTYPES)}, torch "
            "dtypes (torch.bfloat16) and the usual aliases ('bfloat16', 'bf16-mixed', 'float8_e4m3fn', ...)"
        )
    return key


def matmul_dtype(dtype: object) -> str:
    """Like :func:`normalize_dtype`, but fp32 becomes tf32 when torch (already imported) runs fp32
    matmuls on TF32 tensor cores (``torch.get_float32_matmul_precision() != "highest"``), since
    then the TF32 peak is the one the GPU can reach. Never imports torch."""
    key = normalize_dtype(dtype)
    if key != "fp32":
        return key
    torch = sys.modules.get("torch")
    if torch is None:
        return key
    try:
        if torch.get_float32_matmul_precision() != "highest":
            return "tf32"
    except Exception:
        return key
    return key
