"""On a machine with an NVIDIA GPU: ``babysitter probe``'s matmul against a plain ``torch.matmul`` loop.

The command runs as a user would run it (a subprocess, JSON out); the plain loop runs in this
process before and after it, timed with CUDA events around a batch of matmuls, best of several
batches. The two must agree within 10 %: the probe measures the GPU, not its own overhead.
Skipped elsewhere, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpu_helpers import record, requires_gpu

pytestmark = requires_gpu

N, ITERATIONS, REPEATS = 8192, 50, 5


def _plain_matmul_flops() -> float:
    import torch

    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(ITERATIONS):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERATIONS):
            torch.matmul(a, b)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000.0)
    return 2.0 * N**3 * ITERATIONS / best


def test_probe_matmul_agrees_with_a_plain_matmul_loop(tmp_path: Path) -> None:
    import torch

    before = _plain_matmul_flops()
    out = tmp_path / "probe.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "babysitter",
            "probe",
            "--device",
            "cuda",
            "--skip",
            "memory,host_device,collective,storage",
            "--matmul-n",
            str(N),
            "--matmul-iterations",
            str(ITERATIONS),
            "--repeats",
            str(REPEATS),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = _plain_matmul_flops()
    device = json.loads(out.read_text())["devices"][0]
    matmul = device["matmul"]
    probe = matmul["flops_per_second"]
    plain = (before + after) / 2
    ratio = probe / plain
    record(
        "probe_matmul",
        device=torch.cuda.get_device_name(0),
        probe_tflops=probe / 1e12,
        plain_tflops_before=before / 1e12,
        plain_tflops_after=after / 1e12,
        ratio=ratio,
        peak_tflops=(matmul.get("peak_flops_per_second") or 0) / 1e12 or None,
        peak_row=matmul.get("peak_device"),
        peak_ratio=probe / matmul["peak_flops_per_second"] if matmul.get("peak_flops_per_second") else None,
    )
    assert matmul["dtype"] == "bf16"
    assert 0.9 < ratio < 1.1, (probe, before, after)
