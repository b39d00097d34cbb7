"""``babysitter flops`` as text: parameters, FLOPs per token and step, and the throughput each target MFU
needs, from the report the command assembles (the same dict ``--json`` prints)."""

from __future__ import annotations

from typing import Any

from babysitter.terminal import clean

__all__ = ["render_text"]


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def _count(value: float) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.0f}"


def _lines(r: dict[str, Any]) -> list[str]:
    p = r["parameters"]
    lines: list[str] = []
    emit = lines.append
    emit(clean(f"{r['config']}  ({r['model_type']})"))  # the config file's own words
    emit(
        f"parameters: total {_count(p['total'])}, active {_count(p['active'])}, embedding "
        f"{_count(p['embedding'])}, active non-embedding {_count(p['active_non_embedding'])}"
    )
    f = r["flops_per_token"]
    seq = f"seq_len {r['seq_len']}" + (f", encoder {r['encoder_seq_len']}" if "encoder_seq_len" in r else "")
    emit(f"FLOPs per token ({seq}): model {_si(f['model'], 'FLOP')}, hardware {_si(f['hardware'], 'FLOP')}")
    fw = f["forward"]
    total = sum(fw.values())
    shares = ", ".join(f"{k} {v / total:.1%}" for k, v in fw.items() if v)
    emit(f"  forward split: {shares}")
    if "flops_per_step" in r:
        s = r["flops_per_step"]
        emit(
            f"FLOPs per step ({r['batch_tokens']} tokens): model {_si(s['model'], 'FLOP')}, "
            f"hardware {_si(s['hardware'], 'FLOP')}"
        )
    if "device" in r:
        d = r["device"]
        emit(
            f"peak: {d['row']} {d['dtype']} {_si(d['peak_flops_per_second'], 'FLOP/s')} dense ({d['source']})"
        )
        if d.get("note"):
            emit(f"  ({d['note']})")
        for target, need in r["tokens_per_second_for_mfu"].items():
            line = f"  MFU {float(target):.0%}: {need['per_device']:,.0f} tokens/s per device"
            if d["devices"] > 1:
                line += f", {need['job']:,.0f} tokens/s on {d['devices']} devices"
            if "step_seconds_for_mfu" in r:
                line += f", {r['step_seconds_for_mfu'][target]:.3g} s per step"
            emit(line)
    return lines


def render_text(report: dict[str, Any]) -> str:
    """The report as lines of text (no trailing newline)."""
    return "\n".join(_lines(report))
